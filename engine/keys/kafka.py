"""The Kafka key store: the compacted one-partition topic ``<topic>.keys`` (contract: ``base``;
topic settings: ``kafka_topic``; record format: ``record``).

Record key ``conversation id 0x1F key id``; value a key record, or for the *erasure marker* the
key ``conversation id 0x1F`` (empty key id) and a marker record; a *spare* key
(``engine.keys.pool``) has an empty conversation id (record key ``0x1F key id``); a destroyed key
is a tombstone (value null) under its record key, so compaction drops it.

``create`` answers from memory: a conversation's own key (a key record under its id: what
releases before spares wrote, still used for its conversation), else its binding in this
process's ``SparePool``, whose refill produces ``BATCH`` spare records at once (``acks=all``,
idempotent producer) and hands none out before every one is acknowledged. ``get`` of an unknown
key catches up to the end offset before answering ``KeyErased`` / ``KeyStoreDamaged`` (a spare
another instance made is in the topic before any record sealed under it). ``destroy(c, key_ids)``
produces the marker, reads it back, then tombstones every key record of ``c`` and every live
spare among ``key_ids`` and its binding.

Rules every instance applies to the partition in offset order (so all agree), for conversations'
own key records: the key is the first one that is not tombstoned and precedes the marker; one
after the marker is void (a creator racing an erasure): never used, tombstoned by any instance
opening the store. Each instance holds the live keys in memory (loaded at open by reading the
topic from its start). Thread-safe (one lock around the clients); broker errors are
``LogUnavailable``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition

from engine.keys.kafka_topic import DEFAULT_MAX_COMPACTION_LAG_MS, ensure_keys_topic
from engine.keys.master import MasterKey
from engine.keys.pool import SparePool
from engine.keys.record import decode_record, encode_record, record_key, split_record_key
from engine.log.kafka import translate  # the one kafka-python -> histlog error table
from engine.log.kafka_topic import CLIENT_TUNING
from schemas.errors import KeyErased, KeyStoreDamaged, LogUnavailable
from schemas.sealed import DataKey

__all__ = ["KafkaKeyStore"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class KafkaKeyStore:
    """A ``KeyStore`` on the Kafka topic ``topic`` (conventionally ``<event topic>.keys``)."""

    def __init__(self, bootstrap: str, topic: str, *, master: MasterKey | None = None, create: bool = True,
                 replication_factor: int = 1, max_compaction_lag_ms: int = DEFAULT_MAX_COMPACTION_LAG_MS,
                 timeout_ms: int = 30_000, client_id: str = "histlog-keys") -> None:
        self._bootstrap, self._topic, self._master = bootstrap, topic, master
        self._timeout_ms = timeout_ms
        self._tp = TopicPartition(topic, 0)
        self._lock = threading.RLock()
        self._keys: dict[str, list[DataKey]] = {}
        self._records: dict[str, set[str]] = {}  # every key id with a live record, winners or not
        self._markers: set[str] = set()
        self._spares: dict[str, DataKey] = {}  # every live spare in the topic, by key id
        self._pool = SparePool(self._make_spares, name=topic)
        self._producer: Any = None
        self._consumer: Any = None
        admin = self._call("connect to Kafka (admin)", lambda: KafkaAdminClient(
            bootstrap_servers=bootstrap, client_id=f"{client_id}-admin", request_timeout_ms=timeout_ms,
            bootstrap_timeout_ms=timeout_ms, **CLIENT_TUNING))
        try:
            self._call("check the keys topic", lambda: ensure_keys_topic(
                admin, topic=topic, bootstrap=bootstrap, create=create, replication_factor=replication_factor,
                max_compaction_lag_ms=max_compaction_lag_ms, timeout_ms=timeout_ms))
        finally:
            admin.close()
        try:
            self._producer = self._call("connect the keys producer", lambda: KafkaProducer(
                bootstrap_servers=bootstrap, client_id=f"{client_id}-producer", acks="all", enable_idempotence=True,
                linger_ms=0, request_timeout_ms=timeout_ms, delivery_timeout_ms=timeout_ms + 1000,
                max_block_ms=timeout_ms, allow_auto_create_topics=False, **CLIENT_TUNING))
            self._consumer = self._call("connect the keys consumer", lambda: KafkaConsumer(
                bootstrap_servers=bootstrap, client_id=f"{client_id}-reader", group_id=None,
                enable_auto_commit=False, auto_offset_reset="earliest", request_timeout_ms=timeout_ms,
                bootstrap_timeout_ms=timeout_ms, fetch_max_wait_ms=100, allow_auto_create_topics=False,
                **CLIENT_TUNING))
            self._consumer.assign([self._tp])
            self._consumer.seek_to_beginning(self._tp)
            with self._lock:
                self._catch_up()
                self._repair()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ plumbing

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except (KeyErased, KeyStoreDamaged):
            raise
        except Exception as exc:
            raise translate(exc, what, bootstrap=self._bootstrap, topic=self._topic,
                            timeout=self._timeout_ms / 1000) from exc

    def _apply(self, raw_key: bytes | None, value: bytes | None, offset: int) -> None:
        try:
            conv, key_id = split_record_key(raw_key or b"")
        except (ValueError, UnicodeDecodeError):
            raise KeyStoreDamaged(f"the record at {self._topic}@{offset} has no histlog key-store record key "
                                  "(conversation id 0x1F key id): something else writes to the keys topic",
                                  where=f"{self._topic}@{offset}") from None
        if not conv:  # a spare key, or its tombstone
            if value is None:
                self._spares.pop(key_id, None)
            else:
                spare = decode_record(value, self._master, where=f"{self._topic}@{offset}").key
                if spare is None or spare.key_id != key_id:
                    raise KeyStoreDamaged(f"the spare key record at {self._topic}@{offset} does not hold the key "
                                          "its record key names", where=f"{self._topic}@{offset}")
                self._spares[key_id] = spare
            return
        if value is None:  # a tombstone: a destroyed key, or a void one tidied up
            self._records.get(conv, set()).discard(key_id)
            if conv in self._keys:
                self._keys[conv] = [k for k in self._keys[conv] if k.key_id != key_id]
            return
        record = decode_record(value, self._master, where=f"{self._topic}@{offset}")
        if record.key is None:
            self._markers.add(conv)
            self._keys.pop(conv, None)  # destroyed from here on, whatever the tombstones' progress
            return
        self._records.setdefault(conv, set()).add(key_id)
        if conv not in self._markers:
            self._keys.setdefault(conv, []).append(record.key)

    def _catch_up(self, until: int | None = None) -> None:
        """Apply records until the consumer's position reaches ``until`` (default: the end offset).

        ``LogUnavailable`` when the position stops moving for ``timeout_ms``, never for the time a
        long read takes: an open reads every live key (about 20 us a record here, so 30 s
        reached about 1.4 million keys, a store of that many conversations, which then never
        opened)."""
        end = until if until is not None else self._call(
            "read the keys topic's end", lambda: self._consumer.end_offsets([self._tp])[self._tp])
        stall = self._timeout_ms / 1000
        seen, since = -1, time.monotonic()
        while (at := self._call("read the keys topic", lambda: self._consumer.position(self._tp))) < end:
            now = time.monotonic()
            if at != seen:
                seen, since = at, now
            elif now - since > stall:
                raise LogUnavailable(f"reading the Kafka keys topic {self._topic!r} made no progress for {stall:g} s "
                                     f"(at offset {at}, reading up to {end}); is the broker up? Retry later.")
            polled = self._call("read the keys topic", lambda: self._consumer.poll(timeout_ms=200))
            for records in polled.values():
                for r in records:
                    self._apply(r.key, r.value, r.offset)

    def _send(self, conv: str, key_id: str, value: bytes | None) -> int:
        future = self._call("write the keys topic", lambda: self._producer.send(
            self._topic, key=record_key(conv, key_id), value=value, partition=0))
        return int(self._call("write the keys topic", lambda: future.get(timeout=self._timeout_ms / 1000)).offset)

    def _send_all(self, records: Sequence[tuple[str, str, bytes | None]]) -> int | None:
        """Send ``(conv, key_id, value)`` records at once, wait for all; the last one's offset (None: none)."""
        if not records:
            return None
        futures = self._call("write the keys topic", lambda: [self._producer.send(
            self._topic, key=record_key(c, k), value=v, partition=0) for c, k, v in records])
        done = self._call("write the keys topic", lambda: [f.get(timeout=self._timeout_ms / 1000) for f in futures])
        return max(int(d.offset) for d in done)

    def _tombstone(self, conv: str, key_ids: set[str]) -> None:
        self._send_all([(conv, key_id, None) for key_id in sorted(key_ids)])

    def _repair(self) -> None:
        """Tombstone key records of erased conversations that a crashed destroyer or creator left."""
        for conv in sorted(self._markers):
            left = self._records.get(conv)
            if left:
                log.warning("keys topic %s: tombstoning %d key(s) of erased %r left by an interrupted destroy",
                            self._topic, len(left), conv)
                self._tombstone(conv, set(left))
        self._catch_up()

    # ------------------------------------------------------------------ contract

    def _make_spares(self, n: int) -> list[DataKey]:
        """The pool's refill: ``n`` spare records sent at once, returned once all are acknowledged."""
        made = DataKey.generate_many(n)

        def send() -> list[Any]:
            return [self._producer.send(self._topic, key=record_key("", key.key_id),
                                        value=encode_record("", key, self._master), partition=0) for key in made]

        futures = self._call("write the keys topic", send)
        self._call("write the keys topic", lambda: [f.get(timeout=self._timeout_ms / 1000) for f in futures])
        with self._lock:
            self._spares.update((key.key_id, key) for key in made)
        return made

    def create(self, conversation_id: str) -> DataKey:
        key = self._pool.peek(conversation_id)  # a bound conversation without a lock, as FileKeyStore.create
        if key is not None and conversation_id not in self._markers and conversation_id not in self._keys:
            return key
        with self._lock:
            erased, own = conversation_id in self._markers, self._keys.get(conversation_id)
        # From memory, no round trip: a destroy elsewhere not yet read here is harmless: content
        # sealed under the key lands after the clear, which closed the conversation, is refused as
        # closed on every instance, and the projector destroys its key (projections.admission).
        return self._pool.create(conversation_id, erased=erased, own=own)

    def get(self, conversation_id: str, key_id: str) -> DataKey:
        with self._lock:
            for attempt in range(2):
                for key in self._keys.get(conversation_id, ()):
                    if key.key_id == key_id:
                        return key
                if conversation_id in self._markers:
                    raise KeyErased(f"the data key {key_id} of {conversation_id!r} was destroyed: the content is "
                                    "erased", conversation_id=conversation_id, key_id=key_id)
                spare = self._spares.get(key_id)
                if spare is not None:
                    return spare
                if attempt == 0:
                    self._catch_up()
            raise KeyStoreDamaged(f"the keys topic {self._topic!r} has no key {key_id} for {conversation_id!r}, "
                                  "which was never erased: it is not the keys topic the log was written with",
                                  where=self._topic)

    def destroy(self, conversation_id: str, key_ids: Sequence[str] = ()) -> None:
        self.destroy_many([(conversation_id, key_ids)])

    def destroy_many(self, erasures: Sequence[tuple[str, Sequence[str]]]) -> None:
        bound = {c: self._pool.unbind(c) for c, _ in erasures}
        with self._lock:
            todo: dict[str, set[str]] = {}
            for c, key_ids in erasures:
                b = bound.get(c)
                spares = {k for k in (*key_ids, *([b.key_id] if b else [])) if k in self._spares}
                if c in self._markers and not self._records.get(c) and not spares:
                    continue  # erased already and nothing of it left: no round trip (a replay's erased records)
                todo.setdefault(c, set()).update(spares)
            if not todo:
                return
            self._catch_up()
            marked = self._send_all([(c, "", encode_record(c, None)) for c in todo if c not in self._markers])
            if marked is not None:
                self._catch_up(marked + 1)
            self._send_all([(c, k, None) for c in todo for k in sorted(self._records.get(c, ()))]  # one round trip
                           + [("", k, None) for c in todo for k in sorted(todo[c])])
            self._catch_up()

    def list_keys(self, conversation_id: str | None = None) -> list[tuple[str, str]]:
        with self._lock:
            own, spares = {c: list(keys) for c, keys in self._keys.items()}, list(self._spares)
        return self._pool.listing(own, spares, conversation_id)

    def known(self, conversation_id: str) -> bool:
        with self._lock:
            if conversation_id in self._markers:
                return False
            if self._keys.get(conversation_id):
                return True
        return self._pool.ready(conversation_id)

    def erased(self, conversation_id: str) -> bool:
        with self._lock:
            self._catch_up()
            return conversation_id in self._markers

    def close(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.close()
        for client in (self._producer, self._consumer):
            if client is not None:
                try:
                    client.close()
                except Exception:  # pragma: no cover - best effort
                    log.debug("keys client close failed", exc_info=True)
        self._producer = self._consumer = None

    def __enter__(self) -> KafkaKeyStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
