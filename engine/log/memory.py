"""``MemoryLog``: the log contract in memory, for fast tests.

Same partitioning (``partition_for_key``), dense offsets from 0, byte-identical reads, a
cursor that blocks on a ``threading.Condition`` notified by appends (never a sleep loop).
Nothing survives ``close()`` or the process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence

from engine.log.base import Headers, Log, LogCursor, Produced, Record
from engine.log.cursor import ConditionCursor
from schemas.errors import LogUnavailable
from schemas.positions import LogPosition
from schemas.records import partition_for_key

__all__ = ["MemoryLog"]


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

    produce_may_block = False

    def append(self, key: bytes, value: bytes, headers: Sequence[tuple[str, bytes]] = (),
               *, timeout: float = 30.0) -> LogPosition:
        position = self.produce(key, value, headers).position
        assert position is not None  # Invariant: a memory record's position is known when stored
        return position

    def produce(self, key: bytes, value: bytes, headers: Sequence[tuple[str, bytes]] = (),
                *, timeout: float = 30.0, lead: bool = False) -> Produced:
        """Store the record (it is "durable" at once) and return its settled handle."""
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
        produced = Produced(partition, record.position)
        produced.settle(record.position)
        return produced

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
