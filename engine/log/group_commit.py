"""``GroupCommit``: how ``FileLog`` writes. The queue of records produced but not yet written,
the one group commit at a time that writes (and fsyncs) it, led by an appender or by the flusher
thread, the interval fsync thread, and the fail-stop when a write or fsync raises.

A mixin of ``FileLog`` (``engine.log.file``), not an object it holds: the group commit, the
reads and the cursors share one lock and one set of offsets (``_next``, ``_visible``, the tail
segments), so they stay one object and each invariant is kept under that one lock. This module
holds what changes them when records are queued and written; ``engine.log.file`` opens (and
recovers), reads and closes, and holds the gather's limits (``GATHER_S``, ``GATHER_MAX``).

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
* **Visible once durable.** A group's records are published (``_publish``: ``_visible`` and the
  tails' positions advance, then ``_arrival`` is notified) only after its write+fsync has
  returned (``"interval"``/``"never"``: once written).
* **Fail-stop.** If a write or fsync raises, the fate of the records in flight is unknown:
  that append and every later one raise ``LogUnavailable`` until the log is closed and
  reopened (recovery then decides from the bytes on disk), and every produced record not yet
  visible gets that error on its handle at once (``Produced.error``). Nothing is retried.
"""

from __future__ import annotations

import logging
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from engine.log import format as fmt
from engine.log.base import Headers, Produced
from engine.log.recovery import Segment
from engine.log.segment import SegmentWriter, fsync_dir
from schemas.errors import LogUnavailable
from schemas.positions import LogPosition
from schemas.records import partition_for_key

__all__ = ["FileLogStats", "FsyncPolicy", "GroupCommit"]

logger = logging.getLogger("engine.log.file")  # the logger FileLog has always reported on

FsyncPolicy = Literal["always", "interval", "never"]
"""When a record is durable: fsynced with its group, fsynced every interval, or left to the OS
(see "Durability" above)."""


@dataclass(slots=True)
class FileLogStats:
    """Counters since open (``FileLog.stats()``): the group commit's, and the open's recovery.
    ``group_sizes`` maps records-per-write to how often it happened."""

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


class GroupCommit:
    """The group commit of ``FileLog`` (see the module docstring). Its state is guarded by
    ``FileLog``'s ``_lock``, but for what the one leader touches while it writes (``_write_batch``)."""

    # FileLog's, set before the first record is queued and shared with the reads under ``_lock``.
    path: Path
    _partitions: int
    _fsync: FsyncPolicy
    _interval: float  # seconds between the interval fsyncs ("interval")
    _segment_bytes: int
    _lock: threading.Lock
    _arrival: threading.Condition
    _closed: bool
    _stats: FileLogStats
    _segments: list[list[Segment]]
    _bases: list[list[int]]
    _writers: list[SegmentWriter]
    _next: list[int]  # next offset to assign
    _visible: list[int]  # end of what readers may see
    _planned: list[tuple[int, int]]  # (tail segment base, size incl. pending)

    def _gather_limits(self) -> tuple[float, int]:
        """How long a group commit may wait to gather records, and how many it gathers at most
        (``FileLog``: its module's ``GATHER_S`` and ``GATHER_MAX``, read at each group)."""
        raise NotImplementedError

    def _init_group_commit(self) -> None:
        """Nothing queued, nothing written yet (``_lock`` exists; nothing runs)."""
        self._committed = threading.Condition(self._lock)  # appenders wait for their fsync
        self._work = threading.Condition(self._lock)  # the flusher waits for queued records
        self._flusher: threading.Thread | None = None
        self._idle = False  # the flusher waits on ``_work`` (notify it)
        self._retire = False  # the flusher ends once nothing is queued (close)
        self._failed: BaseException | None = None
        self._flushing = False
        self._gather = threading.Condition(self._lock)  # a leader gathering records waits here
        self._gathering = 0  # while a leader gathers: how many queued records it waits for
        self._last_group = 1  # records in the last group commit
        self._writers_in_flight: Callable[[], int] | None = None  # expect_writers
        self._enqueued = 0  # tickets handed out
        self._done = 0  # tickets durable (by the policy)
        self._pending: list[_Pending] = []
        self._dirty: set[int] = set()  # partitions written but not fsynced ("interval")

    def _start_syncer(self) -> None:
        """Once the log is open: the interval fsync thread (``fsync="interval"`` only)."""
        self._stop = threading.Event()
        self._syncer: threading.Thread | None = None
        if self._fsync == "interval":
            self._syncer = threading.Thread(target=self._interval_loop, name="filelog-fsync", daemon=True)
            self._syncer.start()

    def _finish_writes(self) -> bool:
        """Close's first step (without the lock): no record is queued from now on; the flusher
        writes what is queued (or fail-stops on it) and ends, a gathering leader writes what it
        has, cursors wake; then the interval fsync thread ends. False if closed already."""
        with self._lock:
            if self._closed:
                return False
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
        return True

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
        if self._fsync != "always" or self._failed is not None or self._closed:
            return
        gather_s, gather_max = self._gather_limits()  # only here: no call per group without an fsync
        target = min(max(self._last_group, in_flight), gather_max)
        if len(self._pending) >= target:
            return
        self._flushing = True  # a group commit is running: enqueuers queue and leave it to this one
        self._gathering = target
        self._stats.gathers += 1
        deadline = time.monotonic() + gather_s
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
