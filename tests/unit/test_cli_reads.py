"""The library reads behind ``histlog turns`` and ``histlog read --window``, and ``histlog stats``.

``HistoryEngine.turns`` must equal ``turn()`` asked for each turn, and cost O(what it returns):
the keys it visits (``StateStore.keys_read``) do not grow with messages before the first turn or
with replaced (hidden) turns. ``HistoryEngine.window_entries`` must be ``window()`` with the
stored positions, from the same rows, at the same O(window) cost.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TypeVar

import pytest

from engine.cli import main
from engine.facade import EngineStats, HistoryEngine
from schemas.batch import Batch, HistoryTurn, StoredMessage
from schemas.messages import Message, Role, ToolCallPart, ToolOutput, ToolResultPart

T = TypeVar("T")
SLACK = 4  # the conversation row, the turn-index seek, the key past the scanned range


def _turn(k: int) -> list[Message]:
    """A user message, a tool round on even turns, a system note on every third of the first
    100 turns, an answer."""
    out = [Message.user(f"question {k}")]
    if k % 2 == 0:
        out += [Message.assistant(ToolCallPart(f"call-{k}", "lookup", "{}")),
                Message.tool(ToolResultPart(f"call-{k}", "lookup", ToolOutput.text(f"result {k}")))]
    if k % 3 == 0 and k < 100:
        out.append(Message.system(f"note {k}"))
    return [*out, Message.assistant(f"answer {k}")]


def _write(engine: HistoryEngine, conv: str, before_first_turn: int, turns: range, replaced: int = 0,
           filler: int = 0) -> None:
    """``before_first_turn`` messages of turn 0, ``filler`` turns without system notes, the
    turns ``turns``, then the latest turn replaced ``replaced`` times (each hides the one before)."""
    head = [Message.system("You are terse.")] + [Message.assistant(f"greeting {i}") for i in range(before_first_turn)]
    engine.append(Batch(conv, "head", head))
    for k in [*range(1000, 1000 + filler), *turns]:
        engine.append(Batch(conv, f"t{k}", _turn(k)))
    for r in range(replaced):
        latest = engine.latest_turn(conv)
        assert latest is not None
        engine.replace_turn(Batch(conv, f"r{r}", _turn(100 + r)), latest.id, "edit")


@dataclass
class Store:
    engine: HistoryEngine

    def cost(self, read: Callable[[], T]) -> tuple[T, int]:
        before = self.engine._store.keys_read
        result = read()
        return result, self.engine._store.keys_read - before


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    with HistoryEngine.open(tmp_path_factory.mktemp("cli-reads"), fsync="never") as engine:
        _write(engine, "plain", 0, range(30))
        _write(engine, "heavy", 300, range(30), replaced=120)  # 300 messages before turn 1, 120 hidden turns
        _write(engine, "long", 0, range(30), filler=2000)  # plain's 30 turns after 2,000 others
        _write(engine, "system-only", 2, range(0))
        yield Store(engine)


def _reference_turns(entries: list[StoredMessage]) -> list[HistoryTurn]:
    """The visible turns by definition: the entries of each turn position > 0, in stored order."""
    groups: dict[int, list[StoredMessage]] = {}
    for e in entries:
        if e.position.turn > 0:
            groups.setdefault(e.position.turn, []).append(e)
    out = []
    for turn, messages in groups.items():
        answers = [m.id for m in messages if m.message.role is Role.ASSISTANT]
        out.append(HistoryTurn(messages[0].id, turn, messages[0].id, answers[-1] if answers else None, messages))
    return out


@pytest.mark.parametrize("conv", ["plain", "heavy", "long"])
def test_turns_equals_turn_for_each_and_the_definition(store: Store, conv: str) -> None:
    engine = store.engine
    turns = engine.turns(conv)
    assert turns == [engine.turn(conv, t.id) for t in turns]
    assert turns == _reference_turns(engine.entries(conv))
    assert turns[-1] == engine.latest_turn(conv)
    assert any(m.message.role is Role.SYSTEM for t in turns for m in t.messages)  # system notes stay in their turn


def test_turns_of_no_turn_at_all(store: Store) -> None:
    engine = store.engine
    assert engine.turns("system-only") == [] and engine.latest_turn("system-only") is None
    assert engine.turns("never-written") == []


def test_turns_visits_the_messages_it_returns_and_nothing_before_or_hidden(store: Store) -> None:
    plain, plain_keys = store.cost(lambda: store.engine.turns("plain"))
    heavy, heavy_keys = store.cost(lambda: store.engine.turns("heavy"))
    returned = sum(len(t.messages) for t in heavy)
    assert len(heavy) == len(plain) == 30
    assert heavy_keys <= returned + SLACK, (heavy_keys, returned)
    assert plain_keys <= sum(len(t.messages) for t in plain) + SLACK
    # 300 messages before the first turn and 120 hidden turns later, it still reads only what it returns
    assert heavy_keys - returned == plain_keys - sum(len(t.messages) for t in plain)


def test_turns_costs_far_less_than_a_turn_call_per_turn(store: Store) -> None:
    """What ``histlog turns`` did before: every entry, then ``turn()`` for each turn."""
    _, one_pass = store.cost(lambda: store.engine.turns("heavy"))
    _, per_turn = store.cost(lambda: [store.engine.turn("heavy", t.id) for t in store.engine.turns("heavy")])
    assert per_turn > 2 * one_pass


@pytest.mark.parametrize("conv", ["plain", "heavy", "long"])
@pytest.mark.parametrize("limit", [5, 12, 40])
def test_window_entries_is_the_window_with_its_stored_positions(store: Store, conv: str, limit: int) -> None:
    engine = store.engine
    window = engine.window_entries(conv, limit)
    assert window.messages == engine.window(conv, limit)
    stored = {e.id: e for e in engine.entries(conv)}
    assert all(stored[e.id] == e for e in window.entries)  # each is the stored entry, position and all
    assert all(e.message.role is not Role.SYSTEM for e in window.entries)
    assert window.system is not None and window.system.role is Role.SYSTEM
    positions = [e.position for e in window.entries]
    assert positions == sorted(positions)


@pytest.mark.parametrize("limit", [5, 12, 40])
def test_window_entries_costs_what_window_costs_and_not_the_history(store: Store, limit: int) -> None:
    """``long`` ends with ``plain``'s turns (and has the same system messages) after 2,000 more."""
    _, window_keys = store.cost(lambda: store.engine.window("long", limit))
    small, small_keys = store.cost(lambda: store.engine.window_entries("plain", limit))
    big, big_keys = store.cost(lambda: store.engine.window_entries("long", limit))
    assert big_keys == window_keys
    assert big.messages == small.messages and big.entries
    assert big_keys == small_keys, (small_keys, big_keys)
    systems = sum(e.message.role is Role.SYSTEM for e in store.engine.entries("long"))
    assert big_keys <= 2 * (systems + limit) + SLACK + 4, (big_keys, systems)  # the system rows, the window's


# --------------------------------------------------------------------------- the CLI over them


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(list(args)) == 0
    return capsys.readouterr().out


def test_read_window_labels_each_message_with_its_stored_position(capsys: pytest.CaptureFixture[str],
                                                                   tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    with HistoryEngine.open(data) as engine:
        _write(engine, "c", 1, range(4), replaced=2)
        window = engine.window_entries("c", 8)
    lines = _run(capsys, "--data", data, "read", "c", "--window", "8").splitlines()
    assert lines[0].startswith("[system] system: You are terse.")
    assert [re.match(r"\[(\d+:\d+)\]", line).group(1) for line in lines[1:]] == [  # type: ignore[union-attr]
        str(e.position) for e in window.entries]


def test_stats_prints_every_counter_in_text_and_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    with HistoryEngine.open(data) as engine:
        engine.append(Batch("c", "a1", [Message.user("hi")]))
        engine.append(Batch("c", "a2", [Message.user("again")]))
    counters = [f.name for f in fields(EngineStats) if f.name not in ("end_offsets", "applied_offsets", "lag")]
    assert {"accepted", "precondition_failed", "not_replaceable"} <= set(counters)
    as_json = json.loads(_run(capsys, "--data", data, "stats", "--json"))
    assert set(as_json) == {f.name for f in fields(EngineStats)} | {"poison"}
    text = _run(capsys, "--data", data, "stats").splitlines()
    rows = {line.split()[0]: line for line in text[3:]}
    for name in counters:
        assert re.fullmatch(rf"{name} +{as_json[name]}", rows[name]), rows
        assert len(rows[name]) == 25  # the numbers stay in one column
    assert as_json["accepted"] == 2
