"""A destroyed key leaves the broker's files once the keys topic is compacted: the proof on a
dedicated broker (its data directory is read byte by byte), with a short compaction bound."""

from __future__ import annotations

import time

import pytest
from kafka import KafkaAdminClient

from engine.keys import KafkaKeyStore
from engine.keys.kafka_topic import keys_topic_configs
from tests.kafka_broker import KafkaCluster, unique_topic

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

LAG_MS = 1000
BOUND_S = 120  # the lag + the cleaner's back-off (15 s) + slack for a loaded 2-core box


def test_destroyed_key_bytes_leave_the_broker_files(kafka_broker1: KafkaCluster) -> None:
    topic = unique_topic("compaction") + ".keys"
    configs = {**keys_topic_configs(LAG_MS), "file.delete.delay.ms": "0"}  # old segments go at once
    admin = KafkaAdminClient(bootstrap_servers=kafka_broker1.bootstrap)
    try:
        admin.create_topics({topic: {"num_partitions": 1, "replication_factor": 1, "configs": configs}},
                            timeout_ms=15_000, wait_for_metadata=True)
    finally:
        admin.close()
    partition_dir = kafka_broker1.dir / "node-1" / "data" / f"{topic}-0"

    def holding(secret: bytes) -> list[str]:
        return [p.name for p in partition_dir.iterdir() if p.is_file() and secret in p.read_bytes()]

    with KafkaKeyStore(kafka_broker1.bootstrap, topic, max_compaction_lag_ms=LAG_MS) as store:
        victim, kept = store.create("victim"), store.create("kept")
        store.destroy("victim")
        assert holding(victim.secret)  # the check below can fail
        deadline = time.monotonic() + BOUND_S
        ticks = 0
        while holding(victim.secret) and time.monotonic() < deadline:
            # Kafka rolls the active segment of a compacted topic on an append once its first record
            # is older than max.compaction.lag.ms: later creates are what a live store does anyway.
            store.create(f"tick-{ticks}")
            ticks += 1
            time.sleep(0.5)  # pacing of the appends that let the broker roll; the bound is the deadline
        assert holding(victim.secret) == [], f"still in the broker's files after {BOUND_S} s"
        assert holding(kept.secret)  # compaction kept the live key
    with KafkaKeyStore(kafka_broker1.bootstrap, topic, max_compaction_lag_ms=LAG_MS) as late:
        assert late.erased("victim") and late.get("kept", kept.key_id) == kept
