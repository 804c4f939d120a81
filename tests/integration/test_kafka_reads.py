"""The read-projection conformance suite on a real Apache Kafka broker (two partitions, so
conversations land on both). Fewer generated examples: every append is a broker round trip."""

from __future__ import annotations

import pytest

from tests.conformance.backends import OnKafka
from tests.conformance.reads_contract import ReadsContract

pytestmark = pytest.mark.kafka


class TestKafkaReads(OnKafka, ReadsContract):
    examples = 15
    partitions = 2
