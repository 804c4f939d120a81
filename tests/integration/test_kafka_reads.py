"""The read-projection conformance suite on a real Apache Kafka broker (two partitions, so
conversations land on both). Fewer generated examples: every append is a broker round trip."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conformance.reads_contract import ReadsContract
from tests.integration.test_kafka_engine import KafkaBackend

pytestmark = pytest.mark.kafka


class TestKafkaReads(ReadsContract):
    examples = 15

    @pytest.fixture
    def backend(self, kafka_bootstrap: str, kafka_topic: str, tmp_path: Path) -> KafkaBackend:
        return KafkaBackend(kafka_bootstrap, kafka_topic, tmp_path / "state", partitions=2)
