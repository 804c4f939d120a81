"""``FileLog``: the embedded, durable, group-committed log in a directory.

Layout (names from ``engine.log.format``; the spec is ``docs/log-format.md``)::

    path/LOCK                              flock'ed by the one writer process
    path/meta.json                         {"format": ..., "version": 1, "partitions": N}
    path/<partition>/<base offset:020>.log segments: frames back to back, nothing else

Promises:

* **Durability.** ``append`` returns only after the write (and, with ``fsync="always"``, the
  fsync of the segment, plus the directory when the append created a segment) that covers
  its record has returned, so a returned position survives kill -9 and power loss.
  ``"interval"``: a background thread fsyncs every ``fsync_interval_ms``; returned appends
  survive kill -9, not power loss. ``"never"``: the OS decides.
* **Group commit.** Concurrent appends share writes and fsyncs (leader/follower: the first
  waiting appender writes and fsyncs every record queued so far, the others wait on a
  condition for the fsync that covers theirs).
* **Visibility.** ``read``, ``end_offsets`` and cursors see a record once the write+fsync
  its append waited on has returned (with ``"interval"``/``"never"``: once written), so a
  reader never sees a record that could vanish in a kill -9 (or, with ``"always"``, a power loss).
* **Fail-stop.** If a write or fsync raises, the fate of the records in flight is unknown:
  that append and every later one raise ``LogUnavailable`` until the log is closed and
  reopened (recovery then decides from the bytes on disk). Nothing is retried.
* **Recovery on open** (``_recover_partition``): a torn tail of the newest segment is cut and
  reported (``recovery``, a warning on the ``engine.log.file`` logger); damage with an intact
  record after it, or in an older segment, is corruption: ``CorruptLog`` (run the verify
  tool; restore the file from a backup). Older segments are checked when first read.
* **One writer process.** ``path/LOCK`` is ``flock``'ed for the life of the object; a second
  ``FileLog`` on the same path, in any process, raises ``LogUnavailable`` at once.

Errors: ``LogUnavailable`` (locked, closed, fail-stopped, partition count mismatch, not
confirmed within ``timeout``), ``CorruptLog`` (damaged bytes; ``position`` is a
``LogPosition`` when the offset is known, else ``None``; the message names partition,
segment file and byte position).
"""

from __future__ import annotations

import bisect
import fcntl
import json
import logging
import os
import threading
import time
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from engine.log import format as fmt
from engine.log.base import Headers, Log, LogCursor, Record, partition_for_key
from engine.log.memory import ConditionCursor
from engine.log.segment import Damage, Frame, SegmentWriter, fsync_dir, scan, truncate_file
from schemas.errors import CorruptLog, LogUnavailable
from schemas.positions import LogPosition

__all__ = ["FileLog", "FileLogStats", "FsyncPolicy", "RecoveryCut"]

logger = logging.getLogger(__name__)

FsyncPolicy = Literal["always", "interval", "never"]
_META_FORMAT = "histlog-filelog"
_META_VERSION = 1
DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class RecoveryCut:
    """A torn tail removed on open: where, why, and how much."""

    partition: int
    segment: str
    file_position: int
    next_offset: int
    bytes_dropped: int
    reason: str


@dataclass(slots=True)
class FileLogStats:
    """Counters since open. ``group_sizes`` maps records-per-write to how often it happened."""

    appends: int = 0
    writes: int = 0
    fsyncs: int = 0
    dir_fsyncs: int = 0
    segments_created: int = 0
    max_group: int = 0
    group_sizes: dict[int, int] = field(default_factory=dict)
    recovery_cuts: int = 0
    bytes_dropped: int = 0

    def copy(self) -> FileLogStats:
        return FileLogStats(self.appends, self.writes, self.fsyncs, self.dir_fsyncs,
                            self.segments_created, self.max_group, dict(self.group_sizes),
                            self.recovery_cuts, self.bytes_dropped)


class _Segment:
    """One segment file as the log knows it: base offset, size, offset→position index.

    ``positions[i]`` is the file position of record ``base + i``; ``None`` for an older
    segment not read yet (indexed, and checked, on first read). Mutated under the log lock.
    """

    __slots__ = ("base", "fd", "path", "positions", "size")

    def __init__(self, base: int, path: Path, size: int, positions: array[int] | None) -> None:
        self.base = base
        self.path = path
        self.size = size
        self.positions = positions
        self.fd = -1


@dataclass(slots=True)
class _Pending:
    partition: int
    segment_base: int
    position: int
    offset: int
    frame: bytes


def _stored_partitions(path: Path) -> int | None:
    """The partition count recorded in an existing log's meta file (None when absent/unreadable)."""
    try:
        return int(json.loads(fmt.meta_path(path).read_bytes())["partitions"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class FileLog(Log):
    """A partitioned append-only log in a directory. Thread-safe. See the module docstring."""

    def __init__(self, path: str | os.PathLike[str], partitions: int | None = 1, *,
                 fsync: FsyncPolicy = "always", fsync_interval_ms: int = 100,
                 segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
        """``partitions=None`` opens an existing log with its own count (a new one gets 1)."""
        if partitions is None:
            partitions = _stored_partitions(Path(path)) or 1
        if partitions < 1:
            raise ValueError(f"partitions must be >= 1, got {partitions}")
        if fsync not in ("always", "interval", "never"):
            raise ValueError(f"fsync must be 'always', 'interval' or 'never', got {fsync!r}")
        if segment_bytes < fmt.MIN_FRAME_SIZE:
            raise ValueError(f"segment_bytes must be >= {fmt.MIN_FRAME_SIZE}, got {segment_bytes}")
        self.path = Path(path)
        self._partitions = partitions
        self._fsync: FsyncPolicy = fsync
        self._interval = max(1, fsync_interval_ms) / 1000.0
        self._segment_bytes = segment_bytes

        self._lock = threading.Lock()
        self._committed = threading.Condition(self._lock)  # appenders wait for their fsync
        self._arrival = threading.Condition(self._lock)  # cursors wait for visible records
        self._closed = False
        self._failed: BaseException | None = None
        self._flushing = False
        self._enqueued = 0  # tickets handed out
        self._done = 0  # tickets durable (by the policy)
        self._pending: list[_Pending] = []
        self._stats = FileLogStats()
        self.recovery: list[RecoveryCut] = []

        self._lock_fd = -1
        self._segments: list[list[_Segment]] = []
        self._bases: list[list[int]] = []
        self._writers: list[SegmentWriter] = []
        self._next: list[int] = []  # next offset to assign
        self._visible: list[int] = []  # end of what readers may see
        self._planned: list[tuple[int, int]] = []  # (tail segment base, size incl. pending)
        self._dirty: set[int] = set()  # partitions written but not fsynced ("interval")
        try:
            self._open()
        except BaseException:
            self._release_files()
            raise
        self._stop = threading.Event()
        self._syncer: threading.Thread | None = None
        if fsync == "interval":
            self._syncer = threading.Thread(target=self._interval_loop, name="filelog-fsync", daemon=True)
            self._syncer.start()

    # ------------------------------------------------------------ open & recovery

    def _open(self) -> None:
        # Phase 1: take the writer lock (one process, one FileLog per path).
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(fmt.lock_path(self.path), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LogUnavailable(
                f"file log {self.path} is locked by another process (or another FileLog in this "
                "process); stop it or use another path") from None
        # Phase 2: the partition count, fixed at creation.
        self._check_meta()
        for p in range(self._partitions):
            # Phase 3: list the partition's segments.
            pdir = fmt.partition_dir(self.path, p)
            created = not pdir.exists()
            pdir.mkdir(exist_ok=True)
            if created:
                fsync_dir(self.path)
            listed = fmt.list_segments(pdir)
            segments = [_Segment(base, sp, sp.stat().st_size, None) for base, sp in listed]
            if not segments:
                sp = fmt.segment_path(self.path, p, 0)
                SegmentWriter.open(sp, 0).close()
                fsync_dir(pdir)
                segments = [_Segment(0, sp, 0, None)]
            if segments[0].base != 0:
                raise CorruptLog(f"file log {self.path}: partition {p} starts with segment "
                                 f"{segments[0].path.name}; the segments before it are missing: restore "
                                 "them from a backup", reason="missing segment", position=LogPosition(p, 0))
            # Phase 4: scan the newest segment, cut a torn tail, refuse corruption.
            tail = segments[-1]
            self._recover_tail(p, tail)
            assert tail.positions is not None  # Invariant: _recover_tail indexed the tail
            # Phase 5: open the tail for appending; older segments are checked on first read.
            self._segments.append(segments)
            self._bases.append([s.base for s in segments])
            self._writers.append(SegmentWriter.open(tail.path, tail.base))
            end = tail.base + len(tail.positions)
            self._next.append(end)
            self._visible.append(end)
            self._planned.append((tail.base, tail.size))

    def _check_meta(self) -> None:
        meta = fmt.meta_path(self.path)
        if not meta.exists():
            if any(entry.name.isdigit() for entry in self.path.iterdir()):
                raise CorruptLog(f"file log {self.path} has partition directories but no {meta.name}; "
                                 "restore it from a backup (or recreate it with the original partition "
                                 "count)",
                                 reason="missing meta")
            tmp = meta.with_suffix(".tmp")
            body = json.dumps({"format": _META_FORMAT, "version": _META_VERSION,
                               "partitions": self._partitions}).encode()
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, body)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, meta)
            fsync_dir(self.path)
            return
        try:
            data = json.loads(meta.read_bytes())
            stored = int(data["partitions"])
            if data.get("format") != _META_FORMAT:
                raise ValueError(f"format {data.get('format')!r}")
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptLog(f"{meta} is unreadable ({exc}); restore it from a backup",
                             reason="bad meta") from exc
        if stored != self._partitions:
            raise LogUnavailable(
                f"file log {self.path} was created with {stored} partitions but opened with "
                f"{self._partitions}; open it with partitions={stored} (the count is fixed at creation)")

    def _recover_tail(self, partition: int, seg: _Segment) -> None:
        """Scan the newest segment; cut a torn tail; raise ``CorruptLog`` on anything else."""
        data = seg.path.read_bytes()
        positions: array[int] = array("Q")
        items = list(scan(data, expected_offset=seg.base))
        for i, item in enumerate(items):
            if isinstance(item, Frame):
                self._expect_offset(partition, seg, item, seg.base + len(positions))
                positions.append(item.position)
                continue
            later_intact = any(isinstance(x, Frame) for x in items[i + 1:])
            if item.intact or later_intact:
                raise self._corrupt(partition, seg, item, "with intact records after it" if later_intact
                                    else "in a record written whole")
            # A torn tail: damage with nothing intact after it. Cut it and report.
            cut = RecoveryCut(partition, seg.path.name, item.position, seg.base + len(positions),
                              len(data) - item.position, item.reason)
            truncate_file(seg.path, item.position)
            seg.size = item.position
            self.recovery.append(cut)
            self._stats.recovery_cuts += 1
            self._stats.bytes_dropped += cut.bytes_dropped
            logger.warning("file log %s: torn tail cut in partition %d segment %s at byte %d "
                           "(%d bytes dropped, next offset %d): %s", self.path, partition,
                           cut.segment, cut.file_position, cut.bytes_dropped, cut.next_offset, cut.reason)
            break
        seg.positions = positions

    def _expect_offset(self, partition: int, seg: _Segment, frame: Frame, expected: int) -> None:
        if frame.offset != expected:
            raise CorruptLog(
                f"file log {self.path}: partition {partition} segment {seg.path.name} byte "
                f"{frame.position} holds offset {frame.offset}, expected {expected}; run the verify "
                "tool (histlog log verify) and restore the segment from a backup",
                reason="unexpected offset", position=LogPosition(partition, expected))

    def _corrupt(self, partition: int, seg: _Segment, damage: Damage, why: str) -> CorruptLog:
        if damage.intact and damage.reason.startswith("unsupported format version"):
            return CorruptLog(
                f"file log {self.path}: partition {partition} segment {seg.path.name} byte "
                f"{damage.position}: {damage.reason}; it was written by a newer histlog: upgrade "
                "histlog to read this log; nothing was changed", reason=damage.reason, position=None)
        return CorruptLog(
            f"file log {self.path}: partition {partition} segment {seg.path.name} byte "
            f"{damage.position}: {damage.reason} ({len(damage.data)} bytes, {why}). This is corruption, "
            "not a torn write: run the verify tool (histlog log verify) and restore the segment from "
            "a backup; nothing was changed", reason=damage.reason, position=None)

    def _index_older(self, partition: int, seg: _Segment, next_base: int) -> array[int]:
        """Index (and check) an older segment on first read: any damage is corruption."""
        data = seg.path.read_bytes()
        positions: array[int] = array("Q")
        for item in scan(data, expected_offset=seg.base):
            if isinstance(item, Damage):
                raise self._corrupt(partition, seg, item, "in an older segment")
            self._expect_offset(partition, seg, item, seg.base + len(positions))
            positions.append(item.position)
        if seg.base + len(positions) != next_base:
            raise CorruptLog(
                f"file log {self.path}: partition {partition} segment {seg.path.name} ends at offset "
                f"{seg.base + len(positions)} but the next segment starts at {next_base}; run the verify "
                "tool and restore the segment from a backup", reason="missing records",
                position=LogPosition(partition, seg.base + len(positions)))
        return positions

    # ------------------------------------------------------------ append (group commit)

    @property
    def partitions(self) -> int:
        return self._partitions

    def append(self, key: bytes, value: bytes, headers: Sequence[tuple[str, bytes]] = (),
               *, timeout: float = 30.0) -> LogPosition:
        """Append durably (see the module docstring) and return the record's position."""
        hdrs: Headers = tuple((str(name), bytes(hv)) for name, hv in headers)
        partition = partition_for_key(key, self._partitions)
        timestamp_ms = time.time_ns() // 1_000_000
        deadline = time.monotonic() + timeout
        with self._lock:
            self._check_writable()
            offset = self._next[partition]
            try:
                frame = fmt.encode_record(offset, timestamp_ms, key, value, hdrs)
            except ValueError as exc:
                raise LogUnavailable(f"record cannot be framed: {exc}") from exc
            base, size = self._planned[partition]
            if size > 0 and size + len(frame) > self._segment_bytes:
                base, size = offset, 0  # roll: this record starts a new segment
            self._pending.append(_Pending(partition, base, size, offset, frame))
            self._planned[partition] = (base, size + len(frame))
            self._next[partition] = offset + 1
            self._enqueued += 1
            ticket = self._enqueued
            self._stats.appends += 1
            while self._done < ticket:
                if self._failed is not None:
                    raise LogUnavailable(f"file log {self.path} fail-stopped after an I/O error "
                                         f"({self._failed!r}); close and reopen it") from self._failed
                if not self._flushing:
                    self._lead()
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise LogUnavailable(f"append not confirmed within {timeout}s; its outcome is "
                                         "unknown (retrying the same record is safe for histlog events)")
                self._committed.wait(remaining)
        return LogPosition(partition, offset)

    def _check_writable(self) -> None:
        if self._closed:
            raise LogUnavailable(f"file log {self.path} is closed; open it again")
        if self._failed is not None:
            raise LogUnavailable(f"file log {self.path} fail-stopped after an I/O error "
                                 f"({self._failed!r}); close and reopen it to recover") from self._failed

    def _lead(self) -> None:
        """Write (and fsync) everything queued; called and returns with the lock held."""
        self._flushing = True
        batch, self._pending = self._pending, []
        upto = self._enqueued
        self._lock.release()
        try:
            new_segments = self._write_batch(batch)
        except BaseException as exc:
            self._lock.acquire()
            self._failed = exc
            self._flushing = False
            logger.error("file log %s: write/fsync failed, fail-stopping: %r", self.path, exc)
            self._committed.notify_all()
            self._arrival.notify_all()
            return
        self._lock.acquire()
        self._publish(batch, new_segments)
        self._done = upto
        self._flushing = False
        self._stats.writes += 1
        self._stats.max_group = max(self._stats.max_group, len(batch))
        self._stats.group_sizes[len(batch)] = self._stats.group_sizes.get(len(batch), 0) + 1
        self._committed.notify_all()
        self._arrival.notify_all()

    def _write_batch(self, batch: list[_Pending]) -> set[tuple[int, int]]:
        """I/O without the lock: the leader is the only thread touching the writers."""
        runs: dict[int, list[_Pending]] = {}
        for item in batch:
            runs.setdefault(item.partition, []).append(item)
        sync = self._fsync != "never"
        created: set[tuple[int, int]] = set()
        touched: set[int] = set()
        for p, items in runs.items():
            start = 0
            while start < len(items):
                base = items[start].segment_base
                stop = start
                while stop < len(items) and items[stop].segment_base == base:
                    stop += 1
                writer = self._writers[p]
                if writer.base_offset != base:
                    # Roll: the old segment is complete and durable before the new one gets a byte.
                    if sync:
                        writer.sync()
                        self._stats.fsyncs += 1
                    writer.close()
                    writer = SegmentWriter.open(fmt.segment_path(self.path, p, base), base)
                    self._writers[p] = writer
                    created.add((p, base))
                    if sync:
                        fsync_dir(fmt.partition_dir(self.path, p))
                        self._stats.dir_fsyncs += 1
                writer.write(b"".join(i.frame for i in items[start:stop]))
                touched.add(p)
                start = stop
        if self._fsync == "always":
            for p in touched:
                self._writers[p].sync()
                self._stats.fsyncs += 1
        elif self._fsync == "interval":
            self._dirty |= touched
        return created

    def _publish(self, batch: list[_Pending], created: set[tuple[int, int]]) -> None:
        for item in batch:
            p = item.partition
            segs = self._segments[p]
            if segs[-1].base != item.segment_base:  # the leader created this segment (a roll)
                segs.append(_Segment(item.segment_base, fmt.segment_path(self.path, p, item.segment_base),
                                     0, array("Q")))
                self._bases[p].append(item.segment_base)
                self._stats.segments_created += 1
            seg = segs[-1]
            assert seg.positions is not None and seg.base == item.segment_base  # Invariant: tail indexed
            seg.positions.append(item.position)
            seg.size = item.position + len(item.frame)
            self._visible[p] = item.offset + 1

    def _interval_loop(self) -> None:
        while not self._stop.wait(self._interval):
            self._sync_dirty()

    def _sync_dirty(self) -> None:
        with self._lock:
            while self._flushing:
                self._committed.wait()
            if not self._dirty or self._failed is not None or self._writers == []:
                return
            dirty, self._dirty = self._dirty, set()
            self._flushing = True
        try:
            for p in dirty:
                self._writers[p].sync()
                self._stats.fsyncs += 1
        except BaseException as exc:
            with self._lock:
                self._failed = exc
                logger.error("file log %s: background fsync failed, fail-stopping: %r", self.path, exc)
        finally:
            with self._lock:
                self._flushing = False
                self._committed.notify_all()

    # ------------------------------------------------------------ reads

    @property
    def arrival(self) -> threading.Condition:
        return self._arrival

    def visible_end_locked(self, partition: int) -> int:
        return self._visible[partition]

    def is_closed_locked(self) -> bool:
        return self._closed

    def read(self, partition: int, from_offset: int, max_records: int = 1000) -> list[Record]:
        """Visible records of ``partition`` from ``from_offset`` (see "Visibility" above).

        Every record's CRC is checked; damage raises ``CorruptLog``.
        """
        if not 0 <= partition < self._partitions:
            raise ValueError(f"partition {partition} does not exist (the log has {self._partitions})")
        offset = max(0, from_offset)
        out: list[Record] = []
        while len(out) < max_records:
            with self._lock:
                if self._closed:
                    raise LogUnavailable(f"file log {self.path} is closed")
                end = self._visible[partition]
                if offset >= end:
                    break
                i = bisect.bisect_right(self._bases[partition], offset) - 1
                segs = self._segments[partition]
                seg = segs[i]
                next_base = segs[i + 1].base if i + 1 < len(segs) else None
            if seg.positions is None:
                assert next_base is not None  # Invariant: the tail is always indexed
                positions = self._index_older(partition, seg, next_base)
                with self._lock:
                    seg.positions = positions
            with self._lock:
                positions = seg.positions
                assert positions is not None  # Invariant: indexed just above
                limit = min(end, seg.base + len(positions))
                count = min(max_records - len(out), limit - offset)
                k = offset - seg.base
                start_pos = positions[k]
                end_pos = positions[k + count] if k + count < len(positions) else seg.size
                if seg.fd < 0:
                    seg.fd = os.open(seg.path, os.O_RDONLY)
                fd = seg.fd
            try:
                data = os.pread(fd, end_pos - start_pos, start_pos)
            except OSError as exc:
                raise LogUnavailable(f"file log {self.path}: reading {seg.path.name} failed: {exc}") from exc
            got = 0
            for item in scan(data, expected_offset=offset, base_position=start_pos):
                if isinstance(item, Damage):
                    raise self._corrupt(partition, seg, item, "found while reading")
                self._expect_offset(partition, seg, item, offset + got)
                out.append(Record(partition, item.offset, item.timestamp_ms, item.key, item.value,
                                  item.headers))
                got += 1
            if got != count:
                raise CorruptLog(f"file log {self.path}: partition {partition} segment {seg.path.name}: "
                                 f"expected {count} records at byte {start_pos}, read {got}; run the "
                                 "verify tool", reason="short read", position=LogPosition(partition, offset))
            offset += count
        return out

    def end_offsets(self) -> list[int]:
        """Per partition, the offset after the last visible record (the next offset when no
        append is in flight)."""
        with self._lock:
            return list(self._visible)

    def cursor(self, start: Mapping[int, int]) -> LogCursor:
        return ConditionCursor(self, start)

    def stats(self) -> FileLogStats:
        with self._lock:
            return self._stats.copy()

    # ------------------------------------------------------------ close

    def close(self) -> None:
        """Finish in-flight appends, fsync (unless ``"never"``), release files and the lock."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            while self._flushing or (self._done < self._enqueued and self._failed is None):
                if not self._flushing:
                    self._lead()
                    continue
                self._committed.wait()
            self._arrival.notify_all()
        if self._syncer is not None:
            self._stop.set()
            self._syncer.join()
        if self._fsync != "never" and self._failed is None:
            try:
                for w in self._writers:
                    w.sync()
            except OSError as exc:
                logger.error("file log %s: fsync on close failed: %r", self.path, exc)
        self._release_files()

    def _release_files(self) -> None:
        for w in self._writers:
            w.close()
        self._writers = []
        for segs in self._segments:
            for s in segs:
                if s.fd >= 0:
                    os.close(s.fd)
                    s.fd = -1
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = -1

    def __enter__(self) -> FileLog:
        return self

    def __repr__(self) -> str:
        return f"FileLog({str(self.path)!r}, partitions={self._partitions}, fsync={self._fsync!r})"
