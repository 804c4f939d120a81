"""Turn slots (API.md "Runs, slots, assets, deletes": ``allocate_turn``, ``append(batch,
turn=slot)``), run by every backend (``ReadsContract`` includes it: file, memory, Kafka, the
async face and both HTTP clients).
"""

from __future__ import annotations

from typing import Any

import pytest

from schemas import (
    Batch,
    ConversationClosed,
    HistoryPosition,
    InvalidBatch,
    InvalidRequest,
    Message,
    SlotUnavailable,
    TurnSlot,
)

__all__ = ["SlotsContract"]


def _turn(c: str, a: str, question: str) -> Batch:
    return Batch(c, a, [Message.user(question), Message.assistant(f"answer to {question}")])


class SlotsContract:
    """Hand-written cases on one backend (the ``engine`` fixture is ``ReadsContract``'s)."""

    def test_a_slot_names_its_turn_before_any_row_and_the_append_files_under_it(self, engine: Any) -> None:
        c = "slots"
        engine.append(_turn(c, "a", "q1"))
        slot = engine.allocate_turn(c)
        assert isinstance(slot, TurnSlot) and slot.conversation_id == c
        assert slot.turn_id.endswith("/0") and slot.position == 2
        assert [t.id for t in engine.turns(c)] == ["a/0"]  # reserved: no row yet
        engine.append(_turn(c, "b", "q2"), turn=slot)
        turns = engine.turns(c)
        assert [(t.id, t.position) for t in turns] == [("a/0", 1), (slot.turn_id, 2)]
        assert turns[1].request_message_id == "b/0" and turns[1].assistant_message_id == "b/1"
        assert engine.latest_turn(c).id == slot.turn_id
        assert engine.turn(c, "b/1").id == slot.turn_id
        assert [e.position for e in engine.entries(c)][2:] == [HistoryPosition(2, 3), HistoryPosition(2, 4)]

    def test_a_slot_is_spent_whether_or_not_it_is_used_and_positions_leave_gaps(self, engine: Any) -> None:
        c = "slots-gaps"
        released = engine.allocate_turn(c)
        kept = engine.allocate_turn(c)
        assert (released.position, kept.position) == (1, 2) and released.turn_id != kept.turn_id
        assert engine.conversations(prefix="slots-gaps") == []  # a slot is no message
        engine.append(_turn(c, "a", "q1"), turn=kept)
        engine.append(_turn(c, "b", "q2"))  # a turn without a slot: after every position given
        assert [(t.id, t.position) for t in engine.turns(c)] == [(kept.turn_id, 2), ("b/0", 3)]
        assert engine.conversations(prefix="slots-gaps") == ["slots-gaps"]
        later = engine.allocate_turn(c)
        assert later.position == 4
        engine.append(_turn(c, "c", "q3"))  # filed first, so the slot before it can no longer be used
        assert [t.position for t in engine.turns(c)] == [2, 3, 5]
        for slot in (released, later):
            with pytest.raises(SlotUnavailable, match="behind the latest turn"):
                engine.append(_turn(c, "late", "late"), turn=slot)
        assert [t.position for t in engine.turns(c)] == [2, 3, 5]

    def test_a_slot_is_used_once_and_only_in_its_conversation(self, engine: Any) -> None:
        c = "slots-once"
        slot = engine.allocate_turn(c)
        first = engine.append(_turn(c, "a", "q1"), turn=slot)
        assert engine.append(_turn(c, "a", "q1"), turn=slot) == first  # an identical retry: its receipt
        with pytest.raises(SlotUnavailable, match="already used"):
            engine.append(_turn(c, "b", "q2"), turn=slot)
        with pytest.raises(SlotUnavailable, match="conversation"):
            engine.append(_turn("slots-elsewhere", "a", "q1"), turn=slot)
        assert engine.entries("slots-elsewhere") == []
        forged = TurnSlot(c, "slot-never-allocated/0", 9)
        with pytest.raises(SlotUnavailable, match="no turn slot"):
            engine.append(_turn(c, "c", "q3"), turn=forged)
        other = engine.allocate_turn(c)
        with pytest.raises(SlotUnavailable, match="position"):
            engine.append(_turn(c, "d", "q4"), turn=TurnSlot(c, other.turn_id, other.position + 1))
        assert [e.id for e in engine.entries(c)] == ["a/0", "a/1"]

    def test_reads_treat_a_slotted_turn_like_any_other(self, engine: Any) -> None:
        c = "slots-reads"
        engine.append(Batch(c, "s", [Message.system("be brief")]))
        engine.append(_turn(c, "a", "q1"))
        slot = engine.allocate_turn(c)
        engine.append(_turn(c, "b", "q2"), turn=slot)
        engine.append(_turn(c, "c", "q3"))
        assert engine.window(c, 5)[-4:] == [e.message for e in engine.entries(c)][3:]  # the two newest turns
        assert [e.id for e in engine.window_entries(c, 5).entries] == ["b/0", "b/1", "c/0", "c/1"]
        sources = engine.turn_sources(c, 1 << 20, after=HistoryPosition(1, 3))
        assert [s.id for s in sources.messages] == ["b/0", "b/1", "c/0", "c/1"]
        assert engine.turn(c, slot.turn_id) == engine.turns(c)[1]  # a turn is found by its id
        measure = engine.measure(c, after=HistoryPosition(1, 3))
        assert (measure.messages, measure.turns) == (4, 2)

    def test_a_slotted_turn_is_replaced_by_its_id_and_runs_follow_it(self, engine: Any) -> None:
        c = "slots-replace"
        fence = engine.begin_run(c, "r1")
        slot = engine.allocate_turn(c)
        engine.append(Batch(c, "a", [Message.user("q1")], run_id="r1"), turn=slot, fence=fence)
        assert engine.run_wrote_history(c, "r1", slot.turn_id) is True
        assert engine.run_request_message(c, "other-run", slot.turn_id) == "a/0"  # the root turn's request
        engine.replace_turn(Batch(c, "b", [Message.user("q1, edited")]), slot.turn_id, "edit")
        assert [(t.id, t.position) for t in engine.turns(c)] == [("b/0", 2)]
        hidden = [e for e in engine.entries(c, include_hidden=True) if e.superseded_by is not None]
        assert [(e.id, e.superseded_by) for e in hidden] == [("a/0", "b/0")]

    def test_slots_refuse_bad_input_before_any_write(self, engine: Any) -> None:
        c = "slots-bad"
        slot = engine.allocate_turn(c)
        for bad in (1, "x/0", (c, slot.turn_id, slot.position)):
            with pytest.raises(InvalidRequest, match="turn"):
                engine.append(_turn(c, "a", "q1"), turn=bad)
        with pytest.raises(InvalidBatch, match="opens a turn"):
            engine.append(Batch(c, "a", [Message.assistant("no user message")]), turn=slot)
        for turn_id, position in (("x", 1), ("x/1", 1), ("x/0", 0), ("x/0", "1")):
            with pytest.raises(InvalidRequest, match="turn slot"):
                TurnSlot(c, turn_id, position)
        assert engine.entries(c) == []
        engine.append(_turn(c, "a", "q1"), turn=slot)  # the slot is still usable
        assert engine.latest_turn(c).id == slot.turn_id

    def test_a_cleared_conversation_allocates_no_slot(self, engine: Any) -> None:
        c = "slots-cleared"
        slot = engine.allocate_turn(c)
        engine.clear(c)
        with pytest.raises(ConversationClosed):
            engine.allocate_turn(c)
        with pytest.raises(ConversationClosed):
            engine.append(_turn(c, "a", "q1"), turn=slot)
