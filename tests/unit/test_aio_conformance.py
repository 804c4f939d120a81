"""The facade, reads and turns contracts through ``AsyncHistoryEngine``: every call of the suites
runs as a coroutine on an event loop (its own thread), so the asyncio face is proven by the same
rules as the thread face (same results, same errors), on the embedded default (real FileLog +
RocksDB under ``tmp_path``)."""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engine import HistoryEngine
from engine.aio import AsyncHistoryEngine
from tests.conformance.backends import FileBackend
from tests.conformance.facade_contract import FacadeContract
from tests.conformance.reads_contract import ReadsContract
from tests.conformance.turns_contract import TurnsContract

_CALL_TIMEOUT = 60.0  # a bound on one call, far above any of the suites' own waits


class _Loop:
    """An event loop running on its own thread until ``stop``."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="aio-conformance-loop", daemon=True)
        self._thread.start()

    def run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(_CALL_TIMEOUT)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(_CALL_TIMEOUT)
        self.loop.close()


class ThroughLoop:
    """A ``HistoryEngine`` whose every method that ``AsyncHistoryEngine`` has runs through it on
    the loop (the rest, e.g. ``register``, ``subscribe``, ``close``, ``log``: the engine itself)."""

    def __init__(self, engine: HistoryEngine, loop: _Loop) -> None:
        self._engine, self._aio, self._loop = engine, AsyncHistoryEngine(engine), loop

    def __getattr__(self, name: str) -> Any:
        face = getattr(AsyncHistoryEngine, name, None)
        if face is None or not inspect.iscoroutinefunction(face):
            return getattr(self._engine, name)
        method: Callable[..., Any] = getattr(self._aio, name)
        return lambda *args, **kwargs: self._loop.run(method(*args, **kwargs))

    def __enter__(self) -> ThroughLoop:
        return self

    def __exit__(self, *exc: object) -> None:
        self._engine.close()


class LoopBackend(FileBackend):
    def __init__(self, path: Path, partitions: int | None, loop: _Loop) -> None:
        super().__init__(path, partitions)
        self.loop = loop

    def open(self) -> Any:
        return ThroughLoop(super().open(), self.loop)


class ThroughAsync:
    partitions: int | None = None

    @pytest.fixture
    def backend(self, tmp_path: Path) -> Iterator[LoopBackend]:
        loop = _Loop()
        try:
            yield LoopBackend(tmp_path / "data", self.partitions, loop)
        finally:
            loop.stop()


def test_every_coroutine_of_the_face_is_a_method_of_the_engine() -> None:
    faces = {n for n, f in vars(AsyncHistoryEngine).items() if inspect.iscoroutinefunction(f) and n[0] != "_"}
    assert "append" in faces and "window" in faces
    for name in faces:
        assert inspect.signature(getattr(AsyncHistoryEngine, name)).parameters.keys() == inspect.signature(
            getattr(HistoryEngine, name)).parameters.keys(), name


class TestFacadeThroughAsync(ThroughAsync, FacadeContract):
    pass


class TestFacadeThroughAsyncFourPartitions(ThroughAsync, FacadeContract):
    partitions = 4


class TestReadsThroughAsync(ThroughAsync, ReadsContract):
    pass


class TestTurnsThroughAsync(ThroughAsync, TurnsContract):
    pass
