"""``MemoryLog``: the log contract in memory, for fast tests; and the waiting cursor it shares
with ``FileLog``.

Same partitioning (``partition_for_key``), dense offsets from 0, byte-identical reads, a
cursor that blocks on a ``threading.Condition`` notified by appends (never a sleep loop).
Nothing survives ``close()`` or the process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Protocol

from engine.log.base import Headers, Log, LogCursor, Record, partition_for_key
from schemas.errors import LogUnavailable
from schemas.positions import LogPosition

__all__ = ["ConditionCursor", "CursorSource", "MemoryLog"]


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
                if any(self._positions[p] < self._source.visible_end_locked(p)
                       for p in range(len(self._positions))):
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                cond.wait(remaining)

    def _read_available(self, max_records: int) -> list[Record]:
        n = len(self._positions)
        order = [(self._next_first + i) % n for i in range(n)]
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

    def wakeup(self) -> None:
        cond = self._source.arrival
        with cond:
            self._woken = True
            cond.notify_all()

    def close(self) -> None:
        self._closed = True


class MemoryLog(Log):
    """An in-memory ``Log``: appends are "durable" once stored in the process."""

    def __init__(self, partitions: int = 1) -> None:
        if partitions < 1:
            raise ValueError(f"partitions must be >= 1, got {partitions}")
        self._partitions = partitions
        self._records: list[list[Record]] = [[] for _ in range(partitions)]
        self._lock = threading.Lock()
        self._arrival = threading.Condition(self._lock)
        self._closed = False

    @property
    def partitions(self) -> int:
        return self._partitions

    @property
    def arrival(self) -> threading.Condition:
        return self._arrival

    def visible_end_locked(self, partition: int) -> int:
        return len(self._records[partition])

    def is_closed_locked(self) -> bool:
        return self._closed

    def append(self, key: bytes, value: bytes, headers: Sequence[tuple[str, bytes]] = (),
               *, timeout: float = 30.0) -> LogPosition:
        hdrs: Headers = tuple((str(name), bytes(hv)) for name, hv in headers)
        partition = partition_for_key(key, self._partitions)
        with self._lock:
            if self._closed:
                raise LogUnavailable("append to a closed MemoryLog; open a new log")
            records = self._records[partition]
            record = Record(partition, len(records), time.time_ns() // 1_000_000,
                            bytes(key), bytes(value), hdrs)
            records.append(record)
            self._arrival.notify_all()
        return record.position

    def read(self, partition: int, from_offset: int, max_records: int = 1000) -> list[Record]:
        if not 0 <= partition < self._partitions:
            raise ValueError(f"partition {partition} does not exist (the log has {self._partitions})")
        start = max(0, from_offset)
        with self._lock:
            if self._closed:
                raise LogUnavailable("read from a closed MemoryLog")
            return self._records[partition][start:start + max(0, max_records)]

    def end_offsets(self) -> list[int]:
        with self._lock:
            return [len(r) for r in self._records]

    def cursor(self, start: Mapping[int, int]) -> LogCursor:
        return ConditionCursor(self, start)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._arrival.notify_all()
