"""The backends the contract suites run on, declared once.

A test module runs a contract on a backend by mixing one of these into the contract class, the
backend first, and setting ``partitions`` when it wants another count::

    class TestEmbeddedReadsFourPartitions(Embedded, ReadsContract):
        partitions = 4

* engines (``FacadeContract``, ``ProjectionContract``, ``ReadsContract``, ``TurnsContract``: the
  ``backend`` fixture): ``Embedded`` (FileLog + RocksDB under ``tmp_path``) and ``OnKafka`` (a real
  broker, from tests/kafka_broker.py; the module marks itself ``kafka``);
* logs (``LogContract``: the ``make_log`` fixture): ``MemoryLogs``, ``FileLogs``, ``KafkaLogs``;
* over the wire: ``OverHTTP`` (a ``HistoryClient`` on a real server over the embedded default) and
  ``OverAsyncHTTP`` (the same with an ``AsyncHistoryClient``).

Every log a ``make_log`` made is closed after the test (and a Kafka log's topic deleted).
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from engine import HistoryEngine
from engine.log.base import Log
from engine.log.file import FileLog
from engine.log.memory import MemoryLog
from engine.state import open_state
from tests.conformance.log_contract import MakeLog

__all__ = ["AsyncHTTPBackend", "AsyncServedClient", "Embedded", "FileBackend", "FileLogs", "HTTPBackend",
           "InMemory", "KafkaBackend", "KafkaLogs", "MemoryBackend", "MemoryLogs", "OnKafka", "OverAsyncHTTP",
           "OverHTTP", "ServedClient",
           "delete_topics", "kafka_logs_made", "logs_made_by"]


# -- engines ------------------------------------------------------------------------------------
class FileBackend:
    """The embedded default on ``path``: ``open()`` reopens the same log every time."""

    def __init__(self, path: Path, partitions: int | None = None) -> None:
        self.path, self.partitions = path, partitions

    def open(self) -> HistoryEngine:
        return HistoryEngine.open(self.path, partitions=self.partitions)

    def drop_state(self) -> None:
        shutil.rmtree(self.path / "state")


class KafkaBackend:
    """One Kafka topic; ``open(state)`` opens another instance with its own state directory."""

    def __init__(self, bootstrap: str, topic: str, state: Path, partitions: int = 1,
                 replication_factor: int = 1) -> None:
        self.bootstrap, self.topic, self.state = bootstrap, topic, state
        self.partitions, self.replication_factor = partitions, replication_factor

    def open(self, state: Path | None = None) -> HistoryEngine:
        return HistoryEngine.open(kafka=self.bootstrap, topic=self.topic, state_dir=state or self.state,
                                  partitions=self.partitions, replication_factor=self.replication_factor)

    def drop_state(self) -> None:
        shutil.rmtree(self.state)


class MemoryBackend:
    """The engine on an in-memory log (``MemoryLog``) and a real RocksDB state under ``state``:
    every ``open()`` is a new ``MemoryLog`` over the same records, as a restarted process sees a
    log that outlived it (the engine closes the log it was given)."""

    def __init__(self, state: Path, partitions: int = 1) -> None:
        self.state, self.partitions = state, partitions
        self.records: list[list[Any]] = [[] for _ in range(partitions)]

    def open(self) -> HistoryEngine:
        def make(_evidence: object) -> MemoryLog:
            log = MemoryLog(self.partitions)
            log._records = self.records  # the records outlive each log object
            return log

        log_, store = open_state(self.state, make, lambda _log: {"backend": "memory", "partitions": self.partitions},
                                 durable=True)
        return HistoryEngine(log_, store)

    def drop_state(self) -> None:
        shutil.rmtree(self.state)


class InMemory:
    """Runs the contract on ``MemoryBackend``."""

    partitions: ClassVar[int] = 1

    @pytest.fixture
    def backend(self, tmp_path: Path) -> MemoryBackend:
        return MemoryBackend(tmp_path / "state", self.partitions)


class Embedded:
    """Runs the contract on the embedded default (``partitions``: None = the log's own, 1 when new)."""

    partitions: ClassVar[int | None] = None

    @pytest.fixture
    def backend(self, tmp_path: Path) -> FileBackend:
        return FileBackend(tmp_path / "data", self.partitions)


class OnKafka:
    """Runs the contract on a real broker: a fresh topic per test, the state under ``tmp_path``."""

    partitions: ClassVar[int] = 1

    @pytest.fixture
    def backend(self, kafka_bootstrap: str, kafka_topic: str, tmp_path: Path) -> KafkaBackend:
        return KafkaBackend(kafka_bootstrap, kafka_topic, tmp_path / "state", partitions=self.partitions)


# -- logs ---------------------------------------------------------------------------------------
@contextlib.contextmanager
def logs_made_by(new: Callable[[int], Log]) -> Iterator[tuple[MakeLog, list[Log]]]:
    """A ``make_log(partitions=1)`` over ``new``, and the logs it made; each is closed on exit."""
    made: list[Log] = []

    def make_log(partitions: int = 1) -> Log:
        log = new(partitions)
        made.append(log)
        return log

    try:
        yield make_log, made
    finally:
        for log in made:
            log.close()


def delete_topics(bootstrap: str, topics: list[str]) -> None:
    """Best effort: keep an external broker (HISTLOG_KAFKA) tidy."""
    if not topics:
        return
    from kafka import KafkaAdminClient

    with contextlib.suppress(Exception):
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000,
                                 bootstrap_timeout_ms=10_000)
        try:
            admin.delete_topics(topics, timeout_ms=10_000, raise_errors=False)
        finally:
            admin.close()


@contextlib.contextmanager
def kafka_logs_made(bootstrap: str, name: str) -> Iterator[MakeLog]:
    """A ``make_log`` of KafkaLogs, each on a new topic named after ``name``; the logs are closed
    and their topics deleted on exit."""
    from engine.log.kafka import KafkaLog
    from tests.kafka_broker import unique_topic

    def new(partitions: int) -> Log:
        return KafkaLog(bootstrap, unique_topic(f"histlog-{name}"), partitions=partitions,
                        client_id="histlog-test", request_timeout_s=20)

    topics: list[str] = []
    try:
        with logs_made_by(new) as (make_log, made):
            try:
                yield make_log
            finally:
                topics = [log.topic for log in made if isinstance(log, KafkaLog)]
    finally:
        delete_topics(bootstrap, topics)


class MemoryLogs:
    """Runs the log contract on ``MemoryLog``."""

    @pytest.fixture
    def make_log(self) -> Iterator[MakeLog]:
        with logs_made_by(MemoryLog) as (make_log, _):
            yield make_log


class FileLogs:
    """Runs the log contract on ``FileLog`` (small segments, so rolling is exercised)."""

    @pytest.fixture
    def make_log(self, tmp_path: Path) -> Iterator[MakeLog]:
        n = itertools.count()
        with logs_made_by(lambda p: FileLog(tmp_path / f"log{next(n)}", p, segment_bytes=64 * 1024)) as (make_log, _):
            yield make_log


class KafkaLogs:
    """Runs the log contract on ``KafkaLog`` against a real broker."""

    @pytest.fixture
    def make_log(self, kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[MakeLog]:
        with kafka_logs_made(kafka_bootstrap, request.node.name) as make_log:
            yield make_log


# -- over the wire ------------------------------------------------------------------------------
class ServedClient:
    """What ``HTTPBackend.open`` returns: a ``HistoryClient`` on a real server (uvicorn on
    127.0.0.1, a free port) over an embedded engine; ``close()`` closes the client, stops the
    server, then closes the engine. Every facade call goes through the client; ``_store`` is the
    served engine's state, so the suites' "no I/O happened" checks count what the server read."""

    def __init__(self, engine: HistoryEngine) -> None:
        from engine import HistoryClient
        from tests.service.server_support import serving

        self._stack = contextlib.ExitStack()
        try:
            self._stack.enter_context(engine)
            url = self._stack.enter_context(serving(engine))
            self.client = self._stack.enter_context(HistoryClient(url, timeout=30.0))
        except BaseException:
            self._stack.close()
            raise
        self._store = engine._store

    def __getattr__(self, name: str) -> object:
        return getattr(self.client, name)

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> ServedClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class HTTPBackend:
    """An embedded default served over HTTP: ``open()`` reopens the same data dir behind a new
    server each time and hands back its client; ``drop_state()`` as ``FileBackend``'s."""

    def __init__(self, path: Path, partitions: int | None = None) -> None:
        self.files = FileBackend(path, partitions)

    def open(self) -> ServedClient:
        return ServedClient(self.files.open())

    def drop_state(self) -> None:
        self.files.drop_state()


class OverHTTP:
    """Runs the contract through ``HistoryClient`` -> ``histlog`` server -> embedded engine."""

    partitions: ClassVar[int | None] = None

    @pytest.fixture
    def backend(self, tmp_path: Path) -> HTTPBackend:
        return HTTPBackend(tmp_path / "data", self.partitions)


class AsyncServedClient(ServedClient):
    """``ServedClient`` with an ``AsyncHistoryClient`` inside: its coroutines run on an event
    loop of their own (one thread), each call waiting for its result, so the synchronous suites
    run unchanged on the asyncio face (threads of a suite share that loop, as tasks)."""

    def __init__(self, engine: HistoryEngine) -> None:
        import asyncio
        import threading

        from engine import AsyncHistoryClient
        from tests.service.server_support import serving

        self._loop = asyncio.new_event_loop()
        thread = threading.Thread(target=self._loop.run_forever, name="test-async-client", daemon=True)
        self._stack = contextlib.ExitStack()
        try:
            self._stack.enter_context(engine)
            url = self._stack.enter_context(serving(engine))
            thread.start()
            self._stack.callback(self._loop.close)
            self._stack.callback(thread.join, 10)
            self._stack.callback(self._loop.call_soon_threadsafe, self._loop.stop)
            self.aclient = AsyncHistoryClient(url, timeout=30.0)
            self._stack.callback(self._wait, self.aclient.close())
        except BaseException:
            self._stack.close()
            raise
        self._store = engine._store

    def _wait(self, coroutine: Any) -> Any:
        import asyncio

        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=60)

    def __getattr__(self, name: str) -> object:
        method = getattr(self.aclient, name)
        if not callable(method):
            return method
        return lambda *args, **kwargs: self._wait(method(*args, **kwargs))


class AsyncHTTPBackend(HTTPBackend):
    """``HTTPBackend`` whose ``open()`` hands back the asyncio client (``AsyncServedClient``)."""

    def open(self) -> ServedClient:
        return AsyncServedClient(self.files.open())


class OverAsyncHTTP:
    """Runs the contract through ``AsyncHistoryClient`` -> ``histlog`` server -> embedded engine."""

    partitions: ClassVar[int | None] = None

    @pytest.fixture
    def backend(self, tmp_path: Path) -> HTTPBackend:
        return AsyncHTTPBackend(tmp_path / "data", self.partitions)


class KafkaHTTPBackend:
    """A Kafka engine served over HTTP: ``open(state)`` opens an instance on the topic (its own
    state directory) behind a new server and hands back its client; ``drop_state()`` as
    ``KafkaBackend``'s."""

    def __init__(self, kafka: KafkaBackend) -> None:
        self.kafka = kafka

    def open(self, state: Path | None = None) -> ServedClient:
        return ServedClient(self.kafka.open(state))

    def drop_state(self) -> None:
        self.kafka.drop_state()


class OverHTTPOnKafka:
    """Runs the contract through ``HistoryClient`` -> ``histlog`` server -> an engine on a real
    broker (a fresh topic per test, the state under ``tmp_path``)."""

    partitions: ClassVar[int] = 1

    @pytest.fixture
    def backend(self, kafka_bootstrap: str, kafka_topic: str, tmp_path: Path) -> KafkaHTTPBackend:
        return KafkaHTTPBackend(KafkaBackend(kafka_bootstrap, kafka_topic, tmp_path / "state",
                                             partitions=self.partitions))
