"""``KafkaLog``: the history log on an Apache Kafka topic (kafka-python 3.0.x).

* Topic: created when missing with ``retention.ms=-1``, ``retention.bytes=-1``,
  ``cleanup.policy=delete`` (and ``min.insync.replicas=2`` when the replication factor is 3 or
  more). An existing topic is checked and **refused** when it would lose or compact history, or
  when its partition count differs from the requested one (the partitioner would change).
* Producer: ``acks="all"``, ``enable_idempotence=True`` (explicit: a conflicting setting would
  silently turn it off), a few ms of linger so concurrent appends share a request, no
  compression; the partition is ``partition_for_key(key, partitions)``, passed explicitly.
* Readers: consumers without a group (``group_id=None``, ``assign`` + ``seek``), no auto
  commit, ``auto_offset_reset="none"`` (a history reader never jumps silently).

Every kafka-python error is translated in one place, ``_translate``: unreachable / timed out /
retriable → ``LogUnavailable`` (retry later; the same ``KafkaLog`` recovers by itself when the
broker is back), data gone → ``CorruptLog``, anything else that cannot succeed on retry →
``HistoryError``.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import kafka.errors as kerr
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType

from engine.log.base import Headers, Log, LogCursor, Record, partition_for_key
from schemas.errors import CorruptLog, HistoryError, LogUnavailable
from schemas.positions import LogPosition

__all__ = [
    "DEFAULT_MAX_RECORD_BYTES",
    "REQUIRED_TOPIC_CONFIGS",
    "KafkaCursor",
    "KafkaLog",
    "check_topic_configs",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Topic settings histlog creates a topic with: history is kept forever and never compacted.
REQUIRED_TOPIC_CONFIGS: dict[str, str] = {
    "retention.ms": "-1",
    "retention.bytes": "-1",
    "cleanup.policy": "delete",
}

_POLL_SLICE_S = 0.05  # kafka-python's consumer has no wakeup(): poll in short slices instead
_SEND_BLOCK_MS = 2000  # longest a send() may block on metadata before we re-check the deadline
#: ``max.message.bytes`` of topics histlog creates (Kafka's default, ~1 MiB, is too small for a
#: batch with media); the producer's ``max_request_size`` follows the topic's actual value.
DEFAULT_MAX_RECORD_BYTES = 8 * 1024 * 1024


def _alter_hint(bootstrap: str, topic: str, setting: str) -> str:
    return (f"kafka-configs.sh --bootstrap-server {bootstrap} --alter --entity-type topics "
            f"--entity-name {topic} --add-config {setting}")


def check_topic_configs(topic: str, configs: Mapping[str, str], bootstrap: str = "HOST:PORT") -> None:
    """Refuse topic settings that would make replay lie (lost or compacted history).

    ``configs`` maps setting names to their effective values (``describe_configs(...,
    config_filter="all")``). Raises ``HistoryError`` naming the setting and the fix.
    """
    problems: list[str] = []
    for name in ("retention.ms", "retention.bytes"):
        value = configs.get(name)
        if value is None:
            continue
        try:
            finite = int(value) >= 0
        except ValueError:
            finite = True
        if finite:
            problems.append(
                f"{name}={value} deletes old history (histlog needs {name}=-1, kept forever); "
                f"fix: {_alter_hint(bootstrap, topic, f'{name}=-1')}")
    policy = configs.get("cleanup.policy")
    if policy is not None and "compact" in {p.strip() for p in policy.split(",")}:
        problems.append(
            f"cleanup.policy={policy} compacts history (keeps only the last record per key; "
            f"histlog needs cleanup.policy=delete with infinite retention); "
            f"fix: {_alter_hint(bootstrap, topic, 'cleanup.policy=delete')}")
    if problems:
        raise HistoryError(f"refusing Kafka topic {topic!r}: " + "; ".join(problems)
                           + ". A log that loses or compacts records cannot be replayed.")


def _translate(exc: BaseException, what: str, *, bootstrap: str, topic: str,
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
        return HistoryError(
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
    """A ``Log`` on one Kafka topic. Thread-safe (the producer is; readers share a lock)."""

    def __init__(self, bootstrap: str, topic: str, *, partitions: int | None = 1,
                 replication_factor: int = 1, create: bool = True,
                 client_id: str = "histlog", request_timeout_s: float = 30.0,
                 linger_ms: int = 2, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> None:
        if not topic:
            raise ValueError("topic must be a non-empty Kafka topic name")
        if partitions is not None and partitions < 1:
            raise ValueError(f"partitions must be >= 1, got {partitions}")
        if replication_factor < 1:
            raise ValueError(f"replication_factor must be >= 1, got {replication_factor}")
        self._bootstrap = bootstrap
        self._topic = topic
        self._client_id = client_id
        self._request_timeout_ms = max(1000, int(request_timeout_s * 1000))
        self._replication_factor = replication_factor
        self._max_record_bytes = max_record_bytes  # replaced by the topic's max.message.bytes
        self._closed = False
        self._lock = threading.Lock()  # guards the shared reader consumer and close()
        self._reader: Any = None
        self._producer: Any = None
        self._topic_id = ""
        self._partitions = self._ensure_topic(partitions, create)
        self._producer = self._call("connect the producer", lambda: KafkaProducer(
            bootstrap_servers=bootstrap,
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

    def _call(self, what: str, fn: Callable[[], T], timeout: float | None = None) -> T:
        try:
            return fn()
        except Exception as exc:
            raise _translate(exc, what, bootstrap=self._bootstrap, topic=self._topic,
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
                                bootstrap_timeout_ms=self._request_timeout_ms)

    def _ensure_topic(self, partitions: int | None, create: bool) -> int:
        admin = self._call("connect to Kafka (admin)", self._admin)
        try:
            return self._call("check the topic", lambda: self._check_or_create(admin, partitions, create))
        finally:
            try:
                admin.close()
            except Exception:  # pragma: no cover - best effort
                log.debug("admin close failed", exc_info=True)

    def _describe_partitions(self, admin: Any) -> int | None:
        [info] = admin.describe_topics([self._topic])
        code = info.get("error_code", 0)
        if code == kerr.UnknownTopicOrPartitionError.errno:
            return None
        if code:
            raise kerr.for_code(code)(f"describe topic {self._topic}")
        self._topic_id = str(info.get("topic_id") or "")
        return len(info["partitions"])

    def _visible_after_creation(self, admin: Any) -> int:
        """The new topic's partition count, once the broker answering describe knows it: in a
        cluster, brokers learn a new topic from the controller a moment after it is created."""
        deadline = time.monotonic() + self._request_timeout_ms / 1000
        pause = 0.05
        while True:
            actual = self._describe_partitions(admin)
            if actual is not None:
                return actual
            if time.monotonic() >= deadline:
                raise kerr.UnknownTopicOrPartitionError(f"topic {self._topic} not visible after creation")
            time.sleep(pause)  # back-off between metadata requests, bounded by the deadline
            pause = min(pause * 2, 1.0)

    def _check_or_create(self, admin: Any, partitions: int | None, create: bool) -> int:
        actual = self._describe_partitions(admin)
        if actual is None:
            if not create:
                raise HistoryError(
                    f"Kafka topic {self._topic!r} does not exist at {self._bootstrap} and create=False; "
                    f"create it with {self._creation_hint(partitions or 1)} or pass create=True.")
            wanted = partitions or 1
            configs = dict(REQUIRED_TOPIC_CONFIGS)
            configs["max.message.bytes"] = str(self._max_record_bytes)
            if self._replication_factor >= 3:
                configs["min.insync.replicas"] = "2"
            try:
                admin.create_topics({self._topic: {"num_partitions": wanted,
                                                   "replication_factor": self._replication_factor,
                                                   "configs": configs}},
                                    timeout_ms=self._request_timeout_ms, wait_for_metadata=True)
                log.info("created Kafka topic %s (%d partitions, RF %d)", self._topic, wanted,
                         self._replication_factor)
            except kerr.TopicAlreadyExistsError:
                pass  # another instance won the race: check it like any existing topic
            except kerr.InvalidReplicationFactorError as exc:
                raise HistoryError(
                    f"cannot create Kafka topic {self._topic!r} with replication factor "
                    f"{self._replication_factor}: {exc}; the cluster has fewer brokers, "
                    f"lower replication_factor or add brokers.") from exc
            actual = self._visible_after_creation(admin)
        if partitions is not None and actual != partitions:
            raise HistoryError(
                f"Kafka topic {self._topic!r} has {actual} partitions but {partitions} were requested; "
                f"histlog places each conversation by murmur2(conversation id) % partitions, so a "
                f"different count would move conversations and break their order. Open it with "
                f"partitions={actual}, or use a new topic (partitions cannot be changed in place).")
        result = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, self._topic)],
                                        config_filter="all")
        entries = result.get("topic", {}).get(self._topic, {})
        configs_now = {name: str(entry.get("value")) for name, entry in entries.items()
                       if entry.get("value") is not None}
        check_topic_configs(self._topic, configs_now, self._bootstrap)
        try:
            self._max_record_bytes = int(configs_now.get("max.message.bytes", self._max_record_bytes))
        except ValueError:
            pass
        return actual

    def _creation_hint(self, partitions: int) -> str:
        extra = " --config min.insync.replicas=2" if self._replication_factor >= 3 else ""
        return (f"kafka-topics.sh --bootstrap-server {self._bootstrap} --create --topic {self._topic} "
                f"--partitions {partitions} --replication-factor {self._replication_factor} "
                f"--config retention.ms=-1 --config retention.bytes=-1 --config cleanup.policy=delete"
                + extra)

    def _check_open(self) -> None:
        if self._closed:
            raise LogUnavailable(f"KafkaLog for topic {self._topic!r} is closed; open a new one.")

    def _new_consumer(self, role: str) -> Any:
        return KafkaConsumer(
            bootstrap_servers=self._bootstrap,
            client_id=f"{self._client_id}-{role}",
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="none",
            request_timeout_ms=self._request_timeout_ms,
            bootstrap_timeout_ms=self._request_timeout_ms,
            fetch_max_wait_ms=200,
            max_partition_fetch_bytes=max(1024 * 1024, self._max_record_bytes),
            max_poll_records=1000,
            allow_auto_create_topics=False,
        )

    def _tps(self) -> list[TopicPartition]:
        return [TopicPartition(self._topic, p) for p in range(self._partitions)]

    # ------------------------------------------------------------------ Log API

    def append(self, key: bytes, value: bytes, headers: Sequence[tuple[str, bytes]] = (),
               *, timeout: float = 30.0) -> LogPosition:
        self._check_open()
        partition = partition_for_key(key, self._partitions)
        hdrs = [(str(k), bytes(v)) for k, v in headers]
        deadline = time.monotonic() + timeout
        what = f"append to partition {partition}"
        try:
            while True:  # send() raises before enqueuing when metadata is missing: safe to retry
                try:
                    future = self._producer.send(self._topic, value=value, key=key, headers=hdrs,
                                                 partition=partition)
                    break
                except kerr.KafkaTimeoutError:
                    if time.monotonic() >= deadline:
                        raise
            remaining = max(0.0, deadline - time.monotonic())
            metadata = future.get(timeout=remaining)
        except Exception as exc:
            if self._closed:
                raise LogUnavailable(f"KafkaLog for topic {self._topic!r} was closed during an append; "
                                     f"the record may or may not be written: resend it.") from exc
            raise _translate(exc, what, bootstrap=self._bootstrap, topic=self._topic,
                             timeout=timeout) from exc
        return LogPosition(int(metadata.partition), int(metadata.offset))

    def read(self, partition: int, from_offset: int, max_records: int = 1000) -> list[Record]:
        self._check_open()
        if not 0 <= partition < self._partitions:
            raise ValueError(f"partition {partition} out of range 0..{self._partitions - 1}")
        if max_records <= 0:
            return []
        tp = TopicPartition(self._topic, partition)
        with self._lock:
            self._check_open()
            reader = self._get_reader()
            timeout_ms = self._request_timeout_ms

            def fetch() -> list[Record]:
                end = int(reader.end_offsets([tp], timeout_ms=timeout_ms)[tp])
                start = max(from_offset, 0)
                if start >= end:
                    return []
                reader.assign([tp])
                reader.seek(tp, start)
                out: list[Record] = []
                deadline = time.monotonic() + timeout_ms / 1000
                while len(out) < max_records and time.monotonic() < deadline:
                    batch = reader.poll(timeout_ms=100, max_records=max_records - len(out))
                    for recs in batch.values():
                        out.extend(_record(r) for r in recs)
                    if out and out[-1].offset + 1 >= end:
                        break
                    if reader.position(tp, timeout_ms=timeout_ms) >= end:
                        break
                return out

            return self._call(f"read partition {partition} from offset {from_offset}", fetch,
                              timeout=timeout_ms / 1000)

    def end_offsets(self) -> list[int]:
        self._check_open()
        with self._lock:
            self._check_open()
            reader = self._get_reader()
            tps = self._tps()
            ends = self._call("read end offsets",
                              lambda: reader.end_offsets(tps, timeout_ms=self._request_timeout_ms),
                              timeout=self._request_timeout_ms / 1000)
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

    def _get_reader(self) -> Any:
        if self._reader is None:
            self._reader = self._call("connect a reader", lambda: self._new_consumer("reader"))
        return self._reader

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
