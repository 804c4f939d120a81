"""``ConditionCursor``: the waiting cursor of the in-process logs (``FileLog``, ``MemoryLog``).

It reads through the log's own ``read`` and waits on a ``threading.Condition`` the log notifies
when records become visible or the log closes (never a sleep loop). Its own module because two
backends share it and neither owns the other.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Protocol

from engine.log.base import LogCursor, Record
from schemas.errors import LogUnavailable

__all__ = ["ConditionCursor", "CursorSource"]


class CursorSource(Protocol):
    """What ``ConditionCursor`` needs from an in-process log.

    ``arrival`` is notified (``notify_all``, its lock held) whenever records become visible
    and when the log closes; ``visible_end_locked`` and ``is_closed_locked`` are called with
    that lock held.
    """

    @property
    def partitions(self) -> int: ...

    @property
    def arrival(self) -> threading.Condition: ...

    def visible_end_locked(self, partition: int) -> int: ...

    def is_closed_locked(self) -> bool: ...

    def read(self, partition: int, from_offset: int, max_records: int = 1000) -> list[Record]: ...


class ConditionCursor(LogCursor):
    """A ``LogCursor`` over a ``CursorSource``: reads round robin, waits on ``arrival``.

    ``poll`` returns as soon as any partition has records past the cursor (at most
    ``max_records``, spread over partitions in turn so a busy partition cannot starve the
    others), else waits until an append makes some visible, ``wakeup()`` is called, the log
    closes, or ``timeout`` passes; then it returns ``[]``. A ``wakeup()`` that arrives when
    no poll is waiting ends the next wait at once. ``poll`` after ``close()`` of the cursor,
    and a poll when (or while) the log closes, raises ``LogUnavailable``.
    """

    def __init__(self, source: CursorSource, start: Mapping[int, int]) -> None:
        self._source = source
        n = source.partitions
        self._positions = [max(0, int(start.get(p, 0))) for p in range(n)]
        self._read = list(range(n))  # the partitions polled (``assign``)
        self._next_first = 0
        self._woken = False
        self._closed = False

    def poll(self, timeout: float, max_records: int = 1000) -> list[Record]:
        if self._closed:
            raise LogUnavailable("poll on a closed cursor; open a new cursor")
        deadline = time.monotonic() + max(0.0, timeout)
        cond = self._source.arrival
        while True:
            records = self._read_available(max(1, max_records))
            if records:
                return records
            with cond:
                if self._woken:
                    self._woken = False
                    return []
                if self._source.is_closed_locked():
                    return []
                if any(self._positions[p] < self._source.visible_end_locked(p) for p in self._read):
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                cond.wait(remaining)

    def _read_available(self, max_records: int) -> list[Record]:
        n = len(self._read)
        if not n:
            return []
        order = [self._read[(self._next_first + i) % n] for i in range(n)]
        self._next_first = (self._next_first + 1) % n
        share = max(1, -(-max_records // n))
        out: list[Record] = []
        for rounds in range(2):  # a fair share each, then fill what is left
            for p in order:
                budget = max_records - len(out) if rounds else min(share, max_records - len(out))
                if budget <= 0:
                    return out
                got = self._source.read(p, self._positions[p], budget)
                if got:
                    self._positions[p] = got[-1].offset + 1
                    out.extend(got)
        return out

    def seek(self, partition: int, offset: int) -> None:
        if not 0 <= partition < len(self._positions):
            raise ValueError(f"partition {partition} does not exist (the log has {len(self._positions)})")
        self._positions[partition] = max(0, offset)

    def assign(self, start: Mapping[int, int]) -> None:
        for p in start:
            if not 0 <= p < len(self._positions):
                raise ValueError(f"partition {p} does not exist (the log has {len(self._positions)})")
        for p, offset in start.items():
            self._positions[p] = max(0, int(offset))
        self._read = sorted(start)
        self._next_first = 0

    def wakeup(self) -> None:
        cond = self._source.arrival
        with cond:
            self._woken = True
            cond.notify_all()

    def close(self) -> None:
        self._closed = True
