"""``engine.log.kafka.translate``: the one map from kafka-python's errors to histlog's tree.

The broker's own size refusal is rare (histlog refuses oversized records before sending), but when
a topic's ``max.message.bytes`` is lowered under a running writer it is the broker that refuses:
that is bad input for this topic (``InvalidBatch``, exit 2), never a bare ``HistoryError``.
"""

from __future__ import annotations

import kafka.errors as kerr
import pytest

from engine.log.kafka import translate
from schemas.errors import CorruptLog, InvalidBatch, LogUnavailable


@pytest.mark.parametrize(("error", "expected"), [
    (kerr.MessageSizeTooLargeError(), InvalidBatch),
    (kerr.RecordListTooLargeError(), InvalidBatch),
    (kerr.OffsetOutOfRangeError(), CorruptLog),
    (kerr.KafkaTimeoutError(), LogUnavailable),
    (kerr.UnknownTopicOrPartitionError(), LogUnavailable),
    (ConnectionRefusedError(), LogUnavailable),
])
def test_each_kafka_error_maps_to_its_type(error: BaseException, expected: type[Exception]) -> None:
    translated = translate(error, "append", bootstrap="127.0.0.1:9", topic="t")
    assert type(translated) is expected
    assert "'t' at 127.0.0.1:9" in str(translated)


def test_a_too_large_record_says_what_to_do() -> None:
    message = str(translate(kerr.MessageSizeTooLargeError(), "append", bootstrap="h:1", topic="t"))
    assert "max.message.bytes" in message and "smaller batches" in message
