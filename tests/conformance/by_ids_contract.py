"""Reads by ids and clears by prefix (API.md "Runs, slots, assets, deletes": ``entries_by_ids``,
``turn_sources_by_ids``, ``clear_prefix``), stated against a reference written here over
``engine.entries(...)``, and run by every backend (``ReadsContract`` includes it: file, memory,
Kafka, the async face and both HTTP clients).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import strategies as st

from schemas import (
    Batch,
    InvalidConversationID,
    InvalidWindow,
    Message,
    StoredMessage,
    TurnSource,
)
from tests.conformance.turns_model import content_json, is_interrupted

__all__ = ["ByIdsContract", "check_by_ids", "reference_by_ids"]


def reference_by_ids(es: Sequence[StoredMessage], ids: Sequence[str]) -> list[StoredMessage]:
    """The visible entries named, in history order, each once."""
    named = set(ids)
    return [e for e in es if e.id in named]


def as_source(e: StoredMessage) -> TurnSource:
    return TurnSource(e.id, e.message.role, content_json(e.message), e.created_at, is_interrupted(e.message))


def check_by_ids(engine: Any, conv: str, data: st.DataObject) -> None:
    """``entries_by_ids`` and ``turn_sources_by_ids`` of a drawn mix of visible, hidden,
    unknown, repeated and malformed ids equal the reference over ``entries``."""
    es = engine.entries(conv)
    hidden = [e.id for e in engine.entries(conv, include_hidden=True) if e.superseded_by is not None]
    junk = ["nope/0", "not-an-id", "a/01", "/0", *(f"{e.append_id}/99" for e in es[:1])]
    pool = [e.id for e in es] + hidden + junk
    ids = data.draw(st.lists(st.sampled_from(pool), max_size=12), label=f"{conv} ids") if pool else []
    want = reference_by_ids(es, ids)
    assert engine.entries_by_ids(conv, ids) == want, (conv, ids)
    assert engine.turn_sources_by_ids(conv, ids) == [as_source(e) for e in want], (conv, ids)


class ByIdsContract:
    """Hand-written cases on one backend (the ``engine`` fixture is ``ReadsContract``'s)."""

    def test_by_ids_skip_hidden_and_unknown_ids_and_keep_history_order(self, engine: Any) -> None:
        engine.append(Batch("ids", "a", [Message.user("q1"), Message.assistant("r1")]))
        engine.append(Batch("ids", "b", [Message.user("q2"), Message.assistant("r2", metadata={"interrupted": True})]))
        es = engine.entries("ids")
        got = engine.entries_by_ids("ids", ["b/1", "a/0", "b/1", "zz/0", "a/7", "junk"])
        assert got == [es[0], es[3]]
        sources = engine.turn_sources_by_ids("ids", ("b/1",))
        assert [(s.id, s.interrupted) for s in sources] == [("b/1", True)]
        latest = engine.latest_turn("ids")
        engine.replace_turn(Batch("ids", "c", [Message.user("q2 again")]), latest.id, "edit")
        assert [e.id for e in engine.entries_by_ids("ids", ["b/0", "b/1", "c/0", "a/1"])] == ["a/1", "c/0"]
        assert [s.id for s in engine.turn_sources_by_ids("ids", ["b/0", "c/0"])] == ["c/0"]
        assert engine.entries_by_ids("ids", []) == [] and engine.entries_by_ids("never-written", ["a/0"]) == []

    def test_by_ids_refuse_bad_input_before_any_read(self, engine: Any) -> None:
        for bad in ("a/0", None, ["a/0", 7], ["x/0"] * 10_001):
            with pytest.raises(InvalidWindow, match="ids"):
                engine.entries_by_ids("ids", bad)
            with pytest.raises(InvalidWindow, match="ids"):
                engine.turn_sources_by_ids("ids", bad)
        assert len(engine.entries_by_ids("ids", ["x/0"] * 10_000)) == 0  # the limit itself is allowed

    def test_clear_prefix_clears_the_open_conversations_it_names_once(self, engine: Any) -> None:
        for bot in ("bot-1/", "bot-2/", "bot-10/"):
            for user in range(3):
                engine.append(Batch(f"{bot}u{user}", "a", [Message.user(f"hi from {bot}{user}")]))
        engine.clear("bot-1/u0")
        assert engine.clear_prefix("bot-1/") == 2  # u0 was cleared already: not open
        assert engine.conversations(prefix="bot-1") == ["bot-10/u0", "bot-10/u1", "bot-10/u2"]
        assert engine.entries("bot-1/u1") == [] and engine.read("bot-2/u2") != []
        assert engine.clear_prefix("bot-1/") == 0  # idempotent
        with pytest.raises(Exception, match="closed"):
            engine.append(Batch("bot-1/u2", "b", [Message.user("too late")]))
        for bad in ("", None):
            with pytest.raises(InvalidConversationID, match="prefix"):
                engine.clear_prefix(bad)
        assert engine.conversations(prefix="bot-2/") == ["bot-2/u0", "bot-2/u1", "bot-2/u2"]
