"""The log contract every backend implements (``FileLog``, ``KafkaLog``, ``MemoryLog``).

A log is partitioned and append-only. Promises, checked by ``tests/conformance/log_contract.py``:

* ``append`` returns only once the record is durable by the backend's policy (FileLog with
  ``fsync="always"``: on disk; Kafka: acknowledged by all in-sync replicas). The returned
  ``LogPosition`` is where the record is and will stay.
* ``produce`` hands a record to the log without waiting for it: it returns a ``Produced``
  handle at once (after at most ``timeout`` seconds for backends whose enqueue can block:
  ``produce_may_block``). The record is durable when a reader sees it (FileLog makes a record
  visible only once its write+fsync returned; Kafka's readers see only acknowledged records),
  so a writer that waits for its record to be read (histlog's decision) waits once. The handle
  says where the record is (FileLog: known at once; Kafka: once acknowledged) and answers
  ``error`` at once when the write fail-stops or is not acknowledged. ``append`` is ``produce``
  plus the wait for durability.
* Offsets in a partition are dense from 0 for FileLog/MemoryLog; Kafka's may have gaps
  (transaction markers), so readers always continue from ``record.offset + 1``.
* Records of one partition are read back in offset order, byte-identical (key, value, headers).
* The partition of a record is ``partition_for_key(key, partitions)``: Kafka's murmur2 of the
  conversation-id part of the key (the bytes before the first ``0x1F``), so every event of a
  conversation lands in one partition and a producer in any language can compute it. The key
  and the partitioner are wire contracts: they live in ``schemas.records`` (re-exported here).
* ``end_offsets()[p]`` is the offset the next record of partition ``p`` will get (for
  Kafka: the high watermark).
* Errors: a backend that cannot take or serve records raises ``LogUnavailable``; a damaged
  record raises ``CorruptLog`` naming its position (or is reported as poison by readers).
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from schemas.errors import LogUnavailable
from schemas.positions import LogPosition
from schemas.records import KEY_SEPARATOR, partition_for_key, record_key

__all__ = ["KEY_SEPARATOR", "Headers", "Log", "LogCursor", "Produced", "Record", "partition_for_key",
           "record_key"]

Headers = tuple[tuple[str, bytes], ...]


@dataclass(frozen=True, slots=True)
class Record:
    """One record as read back from a log."""

    partition: int
    offset: int
    timestamp_ms: int
    key: bytes
    value: bytes
    headers: Headers = ()

    @property
    def position(self) -> LogPosition:
        return LogPosition(self.partition, self.offset)


class Produced:
    """A record handed to a log by ``Log.produce``: where it is, once known, or why it may not be.

    ``position`` is set at once by a log that assigns it on enqueue (FileLog, MemoryLog) and by
    the acknowledgement otherwise (Kafka, on the client's I/O thread). ``error`` (a
    ``HistoryError``, the one a blocking ``append`` would raise) is set when the write
    fail-stopped or was not acknowledged: the record's fate is then unknown. A handle is
    *settled* once the log has said its last word on it (an acknowledgement or an error);
    a FileLog record that was written says nothing (its durability shows as its visibility).

    ``notify(fn)`` calls ``fn(handle)`` once, when it settles (at once, on the calling thread,
    if it has): on the thread that settles it (Kafka's I/O thread, FileLog's flusher), so
    ``fn`` must be short and must not block.
    """

    __slots__ = ("_error", "_lock", "_position", "_settled", "_watchers", "partition")

    def __init__(self, partition: int, position: LogPosition | None = None) -> None:
        self.partition = partition
        self._position = position
        self._error: Exception | None = None
        self._settled = False
        self._watchers: list[Callable[[Produced], object]] = []
        self._lock = threading.Lock()

    @property
    def position(self) -> LogPosition | None:
        return self._position

    @property
    def error(self) -> Exception | None:
        return self._error

    def notify(self, fn: Callable[[Produced], object]) -> None:
        with self._lock:
            if not self._settled:
                self._watchers.append(fn)
                return
        fn(self)

    def settle(self, position: LogPosition | None = None, error: Exception | None = None) -> None:
        """The log's last word (the log calls this): acknowledged at ``position``, or ``error``.
        Only the first call counts."""
        with self._lock:
            if self._settled:
                return
            self._settled = True
            if error is not None:
                self._error = error
            elif position is not None:
                self._position = position
            watchers, self._watchers = self._watchers, []
        for fn in watchers:
            fn(self)


class LogCursor(abc.ABC):
    """A reader over all partitions of a log (or those ``assign`` names), positioned per partition.

    Not thread-safe: one thread owns a cursor (the projector). ``poll`` returns the next
    records after each partition's position, in offset order per partition, and advances
    past them; it waits up to ``timeout`` seconds when nothing is available and then returns
    ``[]``. ``wakeup()`` may be called from any thread to end a waiting ``poll`` early.
    """

    @abc.abstractmethod
    def poll(self, timeout: float, max_records: int = 1000) -> list[Record]: ...

    @abc.abstractmethod
    def seek(self, partition: int, offset: int) -> None: ...

    @abc.abstractmethod
    def assign(self, start: Mapping[int, int]) -> None:
        """Read exactly the partitions of ``start`` from now on, each from ``start[p]`` (a
        partition left out is no longer read; one kept is positioned again). On the thread
        that polls (a Kafka consumer is not thread-safe)."""

    @abc.abstractmethod
    def wakeup(self) -> None: ...

    @abc.abstractmethod
    def close(self) -> None: ...


class Log(abc.ABC):
    """A partitioned, append-only log. Thread-safe: many threads may append at once."""

    @property
    @abc.abstractmethod
    def partitions(self) -> int: ...

    produce_may_block: bool = True
    """Whether ``produce`` may block its caller on I/O (Kafka: metadata, a full buffer), so that
    an event loop must call it from a thread. False for FileLog and MemoryLog."""

    @abc.abstractmethod
    def append(self, key: bytes, value: bytes, headers: Sequence[tuple[str, bytes]] = (),
               *, timeout: float = 30.0) -> LogPosition:
        """Append one record durably and return its position (partition from ``key``).

        Raises ``LogUnavailable`` when the backend cannot take it within ``timeout``.
        """

    @abc.abstractmethod
    def produce(self, key: bytes, value: bytes, headers: Sequence[tuple[str, bytes]] = (),
                *, timeout: float = 30.0, lead: bool = False) -> Produced:
        """Hand one record to the log and return its handle without waiting for durability (see
        the module). Raises before enqueuing what ``append`` would refuse at once (a closed or
        fail-stopped log, a record too large); ``timeout`` bounds only an enqueue that can block.
        ``lead=True``: the caller's thread may do the write itself (a thread that waits for the
        record anyway; never an event loop): FileLog then leads the group commit when none runs.
        """

    def expect_writers(self, count: Callable[[], int]) -> None:
        """A hint for the group commit: ``count()`` is how many writers have a record in flight
        (produced, or about to be, and not yet answered); called under the log's lock, so it must
        be cheap and take no lock. FileLog gathers that many records into a group commit (see
        its "Group commit"); other logs ignore it."""
        return None

    @abc.abstractmethod
    def read(self, partition: int, from_offset: int, max_records: int = 1000) -> list[Record]:
        """Records of ``partition`` at offsets ``>= from_offset``, at most ``max_records``; never waits long."""

    @abc.abstractmethod
    def end_offsets(self) -> list[int]:
        """Per partition, the offset the next appended record will get."""

    @abc.abstractmethod
    def cursor(self, start: Mapping[int, int]) -> LogCursor:
        """A cursor positioned at ``start[p]`` for every partition (0 where missing)."""

    def last_records(self, n: int) -> list[Record]:
        """The newest ``n`` records of the whole log by record time (ties: partition, offset),
        oldest first: at most ``n`` records read per partition, so O(n x partitions)."""
        records: list[Record] = []
        for partition, end in enumerate(self.end_offsets()):
            offset = max(end - n, 0)
            while offset < end:
                chunk = self.read(partition, offset, max_records=min(n, 1000))
                if not chunk:
                    break
                records.extend(chunk)
                offset = chunk[-1].offset + 1
        records.sort(key=lambda r: (r.timestamp_ms, r.partition, r.offset))
        return records[-n:] if n > 0 else []

    def failure(self) -> LogUnavailable | None:
        """The error every later append gets because this log fail-stopped (FileLog after a failed
        write or fsync: only a reopen recovers it), or None. A backend whose errors pass by
        themselves (a broker that comes back) never fail-stops."""
        return None

    @abc.abstractmethod
    def close(self) -> None:
        """Release files / connections. Idempotent."""

    def __enter__(self) -> Log:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
