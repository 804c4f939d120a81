"""Where the history lives: the flags ``--data`` or ``--kafka/--topic/--state`` over the
``HISTLOG_*`` environment variables, resolved to one ``Target`` that opens the engine.

Each kind of target is one branch of ``resolve`` and one of ``Target.open``: the embedded data
dir and Kafka today; an HTTP ``--url`` (a client with the engine's methods) is the next one.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from engine.cli.exits import UsageError
from engine.facade import HistoryEngine

__all__ = ["DEFAULT_DATA", "DEFAULT_TOPIC", "Target", "resolve"]

DEFAULT_DATA = "./histlog-data"
DEFAULT_TOPIC = "histlog.events"


@dataclass(frozen=True, slots=True)
class Target:
    """Where the history lives: the embedded data dir, or Kafka plus this instance's state dir."""

    data: Path | None
    kafka: str | None = None
    topic: str = DEFAULT_TOPIC
    state: Path | None = None

    @property
    def embedded(self) -> bool:
        return self.kafka is None

    @property
    def state_dir(self) -> Path:
        if self.kafka is None:
            assert self.data is not None  # Invariant: an embedded target always has a data dir.
            return self.data / "state"
        assert self.state is not None  # Invariant: resolve() refuses Kafka without --state.
        return self.state

    def describe(self) -> str:
        if self.kafka is None:
            return f"embedded data dir {self.data}"
        return f"Kafka {self.kafka} topic {self.topic} (state {self.state})"

    def open(self, *, progress: Callable[[int, int], None] | None = None, rebuild: bool = False,
             accept_log_loss: bool = False) -> HistoryEngine:
        """Open the engine on this target (the one place the CLI opens one)."""
        if self.kafka is None:
            return HistoryEngine.open(self.data, progress=progress, rebuild=rebuild, accept_log_loss=accept_log_loss)
        return HistoryEngine.open(kafka=self.kafka, topic=self.topic, state_dir=self.state, progress=progress,
                                  rebuild=rebuild, accept_log_loss=accept_log_loss)


def _flag(ns: argparse.Namespace, name: str) -> str | None:
    """A global option's value; an empty one is refused rather than read as "not given"."""
    value: str | None = getattr(ns, name, None)
    if value is not None and not value.strip():
        raise UsageError(f"--{name} is empty: give a value or leave the option out (see `histlog --help`)")
    return value


def resolve(ns: argparse.Namespace, env: Mapping[str, str] | None = None) -> Target:
    """Flags win over ``HISTLOG_*`` environment variables; an explicit ``--data`` means embedded."""
    env = os.environ if env is None else env
    data_flag, kafka_flag, topic_flag, state_flag = (_flag(ns, name) for name in ("data", "kafka", "topic", "state"))
    if data_flag is not None and kafka_flag is not None:
        raise UsageError("give either --data DIR (embedded) or --kafka HOST:PORT, not both")
    kafka = kafka_flag
    if kafka is None and data_flag is None:
        kafka = env.get("HISTLOG_KAFKA")
    if kafka:
        if ":" not in kafka:
            raise UsageError(f"invalid --kafka {kafka!r}: expected HOST:PORT, e.g. localhost:9092")
        state = state_flag or env.get("HISTLOG_STATE")
        if not state:
            raise UsageError("--kafka needs --state DIR (or HISTLOG_STATE): "
                             "where this instance keeps its state")
        topic = topic_flag or env.get("HISTLOG_TOPIC") or DEFAULT_TOPIC
        return Target(None, kafka, topic, Path(state))
    if state_flag is not None:
        raise UsageError("--state applies to --kafka only (the embedded state is DATA/state)")
    if topic_flag is not None:
        raise UsageError("--topic applies to --kafka only")
    return Target(Path(data_flag or env.get("HISTLOG_DATA") or DEFAULT_DATA))
