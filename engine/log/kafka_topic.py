"""The settings side of ``KafkaLog``: the bootstrap address, the topic and its settings.

* ``parse_bootstrap`` checks a bootstrap string (``HOST:PORT[,HOST:PORT...]``) before any I/O and
  raises ``InvalidConfiguration`` naming the value and the expected form.
* ``ensure_topic`` finds (or creates) the topic with an admin client and refuses one that would
  lose or compact history (``check_topic_configs``) or whose partition count differs. It returns
  the topic's id and its ``max.message.bytes``: the largest record the log may send (a larger
  one is refused before sending, with ``InvalidBatch``).
* ``CLIENT_TUNING``: the reconnect/retry/metadata settings every kafka-python client of
  histlog uses, so that a long-lived client notices a returning broker or a moved leader within
  seconds (kafka-python's defaults back off up to 30 s and refresh metadata every 5 minutes).
"""

from __future__ import annotations

import ipaddress
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kafka.errors as kerr
from kafka.admin import ConfigResource, ConfigResourceType

from schemas.errors import InvalidConfiguration, TopicRefused

__all__ = [
    "CLIENT_TUNING",
    "DEFAULT_MAX_RECORD_BYTES",
    "REQUIRED_TOPIC_CONFIGS",
    "TopicInfo",
    "check_topic_configs",
    "creation_hint",
    "describe",
    "ensure_topic",
    "parse_bootstrap",
    "topic_configs",
    "visible_after_creation",
]

log = logging.getLogger(__name__)

#: Topic settings histlog creates a topic with: history is kept forever and never compacted.
REQUIRED_TOPIC_CONFIGS: dict[str, str] = {
    "retention.ms": "-1",
    "retention.bytes": "-1",
    "cleanup.policy": "delete",
}

#: ``max.message.bytes`` of topics histlog creates (Kafka's default, ~1 MiB, is too small for a
#: batch with media); the producer's ``max_request_size`` follows the topic's actual value.
DEFAULT_MAX_RECORD_BYTES = 8 * 1024 * 1024

#: For the producer, the reader and cursor consumers and the admin client alike (kafka-python
#: 3.0.x names). The reconnect backoff is exponential up to ``reconnect_backoff_max_ms``: with the
#: default 30 s, a client that kept trying while a broker was down resumed 10-32 s after it came
#: back; 1 s bounds that. ``metadata_max_age_ms`` bounds how long a client may act on a stale
#: leader (the default is 5 minutes).
CLIENT_TUNING: dict[str, int] = {
    "reconnect_backoff_ms": 50,
    "reconnect_backoff_max_ms": 1000,
    "retry_backoff_ms": 100,
    "metadata_max_age_ms": 10_000,
}

_HOST = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_FORM = "HOST:PORT[,HOST:PORT...] (e.g. 127.0.0.1:9092 or kafka-1:9092,kafka-2:9092; IPv6 as [::1]:9092)"


def parse_bootstrap(value: object) -> str:
    """Check a Kafka bootstrap string; return it unchanged when valid.

    Each comma-separated entry is ``HOST:PORT`` with a host name or IPv4 address (or an IPv6
    address in brackets) and a port in 1..65535; no spaces, no empty entries. Raises
    ``InvalidConfiguration`` naming the value and the expected form: a typo must not turn into a
    30 s connection timeout.
    """
    if not isinstance(value, str):
        raise InvalidConfiguration(f"invalid Kafka bootstrap address {value!r}: expected a string {_FORM}")
    if not value:
        raise InvalidConfiguration(f"invalid Kafka bootstrap address (empty): expected {_FORM}; "
                                   "pass --kafka HOST:PORT or set HISTLOG_KAFKA")
    for entry in value.split(","):
        problem = _entry_problem(entry)
        if problem:
            raise InvalidConfiguration(f"invalid Kafka bootstrap address {value!r}: {problem}; "
                                       f"expected {_FORM}")
    return value


def _entry_problem(entry: str) -> str:
    if not entry:
        return "an empty entry (a stray comma?)"
    if entry != entry.strip() or any(c.isspace() for c in entry):
        return f"{entry!r} contains whitespace"
    host, sep, port = entry.rpartition(":")
    if not sep:
        return f"{entry!r} has no port"
    if not host:
        return f"{entry!r} has no host"
    if not port.isascii() or not port.isdigit():
        return f"the port of {entry!r} is not a number"
    if not 1 <= int(port) <= 65535:
        return f"the port of {entry!r} is outside 1..65535"
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return f"{host!r} is not an IPv6 address"
        return ""
    if ":" in host:
        return f"{entry!r}: an IPv6 address must be written in brackets, like [::1]:9092"
    if not _HOST.match(host):
        return f"{host!r} is not a host name or IP address"
    return ""


def _alter_hint(bootstrap: str, topic: str, setting: str) -> str:
    return (f"kafka-configs.sh --bootstrap-server {bootstrap} --alter --entity-type topics "
            f"--entity-name {topic} --add-config {setting}")


def check_topic_configs(topic: str, configs: Mapping[str, str], bootstrap: str = "HOST:PORT") -> None:
    """Refuse topic settings that would make replay lie (lost or compacted history).

    ``configs`` maps setting names to their effective values (``describe_configs(...,
    config_filter="all")``). Raises ``TopicRefused`` naming the setting and the fix.
    """
    problems: list[str] = []
    for name in ("retention.ms", "retention.bytes"):
        value = configs.get(name)
        if value is None:
            continue
        try:
            finite = int(value) >= 0
        except ValueError:
            finite = True
        if finite:
            problems.append(
                f"{name}={value} deletes old history (histlog needs {name}=-1, kept forever); "
                f"fix: {_alter_hint(bootstrap, topic, f'{name}=-1')}")
    policy = configs.get("cleanup.policy")
    if policy is not None and "compact" in {p.strip() for p in policy.split(",")}:
        problems.append(
            f"cleanup.policy={policy} compacts history (keeps only the last record per key; "
            f"histlog needs cleanup.policy=delete with infinite retention); "
            f"fix: {_alter_hint(bootstrap, topic, 'cleanup.policy=delete')}")
    if problems:
        raise TopicRefused(f"refusing Kafka topic {topic!r}: " + "; ".join(problems)
                           + ". A log that loses or compacts records cannot be replayed.")


def creation_hint(bootstrap: str, topic: str, partitions: int, replication_factor: int) -> str:
    """The ``kafka-topics.sh`` command that creates ``topic`` the way histlog would."""
    extra = " --config min.insync.replicas=2" if replication_factor >= 3 else ""
    return (f"kafka-topics.sh --bootstrap-server {bootstrap} --create --topic {topic} "
            f"--partitions {partitions} --replication-factor {replication_factor} "
            f"--config retention.ms=-1 --config retention.bytes=-1 --config cleanup.policy=delete"
            + extra)


@dataclass(frozen=True)
class TopicInfo:
    """What ``ensure_topic`` learned: the partition count, the topic's UUID (it changes when the
    topic is deleted and created again) and its ``max.message.bytes``."""

    partitions: int
    topic_id: str
    max_message_bytes: int


def describe(admin: Any, topic: str) -> tuple[int, str] | None:
    [info] = admin.describe_topics([topic])
    code = info.get("error_code", 0)
    if code == kerr.UnknownTopicOrPartitionError.errno:
        return None
    if code:
        raise kerr.for_code(code)(f"describe topic {topic}")
    return len(info["partitions"]), str(info.get("topic_id") or "")


def visible_after_creation(admin: Any, topic: str, timeout_ms: int) -> tuple[int, str]:
    """The new topic, once the broker answering describe knows it: in a cluster, brokers learn a
    new topic from the controller a moment after it is created."""
    deadline = time.monotonic() + timeout_ms / 1000
    pause = 0.05
    while True:
        found = describe(admin, topic)
        if found is not None:
            return found
        if time.monotonic() >= deadline:
            raise kerr.UnknownTopicOrPartitionError(f"topic {topic} not visible after creation")
        time.sleep(pause)  # back-off between metadata requests, bounded by the deadline
        pause = min(pause * 2, 1.0)


def topic_configs(admin: Any, topic: str, timeout_ms: int) -> dict[str, str]:
    """The topic's effective settings (``describe_configs``, every config with its default). A
    broker always lists them all; an empty answer (met on a cluster while a node restarts, or
    just after the topic was created) is no answer: asked again until the deadline, then
    ``KafkaTimeoutError`` (the caller's ``LogUnavailable``), never read as "no settings"."""
    deadline = time.monotonic() + timeout_ms / 1000
    pause = 0.05
    while True:
        result = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)], config_filter="all")
        entries = result.get("topic", {}).get(topic, {})
        configs = {name: str(entry.get("value")) for name, entry in entries.items() if entry.get("value") is not None}
        if configs:
            return configs
        if time.monotonic() >= deadline:
            raise kerr.KafkaTimeoutError(f"no broker described the settings of topic {topic}")
        time.sleep(pause)  # back-off between describe requests, bounded by the deadline
        pause = min(pause * 2, 1.0)


def ensure_topic(admin: Any, *, topic: str, bootstrap: str, partitions: int | None, create: bool,
                 replication_factor: int, max_record_bytes: int, timeout_ms: int) -> TopicInfo:
    """Find or create ``topic`` and check it (see the module docstring). kafka-python errors
    propagate unchanged (the caller translates them); refusals are ``TopicRefused``."""
    found = describe(admin, topic)
    if found is None:
        if not create:
            raise TopicRefused(
                f"Kafka topic {topic!r} does not exist at {bootstrap} and create=False; create it "
                f"with {creation_hint(bootstrap, topic, partitions or 1, replication_factor)} "
                "or pass create=True.")
        wanted = partitions or 1
        configs = dict(REQUIRED_TOPIC_CONFIGS)
        configs["max.message.bytes"] = str(max_record_bytes)
        if replication_factor >= 3:
            configs["min.insync.replicas"] = "2"
        try:
            admin.create_topics({topic: {"num_partitions": wanted, "replication_factor": replication_factor,
                                         "configs": configs}},
                                timeout_ms=timeout_ms, wait_for_metadata=True)
            log.info("created Kafka topic %s (%d partitions, RF %d)", topic, wanted, replication_factor)
        except kerr.TopicAlreadyExistsError:
            pass  # another instance won the race: check it like any existing topic
        except kerr.InvalidReplicationFactorError as exc:
            raise TopicRefused(
                f"cannot create Kafka topic {topic!r} with replication factor {replication_factor}: "
                f"{exc}; the cluster has fewer brokers, lower replication_factor or add brokers.") from exc
        found = visible_after_creation(admin, topic, timeout_ms)
    actual, topic_id = found
    if partitions is not None and actual != partitions:
        raise TopicRefused(
            f"Kafka topic {topic!r} has {actual} partitions but {partitions} were requested; "
            f"histlog places each conversation by murmur2(conversation id) % partitions, so a "
            f"different count would move conversations and break their order. Open it with "
            f"partitions={actual}, or use a new topic (partitions cannot be changed in place).")
    configs_now = topic_configs(admin, topic, timeout_ms)
    check_topic_configs(topic, configs_now, bootstrap)
    try:
        max_bytes = int(configs_now.get("max.message.bytes", max_record_bytes))
    except ValueError:
        max_bytes = max_record_bytes
    return TopicInfo(actual, topic_id, max_bytes if max_bytes > 0 else max_record_bytes)
