"""``FileLog``: the embedded, durable, group-committed log in a directory: open (the writer
lock, creation, recovery), the append entry points, reads, cursors, stats and close. How records
are written (the queue, group commit, the flusher and interval fsync threads, fail-stop) is
``GroupCommit`` in ``group_commit.py``, a mixin of ``FileLog``: writes and reads share this one
object's lock and offsets. Creation and recovery policy are in ``layout.py`` and
``recovery.py``, ``meta.json`` in ``meta.py``, the waiting cursor in ``cursor.py``, the frame
format in ``format.py`` and ``segment.py``.

Layout (names from ``engine.log.format``; the spec is ``docs/log-format.md``)::

    path/LOCK                              flock'ed by the one writer process
    path/meta.json                         {"format": ..., "version": 1, "partitions": N}
    path/<partition>/<base offset:020>.log segments: frames back to back, nothing else

Promises:

* **Durability**, **group commit** and **fail-stop** (when ``append`` returns under each
  ``fsync`` policy, how records are written, what a failed write or fsync does):
  ``engine.log.group_commit``.
* **Visibility.** ``read``, ``end_offsets`` and cursors see a record once the write+fsync
  its append waited on has returned (with ``"interval"``/``"never"``: once written), so a
  reader never sees a record that could vanish in a kill -9 (or, with ``"always"``, a power loss).
* **Creation is crash-safe** (``engine.log.layout``): every partition directory and its
  empty first segment are durable before ``meta.json`` is renamed into place, so a log with
  ``meta.json`` and a missing partition directory or no segment files lost data:
  ``CorruptLog``. A creation killed before ``meta.json`` (only empty segments) is completed.
* **Recovery on open** (``engine.log.recovery``): every partition is planned before any file
  changes, so a refused open changes nothing. A torn tail of the newest segment is cut and
  reported (``recovery``, a warning on the ``engine.log.file`` logger); damage with an intact
  record after it, or in an older segment, is corruption: ``CorruptLog`` (run the verify
  tool; restore the file from a backup). Older segments are checked when first read. After a
  clean close the newest segment's positions come from its saved index (``engine.log.index``)
  when it verifies against the segment's bytes, instead of walking every frame.
* **Evidence** (``acknowledged``, the state's checkpoints): a partition that ends, or would
  be cut, below the offset it names lost acknowledged records: ``CorruptLog`` with
  ``fsync="always"`` (nothing is changed), else reported in ``lost`` (a power loss explains it).
* **One writer process.** ``path/LOCK`` is ``flock``'ed for the life of the object; a second
  ``FileLog`` on the same path, in any process, raises ``LogUnavailable`` at once.

Errors: ``LogUnavailable`` (locked, closed, fail-stopped, partition count mismatch, not
confirmed within ``timeout``), ``CorruptLog`` (damaged bytes or lost records; ``position`` is
a ``LogPosition`` when the offset is known, else ``None``; the message names partition,
segment file and byte position, or the expected and found end offsets), ``InvalidConfiguration``
(``acknowledged`` of the wrong length or with a negative offset; before any I/O).
"""

from __future__ import annotations

import bisect
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from engine.log import format as fmt
from engine.log import layout, meta
from engine.log.base import Log, LogCursor, Produced, Record
from engine.log.cursor import ConditionCursor
from engine.log.group_commit import FileLogStats, FsyncPolicy, GroupCommit
from engine.log.index import save_tail_index
from engine.log.recovery import NO_LOG, LostRecords, Plan, Recovery, RecoveryCut, Segment
from engine.log.segment import SegmentWriter, truncate_file
from schemas.errors import CorruptLog, InvalidConfiguration, LogUnavailable
from schemas.positions import LogPosition

__all__ = ["FileLog", "FileLogStats", "FsyncPolicy", "LostRecords", "RecoveryCut"]  # the last four: re-exported

logger = logging.getLogger(__name__)

DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
GATHER_S = 0.001
"""The longest a group commit (``fsync="always"``) waits to gather as many records as the group
before it had (see "Group commit" in ``engine.log.group_commit``; read at each group)."""
GATHER_MAX = 64
"""A group commit gathers at most this many records before it writes."""


def _evidence(acknowledged: Sequence[int] | None) -> list[int] | None:
    if acknowledged is None:
        return None
    offsets = list(acknowledged)
    if any(not isinstance(a, int) or isinstance(a, bool) or a < 0 for a in offsets):
        raise InvalidConfiguration(f"acknowledged offsets must be non-negative integers, got {offsets!r}; "
                                   "pass the state's checkpoints (the next offset to apply, per partition)")
    return offsets


class FileLog(GroupCommit, Log):
    """A partitioned append-only log in a directory. Thread-safe. See the module docstring."""

    def __init__(self, path: str | os.PathLike[str], partitions: int | None = 1, *,
                 fsync: FsyncPolicy = "always", fsync_interval_ms: int = 100,
                 segment_bytes: int = DEFAULT_SEGMENT_BYTES,
                 acknowledged: Sequence[int] | Callable[[], Sequence[int] | None] | None = None) -> None:
        """``partitions=None`` opens an existing log with its own count (a new one gets 1, or
        ``len(acknowledged)``).

        ``acknowledged``: evidence, per partition, of the offset below which records are known
        to have been acknowledged and applied (the state's checkpoints: the next offset to
        apply). Recovery then never accepts a partition ending below it: with
        ``fsync="always"`` it raises ``CorruptLog`` (partition, expected and found end
        offsets) and changes no file; otherwise (a power loss can take unsynced records) it
        opens and lists the shortfall in ``lost``. ``None``: no evidence (as before). A callable
        is called once this log holds its writer lock, before recovery changes any file: the
        engine opens its state there, so that of two engines on one directory the second meets
        the log's lock (``LogUnavailable``) first, as it always has.
        """
        deferred = acknowledged if callable(acknowledged) else None
        evidence = None if callable(acknowledged) else _evidence(acknowledged)
        if partitions is None:
            partitions = meta.stored_partitions(Path(path)) or (len(evidence) if evidence else 1)
        if evidence is not None and len(evidence) != partitions:
            raise InvalidConfiguration(
                f"acknowledged has {len(evidence)} offsets but the log has {partitions} partitions; pass "
                "one offset per partition (the state's checkpoints), or None for no evidence")
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
        self._acknowledged = evidence
        self._deferred = deferred
        self._created = False  # this open created (or completed the creation of) the log
        self._recovery = Recovery(self.path, partitions, evidence, strict=fsync == "always")

        self._lock = threading.Lock()
        self._arrival = threading.Condition(self._lock)  # cursors wait for visible records
        self._closed = False
        self._init_group_commit()
        self._stats = FileLogStats()
        self.recovery: list[RecoveryCut] = []
        """Torn tails cut on open."""
        self.lost: list[LostRecords] = []
        """Acknowledged records found missing on open (never with ``fsync="always"``: it raises)."""

        self._lock_fd = -1
        self._segments: list[list[Segment]] = []
        self._bases: list[list[int]] = []
        self._writers: list[SegmentWriter] = []
        self._next: list[int] = []  # next offset to assign
        self._visible: list[int] = []  # end of what readers may see
        self._planned: list[tuple[int, int]] = []  # (tail segment base, size incl. pending)
        try:
            self._open()
        except BaseException:
            self._release_files()
            raise
        self._start_syncer()

    # ------------------------------------------------------------ open & recovery

    def _open(self) -> None:
        # Phase 0: a log the evidence says held records is not silently created anew.
        missing = layout.missing(self.path)
        existed = self.path.exists()
        if self._deferred is None:
            self._refuse_missing(missing)
        # Phase 1: take the writer lock (one process, one FileLog per path).
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(fmt.lock_path(self.path), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LogUnavailable(
                f"file log {self.path} is locked by another process (or another FileLog in this "
                "process); stop it or use another path") from None
        if self._deferred is not None:  # the evidence, now that no other writer can change the log
            self._take_evidence(self._deferred())
            try:
                self._refuse_missing(missing)
            except CorruptLog:
                if not existed:  # leave no trace of a log that was refused
                    fmt.lock_path(self.path).unlink()
                    self.path.rmdir()
                raise
        # Phase 2: the partition count, fixed at creation (creating, or completing, a new log).
        self._created = layout.open_or_create(self.path, self._partitions)
        # Phases 3-4, for every partition before any file is changed: list the segments, scan
        # the newest, decide its cut, compare its end with the evidence. Any refusal raises here.
        plans = [self._recovery.plan(p, created=self._created) for p in range(self._partitions)]
        # Phase 5: cut the torn tails; open the tails for appending (older segments are checked
        # on first read).
        for plan in plans:
            self._apply(plan)

    def _refuse_missing(self, missing: bool) -> None:
        if self._fsync == "always" and any(self._acknowledged or ()) and missing:
            for p in range(self._partitions):
                self._recovery.shortfall(p, 0, NO_LOG)

    def _take_evidence(self, acknowledged: Sequence[int] | None) -> None:
        evidence = _evidence(acknowledged)
        if evidence is not None and len(evidence) != self._partitions:
            evidence = None  # from a state of another partition count: the engine refuses that state itself
        self._acknowledged = evidence
        self._recovery = Recovery(self.path, self._partitions, evidence, strict=self._fsync == "always")

    def _apply(self, plan: Plan) -> None:
        """Carry out a plan: cut the torn tail (reported), record a loss, open the tail."""
        p, tail, cut = plan.partition, plan.segments[-1], plan.cut
        if cut is not None:
            truncate_file(tail.path, cut.file_position)
            tail.size = cut.file_position
            self.recovery.append(cut)
            self._stats.recovery_cuts += 1
            self._stats.bytes_dropped += cut.bytes_dropped
            logger.warning("file log %s: torn tail cut in partition %d segment %s at byte %d "
                           "(%d bytes dropped, next offset %d): %s", self.path, p,
                           cut.segment, cut.file_position, cut.bytes_dropped, cut.next_offset, cut.reason)
        if plan.lost is not None:
            self.lost.append(plan.lost)
            logger.warning("file log %s: partition %d lost acknowledged records %d..%d (%s; possible after "
                           "a power loss with fsync=%r): state derived from them must be rebuilt", self.path,
                           p, plan.lost.found_end, plan.lost.expected_end - 1, plan.lost.reason, self._fsync)
        tail.positions = plan.positions
        self._stats.tail_frames_scanned += plan.frames_scanned
        self._segments.append(plan.segments)
        self._bases.append([s.base for s in plan.segments])
        self._writers.append(SegmentWriter.open(tail.path, tail.base, size=tail.size, crc=plan.crc))
        end = tail.base + len(plan.positions)
        self._next.append(end)
        self._visible.append(end)
        self._planned.append((tail.base, tail.size))

    # ------------------------------------------------------------ append (engine.log.group_commit)

    @property
    def partitions(self) -> int:
        return self._partitions

    produce_may_block = False

    def produce(self, key: bytes, value: bytes, headers: Sequence[tuple[str, bytes]] = (),
                *, timeout: float = 30.0, lead: bool = False) -> Produced:
        """Queue the record and return its handle (its position is known now). Visible to
        readers once durable ("Visibility" above). ``lead=False`` never waits for I/O (the
        flusher writes it); ``lead=True`` writes and fsyncs the queue on this thread when no
        group commit is running (the hand-off to the flusher saved), else leaves it to the flusher
        (see "Group commit" in ``engine.log.group_commit``)."""
        return self._enqueue(key, value, headers, lead)[0]

    def append(self, key: bytes, value: bytes, headers: Sequence[tuple[str, bytes]] = (),
               *, timeout: float = 30.0) -> LogPosition:
        """Append durably ("Durability" in ``engine.log.group_commit``) and return the record's
        position."""
        deadline = time.monotonic() + timeout
        produced, ticket = self._enqueue(key, value, headers, True)
        with self._lock:
            while self._done < ticket:
                if self._failed is not None:
                    raise self._fail_stopped()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise LogUnavailable(f"append not confirmed within {timeout}s; its outcome is "
                                         "unknown (retrying the same record is safe for histlog events)")
                self._committed.wait(remaining)
        assert produced.position is not None  # Invariant: FileLog assigns positions on enqueue
        return produced.position

    def _gather_limits(self) -> tuple[float, int]:
        return GATHER_S, GATHER_MAX  # looked up now: a test may have changed them since the open

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
                positions = self._recovery.index_older(partition, seg, next_base)
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
            out.extend(self._recovery.records(partition, seg, data, offset, count, start_pos))
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
        """Finish in-flight appends, fsync (unless ``"never"``), save each partition's tail index
        (``engine.log.index``), release files and the lock."""
        if not self._finish_writes():
            return
        if self._fsync != "never" and self._failed is None:
            try:
                for w in self._writers:
                    w.sync()
            except OSError as exc:
                logger.error("file log %s: fsync on close failed: %r", self.path, exc)
        if self._failed is None:  # every record written is in the tails' positions: save them
            for p, segs in enumerate(self._segments):
                tail, writer = segs[-1], self._writers[p]
                assert tail.positions is not None  # Invariant: the tail is always indexed
                if writer.crc is not None and writer.base_offset == tail.base and writer.size == tail.size:
                    save_tail_index(self.path, p, tail.path, tail.base, tail.size, writer.crc, tail.positions)
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
