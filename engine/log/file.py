"""``FileLog``: the embedded, durable, group-committed log in a directory. Long (≈690 lines)
because group commit, visibility, fail-stop and reads share one lock and one set of offsets:
split, one invariant would span modules. Creation and recovery policy are in ``layout.py`` and
``recovery.py``, ``meta.json`` in ``meta.py``, the waiting cursor in ``cursor.py``, the frame
format in ``format.py`` and ``segment.py``.

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
* **Group commit.** Records are queued under the lock with their offsets (``produce``); one
  group commit at a time writes and fsyncs everything queued so far. It is led by the enqueuing
  thread when that thread may block (``append``, ``produce(lead=True)``: a thread that waits for
  its record anyway) and no group commit runs; otherwise by the flusher thread (started on the
  first record), which takes what arrived during a group as the next one and sleeps only when
  nothing is queued: woken at most once per group, never once per record. After each group the
  readers (the projector's cursor) are woken once. With ``fsync="always"`` a group that would
  hold fewer records than are coming first *gathers* (PostgreSQL's ``commit_delay`` with
  ``commit_siblings``, bounded): its leader waits, the lock released, until as many records are
  queued as the previous group had or as writers are in flight (``expect_writers``: the engine's
  writes waiting for a decision), at most ``GATHER_MAX``, for at most ``GATHER_S`` (1 ms). A lone
  writer never waits. Without it, 64 writers on 2 busy cores could settle into groups of 3-7
  records per fsync (the first writer back leads at once, the others trickle in behind the
  interpreter lock), which costs every record its share of a group's fixed work; with it they
  stay at 25-45 (bench/bench_erasure.py, a new conversation per append). ``produce()`` never
  waits for I/O (an event loop may call it); ``append`` waits on a condition for the write that
  covers its record.
  Measured on the 2-core VM (context switches per durable engine append, all threads): the
  flusher alone took 19.6 at 1 writer (10.2 before: the hand-off to it and its interpreter-lock
  waits) and 6 at 16 writers (11); with the idle-time lead by the enqueuer, 9.8 and 6.2.
* **Visibility.** ``read``, ``end_offsets`` and cursors see a record once the write+fsync
  its append waited on has returned (with ``"interval"``/``"never"``: once written), so a
  reader never sees a record that could vanish in a kill -9 (or, with ``"always"``, a power loss).
* **Fail-stop.** If a write or fsync raises, the fate of the records in flight is unknown:
  that append and every later one raise ``LogUnavailable`` until the log is closed and
  reopened (recovery then decides from the bytes on disk), and every produced record not yet
  visible gets that error on its handle at once (``Produced.error``). Nothing is retried.
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
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from engine.log import format as fmt
from engine.log import layout, meta
from engine.log.base import Headers, Log, LogCursor, Produced, Record
from engine.log.cursor import ConditionCursor
from engine.log.index import save_tail_index
from engine.log.recovery import NO_LOG, LostRecords, Plan, Recovery, RecoveryCut, Segment
from engine.log.segment import SegmentWriter, fsync_dir, truncate_file
from schemas.errors import CorruptLog, InvalidConfiguration, LogUnavailable
from schemas.positions import LogPosition
from schemas.records import partition_for_key

__all__ = ["FileLog", "FileLogStats", "FsyncPolicy", "LostRecords", "RecoveryCut"]

logger = logging.getLogger(__name__)

FsyncPolicy = Literal["always", "interval", "never"]
DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
GATHER_S = 0.001
"""The longest a group commit (``fsync="always"``) waits to gather as many records as the group
before it had (see "Group commit" in the module docstring)."""
GATHER_MAX = 64
"""A group commit gathers at most this many records before it writes."""


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
    gathers: int = 0  # group commits that waited to gather records (GATHER_S)
    gathers_short: int = 0  # of those, the ones that ran out of time before the group was full
    tail_frames_scanned: int = 0  # frames of the newest segments walked on open (none from a saved index)

    def copy(self) -> FileLogStats:
        return FileLogStats(self.appends, self.writes, self.fsyncs, self.dir_fsyncs,
                            self.segments_created, self.max_group, dict(self.group_sizes),
                            self.recovery_cuts, self.bytes_dropped, self.gathers, self.gathers_short,
                            self.tail_frames_scanned)


@dataclass(slots=True)
class _Pending:
    partition: int
    segment_base: int
    position: int
    offset: int
    frame: bytes
    produced: Produced


def _evidence(acknowledged: Sequence[int] | None) -> list[int] | None:
    if acknowledged is None:
        return None
    offsets = list(acknowledged)
    if any(not isinstance(a, int) or isinstance(a, bool) or a < 0 for a in offsets):
        raise InvalidConfiguration(f"acknowledged offsets must be non-negative integers, got {offsets!r}; "
                                   "pass the state's checkpoints (the next offset to apply, per partition)")
    return offsets


class FileLog(Log):
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
        self._committed = threading.Condition(self._lock)  # appenders wait for their fsync
        self._work = threading.Condition(self._lock)  # the flusher waits for queued records
        self._flusher: threading.Thread | None = None
        self._idle = False  # the flusher waits on ``_work`` (notify it)
        self._retire = False  # the flusher ends once nothing is queued (close)
        self._arrival = threading.Condition(self._lock)  # cursors wait for visible records
        self._closed = False
        self._failed: BaseException | None = None
        self._flushing = False
        self._gather = threading.Condition(self._lock)  # a leader gathering records waits here
        self._gathering = 0  # while a leader gathers: how many queued records it waits for
        self._last_group = 1  # records in the last group commit
        self._writers_in_flight: Callable[[], int] | None = None  # expect_writers
        self._enqueued = 0  # tickets handed out
        self._done = 0  # tickets durable (by the policy)
        self._pending: list[_Pending] = []
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

    # ------------------------------------------------------------ append (group commit)

    @property
    def partitions(self) -> int:
        return self._partitions

    produce_may_block = False

    def produce(self, key: bytes, value: bytes, headers: Sequence[tuple[str, bytes]] = (),
                *, timeout: float = 30.0, lead: bool = False) -> Produced:
        """Queue the record and return its handle (its position is known now). Visible to
        readers once durable (see the module docstring). ``lead=False`` never waits for I/O (the
        flusher writes it); ``lead=True`` writes and fsyncs the queue on this thread when no
        group commit is running (the hand-off to the flusher saved), else leaves it to the flusher."""
        return self._enqueue(key, value, headers, lead)[0]

    def append(self, key: bytes, value: bytes, headers: Sequence[tuple[str, bytes]] = (),
               *, timeout: float = 30.0) -> LogPosition:
        """Append durably (see the module docstring) and return the record's position."""
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

    def _enqueue(self, key: bytes, value: bytes, headers: Sequence[tuple[str, bytes]],
                 lead: bool) -> tuple[Produced, int]:
        hdrs: Headers = tuple((str(name), bytes(hv)) for name, hv in headers)
        partition = partition_for_key(key, self._partitions)
        timestamp_ms = time.time_ns() // 1_000_000
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
            produced = Produced(partition, LogPosition(partition, offset))
            self._pending.append(_Pending(partition, base, size, offset, frame, produced))
            self._planned[partition] = (base, size + len(frame))
            self._next[partition] = offset + 1
            self._enqueued += 1
            self._stats.appends += 1
            seq = self._enqueued
            if self._flusher is None:
                self._flusher = threading.Thread(target=self._flush_loop, name="filelog-flush", daemon=True)
                self._flusher.start()
            if self._flushing:  # the running group commit hands what is queued to the flusher when it ends
                if self._gathering and len(self._pending) >= self._gathering:
                    self._gather.notify()  # the group its leader gathers is full
            elif lead and self._idle:
                self._settle_lost(self._lead())  # this thread leads: no hand-off
            else:
                self._wake_flusher()
            return produced, seq

    def _wake_flusher(self) -> None:
        if self._idle:
            self._idle = False  # one wake-up, however many records arrive before it runs
            self._work.notify()

    def _settle_lost(self, lost: list[_Pending]) -> None:
        """Fail-stopped: every record not written answers its error at once (lock held on entry
        and return; released while the handles' callbacks run)."""
        if not lost:
            return
        self._lock.release()
        try:
            for item in lost:
                item.produced.settle(error=self._fail_stopped())
        finally:
            self._lock.acquire()

    def _fail_stopped(self) -> LogUnavailable:
        err = LogUnavailable(f"file log {self.path} fail-stopped after an I/O error "
                             f"({self._failed!r}); close and reopen it to recover")
        err.__cause__ = self._failed
        err.retryable = False  # until the reopen: a retry on this open log cannot succeed
        return err

    def failure(self) -> LogUnavailable | None:
        return None if self._failed is None else self._fail_stopped()

    def _check_writable(self) -> None:
        if self._closed:
            raise LogUnavailable(f"file log {self.path} is closed; open it again")
        if self._failed is not None:
            raise self._fail_stopped()

    def _flush_loop(self) -> None:
        """The flusher: lead a group commit whenever records are queued (see the module)."""
        with self._lock:
            while True:
                while (not self._pending or self._flushing) and not self._retire:
                    self._idle = True
                    self._work.wait()
                    self._idle = False
                if self._flushing:  # retiring while a leading appender writes: wait for it
                    self._committed.wait()
                    continue
                if not self._pending:
                    return
                self._settle_lost(self._lead())

    def _lead(self) -> list[_Pending]:
        """Write (and fsync) everything queued; called and returns with the lock held. Returns
        the records whose fate is unknown when this fail-stops the log (else none)."""
        self._gather_group()
        batch, self._pending = self._pending, []
        if self._failed is not None:  # a background fsync failed meanwhile: write nothing more
            self._committed.notify_all()
            return batch
        self._flushing = True
        upto = self._enqueued
        self._lock.release()
        try:
            new_segments = self._write_batch(batch)
        except BaseException as exc:
            self._lock.acquire()
            self._failed = exc
            self._flushing = False
            logger.error("file log %s: write/fsync failed, fail-stopping: %r", self.path, exc)
            lost, self._pending = batch + self._pending, []
            self._committed.notify_all()
            self._arrival.notify_all()
            return lost
        self._lock.acquire()
        self._publish(batch, new_segments)
        self._last_group = len(batch)
        self._done = upto
        self._flushing = False
        self._stats.writes += 1
        self._stats.max_group = max(self._stats.max_group, len(batch))
        self._stats.group_sizes[len(batch)] = self._stats.group_sizes.get(len(batch), 0) + 1
        self._committed.notify_all()
        self._arrival.notify_all()
        if self._pending:
            self._wake_flusher()  # what arrived meanwhile is the next group (unless it runs it already)
        return []

    def expect_writers(self, count: Callable[[], int]) -> None:
        with self._lock:
            self._writers_in_flight = count

    def _gather_group(self) -> None:
        """With ``fsync="always"``, wait (at most ``GATHER_S``, the lock released meanwhile) until
        as many records are queued as the last group had, or as writers are in flight
        (``expect_writers``): see "Group commit" in the module docstring."""
        in_flight = self._writers_in_flight() if self._writers_in_flight is not None else 0
        target = min(max(self._last_group, in_flight), GATHER_MAX)
        if self._fsync != "always" or len(self._pending) >= target or self._failed is not None or self._closed:
            return
        self._flushing = True  # a group commit is running: enqueuers queue and leave it to this one
        self._gathering = target
        self._stats.gathers += 1
        deadline = time.monotonic() + GATHER_S
        while len(self._pending) < target and not self._closed:
            left = deadline - time.monotonic()
            if left <= 0:
                self._stats.gathers_short += 1
                break
            self._gather.wait(left)
        self._gathering = 0
        self._flushing = False  # never seen unlocked: _lead sets it again before it releases the lock

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
                segs.append(Segment(item.segment_base, fmt.segment_path(self.path, p, item.segment_base),
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
                if self._pending:
                    self._wake_flusher()  # records queued during this fsync

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
        with self._lock:
            if self._closed:
                return
            self._closed = True  # no record is queued from now on
            self._retire = True
            self._work.notify()
            self._gather.notify_all()  # a gathering leader writes what it has
            flusher = self._flusher
            self._arrival.notify_all()
        if flusher is not None:
            flusher.join()  # it drains the queue (or fail-stops on it) first
        if self._syncer is not None:
            self._stop.set()
            self._syncer.join()
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
