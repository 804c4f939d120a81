"""The Kafka keys topic ``<topic>.keys``: created and checked like the event topic
(``engine.log.kafka_topic``), but compacted, because destroying keys is its purpose.

Settings histlog creates it with (``keys_topic_configs``): one partition (every creator reads the
same order, so "the first key record of a conversation wins" is one rule for all instances),
``cleanup.policy=compact``, ``max.compaction.lag.ms`` = the erasure bound (default 1 hour),
``segment.ms`` the same, ``min.compaction.lag.ms=0``, ``min.cleanable.dirty.ratio=0.1``.

What bounds erasure on the broker: a destroyed key is a tombstone; the log cleaner drops the key
record once its segment is closed and older than ``max.compaction.lag.ms`` (Kafka rolls the active
segment of a compacted topic at ``min(segment.ms, max.compaction.lag.ms)``, checked when a record
is appended, so an idle keys topic keeps its last segment until its next write), plus the
cleaner's back-off (``log.cleaner.backoff.ms``, 15 s) and ``file.delete.delay.ms`` (60 s) before
the old segment file is deleted.

``check_keys_topic_configs`` refuses (``TopicRefused``, naming the setting and the fix) a topic
that would break that: a ``delete`` policy (retention would drop live keys, and so content), no
``compact`` (a destroyed key would stay forever), an unbounded or larger ``max.compaction.lag.ms``
than asked, ``min.compaction.lag.ms`` above it, a dirty ratio outside (0, 1], or more than one
partition.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

import kafka.errors as kerr

# The event topic's describe helpers: one home for describe-after-create.
from engine.log.kafka_topic import describe, topic_configs, visible_after_creation
from schemas.errors import TopicRefused

__all__ = ["DEFAULT_MAX_COMPACTION_LAG_MS", "check_keys_topic_configs", "ensure_keys_topic", "keys_topic_configs",
           "keys_topic_of"]

log = logging.getLogger(__name__)

DEFAULT_MAX_COMPACTION_LAG_MS: Final = 3_600_000
"""One hour: how long a destroyed key may stay in a closed segment of the keys topic."""


def keys_topic_of(topic: str) -> str:
    """The keys topic of event topic ``topic``."""
    return f"{topic}.keys"


def keys_topic_configs(max_compaction_lag_ms: int) -> dict[str, str]:
    return {
        "cleanup.policy": "compact",
        "max.compaction.lag.ms": str(max_compaction_lag_ms),
        "segment.ms": str(max_compaction_lag_ms),
        "min.compaction.lag.ms": "0",
        "min.cleanable.dirty.ratio": "0.1",
    }


def _hint(bootstrap: str, topic: str, setting: str) -> str:
    return (f"kafka-configs.sh --bootstrap-server {bootstrap} --alter --entity-type topics "
            f"--entity-name {topic} --add-config {setting}")


def _int(value: str | None) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def check_keys_topic_configs(topic: str, configs: Mapping[str, str], *, max_compaction_lag_ms: int,
                             bootstrap: str = "HOST:PORT", partitions: int = 1) -> None:
    """Refuse keys-topic settings that would lose live keys or keep destroyed ones (see module)."""
    problems: list[str] = []
    policy = {p.strip() for p in configs.get("cleanup.policy", "delete").split(",")}
    if "delete" in policy:
        fix = _hint(bootstrap, topic, "cleanup.policy=compact")
        problems.append(f"cleanup.policy={configs.get('cleanup.policy', 'delete')} deletes live keys by retention "
                        f"(and with them the content they open); fix: {fix}")
    elif "compact" not in policy:
        problems.append(f"cleanup.policy={configs.get('cleanup.policy')} never removes destroyed keys; "
                        f"fix: {_hint(bootstrap, topic, 'cleanup.policy=compact')}")
    lag = _int(configs.get("max.compaction.lag.ms"))
    if lag is None or lag <= 0 or lag > max_compaction_lag_ms:
        problems.append(f"max.compaction.lag.ms={configs.get('max.compaction.lag.ms')} does not bound how long a "
                        f"destroyed key stays on the broker (at most {max_compaction_lag_ms} asked); fix: "
                        f"{_hint(bootstrap, topic, f'max.compaction.lag.ms={max_compaction_lag_ms}')}")
    min_lag = _int(configs.get("min.compaction.lag.ms"))
    if lag is not None and min_lag is not None and min_lag > lag:
        problems.append(f"min.compaction.lag.ms={min_lag} exceeds max.compaction.lag.ms={lag}; fix: "
                        f"{_hint(bootstrap, topic, 'min.compaction.lag.ms=0')}")
    ratio_text = configs.get("min.cleanable.dirty.ratio")
    if ratio_text is not None:
        try:
            ratio = float(ratio_text)
        except ValueError:
            ratio = -1.0
        if not 0 < ratio <= 1:
            problems.append(f"min.cleanable.dirty.ratio={ratio_text} is outside (0, 1]; fix: "
                            f"{_hint(bootstrap, topic, 'min.cleanable.dirty.ratio=0.1')}")
    if partitions != 1:
        problems.append(f"it has {partitions} partitions: the keys topic has one, so every instance reads one "
                        "order of key records (the first key of a conversation wins); use a new keys topic")
    if problems:
        raise TopicRefused(f"refusing Kafka keys topic {topic!r}: " + "; ".join(problems) + ".")


def ensure_keys_topic(admin: Any, *, topic: str, bootstrap: str, create: bool, replication_factor: int,
                      max_compaction_lag_ms: int, timeout_ms: int) -> str:
    """Find or create the keys topic and check it; returns its topic id. kafka-python errors
    propagate (the caller translates them); refusals are ``TopicRefused``."""
    found = describe(admin, topic)
    if found is None:
        if not create:
            raise TopicRefused(f"Kafka keys topic {topic!r} does not exist at {bootstrap} and create=False; "
                               "open once with create=True, or create it with cleanup.policy=compact and "
                               f"max.compaction.lag.ms={max_compaction_lag_ms}")
        configs = keys_topic_configs(max_compaction_lag_ms)
        if replication_factor >= 3:
            configs["min.insync.replicas"] = "2"
        try:
            admin.create_topics({topic: {"num_partitions": 1, "replication_factor": replication_factor,
                                         "configs": configs}}, timeout_ms=timeout_ms, wait_for_metadata=True)
            log.info("created Kafka keys topic %s (RF %d)", topic, replication_factor)
        except kerr.TopicAlreadyExistsError:
            pass  # another instance won the race: check it like any existing topic
        except kerr.InvalidReplicationFactorError as exc:
            raise TopicRefused(f"cannot create Kafka keys topic {topic!r} with replication factor "
                               f"{replication_factor}: {exc}") from exc
        found = visible_after_creation(admin, topic, timeout_ms)
    partitions, topic_id = found
    configs_now = topic_configs(admin, topic, timeout_ms)
    check_keys_topic_configs(topic, configs_now, max_compaction_lag_ms=max_compaction_lag_ms,
                             bootstrap=bootstrap, partitions=partitions)
    return topic_id
