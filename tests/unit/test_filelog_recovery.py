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
from schemas.errors import CorruptLog, InvalidConfiguration
from schemas.positions import LogPosition

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


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (but the LOCK) by relative path: to prove a refusal changed nothing."""
    return {str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*"))
            if f.is_file() and f.name != fmt.LOCK_FILE}


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


# ---------------------------------------------------------------- the evidence table, in order
# ``acknowledged=[5]``: the state's checkpoint says offsets 0..4 were acknowledged and applied.


def test_row7_records_removed_at_a_boundary_below_the_evidence_is_lost_data(tmp_path: Path) -> None:
    seg = write_log(tmp_path)
    truncate(seg, frame_positions(seg)[-1])  # a clean end: record 4 removed whole
    before = snapshot(tmp_path)
    with pytest.raises(CorruptLog) as info:
        FileLog(tmp_path, 1, acknowledged=[5])
    message = str(info.value)
    assert "partition 0" in message and "expected end offset 5, found 4" in message
    assert "restore" in message.lower() and "nothing was changed" in message
    assert info.value.position == LogPosition(0, 4)
    assert snapshot(tmp_path) == before, "a refused open must not change any file"


def test_row7_without_fsync_always_a_shorter_log_is_reported_not_refused(tmp_path: Path) -> None:
    seg = write_log(tmp_path)
    truncate(seg, frame_positions(seg)[-1])
    with FileLog(tmp_path, 1, fsync="interval", acknowledged=[5]) as log:
        [lost] = log.lost
        assert (lost.partition, lost.expected_end, lost.found_end) == (0, 5, 4)
        assert log.recovery == [] and log.end_offsets() == [4]


def test_row8_bad_crc_in_the_last_acknowledged_record_is_lost_data(tmp_path: Path) -> None:
    seg = write_log(tmp_path)
    last = frame_positions(seg)[-1]
    flip_byte(seg, last + 30)  # a bit flip inside the body: the frame is complete, its CRC fails
    before = snapshot(tmp_path)
    with pytest.raises(CorruptLog) as info:
        FileLog(tmp_path, 1, acknowledged=[5])
    message = str(info.value)
    assert "expected end offset 5, found 4" in message and f"byte {last}" in message
    assert "CRC mismatch" in message
    assert snapshot(tmp_path) == before


def test_row8_without_fsync_always_the_damaged_record_is_cut_and_the_loss_reported(tmp_path: Path) -> None:
    seg = write_log(tmp_path)
    last = frame_positions(seg)[-1]
    flip_byte(seg, last + 30)
    with FileLog(tmp_path, 1, fsync="never", acknowledged=[5]) as log:
        [cut] = log.recovery
        [lost] = log.lost
        assert cut.file_position == last and (lost.expected_end, lost.found_end) == (5, 4)
    assert seg.stat().st_size == last


def test_row9_a_torn_tail_past_the_evidence_is_still_cut(tmp_path: Path) -> None:
    seg = write_log(tmp_path)
    size = seg.stat().st_size
    zero_fill(seg, 100)  # bytes past offset 4, the last acknowledged record
    with FileLog(tmp_path, 1, acknowledged=[5]) as log:
        [cut] = log.recovery
        assert cut.next_offset == 5 and log.lost == []
        assert [r.value for r in log.read(0, 0, 100)] == VALUES
    assert seg.stat().st_size == size


def test_row9_a_torn_record_that_was_never_acknowledged_is_cut(tmp_path: Path) -> None:
    seg = write_log(tmp_path)
    last = frame_positions(seg)[-1]
    flip_byte(seg, last + 30)
    with FileLog(tmp_path, 1, acknowledged=[4]) as log:  # record 4's append never returned
        [cut] = log.recovery
        assert cut.next_offset == 4 and log.lost == []


def test_row10_bad_crc_in_the_last_record_without_evidence_is_cut_as_a_torn_tail(tmp_path: Path) -> None:
    # Not detectable without evidence: a complete frame whose CRC fails is what a torn write
    # leaves when the file's size reached the disk before its data (docs/log-format.md §5).
    seg = write_log(tmp_path)
    last = frame_positions(seg)[-1]
    flip_byte(seg, last + 30)
    with FileLog(tmp_path, 1) as log:
        [cut] = log.recovery
        assert cut.file_position == last and "CRC" in cut.reason
        assert log.lost == []


def test_row10_records_removed_at_a_boundary_without_evidence_open_clean(tmp_path: Path) -> None:
    seg = write_log(tmp_path)
    truncate(seg, frame_positions(seg)[-1])
    with FileLog(tmp_path, 1) as log:
        assert log.recovery == [] and log.lost == [] and log.end_offsets() == [4]


def test_evidence_below_the_end_is_consistent(tmp_path: Path) -> None:
    write_log(tmp_path)
    with FileLog(tmp_path, 1, acknowledged=[3]) as log:
        assert log.recovery == [] and log.lost == [] and log.end_offsets() == [5]


def test_a_removed_newest_segment_below_the_evidence_is_lost_data(tmp_path: Path) -> None:
    write_log(tmp_path, [b"x" * 300] * 8, segment_bytes=700)
    segments = fmt.list_segments(fmt.partition_dir(tmp_path, 0))
    assert len(segments) >= 2
    segments[-1][1].unlink()
    before = snapshot(tmp_path)
    with pytest.raises(CorruptLog, match=f"expected end offset 8, found {segments[-1][0]}"):
        FileLog(tmp_path, 1, acknowledged=[8])
    assert snapshot(tmp_path) == before


def test_a_refusal_in_one_partition_cuts_no_torn_tail_in_another(tmp_path: Path) -> None:
    with FileLog(tmp_path, 2) as log:
        for i in range(40):
            log.append(record_key(f"conv-{i}", "a"), b"v" * 20)
        ends = log.end_offsets()
    assert min(ends) > 0
    for p in (0, 1):
        seg = fmt.list_segments(fmt.partition_dir(tmp_path, p))[-1][1]
        truncate(seg, frame_positions(seg)[-1] + 3)  # partition 0: a torn tail past the evidence
    before = snapshot(tmp_path)
    with pytest.raises(CorruptLog, match="partition 1"):
        FileLog(tmp_path, 2, acknowledged=[ends[0] - 1, ends[1]])
    assert snapshot(tmp_path) == before


def test_evidence_of_the_wrong_length_is_refused_before_any_io(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfiguration, match="2 partitions"):
        FileLog(tmp_path / "log", 2, acknowledged=[1])
    with pytest.raises(InvalidConfiguration, match="negative"):
        FileLog(tmp_path / "log", 1, acknowledged=[-1])
    assert not (tmp_path / "log").exists()


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
