"""Where the history lives: the flags ``--data``, ``--kafka/--topic/--state`` or ``--url`` over
the ``HISTLOG_*`` environment variables, resolved to one ``Target`` that opens the engine.

Each kind of target is one branch of ``resolve`` and one of ``Target.open``: the embedded data
dir, Kafka, and a histlog server (``--url``, env ``HISTLOG_URL``; ``HISTLOG_TOKEN`` is its bearer
token, ``HISTLOG_TIMEOUT`` the seconds a call may take with its retries, default 30), which
``open`` answers with a ``HistoryClient``: the engine's methods over HTTP, so the commands make
the same calls either way. The commands that need the files themselves (``LOCAL``:
rebuild, replay, log verify, tail, bench, serve) are refused with ``--url`` here, before they run,
with one line saying what to run instead.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from engine.cli.exits import UsageError
from engine.facade import HistoryEngine

__all__ = ["DEFAULT_DATA", "DEFAULT_TOPIC", "LOCAL", "Target", "resolve"]

DEFAULT_DATA = "./histlog-data"
DEFAULT_TOPIC = "histlog.events"


@dataclass(frozen=True, slots=True)
class Target:
    """Where the history lives: the embedded data dir, Kafka plus this instance's state dir, or
    a histlog server (``url``, with its bearer ``token``)."""

    data: Path | None
    kafka: str | None = None
    topic: str = DEFAULT_TOPIC
    state: Path | None = None
    url: str | None = None
    token: str | None = None
    timeout: float = 30.0

    @property
    def embedded(self) -> bool:
        return self.kafka is None and self.url is None

    @property
    def state_dir(self) -> Path:
        if self.kafka is None:
            assert self.data is not None  # Invariant: an embedded target always has a data dir.
            return self.data / "state"
        assert self.state is not None  # Invariant: resolve() refuses Kafka without --state.
        return self.state

    def describe(self) -> str:
        if self.url is not None:
            return f"histlog server {self.url}"
        if self.kafka is None:
            return f"embedded data dir {self.data}"
        return f"Kafka {self.kafka} topic {self.topic} (state {self.state})"

    def open(self, *, progress: Callable[[int, int], None] | None = None, rebuild: bool = False,
             accept_log_loss: bool = False, partitions: int | None = None,
             owned: Iterable[int] | None = None) -> HistoryEngine:
        """Open the engine on this target (the one place the CLI opens one). A server target
        opens a ``HistoryClient``: it has every method the commands ``resolve`` lets through with
        ``--url`` call (the others are refused there), with the same results and errors."""
        if self.url is not None:
            from engine.client import HistoryClient  # httpx: only when a server is the target

            # Invariant: resolve() admits with --url only commands whose calls HistoryClient offers.
            return cast(HistoryEngine, HistoryClient(self.url, token=self.token, timeout=self.timeout))
        if self.kafka is None:
            return HistoryEngine.open(self.data, progress=progress, rebuild=rebuild, accept_log_loss=accept_log_loss,
                                      partitions=partitions, owned=owned)
        return HistoryEngine.open(kafka=self.kafka, topic=self.topic, state_dir=self.state, progress=progress,
                                  rebuild=rebuild, accept_log_loss=accept_log_loss, partitions=partitions, owned=owned)


def _flag(ns: argparse.Namespace, name: str) -> str | None:
    """A global option's value; an empty one is refused rather than read as "not given"."""
    value: str | None = getattr(ns, name, None)
    if value is not None and not value.strip():
        raise UsageError(f"--{name} is empty: give a value or leave the option out (see `histlog --help`)")
    return value


LOCAL: dict[str, str] = {
    "rebuild": "rebuild replays the log into this machine's state dir: run `histlog --data DIR rebuild` "
               "(or --kafka ... --state DIR) where the server's files are, with the server stopped",
    "replay": "replay rebuilds a custom projection in process: run `histlog --data DIR replay --projection ...` "
              "where the server's files are, with the server stopped",
    "log verify": "log verify reads the file log's segments: run `histlog --data DIR log verify` where the "
                  "server's data dir is",
    "tail": "tail follows the log in process: run `histlog --data DIR tail` where the files are, or follow one "
            "conversation over HTTP with `curl -N URL/v1/conversations/C/events`",
    "bench": "bench measures local engines and starts its own servers: run `histlog bench` without --url",
    "serve": "serve runs a server on --data DIR or --kafka: drop --url",
    "keys rotate": "keys rotate rewraps the key store's files: run `histlog --data DIR keys rotate ...` where "
                   "the server's data dir is, with the server stopped",
}
"""The commands that need the history's files or an engine in this process, and what to run
instead when ``--url`` names a server."""


def _command(ns: argparse.Namespace) -> str:
    sub = getattr(ns, "log_command", None)
    return f"{ns.command} {sub}" if sub else str(getattr(ns, "command", ""))


def _server(url: str, ns: argparse.Namespace, env: Mapping[str, str]) -> Target:
    if not url.startswith(("http://", "https://")) or len(url.split("://", 1)[1].strip("/")) == 0:
        raise UsageError(f"invalid --url {url!r}: expected http://HOST:PORT, e.g. http://127.0.0.1:8420")
    command = _command(ns)
    instead = LOCAL.get(command) or LOCAL.get(command.split(" ")[0])
    if instead is not None:
        raise UsageError(f"{command} does not run against a server (--url {url}): {instead}")
    text = env.get("HISTLOG_TIMEOUT") or "30"
    try:
        timeout = float(text)
    except ValueError:
        timeout = -1.0
    if not 0 < timeout < float("inf"):
        raise UsageError(f"invalid HISTLOG_TIMEOUT {text!r}: expected seconds > 0, e.g. 30")
    return Target(None, url=url, token=env.get("HISTLOG_TOKEN") or None, timeout=timeout)


def resolve(ns: argparse.Namespace, env: Mapping[str, str] | None = None) -> Target:
    """Flags win over ``HISTLOG_*`` environment variables; an explicit ``--data`` means embedded,
    an explicit ``--url`` a server."""
    env = os.environ if env is None else env
    data_flag, kafka_flag, topic_flag, state_flag, url_flag = (
        _flag(ns, name) for name in ("data", "kafka", "topic", "state", "url"))
    if data_flag is not None and kafka_flag is not None:
        raise UsageError("give either --data DIR (embedded) or --kafka HOST:PORT, not both")
    if url_flag is not None and (data_flag is not None or kafka_flag is not None):
        raise UsageError("give either --url URL (a server) or --data / --kafka (local files), not both")
    if url_flag is None and data_flag is None and kafka_flag is None and env.get("HISTLOG_URL"):
        url_flag = env["HISTLOG_URL"]
    if url_flag is not None:
        if topic_flag is not None or state_flag is not None:
            raise UsageError("--topic and --state apply to --kafka; with --url the server has its own")
        return _server(url_flag, ns, env)
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
