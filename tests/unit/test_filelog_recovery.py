"""FileLog recovery on open: one test per row of the recovery table in docs/log-format.md
(same order), built with byte-surgery helpers on real segment files, plus the intermediate
on-disk states of the open phases and the read-only verify tool.
"""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import crc32c
import pytest

from engine.log import format as fmt
from engine.log.base import record_key
from engine.log.file import FileLog
from engine.log.segment import Frame, scan
from engine.log.verify import verify
from schemas.errors import CorruptLog

# ---------------------------------------------------------------- byte surgery


def flip_byte(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0xFF
    path.write_bytes(bytes(data))


def truncate(path: Path, size: int) -> None:
    with path.open("r+b") as f:
        f.truncate(size)


def rewrite_crc(path: Path, record_position: int, crc: int | None = None) -> None:
    """Overwrite the CRC field of the record at ``record_position`` (default: a wrong CRC)."""
    data = bytearray(path.read_bytes())
    (old,) = struct.unpack_from("<I", data, record_position + 4)
    struct.pack_into("<I", data, record_position + 4, (old ^ 0xDEADBEEF) if crc is None else crc)
    path.write_bytes(bytes(data))


def zero_fill(path: Path, count: int, at: int | None = None) -> None:
    """Write ``count`` zero bytes at ``at`` (default: append them)."""
    data = bytearray(path.read_bytes())
    start = len(data) if at is None else at
    data[start:start + count] = bytes(count)
    path.write_bytes(bytes(data))


# ---------------------------------------------------------------- helpers

VALUES = [f"value-{i}".encode() * (i + 1) for i in range(5)]


def write_log(root: Path, values: list[bytes] = VALUES, **kwargs: object) -> Path:
    """A one-partition log holding ``values`` at offsets 0..; returns its newest segment."""
    with FileLog(root, 1, **kwargs) as log:  # type: ignore[arg-type]
        for i, v in enumerate(values):
            log.append(record_key("conv", f"a{i}"), v)
    return fmt.list_segments(fmt.partition_dir(root, 0))[-1][1]


def frame_positions(path: Path) -> list[int]:
    return [f.position for f in scan(path.read_bytes(), expected_offset=0) if isinstance(f, Frame)]


def values_after_open(root: Path) -> list[bytes]:
    with FileLog(root, 1) as log:
        return [r.value for r in log.read(0, 0, 1000)]


# ---------------------------------------------------------------- the recovery table, in order


def test_row1_clean_end_opens_without_a_cut(tmp_path: Path) -> None:
    write_log(tmp_path)
    with FileLog(tmp_path, 1) as log:
        assert log.recovery == []
        assert log.stats().recovery_cuts == 0
        assert [r.value for r in log.read(0, 0, 100)] == VALUES


def test_row2_header_cut_at_end_is_a_torn_tail(tmp_path: Path) -> None:
    seg = write_log(tmp_path)
    last = frame_positions(seg)[-1]
    truncate(seg, last + 5)
    with FileLog(tmp_path, 1) as log:
        [cut] = log.recovery
        assert (cut.partition, cut.segment, cut.file_position, cut.next_offset, cut.bytes_dropped) == (
            0, seg.name, last, 4, 5)
        assert "header cut" in cut.reason
        assert [r.value for r in log.read(0, 0, 100)] == VALUES[:4]
    assert seg.stat().st_size == last


def test_row3_body_cut_at_end_is_a_torn_tail(tmp_path: Path) -> None:
    seg = write_log(tmp_path)
    last = frame_positions(seg)[-1]
    size = seg.stat().st_size
    truncate(seg, size - 3)
    with FileLog(tmp_path, 1) as log:
        [cut] = log.recovery
        assert (cut.file_position, cut.bytes_dropped, cut.next_offset) == (last, size - 3 - last, 4)
        assert "body cut" in cut.reason
        assert [r.value for r in log.read(0, 0, 100)] == VALUES[:4]


def test_row4_bad_crc_at_end_is_a_torn_tail(tmp_path: Path) -> None:
    seg = write_log(tmp_path)
    last = frame_positions(seg)[-1]
    rewrite_crc(seg, last)
    with FileLog(tmp_path, 1) as log:
        [cut] = log.recovery
        assert cut.file_position == last and "CRC" in cut.reason
        assert [r.value for r in log.read(0, 0, 100)] == VALUES[:4]


def test_row5_bad_crc_with_valid_records_after_is_corruption(tmp_path: Path) -> None:
    seg = write_log(tmp_path)
    middle = frame_positions(seg)[2]
    rewrite_crc(seg, middle)
    before = seg.read_bytes()
    with pytest.raises(CorruptLog) as info:
        FileLog(tmp_path, 1)
    message = str(info.value)
    assert "partition 0" in message and seg.name in message and f"byte {middle}" in message
    assert "verify" in message and "restore" in message
    assert seg.read_bytes() == before, "a refused open must not change the segment"


def test_row5_flipped_value_byte_with_valid_records_after_is_corruption(tmp_path: Path) -> None:
    seg = write_log(tmp_path)
    positions = frame_positions(seg)
    flip_byte(seg, positions[1] + 40)
    with pytest.raises(CorruptLog, match="CRC mismatch"):
        FileLog(tmp_path, 1)


def test_row6_zero_filled_tail_is_a_torn_tail(tmp_path: Path) -> None:
    seg = write_log(tmp_path)
    size = seg.stat().st_size
    zero_fill(seg, 4096)
    with FileLog(tmp_path, 1) as log:
        [cut] = log.recovery
        assert (cut.file_position, cut.bytes_dropped, cut.next_offset) == (size, 4096, 5)
        assert "zero" in cut.reason
        assert [r.value for r in log.read(0, 0, 100)] == VALUES
    assert seg.stat().st_size == size


# ---------------------------------------------------------------- around the table


def test_zero_filled_last_record_is_a_torn_tail(tmp_path: Path) -> None:
    seg = write_log(tmp_path)
    last = frame_positions(seg)[-1]
    zero_fill(seg, seg.stat().st_size - last, at=last)
    assert values_after_open(tmp_path) == VALUES[:4]


def test_a_cut_is_logged_as_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    seg = write_log(tmp_path)
    truncate(seg, seg.stat().st_size - 1)
    with caplog.at_level(logging.WARNING, logger="engine.log.file"), FileLog(tmp_path, 1):
        pass
    assert any("torn tail" in r.message for r in caplog.records)


def test_appends_after_a_cut_continue_at_the_cut_offset(tmp_path: Path) -> None:
    seg = write_log(tmp_path)
    truncate(seg, seg.stat().st_size - 1)
    with FileLog(tmp_path, 1) as log:
        assert log.append(record_key("conv", "new"), b"new").offset == 4
    assert values_after_open(tmp_path) == [*VALUES[:4], b"new"]


def test_record_of_an_unknown_version_is_never_cut(tmp_path: Path) -> None:
    seg = write_log(tmp_path)
    frame = bytearray(fmt.encode_record(5, 0, b"k", b"from the future"))
    frame[8] = 2  # magic 2, then a valid CRC: a record written whole by a newer writer
    struct.pack_into("<I", frame, 4, crc32c.crc32c(bytes(frame[8:])))
    seg.write_bytes(seg.read_bytes() + bytes(frame))
    before = seg.read_bytes()
    with pytest.raises(CorruptLog, match="upgrade histlog"):
        FileLog(tmp_path, 1)
    assert seg.read_bytes() == before


def test_record_with_an_unexpected_offset_is_corruption(tmp_path: Path) -> None:
    seg = write_log(tmp_path)
    seg.write_bytes(seg.read_bytes() + fmt.encode_record(9, 0, b"k", b"v"))
    with pytest.raises(CorruptLog, match="expected 5"):
        FileLog(tmp_path, 1)


def test_damage_in_an_older_segment_is_corruption_when_read(tmp_path: Path) -> None:
    values = [bytes([65 + i]) * 300 for i in range(12)]
    write_log(tmp_path, values, segment_bytes=1024)
    segments = fmt.list_segments(fmt.partition_dir(tmp_path, 0))
    assert len(segments) >= 3
    oldest = segments[0][1]
    truncate(oldest, oldest.stat().st_size - 2)  # a "torn tail", but not in the newest segment
    with FileLog(tmp_path, 1) as log:
        assert log.recovery == []
        with pytest.raises(CorruptLog, match=oldest.name):
            log.read(0, 0, 100)


def test_an_empty_newest_segment_after_a_roll_opens(tmp_path: Path) -> None:
    # Crash after the roll created the next segment file and before any byte reached it.
    write_log(tmp_path)
    (fmt.partition_dir(tmp_path, 0) / fmt.segment_name(5)).touch()
    with FileLog(tmp_path, 1) as log:
        assert log.end_offsets() == [5]
        assert log.append(record_key("conv", "x"), b"x").offset == 5
        assert [r.value for r in log.read(0, 0, 100)] == [*VALUES, b"x"]


def test_a_missing_partition_directory_is_recreated_empty(tmp_path: Path) -> None:
    # Crash after meta.json was written and before the partition directories were.
    FileLog(tmp_path, 2).close()
    for seg in fmt.partition_dir(tmp_path, 1).iterdir():
        seg.unlink()
    fmt.partition_dir(tmp_path, 1).rmdir()
    with FileLog(tmp_path, 2) as log:
        assert log.end_offsets() == [0, 0]


def test_a_missing_first_segment_is_corruption(tmp_path: Path) -> None:
    write_log(tmp_path, [b"x" * 300] * 8, segment_bytes=700)
    fmt.list_segments(fmt.partition_dir(tmp_path, 0))[0][1].unlink()
    with pytest.raises(CorruptLog, match="missing"):
        FileLog(tmp_path, 1)


# ---------------------------------------------------------------- verify (read-only)


def test_verify_reports_a_clean_log(tmp_path: Path) -> None:
    write_log(tmp_path)
    report = verify(tmp_path)
    assert report.clean and report.ok and report.records == 5


def test_verify_reports_a_torn_tail_without_cutting_it(tmp_path: Path) -> None:
    seg = write_log(tmp_path)
    truncate(seg, seg.stat().st_size - 3)
    before = seg.read_bytes()
    report = verify(tmp_path)
    assert [p.kind for p in report.problems] == ["torn tail"]
    assert report.ok and not report.clean
    assert seg.read_bytes() == before


def test_verify_reports_corruption_with_its_position(tmp_path: Path) -> None:
    seg = write_log(tmp_path)
    middle = frame_positions(seg)[2]
    rewrite_crc(seg, middle)
    report = verify(tmp_path)
    [problem] = report.problems
    assert (problem.kind, problem.partition, problem.segment, problem.file_position) == (
        "corruption", 0, seg.name, middle)
    assert not report.ok and "CORRUPT" in report.summary()
    assert report.records == 4


def test_verify_reports_damage_in_an_older_segment_as_corruption(tmp_path: Path) -> None:
    write_log(tmp_path, [b"x" * 300] * 8, segment_bytes=700)
    oldest = fmt.list_segments(fmt.partition_dir(tmp_path, 0))[0][1]
    truncate(oldest, oldest.stat().st_size - 2)
    kinds = {p.kind for p in verify(tmp_path).problems}
    assert kinds == {"corruption"}
