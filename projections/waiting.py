"""Waiting for applied positions: the readers' half of ``projections.runtime.Projector`` (its
module says what is promised).

A position of a partition is *applied* once the step that applied it is committed **and** every
clear at or before it in that partition is erased: a clear's compaction runs beside later steps
(``projections.eraser``), so its own writer and any reader waiting past it (``wait_applied``,
``wait_offsets``: another instance's ``at_least``, ``catch_up``) see the conversation forgotten,
files included, as when the erasure ran inside the step, while writers of other conversations
are decided meanwhile (they wait on their tickets, not on positions). ``applied_offsets`` is the
projector's own progress: what its next step resumes from, erasures still running or not.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, TypeAlias

from schemas.errors import NotOwner, StateUnavailable
from schemas.positions import LogPosition

__all__ = ["Positions", "Wake"]

Wake: TypeAlias = Callable[[], None]
"""Called once, on the projector's thread and under its lock, when a waited-for position is
applied, or the projector fails, or the partition is revoked: it must only hand off (set an
event, ``call_soon_threadsafe``), never block or take the lock."""


class Positions:
    """Applied offsets and their waiters, under ``_cond`` (see the module)."""

    partitions: int
    failure: BaseException | None
    _cond: threading.Condition
    _owned: frozenset[int]
    _applying: frozenset[int]
    _applied: list[int]
    _waiters: list[list[tuple[int, int, Wake]]]  # (offset, seq, wake) heaps per partition
    _waiter_seq: int
    _erasing: list[dict[int, int]]  # per partition: eraser job -> the offset of its first clear there

    if TYPE_CHECKING:  # the projector's (``Ownership`` and ``Projector``)
        def _not_owner(self, partition: int) -> NotOwner: ...
        def _failed_now(self) -> StateUnavailable: ...

    def _visible(self, p: int) -> int:
        """Under ``_cond``: the offset partition ``p`` is applied up to (exclusive)."""
        held = self._erasing[p]
        return min(self._applied[p], *held.values()) if held else self._applied[p]

    def _wake_locked(self) -> None:
        """Under ``_cond``: wake the waiters of every position now applied."""
        for p, heap in enumerate(self._waiters):
            visible = self._visible(p)
            while heap and heap[0][0] < visible:
                heapq.heappop(heap)[2]()
        self._cond.notify_all()

    def _hold_locked(self, job: int, positions: Iterable[LogPosition]) -> None:
        """Under ``_cond``: the clears at ``positions`` are erased by eraser job ``job``; until
        ``_release`` no position at or after them is applied."""
        for position in positions:
            held = self._erasing[position.partition]
            held[job] = min(held.get(job, position.offset), position.offset)

    def _release(self, job: int) -> None:
        with self._cond:
            for held in self._erasing:
                held.pop(job, None)
            self._wake_locked()

    def applied_offsets(self) -> list[int]:
        """The next offset each partition's step applies (see the module)."""
        with self._cond:
            return list(self._applied)

    def wait_applied(self, position: LogPosition, timeout: float | None) -> bool:
        """Wait until ``position`` has been applied. False on timeout; raises if the projector failed."""
        event = threading.Event()
        cancel = self.when_applied(position, event.set)
        if cancel is None:
            return True
        if not event.wait(timeout):
            cancel()
        self.after_wait(position)
        return event.is_set()

    def when_applied(self, position: LogPosition, wake: Wake) -> Callable[[], None] | None:
        """``None`` when ``position`` is applied already; else call ``wake`` once (see ``Wake``)
        when it is, or the projector fails, or its partition is revoked (``after_wait`` then tells
        which), and return the waiter's cancel: a waiter that gives up (a timeout) calls it, so
        nothing is left behind for a position that never comes. Raises as ``wait_applied`` does.
        The thread face waits on an event, the asyncio face on a future: neither holds a thread."""
        p, o = position.partition, position.offset
        with self._cond:
            if self.failure is not None:
                raise self._failed_now()
            if p not in self._owned:
                raise self._not_owner(p)
            if self._visible(p) > o:
                return None
            self._waiter_seq += 1
            entry = (o, self._waiter_seq, wake)
            heapq.heappush(self._waiters[p], entry)

        def cancel() -> None:
            with self._cond:
                heap = self._waiters[p]
                if entry in heap:  # not woken (nor cleared) meanwhile
                    heap.remove(entry)
                    heapq.heapify(heap)
        return cancel

    def after_wait(self, position: LogPosition) -> None:
        """Raise what ended a wait for ``position`` other than its being applied: the projector's
        failure, or the partition revoked meanwhile."""
        if self.failure is not None:
            raise self._failed_now()
        with self._cond:
            if position.partition not in self._owned:  # revoked while waiting
                raise self._not_owner(position.partition)

    def wait_offsets(self, targets: Sequence[int], timeout: float | None, *, standbys: bool = False) -> bool:
        """Wait until every owned partition (and standby, with ``standbys``) has applied up to
        ``targets[p]`` (exclusive); one revoked (or removed) meanwhile is no longer waited for."""
        def done() -> bool:
            waited = self._applying if standbys else self._owned
            return self.failure is not None or all(
                t <= 0 or p not in waited or self._visible(p) >= t for p, t in enumerate(targets))

        with self._cond:
            ok = self._cond.wait_for(done, timeout)
            if self.failure is not None:
                raise self._failed_now()
            return ok
