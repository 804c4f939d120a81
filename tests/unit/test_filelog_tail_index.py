"""The tail index (``engine.log.index``, docs/log-format.md §5): after a clean close the next open
takes the newest segment's positions from ``<partition>/tail.index`` instead of walking its
frames, and any change to the segment or to the index since makes the open walk, with exactly
the verdict it has without an index (compared case by case against the same bytes with the index
deleted)."""

from __future__ import annotations

import logging
import os
import shutil
from array import array
from collections.abc import Callable
from pathlib import Path

import crc32c
import pytest

from engine.log import format as fmt
from engine.log.base import record_key
from engine.log.file import FileLog
from engine.log.index import decode_tail_index, encode_tail_index
from engine.log.segment import SegmentWriter, file_crc
from schemas.errors import CorruptLog, LogUnavailable
from tests.unit.test_filelog_recovery import (
    VALUES,
    flip_byte,
    frame_positions,
    rewrite_crc,
    truncate,
    write_log,
    zero_fill,
)


def index_path(root: Path, partition: int = 0) -> Path:
    return fmt.tail_index_path(root, partition)


def decode_for(raw: bytes, base: int, segment: Path) -> array[int] | None:
    """The positions ``raw`` gives when it is the index of ``segment`` (base offset ``base``) as it is."""
    data = segment.read_bytes()
    return decode_tail_index(raw, base, len(data), crc32c.crc32c(data))


def outcome(root: Path) -> tuple[str, object]:
    """What opening ``root`` (one partition) does: its cuts, losses and records, or the refusal."""
    try:
        with FileLog(root, 1) as log:
            return "opened", ([(c.file_position, c.next_offset, c.bytes_dropped, c.reason) for c in log.recovery],
                              [r.value for r in log.read(0, 0, 1000)], log.end_offsets())
    except CorruptLog as e:
        return "refused", (e.reason, str(e))


def test_a_clean_close_saves_the_index_a_walk_of_the_segment_gives(tmp_path: Path) -> None:
    seg = write_log(tmp_path)
    positions = decode_for(index_path(tmp_path).read_bytes(), 0, seg)
    assert positions is not None and list(positions) == frame_positions(seg)


def test_the_next_open_takes_the_positions_without_walking_a_frame(tmp_path: Path) -> None:
    with FileLog(tmp_path, 3) as log:
        for i in range(300):
            log.append(record_key(f"conv-{i % 7}", f"a{i}"), f"v{i}".encode())
        ends = log.end_offsets()
    with FileLog(tmp_path, 3) as log:
        assert log.stats().tail_frames_scanned == 0
        assert log.end_offsets() == ends and log.recovery == []
        got = {r.value for p in range(3) for r in log.read(p, 0, 1000)}
        assert got == {f"v{i}".encode() for i in range(300)}
        more = [log.append(record_key(f"conv-{i % 7}", f"b{i}"), b"more") for i in range(20)]
        for p in range(3):  # appends go on from each partition's end
            offsets = sorted(q.offset for q in more if q.partition == p)
            assert offsets == list(range(ends[p], ends[p] + len(offsets)))
    with FileLog(tmp_path, 3) as log:  # the appends after an indexed open are in the next index
        assert log.stats().tail_frames_scanned == 0
        assert sum(log.end_offsets()) == 320


def test_without_the_index_the_open_walks_every_frame_to_the_same_state(tmp_path: Path) -> None:
    write_log(tmp_path)
    index_path(tmp_path).unlink()
    with FileLog(tmp_path, 1) as log:
        assert log.stats().tail_frames_scanned == len(VALUES)
        assert [r.value for r in log.read(0, 0, 100)] == VALUES
    with FileLog(tmp_path, 1) as log:  # that close saved one again
        assert log.stats().tail_frames_scanned == 0


def test_only_the_newest_segment_is_indexed_and_older_ones_still_read(tmp_path: Path) -> None:
    values = [bytes([65 + i % 26]) * 200 for i in range(40)]
    write_log(tmp_path, values, segment_bytes=1000)
    segments = fmt.list_segments(fmt.partition_dir(tmp_path, 0))
    assert len(segments) > 3
    with FileLog(tmp_path, 1, segment_bytes=1000) as log:
        assert log.stats().tail_frames_scanned == 0
        assert [r.value for r in log.read(0, 0, 100)] == values
    raw = index_path(tmp_path).read_bytes()
    assert decode_for(raw, segments[-1][0], segments[-1][1]) is not None
    assert decode_for(raw, segments[-2][0], segments[-2][1]) is None  # names its segment


SEGMENT_CHANGES: dict[str, Callable[[Path], None]] = {
    "a flipped byte in the last record (row 4)": lambda s: flip_byte(s, frame_positions(s)[-1] + 12),
    "a bad CRC in a middle record (row 5)": lambda s: rewrite_crc(s, frame_positions(s)[2]),
    "a flipped value byte in a middle record (row 5)": lambda s: flip_byte(s, frame_positions(s)[1] + 40),
    "a header cut (row 2)": lambda s: truncate(s, frame_positions(s)[-1] + 5),
    "a body cut (row 3)": lambda s: truncate(s, s.stat().st_size - 3),
    "records removed at a frame boundary (row 10)": lambda s: truncate(s, frame_positions(s)[3]),
    "zeros appended (row 6)": lambda s: zero_fill(s, 64),
    "the last record zeroed in place": lambda s: zero_fill(s, s.stat().st_size - frame_positions(s)[-1],
                                                             frame_positions(s)[-1]),
    "an emptied segment": lambda s: truncate(s, 0),
}


@pytest.mark.parametrize("change", sorted(SEGMENT_CHANGES))
def test_a_segment_changed_since_the_close_is_walked_with_the_verdict_it_has_without_an_index(
        tmp_path: Path, change: str) -> None:
    with_index, without = tmp_path / "with", tmp_path / "without"
    seg = write_log(with_index)
    SEGMENT_CHANGES[change](seg)
    shutil.copytree(with_index, without)
    index_path(without).unlink()
    assert index_path(with_index).exists()
    got, expected = outcome(with_index), outcome(without)
    assert got[0] == expected[0]
    if got[0] == "opened":
        assert got[1] == expected[1]
    else:  # the same refusal, naming its own directory
        assert got[1] == (expected[1][0], expected[1][1].replace(str(without), str(with_index)))  # type: ignore[index]


def _damaged_indexes(root: Path) -> dict[str, bytes]:
    raw = index_path(root).read_bytes()
    out = {f"byte {i} flipped": raw[:i] + bytes([raw[i] ^ 0x01]) + raw[i + 1:] for i in range(len(raw))}
    out.update({"empty": b"", "cut short": raw[:-1], "one byte more": raw + b"\0", "garbage": os.urandom(len(raw))})
    return out


def test_a_damaged_index_is_never_taken(tmp_path: Path) -> None:
    write_log(tmp_path)
    cases = _damaged_indexes(tmp_path)
    assert len(cases) > 60
    for name, raw in cases.items():
        index_path(tmp_path).write_bytes(raw)
        with FileLog(tmp_path, 1) as log:
            assert log.stats().tail_frames_scanned == len(VALUES), name
            assert [r.value for r in log.read(0, 0, 100)] == VALUES, name


def test_a_stale_index_of_fewer_records_is_never_taken(tmp_path: Path) -> None:
    write_log(tmp_path)
    stale = index_path(tmp_path).read_bytes()
    with FileLog(tmp_path, 1) as log:
        log.append(record_key("conv", "later"), b"later")
    index_path(tmp_path).write_bytes(stale)  # as a crash after those appends would leave it
    with FileLog(tmp_path, 1) as log:
        assert log.stats().tail_frames_scanned == len(VALUES) + 1
        assert [r.value for r in log.read(0, 0, 100)] == [*VALUES, b"later"]


def test_another_partitions_index_is_never_taken(tmp_path: Path) -> None:
    with FileLog(tmp_path, 2) as log:
        for i in range(50):
            log.append(record_key(f"conv-{i}"), b"x" * i)
        ends = log.end_offsets()
    assert all(ends)
    shutil.copyfile(index_path(tmp_path, 0), index_path(tmp_path, 1))
    with FileLog(tmp_path, 2) as log:
        assert log.stats().tail_frames_scanned == ends[1]
        assert log.end_offsets() == ends


def test_a_fail_stopped_log_saves_no_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_log(tmp_path)
    index_path(tmp_path).unlink()
    log = FileLog(tmp_path, 1)

    def failing_write(fd: int, data: bytes) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", failing_write)
    with pytest.raises(LogUnavailable):
        log.append(record_key("conv", "x"), b"x")
    monkeypatch.undo()
    log.close()
    assert not index_path(tmp_path).exists()
    assert outcome(tmp_path)[0] == "opened"


def test_an_index_that_cannot_be_saved_is_logged_and_the_close_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    write_log(tmp_path)
    index_path(tmp_path).unlink()

    def failing_replace(src: object, dst: object) -> None:
        raise OSError(30, "Read-only file system")

    log = FileLog(tmp_path, 1)
    monkeypatch.setattr(os, "replace", failing_replace)
    with caplog.at_level(logging.WARNING, logger="engine.log.index"):
        log.close()
    monkeypatch.undo()
    assert "cannot save the tail index" in caplog.text and "Read-only file system" in caplog.text
    assert not index_path(tmp_path).exists()
    assert not index_path(tmp_path).with_name("tail.index.tmp").exists()
    with FileLog(tmp_path, 1) as reopened:
        assert reopened.stats().tail_frames_scanned == len(VALUES)


def test_the_index_holds_positions_only_never_record_bytes(tmp_path: Path) -> None:
    token = os.urandom(16).hex().encode()
    seg = write_log(tmp_path, [token * 3])
    raw = index_path(tmp_path).read_bytes()
    assert token not in raw and len(raw) == len(encode_tail_index(0, seg.stat().st_size, 0, array("Q", [0])))


def _writes_of_at_most(monkeypatch: pytest.MonkeyPatch, most: int) -> None:
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real(fd, bytes(data)[:most]))


@pytest.mark.parametrize("history", ["appends", "short writes", "rolls", "an indexed open", "a walked open",
                                     "a torn tail cut"])
def test_the_writers_running_crc_names_the_bytes_on_disk_so_closing_reads_nothing_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, history: str) -> None:
    """The index a close saves names the CRC-32C its writers kept as they wrote (seeded by the
    open's check, after any cut), not one computed by reading the segment back: whatever came
    before the close, that CRC is the one of the bytes on disk, so the next open takes the index."""
    kwargs = {"segment_bytes": 600} if history == "rolls" else {}
    write_log(tmp_path, **kwargs)  # type: ignore[arg-type]
    if history == "a walked open":
        index_path(tmp_path).unlink()
    if history == "a torn tail cut":
        seg = fmt.list_segments(fmt.partition_dir(tmp_path, 0))[-1][1]
        truncate(seg, seg.stat().st_size - 3)
    if history == "short writes":
        _writes_of_at_most(monkeypatch, 7)
    log = FileLog(tmp_path, 1, **kwargs)  # type: ignore[arg-type]
    assert len(log.recovery) == (history == "a torn tail cut")
    for i in range(30):
        log.append(record_key("conv", f"more{i}"), f"more-{i}".encode() * 5)
    real_read = Path.read_bytes

    def no_segment_read(self: Path) -> bytes:
        assert not self.name.endswith(fmt.SEGMENT_SUFFIX), f"the close read {self} back"
        return real_read(self)

    monkeypatch.setattr(Path, "read_bytes", no_segment_read)
    log.close()
    monkeypatch.undo()
    segments = fmt.list_segments(fmt.partition_dir(tmp_path, 0))
    assert (len(segments) > 2) == (history == "rolls")
    assert decode_for(index_path(tmp_path).read_bytes(), *segments[-1]) is not None
    with FileLog(tmp_path, 1, **kwargs) as log:  # type: ignore[arg-type]
        assert log.stats().tail_frames_scanned == 0 and log.recovery == []
        values = [r.value for r in log.read(0, 0, 1000)]
        assert values[-30:] == [f"more-{i}".encode() * 5 for i in range(30)]
        assert len(values) == len(VALUES) + 30 - (history == "a torn tail cut")


def test_a_writer_opened_on_a_file_of_another_size_keeps_no_crc(tmp_path: Path) -> None:
    path = tmp_path / "seg"
    path.write_bytes(b"0123456789")
    exact = SegmentWriter.open(path, 0, size=10, crc=crc32c.crc32c(b"0123456789"))
    exact.write(b"abc")
    assert exact.crc == crc32c.crc32c(path.read_bytes()) and exact.size == 13
    exact.close()
    other = SegmentWriter.open(path, 0, size=10, crc=crc32c.crc32c(b"0123456789"))
    other.write(b"d")
    assert other.crc is None and other.size == 14  # no CRC, so its log saves no index at close
    other.close()


@pytest.mark.parametrize("size", [0, 1, 4096, 100_003])
def test_file_crc_is_the_crc_of_the_files_bytes(tmp_path: Path, size: int) -> None:
    path = tmp_path / "f"
    data = os.urandom(size)
    path.write_bytes(data)
    assert file_crc(path) == (size, crc32c.crc32c(data))
