"""The projector runtime: consume the log in order, decide, project, checkpoint, wake writers.

One thread per engine consumes every partition through a cursor. For each step (the records
one ``poll`` returned) it applies admission, the read projections and the new checkpoints in
**one RocksDB WriteBatch**; only after that write returns does it publish the applied offsets
and the decisions, and wake every writer waiting on those positions. A waiter checks the
applied offset under the same lock the projector publishes under, so no wake-up is lost.

Poison records are decided as ``corrupt`` by admission: counted, quarantined, skipped; the
checkpoint moves past them, so they never cause a crash loop. A failure of the state store
itself stops the projector (``failure``): waiters are woken and get the error.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Protocol

from projections import keys
from projections.admission import Decision, Known, admit
from projections.store import StateStore
from schemas.batch import Batch
from schemas.positions import LogPosition

__all__ = ["CORE", "CursorLike", "Projector", "RecordLike", "checkpoints"]

log = logging.getLogger("histlog.projector")

CORE = "core"  # the checkpoint name of admission + the built-in read projections
_RECENT_DECISIONS = 16384
_POLL_TIMEOUT = 0.5
_MAX_RECORDS = 2000


class RecordLike(Protocol):
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes: ...
    @property
    def value(self) -> bytes: ...


class CursorLike(Protocol):
    def poll(self, timeout: float, max_records: int = ...) -> Sequence[RecordLike]: ...
    def wakeup(self) -> None: ...
    def close(self) -> None: ...


def checkpoints(store: StateStore, partitions: int, name: str = CORE) -> list[int]:
    """The next offset to apply, per partition, of the named checkpoint (0 when new)."""
    out = []
    for p in range(partitions):
        raw = store.get(keys.checkpoint_key(name, p))
        out.append(keys.read_u64(raw) if raw else 0)
    return out


class Projector:
    """Applies log records to a ``StateStore``; thread-safe to wait on and to read stats from."""

    def __init__(self, store: StateStore, partitions: int) -> None:
        self.store = store
        self.partitions = partitions
        self._cond = threading.Condition()
        # Writers waiting on one position each: (offset, event) heaps per partition, so a step
        # wakes exactly the writers it decided instead of every waiting thread.
        self._waiters: list[list[tuple[int, int, threading.Event]]] = [[] for _ in range(partitions)]
        self._waiter_seq = 0
        self._applied = checkpoints(store, partitions)
        self._stats = keys.Stats.decode(store.get(keys.STATS_KEY))
        self._decisions: OrderedDict[tuple[int, int], Decision] = OrderedDict()
        self._thread: threading.Thread | None = None
        self._cursor: CursorLike | None = None
        self._stopping = False
        self._known: Known = {}
        self.failure: BaseException | None = None
        self.poll_error: BaseException | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, open_cursor: Callable[[Mapping[int, int]], CursorLike]) -> None:
        """Open a cursor at the checkpoints and consume on a daemon thread until ``stop()``."""
        self._cursor = open_cursor(dict(enumerate(self.applied_offsets())))
        self._thread = threading.Thread(target=self._run, name="histlog-projector", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        cursor = self._cursor
        if cursor is not None:
            cursor.wakeup()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if cursor is not None:
            cursor.close()
            self._cursor = None

    def _run(self) -> None:
        cursor = self._cursor
        assert cursor is not None  # Invariant: start() sets the cursor before the thread runs.
        while not self._stopping:
            try:
                records = cursor.poll(_POLL_TIMEOUT, _MAX_RECORDS)
            except Exception as e:  # the log is unavailable: keep the error visible, retry
                if self.poll_error is None:
                    log.warning("projector cannot read the log (will retry): %s", e)
                self.poll_error = e
                with self._cond:
                    self._cond.wait(1.0)  # back-off before the next poll, not synchronisation
                continue
            self.poll_error = None
            if records:
                try:
                    self.apply(records)
                except BaseException as e:
                    log.exception("projector stopped: the state store failed")
                    with self._cond:
                        self.failure = e
                        self._cond.notify_all()
                        for heap in self._waiters:
                            for _, _, event in heap:
                                event.set()
                            heap.clear()
                    return

    # -- the step ----------------------------------------------------------------------------
    def apply(self, records: Sequence[RecordLike]) -> None:
        """Apply one step atomically and publish it. Records already applied are ignored."""
        tx = self.store.tx()
        stats = keys.Stats(**{f: getattr(self._stats, f) for f in keys.Stats.__slots__})
        applied = list(self._applied)
        decided: list[tuple[tuple[int, int], Decision]] = []
        for r in records:
            p, o = r.partition, r.offset
            if o < applied[p]:
                continue  # Invariant: replays after a seek never apply a record twice.
            decision, _event = admit(tx, stats, LogPosition(p, o), r.key, r.value, known=self._known)
            applied[p] = o + 1
            decided.append(((p, o), decision))
        if not decided:
            return
        for p in range(self.partitions):
            if applied[p] != self._applied[p]:
                tx.put(keys.checkpoint_key(CORE, p), keys.u64(applied[p]))
        tx.put(keys.STATS_KEY, stats.encode())
        tx.commit()
        with self._cond:
            self._applied = applied
            self._stats = stats
            recent = self._decisions
            for pos, decision in decided:
                recent[pos] = decision
            while len(recent) > _RECENT_DECISIONS:
                recent.popitem(last=False)
            for p, heap in enumerate(self._waiters):
                while heap and heap[0][0] < applied[p]:
                    heapq.heappop(heap)[2].set()
            self._cond.notify_all()

    # -- waiting and reading -----------------------------------------------------------------
    @contextlib.contextmanager
    def expecting(self, key: bytes, batch: Batch) -> Iterator[None]:
        """Tell the projector that this process is appending ``batch`` under ``key``: it is
        validated already, so its record is applied without parsing the bytes again (they are
        still compared with the batch's canonical bytes)."""
        entry = (key, batch.digest)
        self._known[entry] = batch
        try:
            yield
        finally:
            self._known.pop(entry, None)

    def applied_offsets(self) -> list[int]:
        with self._cond:
            return list(self._applied)

    def stats(self) -> keys.Stats:
        with self._cond:
            s = self._stats
            return keys.Stats(s.accepted, s.duplicates, s.conflicts, s.rejected_closed, s.corrupt)

    def wait_applied(self, position: LogPosition, timeout: float | None) -> bool:
        """Wait until ``position`` has been applied. False on timeout; raises if the projector failed."""
        p, o = position.partition, position.offset
        with self._cond:
            if self.failure is not None:
                raise self.failure
            if self._applied[p] > o:
                return True
            event = threading.Event()
            self._waiter_seq += 1
            heapq.heappush(self._waiters[p], (o, self._waiter_seq, event))
        ok = event.wait(timeout)
        if self.failure is not None:
            raise self.failure
        return ok

    def decision(self, position: LogPosition) -> Decision | None:
        """The decision for an applied position, if still remembered (recent ones are)."""
        with self._cond:
            return self._decisions.get((position.partition, position.offset))

    def wait_offsets(self, targets: Sequence[int], timeout: float | None) -> bool:
        """Wait until every partition has applied up to ``targets[p]`` (exclusive)."""
        with self._cond:
            ok = self._cond.wait_for(
                lambda: self.failure is not None or all(a >= t for a, t in zip(self._applied, targets, strict=True)),
                timeout)
            if self.failure is not None:
                raise self.failure
            return ok
