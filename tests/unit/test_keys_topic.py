"""The keys topic's settings check (engine/keys/kafka_topic.py), without a broker: what histlog
creates passes, and each setting that would lose live keys or keep destroyed ones is refused
with the setting named and a fix."""

from __future__ import annotations

import pytest

from engine.keys.kafka_topic import check_keys_topic_configs, keys_topic_configs, keys_topic_of
from schemas.errors import TopicRefused

LAG = 3_600_000


def test_what_histlog_creates_passes() -> None:
    check_keys_topic_configs("t.keys", keys_topic_configs(LAG), max_compaction_lag_ms=LAG)
    assert keys_topic_of("t") == "t.keys"


@pytest.mark.parametrize(("change", "named"), [
    ({"cleanup.policy": "delete"}, "cleanup.policy=delete"),
    ({"cleanup.policy": "compact,delete"}, "cleanup.policy=compact,delete"),
    ({"cleanup.policy": "none"}, "never removes destroyed keys"),
    ({"max.compaction.lag.ms": "9223372036854775807"}, "max.compaction.lag.ms=9223372036854775807"),
    ({"max.compaction.lag.ms": str(LAG + 1)}, "max.compaction.lag.ms"),
    ({"max.compaction.lag.ms": "0"}, "max.compaction.lag.ms=0"),
    ({"min.compaction.lag.ms": str(LAG + 1)}, "min.compaction.lag.ms"),
    ({"min.cleanable.dirty.ratio": "0"}, "min.cleanable.dirty.ratio=0"),
    ({"min.cleanable.dirty.ratio": "x"}, "min.cleanable.dirty.ratio=x"),
])
def test_breaking_settings_are_refused(change: dict[str, str], named: str) -> None:
    with pytest.raises(TopicRefused, match=r"kafka-configs\.sh") as info:
        check_keys_topic_configs("t.keys", {**keys_topic_configs(LAG), **change}, max_compaction_lag_ms=LAG)
    assert named in str(info.value)


def test_a_missing_lag_and_more_partitions_are_refused() -> None:
    configs = keys_topic_configs(LAG)
    del configs["max.compaction.lag.ms"]
    with pytest.raises(TopicRefused, match=r"max\.compaction\.lag\.ms=None"):
        check_keys_topic_configs("t.keys", configs, max_compaction_lag_ms=LAG)
    with pytest.raises(TopicRefused, match="3 partitions"):
        check_keys_topic_configs("t.keys", keys_topic_configs(LAG), max_compaction_lag_ms=LAG, partitions=3)
