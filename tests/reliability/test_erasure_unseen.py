"""``clear`` forgets in custom projections that do not see it (projections.erasure.forget_unseen):
one not registered in the process that clears, one stopped after an error. Their rows of the
cleared conversation's partition go with the clear (histlog cannot call their code, nor tell
their rows apart), and registering them again replays that partition to the state a rebuild
gives. A projection being caught up while the clear lands keeps its rows: its catch-up delivers
the ``ClearEvent`` itself. Real engine: FileLog, RocksDB, the file key store."""

from __future__ import annotations

import secrets
import threading
from pathlib import Path

import pytest

from engine.facade import HistoryEngine
from projections import ClearEvent, Projection, ProjectionTx
from projections.events import ProjectedEvent
from schemas import Batch, Message
from tests.reliability.erasure_support import ContentStore, Written, files_holding, needles_of, token_batch

WAIT = 30.0  # bound of every wait on another thread (never reached when the code is right)


def _written(conv: str, batch: Batch, token: str) -> Written:
    return Written(conv, [token], [batch])


def _state_of(engine: HistoryEngine, name: str) -> list[tuple[bytes, bytes]]:
    return engine.view(name).scan()


def _rebuilt(engine: HistoryEngine, projection: Projection) -> list[tuple[bytes, bytes]]:
    engine.rebuild(projection.name)
    return _state_of(engine, projection.name)


@pytest.mark.parametrize("partitions", [1, 4])
def test_a_projection_not_registered_at_the_clear_loses_the_conversation(tmp_path: Path, partitions: int) -> None:
    data = tmp_path / "data"
    token = secrets.token_hex(16)
    victim = token_batch("victim", "a-1", token)
    with HistoryEngine.open(data, partitions=partitions, fsync="never") as engine:
        engine.register(ContentStore())
        engine.append(victim)
        for i in range(8):
            engine.append(Batch(f"other-{i}", "a-1", [Message.user(f"keep {i}")]))
        before = _state_of(engine, ContentStore.name)
    assert any(token.encode() in v for _, v in before)  # the projection held the content
    with HistoryEngine.open(data, fsync="never") as engine:  # ContentStore is not registered here
        engine.clear("victim")
    found = files_holding(data, needles_of(_written("victim", victim, token)))
    assert not found, f"an unregistered projection kept the cleared content: {found}"
    with HistoryEngine.open(data, fsync="never") as engine:
        store = ContentStore()
        engine.register(store)
        after = _state_of(engine, store.name)
        assert not store.rows_of(engine, "victim")
        assert after == [(k, v) for k, v in before if not k.startswith(b"victim\x1f")]
        assert after == _rebuilt(engine, store)


class _Failing(ContentStore):
    """ContentStore that raises on a message saying "boom" (until ``fixed``)."""

    fixed = False

    def apply(self, event: ProjectedEvent, tx: ProjectionTx) -> None:
        if not self.fixed and not isinstance(event, ClearEvent) and any(m.text() == "boom" for m in event.messages):
            raise RuntimeError("boom")
        super().apply(event, tx)


def test_a_projection_stopped_by_an_error_loses_the_conversation(tmp_path: Path) -> None:
    data = tmp_path / "data"
    token = secrets.token_hex(16)
    victim = token_batch("victim", "a-1", token)
    with HistoryEngine.open(data, fsync="never") as engine:
        failing = _Failing()
        engine.register(failing)
        engine.append(victim)
        engine.append(Batch("other", "a-1", [Message.user("keep")]))
        engine.append(Batch("bomb", "a-1", [Message.user("boom")]))  # the projection stops here
        assert failing.name in engine._projector.projection_errors
        engine.clear("victim")
        found = files_holding(data, needles_of(_written("victim", victim, token)))
        assert not found, f"a stopped projection kept the cleared content: {found}"
        failing.fixed = True
        engine.register(failing)  # replays the partition from the log's start
        assert not failing.rows_of(engine, "victim")
        assert failing.rows_of(engine, "other") and failing.rows_of(engine, "bomb")
        assert _state_of(engine, failing.name) == _rebuilt(engine, failing)


class _Paused(ContentStore):
    """ContentStore that, during its catch-up, stops at the record at ``at`` until released."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at = at
        self.reached = threading.Event()
        self.release = threading.Event()

    def apply(self, event: ProjectedEvent, tx: ProjectionTx) -> None:
        if event.position.offset == self.at and not self.reached.is_set():
            self.reached.set()
            assert self.release.wait(WAIT), "the test never released the catch-up"
        super().apply(event, tx)


def test_a_projection_caught_up_meanwhile_keeps_its_rows_and_forgets_by_its_clear_event(tmp_path: Path) -> None:
    """Its first catch-up step (2,000 records) is committed, victim's rows with it, when the
    clear lands: dropping its state then would leave it without the rows of that step."""
    data = tmp_path / "data"
    token = secrets.token_hex(16)
    victim = token_batch("victim", "a-1", token)
    with HistoryEngine.open(data, fsync="never") as engine:
        engine.append(victim)  # offset 0
        for i in range(2100):
            engine.append(Batch(f"other-{i % 50}", f"a-{i}", [Message.user(f"keep {i}")]))
        paused = _Paused(at=2050)
        failures: list[BaseException] = []

        def register() -> None:
            try:
                engine.register(paused)
            except BaseException as e:  # reported by the main thread
                failures.append(e)

        registering = threading.Thread(target=register)
        registering.start()
        try:
            assert paused.reached.wait(WAIT), "the catch-up never reached its second step"
            engine.clear("victim")
        finally:
            paused.release.set()
            registering.join(WAIT)
        assert not registering.is_alive() and not failures, failures
        assert ("clear", "victim") in paused.seen  # its own catch-up gave it the ClearEvent
        assert not paused.rows_of(engine, "victim")
        found = files_holding(data, needles_of(_written("victim", victim, token)))
        assert not found, f"the projection caught up meanwhile kept the cleared content: {found}"
        assert len(_state_of(engine, paused.name)) == 2100
        assert _state_of(engine, paused.name) == _rebuilt(engine, ContentStore())
