"""Real Apache Kafka brokers for the tests (loaded by tests/conftest.py via ``pytest_plugins``).

Fixtures:

* ``kafka_bootstrap`` (session): ``"host:port[,...]"`` of a broker shared by the session, found in
  this order: the ``HISTLOG_KAFKA`` env var (an external broker, never stopped by us) →
  testcontainers' ``KafkaContainer`` when a Docker engine answers → ``scripts/kafka start``
  (a KRaft broker from Maven Central jars on a free loopback port, stopped at session end).
* ``kafka_broker1`` (module): a dedicated single-node ``KafkaCluster`` the test may stop and
  start again (broker-down tests). Always the Maven-jar broker.
* ``kafka_cluster3`` (module): a dedicated 3-node ``KafkaCluster`` with ``kill_node(n)`` (kill -9)
  and ``start_node(n)``. Mark its users ``@pytest.mark.slow``.
* ``kafka_topic`` (function): a unique topic name per test; ``unique_topic(prefix)`` does the same.

When no broker can be had: under ``CI=true`` the test FAILS with the reason, otherwise it is skipped.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "kafka"
START_TIMEOUT_S = 120.0

__all__ = ["KafkaCluster", "broker_unavailable", "unique_topic"]


def broker_unavailable(reason: str) -> NoReturn:
    """Fail under CI (a broker is required there), skip elsewhere."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"no Kafka broker: {reason}", pytrace=False)
    pytest.skip(f"no Kafka broker: {reason}")


def unique_topic(prefix: str = "histlog-test") -> str:
    """A topic name no other test uses (legal Kafka characters only)."""
    clean = re.sub(r"[^A-Za-z0-9._-]+", "-", prefix).strip("-.")[:150] or "t"
    return f"{clean}-{uuid.uuid4().hex[:10]}"


def _script(*args: str, timeout: float = START_TIMEOUT_S + 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=timeout, check=False)


def _bootstrap_from(out: str) -> str:
    lines = [ln for ln in out.strip().splitlines() if ln.startswith("bootstrap=")]
    if not lines:
        raise RuntimeError(f"scripts/kafka printed no bootstrap= line: {out[-500:]!r}")
    return lines[-1].split("=", 1)[1].strip()


@dataclass
class KafkaCluster:
    """A broker cluster started by ``scripts/kafka`` in ``dir``; this process owns it."""

    dir: Path
    nodes: int
    bootstrap: str = ""
    stopped: set[int] = field(default_factory=set)

    @classmethod
    def start_new(cls, dir: Path, nodes: int = 1) -> KafkaCluster:
        cluster = cls(dir=dir, nodes=nodes)
        cluster.start()
        return cluster

    def _run(self, *args: str) -> str:
        proc = _script(*args, "--dir", str(self.dir))
        if proc.returncode != 0:
            lines = proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"]
            detail = "\n".join(lines[-40:-1])
            raise RuntimeError(f"scripts/kafka {' '.join(args)} failed: {lines[-1]}"
                               + (f"\n{detail}" if detail else ""))
        return proc.stdout

    def start(self) -> str:
        """Start every node (a new cluster, or the stopped one with its storage and ports)."""
        args = ["start", "--timeout", str(START_TIMEOUT_S)]
        if not (self.dir / "cluster.json").exists():
            args += ["--nodes", str(self.nodes)]
        self.bootstrap = _bootstrap_from(self._run(*args))
        self.stopped.clear()
        return self.bootstrap

    def stop(self) -> None:
        """TERM every node (KILL after a bounded wait); storage stays for ``start()``."""
        self._run("stop")
        self.stopped = set(range(1, self.nodes + 1))

    def kill_node(self, node: int) -> None:
        """kill -9 node ``node`` (1-based)."""
        self._run("kill-node", str(node))
        self.stopped.add(node)

    def start_node(self, node: int) -> None:
        """Restart a stopped node with its existing storage and wait until it serves."""
        self._run("start-node", str(node), "--timeout", str(START_TIMEOUT_S))
        self.stopped.discard(node)

    def node_log(self, node: int) -> Path:
        return self.dir / f"node-{node}" / "server.log"

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stop()


def _start_script_cluster(tmp_path_factory: pytest.TempPathFactory, name: str, nodes: int) -> KafkaCluster:
    directory = tmp_path_factory.mktemp(name)
    try:
        return KafkaCluster.start_new(directory, nodes)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        with contextlib.suppress(Exception):
            _script("stop", "--dir", str(directory), timeout=60)
        broker_unavailable(f"scripts/kafka could not start a {nodes}-node broker: {exc}")


def _docker_answers() -> bool:
    """True only when a Docker engine responds (quickly); the client binary alone is not enough."""
    host = os.environ.get("DOCKER_HOST", "")
    if not host and not Path("/var/run/docker.sock").exists():
        return False
    try:
        import docker

        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


def _testcontainers_kafka() -> Any:
    try:
        from testcontainers.community.kafka import KafkaContainer
    except ImportError:
        from testcontainers.kafka import KafkaContainer
    return KafkaContainer().with_kraft()


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A broker for the whole session: env var → testcontainers (Docker) → scripts/kafka."""
    external = os.environ.get("HISTLOG_KAFKA", "").strip()
    if external:
        yield external
        return
    if _docker_answers():
        container = None
        try:
            container = _testcontainers_kafka()
            container.start()
        except Exception as exc:  # fall through to the jar broker
            sys.stderr.write(f"testcontainers Kafka failed ({exc}); using scripts/kafka\n")
            with contextlib.suppress(Exception):
                if container is not None:
                    container.stop()
            container = None
        if container is not None:
            try:
                yield str(container.get_bootstrap_server())
            finally:
                container.stop()
            return
    cluster = _start_script_cluster(tmp_path_factory, "kafka-session", 1)
    try:
        yield cluster.bootstrap
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def kafka_broker1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """A dedicated single-node broker this module may stop and restart."""
    cluster = _start_script_cluster(tmp_path_factory, "kafka-dedicated", 1)
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def kafka_cluster3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """A dedicated 3-node KRaft cluster (each node broker+controller) for fault tests."""
    cluster = _start_script_cluster(tmp_path_factory, "kafka-cluster3", 3)
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def kafka_topic(request: pytest.FixtureRequest) -> str:
    """A unique topic name for this test."""
    return unique_topic(f"histlog-{request.node.name}")
