"""The turns conformance suite (issue 7) on the embedded default: FileLog + RocksDB, 1 and 4 partitions."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from rocksdict import ReadOptions

from engine import HistoryEngine
from projections.store import Snapshot, StateStore
from schemas import Batch, HistoryLoad, HistoryTurn, Message, StoredMessage
from tests.conformance.backends import Embedded
from tests.conformance.turns_contract import TurnsContract, user_turn


class TestEmbeddedTurns(Embedded, TurnsContract):
    max_examples = 40


class TestEmbeddedTurnsFourPartitions(Embedded, TurnsContract):
    max_examples = 40
    partitions = 4


# -- the cost of hidden rows: reads stay O(window) -------------------------------------------------
# Deterministic cost, no clocks: ``StateStore.keys_read`` counts the keys a read was given, and a
# RocksDB iterator opened with ``max_skippable_internal_keys`` gives up (invalid, status
# Incomplete) once it has stepped over more internal entries (tombstones, old versions) than that,
# so a read that walks over hidden rows comes back different. bench/bench_turns.py measures time.
VISIBLE, REPLACED, SKIPPABLE = 10, 100, 16


@pytest.fixture(scope="module")
def two_histories(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HistoryEngine]:
    """``plain``: a system message and 10 turns. ``replaced``: the same visible history, after
    100 replacements of its newest turn (all hidden rows lie between its two newest turns)."""
    with HistoryEngine.open(tmp_path_factory.mktemp("cost"), fsync="never") as engine:
        for conv in ("plain", "replaced"):
            engine.append(Batch(conv, "s", [Message.system("be brief")]))
            for t in range(VISIBLE - 1):
                engine.append(user_turn(conv, f"t{t}", f"q{t}"))
        engine.append(user_turn("plain", "last", "q", "final"))
        engine.append(user_turn("replaced", "r0", "q", "draft 0"))
        for k in range(1, REPLACED + 1):
            engine.replace_turn(user_turn("replaced", f"r{k}", "q", "final" if k == REPLACED else f"draft {k}"),
                                f"r{k - 1}/0", "retry")
        yield engine


class _Bounded(Snapshot):
    """A query snapshot whose iterator refuses to step over more than ``limit`` internal keys."""

    def __init__(self, store: StateStore, limit: int) -> None:
        options = ReadOptions()
        options.set_max_skippable_internal_keys(limit)
        self._store = store
        self._it = store.db.iter(options)


def _answer(result: object) -> object:
    """A read's result without ids and positions (the two histories' append ids differ)."""
    if isinstance(result, list):
        return [m.canonical_json() for m in result]
    if isinstance(result, HistoryLoad):
        return ([getattr(m, "content", None) or m.message.canonical_json() for m in result.messages],
                result.truncated)
    if isinstance(result, HistoryTurn):
        return [m.message.canonical_json() for m in result.messages]
    if isinstance(result, StoredMessage):
        return result.message.canonical_json()
    return result


Read = Callable[[HistoryEngine, str], object]
WINDOW_READS: dict[str, Read] = {
    "window": lambda e, c: e.window(c, 7),
    "read_within_bytes": lambda e, c: e.read_within_bytes(c, 250),
    "turn_sources": lambda e, c: e.turn_sources(c, 250),
}
POINT_READS: dict[str, Read] = {
    "measure": lambda e, c: e.measure(c),
    "latest_turn": lambda e, c: e.latest_turn(c),
    "latest_interrupted_checkpoint": lambda e, c: e.latest_interrupted_checkpoint(c),
}


def _bounded_answer(engine: HistoryEngine, monkeypatch: pytest.MonkeyPatch, read: Read, conv: str) -> object:
    store = engine._store
    with monkeypatch.context() as m:
        m.setattr(store, "iterator", lambda: _Bounded(store, SKIPPABLE))
        return _answer(read(engine, conv))


@pytest.mark.parametrize("name", [*WINDOW_READS, *POINT_READS])
def test_hidden_rows_cost_no_keys(two_histories: HistoryEngine, name: str) -> None:
    read = {**WINDOW_READS, **POINT_READS}[name]
    engine, store = two_histories, two_histories._store
    visited = []
    for conv in ("plain", "replaced"):
        before = store.keys_read
        answer = _answer(read(engine, conv))
        visited.append(store.keys_read - before)
        assert answer == _answer(read(engine, "plain"))
    assert visited[0] == visited[1]


@pytest.mark.parametrize("name", [*WINDOW_READS, *POINT_READS])
def test_reads_of_a_history_without_replacements_skip_no_internal_keys(
        two_histories: HistoryEngine, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """The control of the next test: the bound changes nothing where nothing was hidden."""
    read = {**WINDOW_READS, **POINT_READS}[name]
    assert _bounded_answer(two_histories, monkeypatch, read, "plain") == _answer(read(two_histories, "plain"))


@pytest.mark.parametrize("name", list(POINT_READS))
def test_point_reads_do_not_walk_over_replaced_turns(
        two_histories: HistoryEngine, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    read = POINT_READS[name]
    assert _bounded_answer(two_histories, monkeypatch, read, "replaced") == _answer(read(two_histories, "plain"))


@pytest.mark.parametrize("name", list(WINDOW_READS))
def test_window_reads_do_not_walk_over_replaced_turns(
        two_histories: HistoryEngine, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    read = WINDOW_READS[name]
    assert _bounded_answer(two_histories, monkeypatch, read, "replaced") == _answer(read(two_histories, "plain"))
