"""The owned-partitions contract (``tests/conformance/owned_contract.py``) on a real Kafka broker:
a fresh 4-partition topic per test, the states under ``tmp_path``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conformance.owned_contract import KafkaOwned, OwnedContract
from tests.conformance.standby_contract import StandbyContract

pytestmark = pytest.mark.kafka


class TestKafkaOwned(OwnedContract):
    @pytest.fixture
    def backend(self, kafka_bootstrap: str, kafka_topic: str, tmp_path: Path) -> KafkaOwned:
        return KafkaOwned(kafka_bootstrap, kafka_topic, tmp_path)


class TestKafkaStandby(StandbyContract):
    @pytest.fixture
    def backend(self, kafka_bootstrap: str, kafka_topic: str, tmp_path: Path) -> KafkaOwned:
        return KafkaOwned(kafka_bootstrap, kafka_topic, tmp_path)
