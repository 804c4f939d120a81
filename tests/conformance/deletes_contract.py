"""Message deletes (API.md "Runs, slots, assets, deletes": ``delete_messages``), run by every
backend (``ReadsContract`` includes it: file, memory, Kafka, the async face and both HTTP clients).
"""

from __future__ import annotations

from typing import Any

import pytest

from schemas import (
    AssetRef,
    Batch,
    ConversationClosed,
    Fenced,
    HistoryPosition,
    InvalidWindow,
    Message,
    NotFound,
)

__all__ = ["DeletesContract"]


def _turn(c: str, a: str, question: str, *replies: str) -> Batch:
    return Batch(c, a, [Message.user(question), *(Message.assistant(r) for r in replies or (f"re {question}",))])


def _ids(rows: Any) -> list[str]:
    return [m.id for m in rows]


class DeletesContract:
    """Hand-written cases on one backend (the ``engine`` fixture is ``ReadsContract``'s)."""

    def test_deleted_messages_leave_every_read(self, engine: Any) -> None:
        c = "deletes"
        engine.append(Batch(c, "s", [Message.system("be brief")]))
        engine.append(_turn(c, "a", "one", "r1"))
        engine.append(_turn(c, "b", "two", "r2a", "r2b"))
        engine.append(_turn(c, "c", "three", "r3"))
        before = engine.measure(c)
        assert engine.delete_messages(c, ["b/1", "a/1", "nope/0", "b/1"]) == 2
        assert _ids(engine.entries(c)) == ["s/0", "a/0", "b/0", "b/2", "c/0", "c/1"]
        assert _ids(engine.entries(c, order="desc", limit=2)) == ["c/1", "c/0"]
        # Seqs stay: b/0 is (2, 4), the deleted b/1 was (2, 5), b/2 is (2, 6), c/1 is (3, 8).
        assert _ids(engine.entries(c, after=HistoryPosition(2, 5))) == ["b/2", "c/0", "c/1"]
        assert _ids(engine.entries(c, after=HistoryPosition(2, 4), before=HistoryPosition(3, 8))) == ["b/2", "c/0"]
        assert _ids(engine.entries(c, after=HistoryPosition(2, 4), before=HistoryPosition(2, 6))) == []
        after = engine.measure(c)
        assert (after.messages, after.turns) == (before.messages - 2, before.turns)
        assert after.content_bytes == sum(len(m.message.content_json()) for m in engine.entries(c))
        assert _ids(engine.entries_by_ids(c, ["b/1", "b/2", "a/1", "c/0"])) == ["b/2", "c/0"]
        assert [s.id for s in engine.turn_sources_by_ids(c, ["a/1", "b/2"])] == ["b/2"]
        assert [t.id for t in engine.turns(c)] == ["a/0", "b/0", "c/0"]
        assert _ids(engine.turn(c, "b/0").messages) == ["b/0", "b/2"]
        assert _ids(engine.window_entries(c, 5).entries) == ["b/0", "b/2", "c/0", "c/1"]  # whole turns
        assert "r2a" not in str([m.message for m in engine.read_within_bytes(c, 1 << 20).messages])
        with pytest.raises(NotFound, match="deleted"):
            engine.turn(c, "a/1")

    def test_a_turn_whose_messages_are_all_deleted_disappears(self, engine: Any) -> None:
        c = "deletes-turn"
        engine.append(_turn(c, "a", "one"))
        engine.append(_turn(c, "b", "two"))
        engine.append(_turn(c, "c", "three"))
        assert engine.delete_messages(c, ["b/0", "b/1"]) == 2
        assert [(t.id, t.position) for t in engine.turns(c)] == [("a/0", 1), ("c/0", 3)]
        assert engine.measure(c).turns == 2
        assert engine.delete_messages(c, ["c/0", "c/1"]) == 2
        latest = engine.latest_turn(c)
        assert latest is not None and latest.id == "a/0"
        engine.append(_turn(c, "d", "four"))  # the next turn sorts after every position ever given
        assert [(t.id, t.position) for t in engine.turns(c)] == [("a/0", 1), ("d/0", 4)]
        assert engine.delete_messages(c, ["a/0", "a/1", "d/0", "d/1"]) == 4
        assert engine.entries(c) == [] and engine.turns(c) == [] and engine.latest_turn(c) is None
        assert engine.measure(c).messages == 0

    def test_a_turn_keeps_its_id_when_its_first_message_is_deleted(self, engine: Any) -> None:
        c = "deletes-turn-id"
        engine.append(_turn(c, "a", "one", "r1"))
        engine.append(_turn(c, "b", "two", "r2"))
        assert engine.delete_messages(c, ["b/0"]) == 1
        latest = engine.latest_turn(c)
        assert latest is not None and latest.id == "b/0" and _ids(latest.messages) == ["b/1"]
        engine.replace_turn(_turn(c, "b2", "two, edited"), "b/0", "edit")  # the id still names the turn
        assert _ids(engine.entries(c)) == ["a/0", "a/1", "b2/0", "b2/1"]

    def test_deleting_again_or_unknown_ids_is_a_no_op_and_nothing_comes_back(self, engine: Any) -> None:
        c = "deletes-idem"
        batch = _turn(c, "a", "one")
        engine.append(batch)
        assert engine.delete_messages(c, ["a/1"]) == 1
        assert engine.delete_messages(c, ["a/1", "a/9", "zz/0", "not an id"]) == 0
        assert engine.delete_messages(c, []) == 0
        assert engine.delete_messages("deletes-never-written", ["a/0"]) == 0
        receipt = engine.append(batch)  # the same append again: a duplicate, never resurrected
        assert receipt.append_id == "a" and _ids(engine.entries(c)) == ["a/0"]
        engine.append(_turn(c, "b", "two"))
        assert _ids(engine.entries(c)) == ["a/0", "b/0", "b/1"]

    def test_hidden_messages_can_be_deleted_too(self, engine: Any) -> None:
        c = "deletes-hidden"
        engine.append(_turn(c, "a", "one"))
        engine.replace_turn(_turn(c, "b", "one, edited"), "a/0", "edit")
        assert engine.delete_messages(c, ["a/0", "a/1"]) == 0  # hidden: removed, but none was visible
        assert _ids(engine.entries(c, include_hidden=True)) == ["b/0", "b/1"]

    def test_assets_of_a_deleted_message_go_with_it(self, engine: Any) -> None:
        c = "deletes-assets"
        engine.append(_turn(c, "a", "look"))
        image = AssetRef("sha256:" + "ab" * 32, "image", 0)
        engine.link_assets(c, "a/0", [image])
        assert engine.delete_messages(c, ["a/0"]) == 1
        with pytest.raises(NotFound):
            engine.link_assets(c, "a/0", [image])
        assert [m.assets for m in engine.entries(c)] == [()]

    def test_locate_by_external_id_skips_deleted_messages(self, engine: Any) -> None:
        c = "deletes-locate"
        engine.append(Batch(c, "a", [Message.user("hi", metadata={"external_id": "wa-1"}),
                                     Message.assistant("hello", metadata={"external_id": "wa-2"})]))
        engine.append(Batch(c, "b", [Message.user("again", metadata={"external_id": "wa-3"})]))
        assert engine.delete_messages(c, ["a/0"]) == 1
        with pytest.raises(NotFound):
            engine.locate(c, "wa-1")
        found = engine.locate(c, "wa-3", before=5)
        assert found.message.id == "b/0" and _ids(found.before) == ["a/1"]

    def test_fences_and_clears_refuse_a_delete(self, engine: Any) -> None:
        c = "deletes-fenced"
        engine.append(_turn(c, "a", "one"))
        old = engine.begin_run(c, "run-1")
        engine.begin_run(c, "run-2")
        with pytest.raises(Fenced):
            engine.delete_messages(c, ["a/0"], fence=old)
        assert _ids(engine.entries(c)) == ["a/0", "a/1"]
        engine.clear(c)
        with pytest.raises(ConversationClosed):
            engine.delete_messages(c, ["a/0"])

    def test_bad_ids_are_refused_before_any_write(self, engine: Any) -> None:
        c = "deletes-bad"
        engine.append(_turn(c, "a", "one"))
        for bad in ("a/0", None, [1], ["a/0", None], ["a/0"] * 10_001):
            with pytest.raises(InvalidWindow, match="ids"):
                engine.delete_messages(c, bad)
        assert _ids(engine.entries(c)) == ["a/0", "a/1"]
