"""KafkaLog's topic handling on a real broker: settings, refusals, partitioning, broker loss."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import ConfigResource, ConfigResourceType
from kafka.partitioner import DefaultPartitioner

from engine.log.base import partition_for_key, record_key
from engine.log.kafka import KafkaLog, check_topic_configs
from schemas.errors import InvalidBatch, LogUnavailable, TopicRefused
from tests.kafka_broker import REPO, KafkaCluster, unique_topic

pytestmark = pytest.mark.kafka

#: Longest a long-lived client may take to append again once a restarted broker serves: a bound
#: of the reconnect backoff setting (see CLIENT_TUNING), generous for a loaded 2-core machine.
RESUME_BOUND_S = 10.0

CONVERSATIONS = ["c", "conversation-1", "ünïcødé 会話", "a" * 300, "user:42/thread:7", "x y z"]


@contextlib.contextmanager
def admin_client(bootstrap: str):  # type: ignore[no-untyped-def]
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15_000,
                             bootstrap_timeout_ms=15_000)
    try:
        yield admin
    finally:
        admin.close()


def topic_configs(bootstrap: str, topic: str) -> dict[str, str]:
    with admin_client(bootstrap) as admin:
        res = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)], config_filter="all")
    return {k: str(v["value"]) for k, v in res["topic"][topic].items()}


def create_raw_topic(bootstrap: str, topic: str, partitions: int = 1, **configs: str) -> None:
    with admin_client(bootstrap) as admin:
        admin.create_topics({topic: {"num_partitions": partitions, "replication_factor": 1,
                                     "configs": {k.replace("_", "."): v for k, v in configs.items()}}},
                            timeout_ms=15_000, wait_for_metadata=True)


# ---------------------------------------------------------------- creation and refusal


def test_created_topic_keeps_history_forever(kafka_bootstrap: str, kafka_topic: str) -> None:
    with KafkaLog(kafka_bootstrap, kafka_topic, partitions=3) as log:
        assert log.partitions == 3
    configs = topic_configs(kafka_bootstrap, kafka_topic)
    assert configs["retention.ms"] == "-1"
    assert configs["retention.bytes"] == "-1"
    assert configs["cleanup.policy"] == "delete"
    with admin_client(kafka_bootstrap) as admin:
        [info] = admin.describe_topics([kafka_topic])
    assert len(info["partitions"]) == 3


def test_finite_retention_ms_is_refused_naming_the_setting(kafka_bootstrap: str, kafka_topic: str) -> None:
    create_raw_topic(kafka_bootstrap, kafka_topic, retention_ms="86400000")
    with pytest.raises(TopicRefused) as info:
        KafkaLog(kafka_bootstrap, kafka_topic)
    message = str(info.value)
    assert "retention.ms=86400000" in message
    assert "--alter" in message and "retention.ms=-1" in message


def test_finite_retention_bytes_is_refused(kafka_bootstrap: str, kafka_topic: str) -> None:
    create_raw_topic(kafka_bootstrap, kafka_topic, retention_ms="-1", retention_bytes="1073741824")
    with pytest.raises(TopicRefused, match=r"retention\.bytes=1073741824"):
        KafkaLog(kafka_bootstrap, kafka_topic)


def test_broker_default_retention_is_refused(kafka_bootstrap: str, kafka_topic: str) -> None:
    """A topic made without settings inherits the broker's 7-day retention."""
    create_raw_topic(kafka_bootstrap, kafka_topic)
    inherited = topic_configs(kafka_bootstrap, kafka_topic)["retention.ms"]
    if int(inherited) < 0:
        pytest.skip("this broker's default retention is already infinite")
    with pytest.raises(TopicRefused, match=rf"retention\.ms={inherited}\b"):
        KafkaLog(kafka_bootstrap, kafka_topic)


@pytest.mark.parametrize("policy", ["compact", "compact,delete"])
def test_compaction_is_refused(kafka_bootstrap: str, kafka_topic: str, policy: str) -> None:
    create_raw_topic(kafka_bootstrap, kafka_topic, retention_ms="-1", cleanup_policy=policy)
    with pytest.raises(TopicRefused) as info:
        KafkaLog(kafka_bootstrap, kafka_topic)
    assert f"cleanup.policy={policy}" in str(info.value)
    assert "cleanup.policy=delete" in str(info.value)


def test_a_good_existing_topic_is_accepted(kafka_bootstrap: str, kafka_topic: str) -> None:
    create_raw_topic(kafka_bootstrap, kafka_topic, partitions=2, retention_ms="-1",
                     retention_bytes="-1", cleanup_policy="delete")
    with KafkaLog(kafka_bootstrap, kafka_topic, partitions=2, create=False) as log:
        assert log.append(record_key("c", "a"), b"v").offset == 0


def test_partition_count_mismatch_is_refused(kafka_bootstrap: str, kafka_topic: str) -> None:
    with KafkaLog(kafka_bootstrap, kafka_topic, partitions=4):
        pass
    with pytest.raises(TopicRefused) as info:
        KafkaLog(kafka_bootstrap, kafka_topic, partitions=2)
    assert "4 partitions" in str(info.value) and "partitions=4" in str(info.value)
    with KafkaLog(kafka_bootstrap, kafka_topic, partitions=None) as adopted:
        assert adopted.partitions == 4


def test_missing_topic_without_create_is_refused(kafka_bootstrap: str, kafka_topic: str) -> None:
    with pytest.raises(TopicRefused) as info:
        KafkaLog(kafka_bootstrap, kafka_topic, partitions=3, create=False)
    assert "does not exist" in str(info.value)
    assert "--partitions 3" in str(info.value) and "retention.ms=-1" in str(info.value)


def test_a_replication_factor_beyond_the_cluster_is_refused(kafka_bootstrap: str, kafka_topic: str) -> None:
    """N brokers cannot hold N + 1 replicas: a typed refusal that names the fix, not a Kafka error."""
    with admin_client(kafka_bootstrap) as admin:
        too_many = len(admin.describe_cluster()["brokers"]) + 1
    with pytest.raises(TopicRefused, match=f"replication factor {too_many}") as info:
        KafkaLog(kafka_bootstrap, kafka_topic, partitions=1, replication_factor=too_many)
    assert "lower replication_factor or add brokers" in str(info.value)


def test_check_topic_configs_accepts_infinite_delete() -> None:
    check_topic_configs("t", {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"})


def test_check_topic_configs_names_every_problem() -> None:
    with pytest.raises(TopicRefused) as info:
        check_topic_configs("t", {"retention.ms": "1000", "retention.bytes": "5",
                                  "cleanup.policy": "compact"})
    message = str(info.value)
    assert "retention.ms=1000" in message and "retention.bytes=5" in message
    assert "cleanup.policy=compact" in message


# ---------------------------------------------------------------- partitioning


def test_partition_matches_a_plain_kafka_python_producer(kafka_bootstrap: str, kafka_topic: str) -> None:
    """Another producer keyed by the conversation id picks the same partition (DefaultPartitioner)."""
    partitions = 7
    with KafkaLog(kafka_bootstrap, kafka_topic, partitions=partitions) as log:
        producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, partitioner=DefaultPartitioner(),
                                 enable_idempotence=True, acks="all")
        try:
            for conv in [*CONVERSATIONS, *(f"conversation-{i}" for i in range(40))]:
                ours = log.append(record_key(conv, "append-1"), b"ours").partition
                plain = producer.send(kafka_topic, key=conv.encode("utf-8"), value=b"plain").get(timeout=20)
                assert ours == plain.partition == partition_for_key(record_key(conv), partitions), conv
        finally:
            producer.close(timeout=5)


JAVA_PARTITION = """
import org.apache.kafka.clients.producer.internals.BuiltInPartitioner;
import java.nio.charset.StandardCharsets;
public class Part {
    public static void main(String[] args) {
        int n = Integer.parseInt(args[0]);
        for (int i = 1; i < args.length; i++) {
            byte[] key = args[i].getBytes(StandardCharsets.UTF_8);
            System.out.println(BuiltInPartitioner.partitionForKey(key, n));
        }
    }
}
"""


def test_partition_matches_the_java_client(tmp_path: Path) -> None:
    """Java's own BuiltInPartitioner (from the broker's kafka-clients jar) agrees with us."""
    libs = REPO / "build" / "kafka" / "libs"
    java = shutil.which("java")
    if java is None or not any(libs.glob("kafka-clients-*.jar")):
        pytest.skip("needs java and build/kafka/libs (scripts/kafka fetch)")
    src = tmp_path / "Part.java"
    src.write_text(JAVA_PARTITION)
    convs = [*CONVERSATIONS, *(f"conversation-{i}" for i in range(30))]
    for partitions in (3, 16):
        out = subprocess.run([java, "-cp", f"{libs}/*", str(src), str(partitions), *convs],
                             capture_output=True, text=True, timeout=120, check=True).stdout.split()
        assert [int(p) for p in out] == [partition_for_key(record_key(c, "a"), partitions) for c in convs]


# ---------------------------------------------------------------- broker loss


def test_a_record_larger_than_the_topics_max_message_bytes_is_refused_before_sending(
        kafka_bootstrap: str, kafka_topic: str) -> None:
    """An existing topic's max.message.bytes (here Kafka's 1 MiB default) is the limit, read at open."""
    create_raw_topic(kafka_bootstrap, kafka_topic, retention_ms="-1", retention_bytes="-1",
                     max_message_bytes="1048576")
    with KafkaLog(kafka_bootstrap, kafka_topic) as log:
        assert log.max_record_bytes == 1048576
        with pytest.raises(InvalidBatch, match=r"the encoded event is \d+ bytes; this topic takes at most "
                                               r"1048576; split the batch"):
            log.append(record_key("c", "big"), b"x" * 1048576)
        assert log.end_offsets() == [0]  # nothing was sent
        fits = log.append(record_key("c", "fits"), b"x" * (1048576 - 200))  # just under the limit
        assert log.end_offsets() == [fits.offset + 1]


def test_broker_down_append_fails_within_timeout_and_recovers(kafka_broker1: KafkaCluster) -> None:
    topic = unique_topic("histlog-broker-down")
    log = KafkaLog(kafka_broker1.bootstrap, topic, partitions=1, request_timeout_s=5)
    try:
        before = log.append(record_key("c", "before"), b"before")
        kafka_broker1.stop()
        try:
            t0 = time.monotonic()
            with pytest.raises(LogUnavailable) as info:
                log.append(record_key("c", "during"), b"during", timeout=4.0)
            elapsed = time.monotonic() - t0
            assert elapsed < 4.0 + 2.0, f"append took {elapsed:.1f} s with timeout=4"
            assert "retry" in str(info.value).lower()
            t0 = time.monotonic()
            with pytest.raises(LogUnavailable):
                log.end_offsets()
            assert time.monotonic() - t0 < 5.0 + 5.0
        finally:
            kafka_broker1.start()  # same storage, same ports; returns once the broker serves
        ready = time.monotonic()
        after = log.append(record_key("c", "after"), b"after", timeout=60.0)
        resumed = time.monotonic() - ready
        print(f"append resumed {resumed:.2f} s after the broker was ready")
        # A correctness bound of the reconnect backoff (reconnect_backoff_max_ms=1000), not a
        # performance assertion: with kafka-python's default 30 s maximum this took 10-32 s.
        assert resumed < RESUME_BOUND_S, f"append resumed {resumed:.1f} s after the broker was ready"
        assert after.offset > before.offset
        records = []
        offset = 0
        while batch := log.read(0, offset, 100):
            records.extend(batch)
            offset = batch[-1].offset + 1
        values = [r.value for r in records]
        # Whole records only, each at most once; the unconfirmed one may or may not have landed.
        assert values[0] == b"before" and values[-1] == b"after"
        assert set(values) <= {b"before", b"during", b"after"}
        assert len(values) == len(set(values))
    finally:
        log.close()


@pytest.mark.slow
def test_rf3_cluster_loses_nothing_when_a_node_is_killed(kafka_cluster3: KafkaCluster) -> None:
    topic = unique_topic("histlog-rf3")
    log = KafkaLog(kafka_cluster3.bootstrap, topic, partitions=2, replication_factor=3, request_timeout_s=15)
    try:
        assert topic_configs(kafka_cluster3.bootstrap, topic)["min.insync.replicas"] == "2"
        acked = {log.append(record_key(f"c{i}", "a"), f"v{i}".encode()): f"v{i}".encode() for i in range(20)}
        with admin_client(kafka_cluster3.bootstrap) as admin:
            [info] = admin.describe_topics([topic])
        leader = next(p["leader_id"] for p in info["partitions"] if p["partition_index"] == 0)
        kafka_cluster3.kill_node(leader)
        try:
            for i in range(20, 40):
                pos = log.append(record_key(f"c{i}", "a"), f"v{i}".encode(), timeout=60.0)
                acked[pos] = f"v{i}".encode()
        finally:
            kafka_cluster3.start_node(leader)
        got = {}
        ends = log.end_offsets()
        for p in range(2):
            offset, empty_reads = 0, 0
            # Read up to the end offsets: right after a leader change a read may come back empty
            # for a moment, which is not the end of the partition (bounded retries).
            while offset < ends[p] and empty_reads < 200:
                batch = log.read(p, offset, 500)
                if not batch:
                    empty_reads += 1
                    continue
                got.update({r.position: r.value for r in batch})
                offset = batch[-1].offset + 1
        assert got == acked
    finally:
        log.close()
