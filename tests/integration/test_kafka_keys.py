"""The Kafka key store (engine/keys/kafka.py) on a real broker: the compacted keys topic is created
and checked, a spare one instance binds opens on every instance, destroy is a marker plus
tombstones (of a conversation's own keys and of the spares the log names) that every instance
honours, and an own key record a racing creator wrote after an erasure is void and tidied up."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType

from engine.keys import KafkaKeyStore, KeyStore, MasterKey, keys_topic_of
from engine.keys.record import encode_record, record_key
from schemas.errors import KeyErased, KeyStoreDamaged, TopicRefused
from schemas.sealed import DataKey

pytestmark = pytest.mark.kafka


@pytest.fixture
def keys_topic(kafka_topic: str) -> str:
    return keys_topic_of(kafka_topic)


@contextlib.contextmanager
def stores(bootstrap: str, topic: str, n: int, **kw: object) -> Iterator[list[KafkaKeyStore]]:
    opened = [KafkaKeyStore(bootstrap, topic, client_id=f"keys-{i}", **kw) for i in range(n)]  # type: ignore[arg-type]
    try:
        yield opened
    finally:
        for s in opened:
            s.close()


def raw_records(bootstrap: str, topic: str) -> list[tuple[bytes, bytes | None]]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest")
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        end = consumer.end_offsets([tp])[tp]
        out: list[tuple[bytes, bytes | None]] = []
        while consumer.position(tp) < end:
            for recs in consumer.poll(timeout_ms=500).values():
                out.extend((r.key, r.value) for r in recs)
        return out
    finally:
        consumer.close()


def latest(records: list[tuple[bytes, bytes | None]]) -> dict[bytes, bytes | None]:
    return dict(records)


def create_raw_topic(bootstrap: str, topic: str, partitions: int = 1, **configs: str) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics({topic: {"num_partitions": partitions, "replication_factor": 1, "configs": configs}},
                            timeout_ms=15_000, wait_for_metadata=True)
    finally:
        admin.close()


def test_created_keys_topic_is_compacted_with_a_bounded_lag(kafka_bootstrap: str, keys_topic: str) -> None:
    with stores(kafka_bootstrap, keys_topic, 1, max_compaction_lag_ms=600_000) as [store]:
        assert isinstance(store, KeyStore)
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        res = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, keys_topic)], config_filter="all")
        [info] = admin.describe_topics([keys_topic])
    finally:
        admin.close()
    configs = {k: str(v["value"]) for k, v in res["topic"][keys_topic].items()}
    assert configs["cleanup.policy"] == "compact"
    assert configs["max.compaction.lag.ms"] == "600000"
    assert len(info["partitions"]) == 1


@pytest.mark.parametrize(("partitions", "configs", "why"), [
    (1, {"cleanup.policy": "delete"}, "deletes live keys"),
    (1, {"cleanup.policy": "compact,delete"}, "deletes live keys"),
    (1, {"cleanup.policy": "compact"}, "max.compaction.lag.ms"),  # the broker default is unbounded
    (2, {"cleanup.policy": "compact", "max.compaction.lag.ms": "60000"}, "partitions"),
])
def test_refuses_a_topic_that_would_lose_or_keep_keys(kafka_bootstrap: str, keys_topic: str, partitions: int,
                                                       configs: dict[str, str], why: str) -> None:
    create_raw_topic(kafka_bootstrap, keys_topic, partitions, **configs)
    with pytest.raises(TopicRefused, match=why):
        KafkaKeyStore(kafka_bootstrap, keys_topic, timeout_ms=15_000)


def test_missing_topic_with_create_false_is_refused(kafka_bootstrap: str, keys_topic: str) -> None:
    with pytest.raises(TopicRefused, match="does not exist"):
        KafkaKeyStore(kafka_bootstrap, keys_topic, create=False, timeout_ms=15_000)


def test_a_spare_one_instance_binds_opens_on_every_instance(kafka_bootstrap: str, keys_topic: str) -> None:
    with stores(kafka_bootstrap, keys_topic, 2) as [a, b]:
        key = a.create("c")
        assert a.create("c") == key and a.known("c") and a.list_keys("c") == [("c", key.key_id)]
        assert b.get("c", key.key_id) == key  # b catches up on an unknown key
        mine = b.create("c")  # b binds its own spare: content under either opens everywhere
        assert mine != key and a.get("c", mine.key_id) == mine
        with pytest.raises(KeyStoreDamaged):
            b.get("c", "0" * 32)
    live = {k: v for k, v in latest(raw_records(kafka_bootstrap, keys_topic)).items() if v is not None}
    assert record_key("", key.key_id) in live and all(k.startswith(b"\x1f") for k in live)  # spares only
    with stores(kafka_bootstrap, keys_topic, 1) as [late]:
        assert {("", key.key_id), ("", mine.key_id)} <= set(late.list_keys())
        assert late.get("c", key.key_id) == key
        assert late.create("c") not in (key, mine)  # a spare of an earlier lifetime is never bound again


def test_many_new_conversations_on_two_instances_never_share_a_key(kafka_bootstrap: str, keys_topic: str) -> None:
    conversations = [f"new-{i}" for i in range(100)]  # more than one refill each
    with stores(kafka_bootstrap, keys_topic, 2) as pair:
        got: dict[int, dict[str, DataKey]] = {0: {}, 1: {}}
        errors: list[BaseException] = []

        def run(i: int) -> None:
            try:
                for c in conversations:
                    got[i][c] = pair[i].create(c)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors, errors
        ids = [k.key_id for i in (0, 1) for k in got[i].values()]
        assert len(set(ids)) == 2 * len(conversations)
        for i in (0, 1):
            other = pair[1 - i]
            assert all(other.get(c, k.key_id) == k for c, k in got[i].items())


def test_destroy_is_honoured_by_every_instance(kafka_bootstrap: str, keys_topic: str) -> None:
    master = MasterKey(os.urandom(32))
    with stores(kafka_bootstrap, keys_topic, 2, master=master) as [a, b]:
        key, other = a.create("gone"), a.create("kept")
        assert b.get("gone", key.key_id) == key
        a.destroy("gone")  # its binding on a: tombstoned
        # b answered from memory until it catches up (erased, create, destroy, an unknown key).
        assert b.erased("gone") and not b.erased("kept")
        with pytest.raises(KeyErased):
            b.get("gone", key.key_id)
        with pytest.raises(KeyErased):
            b.create("gone")
        a.destroy("gone")  # idempotent
    records = raw_records(kafka_bootstrap, keys_topic)
    assert all(key.secret not in (v or b"") for _, v in records)  # wrapped at rest
    last = latest(records)
    assert last[record_key("", key.key_id)] is None  # a tombstone: compaction drops the key
    assert last[record_key("gone", "")] is not None  # the marker outlives it
    with stores(kafka_bootstrap, keys_topic, 1, master=master) as [late]:
        with pytest.raises(KeyErased):
            late.get("gone", key.key_id)
        assert late.get("kept", other.key_id) == other
        listed = set(late.list_keys())
        assert ("", other.key_id) in listed and ("", key.key_id) not in listed


def test_destroy_on_another_instance_takes_the_key_ids_the_log_names(kafka_bootstrap: str, keys_topic: str) -> None:
    with stores(kafka_bootstrap, keys_topic, 2) as [a, b]:
        key, kept = a.create("c"), a.create("k")
        b.destroy("c", [key.key_id])  # b never bound it: the id comes from c's records in the log
        assert a.erased("c")  # catches up
        with pytest.raises(KeyErased):
            a.get("c", key.key_id)
        with pytest.raises(KeyErased):
            a.create("c")
        b.destroy("c", [key.key_id])  # idempotent, and answered from memory
        assert b.get("k", kept.key_id) == kept
    last = latest(raw_records(kafka_bootstrap, keys_topic))
    assert last[record_key("", key.key_id)] is None and last[record_key("", kept.key_id)] is not None


def test_a_key_written_after_the_marker_is_void_and_tidied(kafka_bootstrap: str, keys_topic: str) -> None:
    with stores(kafka_bootstrap, keys_topic, 1) as [a]:
        a.destroy("late-race")
    # What a creator racing the erasure leaves when it crashes before reading its write back.
    void = DataKey.generate()
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    try:
        producer.send(keys_topic, key=record_key("late-race", void.key_id), value=encode_record("late-race", void),
                      partition=0).get(timeout=30)
    finally:
        producer.close()
    with stores(kafka_bootstrap, keys_topic, 1) as [b]:
        with pytest.raises(KeyErased):
            b.get("late-race", void.key_id)
        assert b.list_keys("late-race") == []
    assert latest(raw_records(kafka_bootstrap, keys_topic))[record_key("late-race", void.key_id)] is None


def test_the_first_key_record_wins_for_every_reader(kafka_bootstrap: str, keys_topic: str) -> None:
    """Two creators that both wrote before reading back (the race, built deterministically)."""
    with stores(kafka_bootstrap, keys_topic, 1):
        pass  # creates the topic
    first, second = DataKey.generate(), DataKey.generate()
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    try:
        for key in (first, second):
            producer.send(keys_topic, key=record_key("c", key.key_id), value=encode_record("c", key),
                          partition=0).get(timeout=30)
    finally:
        producer.close()
    with stores(kafka_bootstrap, keys_topic, 2) as [a, b]:
        assert a.create("c") == b.create("c") == first
        assert b.get("c", second.key_id) == second  # still readable: content sealed under it opens


def test_a_foreign_record_is_damage(kafka_bootstrap: str, keys_topic: str) -> None:
    with stores(kafka_bootstrap, keys_topic, 1):
        pass
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    try:
        producer.send(keys_topic, key=b"no separator", value=b"junk", partition=0).get(timeout=30)
    finally:
        producer.close()
    with pytest.raises(KeyStoreDamaged, match="something else writes"):
        KafkaKeyStore(kafka_bootstrap, keys_topic, timeout_ms=15_000)


def test_opening_a_store_larger_than_its_timeout_reads_it_all(kafka_bootstrap: str, keys_topic: str) -> None:
    """The open's read of the topic fails on a stall, not on its length: 100,000 keys take ~2 s
    to read here, twice the 1 s timeout that used to bound the whole read (a store of about 1.4
    million conversations then never opened with the default 30 s)."""
    with stores(kafka_bootstrap, keys_topic, 1):
        pass  # creates the topic
    made = DataKey.generate_many(100_000)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=20, batch_size=1 << 20)
    try:
        for key in made:
            producer.send(keys_topic, key=record_key("", key.key_id), value=encode_record("", key), partition=0)
        producer.flush(timeout=60)
    finally:
        producer.close()
    with KafkaKeyStore(kafka_bootstrap, keys_topic, timeout_ms=1_000) as store:
        assert len(store.list_keys()) == len(made)
        assert store.get("anyone", made[-1].key_id) == made[-1]
