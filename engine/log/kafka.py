"""``KafkaLog``: the history log on an Apache Kafka topic (kafka-python 3.0.x). About 550 lines
on purpose: the producer face, the consumer faces and the one error translation they share stay
together, so no Kafka error is translated in two places.

* Settings (``engine.log.kafka_topic``): the bootstrap string is checked before any I/O
  (``InvalidConfiguration``). The topic is created when missing with ``retention.ms=-1``,
  ``retention.bytes=-1``, ``cleanup.policy=delete`` (and ``min.insync.replicas=2`` when the
  replication factor is 3 or more); an existing topic is **refused** when it would lose or compact
  history, or when its partition count differs from the requested one (the partitioner would
  change). Its ``max.message.bytes`` is the producer's ``max_request_size``; a larger record is
  refused before sending (``InvalidBatch``). Every client uses ``CLIENT_TUNING`` (reconnect
  backoff at most 1 s, metadata at most 10 s old), so a long-lived client resumes within about a
  second of a broker's return.
* Producer: ``acks="all"``, ``enable_idempotence=True`` (explicit: a conflicting setting would
  silently turn it off), a few ms of linger so concurrent appends share a request, no
  compression; the partition is ``partition_for_key(key, partitions)``, passed explicitly.
* Readers: consumers without a group (``group_id=None``, ``assign`` + ``seek``), no auto
  commit, ``auto_offset_reset="none"`` (a history reader never jumps silently), and the fetch
  settings of ``CONSUMER_TUNING``. The shared
  reader (``read``, ``end_offsets``) is replaced by a fresh consumer when an attempt fails
  retriably (a leader moved, a node restarted), within the request timeout.

Every kafka-python error is translated in one place, ``translate``: unreachable / timed out /
retriable → ``LogUnavailable`` (retry later; the same ``KafkaLog`` recovers by itself when the
broker is back), data gone → ``CorruptLog``, a record the broker refuses as too large →
``InvalidBatch`` (bad input, CLI exit 2), anything else that cannot succeed on retry →
``HistoryError``.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import kafka.errors as kerr
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.record.default_records import DefaultRecordBatchBuilder

from engine.log.base import Headers, Log, LogCursor, Produced, Record
from engine.log.kafka_topic import (
    CLIENT_TUNING,
    DEFAULT_MAX_RECORD_BYTES,
    REQUIRED_TOPIC_CONFIGS,
    check_topic_configs,
    ensure_topic,
    parse_bootstrap,
)
from schemas.errors import CorruptLog, HistoryError, InvalidBatch, InvalidConfiguration, LogUnavailable
from schemas.positions import LogPosition
from schemas.records import partition_for_key

__all__ = [
    "DEFAULT_MAX_RECORD_BYTES",
    "REQUIRED_TOPIC_CONFIGS",
    "KafkaCursor",
    "KafkaLog",
    "check_topic_configs",
    "parse_bootstrap",
    "translate",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

_POLL_SLICE_S = 0.05  # kafka-python's consumer has no wakeup(): poll in short slices instead
_SEND_BLOCK_MS = 2000  # longest a send() may block on metadata before we re-check the deadline
_MIN_ATTEMPT_S = 1.0  # the shortest slice of the request timeout one reader attempt gets
CONSUMER_TUNING: dict[str, Any] = {
    "fetch_min_bytes": 1,  # the broker answers a fetch as soon as one record is there ...
    "fetch_max_wait_ms": 200,  # ... so this bounds only the wait of an idle partition
    "max_poll_records": 1000,  # a default: the projector and ``read`` pass their own max_records
    "metrics_enabled": False,  # nobody reads them
}
"""The consumers' settings beyond ``CLIENT_TUNING``.

Measured (``bench kafka``'s decision wait, issue 15): the projector's polls return every record
there is (about 33 a poll at 64 writers, whose appends are at most 64 in flight), so neither a
larger ``max_poll_records`` nor a larger fetch changes a step; ``fetch_min_bytes`` 4-16 KiB with
2-3 ms of wait made fuller polls (63 records) but fewer appends/s in both rounds measured (the
writers wait for the fuller fetch). Client metrics cost ~15% of the CPU of a fetch round trip
(about 1,000 -> 870 µs, both threads, one record per fetch), paid by every step. What bounds the
engine at 64 writers is the CPU per append under one interpreter lock, not the fetch: see
bench/bench_kafka.py."""


def _retriable(exc: BaseException) -> bool:
    """True for a failure another attempt (with a fresh consumer) may not see: unreachable,
    timed out, stale metadata. Data gone, refusals and histlog's own errors are final."""
    if isinstance(exc, HistoryError):
        return False
    if isinstance(exc, kerr.KafkaError):
        return bool(exc.retriable)
    return isinstance(exc, OSError)


def translate(exc: BaseException, what: str, *, bootstrap: str, topic: str,
              timeout: float | None = None) -> HistoryError:
    """Map a kafka-python error to histlog's error tree (the only place that does)."""
    if isinstance(exc, HistoryError):
        return exc
    within = f" within {timeout:g} s" if timeout is not None else ""
    where = f"Kafka topic {topic!r} at {bootstrap}"
    if isinstance(exc, kerr.OffsetOutOfRangeError):
        return CorruptLog(
            f"{what}: offset out of range on {where} ({exc}); records the reader needs are gone "
            f"(retention or deletion). Rebuild from a topic with infinite retention.",
            reason="offset out of range")
    if isinstance(exc, kerr.MessageSizeTooLargeError | kerr.RecordListTooLargeError):
        return InvalidBatch(  # bad input: the same batch can never succeed on this topic
            f"{what}: the record is larger than {where} accepts ({exc}); raise the topic's "
            f"max.message.bytes (and the producer's max_request_size) or append smaller batches.")
    if isinstance(exc, kerr.TopicAuthorizationFailedError | kerr.ClusterAuthorizationFailedError):
        return LogUnavailable(f"{what}: not authorized on {where} ({exc}); grant this client access.")
    if isinstance(exc, kerr.UnknownTopicOrPartitionError):
        return LogUnavailable(
            f"{what}: {where} does not exist or has no leader right now ({exc}); "
            f"if it was deleted, history is gone: restore it; otherwise retry.")
    if isinstance(exc, kerr.KafkaTimeoutError | kerr.KafkaConnectionError | kerr.RequestTimedOutError):
        return LogUnavailable(
            f"{what}: no answer from {where}{within} ({exc}); is the broker running and "
            f"reachable? Retry later (resending the same batch is safe: append ids deduplicate).")
    if isinstance(exc, kerr.KafkaError) and exc.retriable:
        return LogUnavailable(
            f"{what}: {where} cannot take it now ({exc}); retry later (resending the same batch "
            f"is safe: append ids deduplicate).")
    if isinstance(exc, kerr.KafkaError):
        return LogUnavailable(f"{what}: {where} failed ({exc}); check the broker and retry.")
    if isinstance(exc, OSError):
        return LogUnavailable(f"{what}: cannot reach {where} ({exc}); check the address and retry.")
    return HistoryError(f"{what}: unexpected error from {where}: {exc!r}")


class KafkaLog(Log):
    """A ``Log`` on one Kafka topic. Thread-safe (the producer is; readers share a lock).

    Every argument is checked before any I/O (``InvalidConfiguration``: a malformed bootstrap
    string, an empty topic, a non-positive count or timeout).
    """

    def __init__(self, bootstrap: str, topic: str, *, partitions: int | None = 1,
                 replication_factor: int = 1, create: bool = True,
                 client_id: str = "histlog", request_timeout_s: float = 30.0,
                 linger_ms: int = 2, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> None:
        self._bootstrap = parse_bootstrap(bootstrap)
        if not isinstance(topic, str) or not topic:
            raise InvalidConfiguration(f"invalid Kafka topic {topic!r}: expected a non-empty topic name "
                                       "(--topic NAME or HISTLOG_TOPIC)")
        if partitions is not None and (not isinstance(partitions, int) or partitions < 1):
            raise InvalidConfiguration(f"invalid partitions={partitions!r}: expected an integer >= 1, "
                                       "or None to adopt the topic's count")
        if not isinstance(replication_factor, int) or replication_factor < 1:
            raise InvalidConfiguration(f"invalid replication_factor={replication_factor!r}: expected an "
                                       "integer >= 1 (at most the number of brokers)")
        if not isinstance(request_timeout_s, int | float) or not math.isfinite(request_timeout_s) \
                or request_timeout_s <= 0:
            raise InvalidConfiguration(f"invalid request_timeout_s={request_timeout_s!r}: expected a "
                                       "finite number of seconds > 0")
        if not isinstance(max_record_bytes, int) or max_record_bytes < 1024:
            raise InvalidConfiguration(f"invalid max_record_bytes={max_record_bytes!r}: expected an "
                                       "integer >= 1024 (the max.message.bytes of a topic histlog creates)")
        self._topic = topic
        self._client_id = client_id
        self._request_timeout_ms = max(1000, int(request_timeout_s * 1000))
        # One reader attempt gets a slice of the request timeout, so that a wedged consumer is
        # replaced by a fresh one within the same call (see _reading).
        self._attempt_s = max(2.0, self._request_timeout_ms / 1000 / 4)
        self._replication_factor = replication_factor
        self._max_record_bytes = max_record_bytes  # replaced by the topic's max.message.bytes
        self._closed = False
        self._lock = threading.Lock()  # guards the shared reader consumer and close()
        self._reader: Any = None
        self._producer: Any = None
        self._topic_id = ""
        self._partitions = self._ensure_topic(partitions, create)
        self._producer = self._call("connect the producer", lambda: KafkaProducer(
            bootstrap_servers=self._bootstrap,
            client_id=f"{client_id}-producer",
            acks="all",
            enable_idempotence=True,
            linger_ms=linger_ms,
            compression_type=None,
            max_in_flight_requests_per_connection=5,
            request_timeout_ms=self._request_timeout_ms,
            delivery_timeout_ms=max(120_000, self._request_timeout_ms + linger_ms + 1000),
            max_block_ms=_SEND_BLOCK_MS,
            max_request_size=self._max_record_bytes,
            bootstrap_timeout_ms=self._request_timeout_ms,
            allow_auto_create_topics=False,
            metrics_enabled=False,  # nobody reads them (as the consumers: CONSUMER_TUNING)
            **CLIENT_TUNING,
        ))
        # Load the topic's metadata now so that the first append does not block on it.
        try:
            self._call("load topic metadata", lambda: self._producer_partitions(self._request_timeout_ms))
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ helpers

    @property
    def topic(self) -> str:
        return self._topic

    @property
    def topic_id(self) -> str:
        """The topic's UUID: it changes when a topic is deleted and created again under the same name."""
        return self._topic_id

    @property
    def bootstrap(self) -> str:
        return self._bootstrap

    @property
    def partitions(self) -> int:
        return self._partitions

    @property
    def max_record_bytes(self) -> int:
        """The largest record (as the producer encodes it) this log sends: the topic's
        ``max.message.bytes``. A larger one is refused by ``append`` with ``InvalidBatch``."""
        return self._max_record_bytes

    def _call(self, what: str, fn: Callable[[], T], timeout: float | None = None) -> T:
        try:
            return fn()
        except Exception as exc:
            raise translate(exc, what, bootstrap=self._bootstrap, topic=self._topic,
                            timeout=timeout) from exc

    def _producer_partitions(self, wait_ms: int) -> None:
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            try:
                self._producer.partitions_for(self._topic)
                return
            except kerr.KafkaTimeoutError:
                if time.monotonic() >= deadline:
                    raise

    def _admin(self) -> Any:
        return KafkaAdminClient(bootstrap_servers=self._bootstrap, client_id=f"{self._client_id}-admin",
                                request_timeout_ms=self._request_timeout_ms,
                                bootstrap_timeout_ms=self._request_timeout_ms, **CLIENT_TUNING)

    def _ensure_topic(self, partitions: int | None, create: bool) -> int:
        admin = self._call("connect to Kafka (admin)", self._admin)
        try:
            info = self._call("check the topic", lambda: ensure_topic(
                admin, topic=self._topic, bootstrap=self._bootstrap, partitions=partitions,
                create=create, replication_factor=self._replication_factor,
                max_record_bytes=self._max_record_bytes, timeout_ms=self._request_timeout_ms))
        finally:
            try:
                admin.close()
            except Exception:  # pragma: no cover - best effort
                log.debug("admin close failed", exc_info=True)
        self._topic_id = info.topic_id
        self._max_record_bytes = info.max_message_bytes
        return info.partitions

    def _check_open(self) -> None:
        if self._closed:
            raise LogUnavailable(f"KafkaLog for topic {self._topic!r} is closed; open a new one.")

    def _new_consumer(self, role: str, bootstrap_timeout_ms: int | None = None) -> Any:
        return KafkaConsumer(
            bootstrap_servers=self._bootstrap,
            client_id=f"{self._client_id}-{role}",
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="none",
            request_timeout_ms=self._request_timeout_ms,
            bootstrap_timeout_ms=max(1000, bootstrap_timeout_ms or self._request_timeout_ms),
            max_partition_fetch_bytes=max(1024 * 1024, self._max_record_bytes),
            allow_auto_create_topics=False,
            **CLIENT_TUNING,
            **CONSUMER_TUNING,
        )

    def _tps(self) -> list[TopicPartition]:
        return [TopicPartition(self._topic, p) for p in range(self._partitions)]

    def _check_size(self, partition: int, key: bytes, value: bytes, headers: list[tuple[str, bytes]]) -> None:
        """Refuse, before sending, a record the topic would refuse (the producer would raise
        ``MessageSizeTooLargeError`` itself, untyped; the broker ``RecordTooLarge``)."""
        size = DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, headers)
        if size > self._max_record_bytes:
            raise InvalidBatch(
                f"append to partition {partition} of Kafka topic {self._topic!r} refused: the encoded "
                f"event is {size} bytes; this topic takes at most {self._max_record_bytes}; split the "
                f"batch into smaller appends (or raise the topic's max.message.bytes). Nothing was sent.")

    # ------------------------------------------------------------------ Log API

    def append(self, key: bytes, value: bytes, headers: Sequence[tuple[str, bytes]] = (),
               *, timeout: float = 30.0) -> LogPosition:
        deadline = time.monotonic() + timeout
        partition, future = self._send(key, value, headers, deadline, timeout)
        try:
            metadata = future.get(timeout=max(0.0, deadline - time.monotonic()))
        except Exception as exc:
            raise self._send_failed(exc, partition, timeout) from exc
        return LogPosition(int(metadata.partition), int(metadata.offset))

    def produce(self, key: bytes, value: bytes, headers: Sequence[tuple[str, bytes]] = (),
                *, timeout: float = 30.0, lead: bool = False) -> Produced:
        """``send`` the record and return its handle: settled from the send's future on the
        producer's I/O thread, with the position the broker acknowledged, or with the error
        ``append`` would raise (``_send_failed``). The send itself may block on metadata or a
        full buffer, up to ``timeout`` (``produce_may_block``)."""
        partition, future = self._send(key, value, headers, time.monotonic() + timeout, timeout)
        produced = Produced(partition)

        def acknowledged(metadata: Any) -> None:
            produced.settle(LogPosition(int(metadata.partition), int(metadata.offset)))

        def failed(exc: Exception) -> None:
            error = self._send_failed(exc, partition, None)
            error.__cause__ = exc
            produced.settle(error=error)

        future.add_callback(acknowledged)
        future.add_errback(failed)
        return produced

    def _send(self, key: bytes, value: bytes, headers: Sequence[tuple[str, bytes]], deadline: float,
              timeout: float) -> tuple[int, Any]:
        """Enqueue the record in the producer; the partition and the send's future."""
        self._check_open()
        partition = partition_for_key(key, self._partitions)
        hdrs = [(str(k), bytes(v)) for k, v in headers]
        self._check_size(partition, key, value, hdrs)
        try:
            while True:  # send() raises before enqueuing when metadata is missing: safe to retry
                try:
                    return partition, self._producer.send(self._topic, value=value, key=key, headers=hdrs,
                                                          partition=partition)
                except kerr.KafkaTimeoutError:
                    if time.monotonic() >= deadline:
                        raise
        except Exception as exc:
            raise self._send_failed(exc, partition, timeout) from exc

    def _send_failed(self, exc: Exception, partition: int, timeout: float | None) -> HistoryError:
        """The typed error of a send that failed or was not acknowledged (one home for both faces)."""
        if self._closed:
            return LogUnavailable(f"KafkaLog for topic {self._topic!r} was closed during an append; "
                                  f"the record may or may not be written: resend it.")
        return translate(exc, f"append to partition {partition}", bootstrap=self._bootstrap,
                         topic=self._topic, timeout=timeout)

    def _reading(self, what: str, fn: Callable[[Any, float], T]) -> T:
        """Run ``fn(reader, attempt_seconds)`` on the shared reader consumer, bounded by the
        request timeout, and recover from a reader that no longer gets answers.

        A consumer whose leader was killed and restarted can keep asking it (kafka-python 3.0.x
        retries ``ListOffsets`` on ``NotLeaderForPartition`` with its cached metadata and stayed
        stuck for minutes, while a fresh process read at once). So one attempt gets a slice of the
        request timeout; after a retriable failure the reader is closed and a fresh consumer
        (bootstrap, new metadata, new connections) retries, until the request timeout. Final
        errors (data gone, refusals) are raised at once. All under the reader lock.
        """
        budget = self._request_timeout_ms / 1000
        deadline = time.monotonic() + budget
        with self._lock:
            attempt = 0
            while True:
                self._check_open()
                attempt += 1
                remaining = deadline - time.monotonic()
                try:
                    if self._reader is None:
                        self._reader = self._new_consumer("reader", int(remaining * 1000))
                    return fn(self._reader, max(_MIN_ATTEMPT_S, min(remaining, self._attempt_s)))
                except Exception as exc:
                    if not _retriable(exc) or deadline - time.monotonic() < _MIN_ATTEMPT_S:
                        raise translate(exc, what, bootstrap=self._bootstrap, topic=self._topic,
                                        timeout=budget) from exc
                    log.info("%s: attempt %d failed (%s); reconnecting the reader", what, attempt, exc)
                    self._discard_reader()

    def _discard_reader(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            try:
                reader.close()
            except Exception:  # pragma: no cover - best effort
                log.debug("closing the Kafka reader failed", exc_info=True)

    def read(self, partition: int, from_offset: int, max_records: int = 1000) -> list[Record]:
        self._check_open()
        if not 0 <= partition < self._partitions:
            raise ValueError(f"partition {partition} out of range 0..{self._partitions - 1}")
        if max_records <= 0:
            return []
        tp = TopicPartition(self._topic, partition)
        start = max(from_offset, 0)

        def fetch(reader: Any, attempt_s: float) -> list[Record]:
            timeout_ms = int(attempt_s * 1000)
            deadline = time.monotonic() + attempt_s
            end = int(reader.end_offsets([tp], timeout_ms=timeout_ms)[tp])
            if start >= end:
                return []
            reader.assign([tp])
            reader.seek(tp, start)
            out: list[Record] = []
            while len(out) < max_records:
                if time.monotonic() >= deadline:
                    if out:
                        break  # a short read is fine: the caller continues from the last offset + 1
                    raise kerr.KafkaTimeoutError(
                        f"no record of partition {partition} (offsets {start}..{end - 1}) within {attempt_s:g} s")
                batch = reader.poll(timeout_ms=100, max_records=max_records - len(out))
                for recs in batch.values():
                    out.extend(_record(r) for r in recs)
                if out and out[-1].offset + 1 >= end:
                    break
                if reader.position(tp, timeout_ms=timeout_ms) >= end:
                    break
            return out

        return self._reading(f"read partition {partition} from offset {from_offset}", fetch)

    def end_offsets(self) -> list[int]:
        self._check_open()
        tps = self._tps()
        ends = self._reading("read end offsets",
                             lambda reader, attempt_s: reader.end_offsets(tps, timeout_ms=int(attempt_s * 1000)))
        return [int(ends[tp]) for tp in tps]

    def cursor(self, start: Mapping[int, int]) -> KafkaCursor:
        self._check_open()
        for p in start:
            if not 0 <= p < self._partitions:
                raise ValueError(f"partition {p} out of range 0..{self._partitions - 1}")
        consumer = self._call("open a cursor", lambda: self._new_consumer("cursor"))
        return KafkaCursor(self, consumer, {p: int(start.get(p, 0)) for p in range(self._partitions)})

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            reader, self._reader = self._reader, None
        producer = self._producer
        for client, what in ((producer, "producer"), (reader, "reader")):
            if client is None:
                continue
            try:
                client.close(timeout=5) if what == "producer" else client.close()
            except Exception:  # pragma: no cover - best effort on the way out
                log.debug("closing the Kafka %s failed", what, exc_info=True)

    def __repr__(self) -> str:
        return (f"KafkaLog(bootstrap={self._bootstrap!r}, topic={self._topic!r}, "
                f"partitions={self._partitions})")


def _record(r: Any) -> Record:
    headers: Headers = tuple((str(k), bytes(v) if v is not None else b"") for k, v in (r.headers or ()))
    return Record(partition=int(r.partition), offset=int(r.offset), timestamp_ms=int(r.timestamp),
                  key=bytes(r.key) if r.key is not None else b"",
                  value=bytes(r.value) if r.value is not None else b"",
                  headers=headers)


class KafkaCursor(LogCursor):
    """All partitions of the topic, manually assigned (no group), positioned per partition.

    Not thread-safe except ``wakeup()``: kafka-python's consumer has no wakeup, so ``poll`` waits
    in short slices and checks a flag that ``wakeup()`` sets.
    """

    def __init__(self, owner: KafkaLog, consumer: Any, start: Mapping[int, int]) -> None:
        self._owner = owner
        self._consumer = consumer
        self._woken = threading.Event()
        self._closed = False
        self._assigned = True
        tps = owner._tps()
        self._owner._call("assign the cursor", lambda: self._assign(tps, start))

    def _assign(self, tps: Iterable[TopicPartition], start: Mapping[int, int]) -> None:
        tps = list(tps)
        self._consumer.assign(tps)
        for tp in tps:
            self._consumer.seek(tp, max(0, int(start.get(tp.partition, 0))))

    def poll(self, timeout: float, max_records: int = 1000) -> list[Record]:
        if self._closed:
            raise LogUnavailable("the Kafka cursor is closed; open a new one with log.cursor(...)")
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            if self._woken.is_set():
                self._woken.clear()
                return []
            if not self._assigned:  # a consumer with no partition cannot poll: wait for a wakeup
                if self._woken.wait(max(0.0, deadline - time.monotonic())):
                    continue
                return []
            remaining = deadline - time.monotonic()
            slice_ms = int(max(0.0, min(_POLL_SLICE_S, remaining)) * 1000)
            batch = self._owner._call(
                "poll the log", functools.partial(self._consumer.poll, timeout_ms=slice_ms,
                                                  max_records=max_records))
            if batch:
                out: list[Record] = []
                for tp in sorted(batch, key=lambda t: t.partition):
                    out.extend(_record(r) for r in batch[tp])
                return out
            if remaining <= 0:
                return []

    def seek(self, partition: int, offset: int) -> None:
        if not 0 <= partition < self._owner.partitions:
            raise ValueError(f"partition {partition} out of range 0..{self._owner.partitions - 1}")
        tp = TopicPartition(self._owner.topic, partition)
        self._owner._call("seek the cursor", lambda: self._consumer.seek(tp, max(0, int(offset))))

    def assign(self, start: Mapping[int, int]) -> None:
        for p in start:
            if not 0 <= p < self._owner.partitions:
                raise ValueError(f"partition {p} out of range 0..{self._owner.partitions - 1}")
        tps = [TopicPartition(self._owner.topic, p) for p in sorted(start)]
        self._owner._call("assign the cursor", lambda: self._assign(tps, start))
        self._assigned = bool(tps)

    def wakeup(self) -> None:
        self._woken.set()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._consumer.close()
        except Exception:  # pragma: no cover - best effort
            log.debug("closing the Kafka cursor failed", exc_info=True)
