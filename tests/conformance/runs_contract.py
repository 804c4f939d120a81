"""Runs and fences (API.md "Runs, slots, assets, deletes": ``begin_run``, ``fence=``,
``run_wrote_history``, ``run_request_message``), run by every backend (``ReadsContract``
includes it: file, memory, Kafka, the async face and both HTTP clients).
"""

from __future__ import annotations

from typing import Any

import pytest

from schemas import (
    AppendConflict,
    Batch,
    ConversationClosed,
    Fence,
    Fenced,
    InvalidRequest,
    Message,
    NotFound,
)

__all__ = ["RunsContract"]


class RunsContract:
    """Hand-written cases on one backend (the ``engine`` fixture is ``ReadsContract``'s)."""

    def test_each_new_run_gets_the_next_epoch_and_a_known_run_keeps_its_own(self, engine: Any) -> None:
        first = engine.begin_run("runs", "r1")
        assert first == Fence("runs", "r1", 1)
        assert engine.begin_run("runs", "r2").epoch == 2
        assert engine.begin_run("runs", "r1") == first  # the same run again: its epoch, no new run
        assert engine.begin_run("runs", "r3").epoch == 3
        assert engine.begin_run("other-runs", "r1").epoch == 1  # epochs are per conversation
        assert engine.entries("runs") == [] and engine.conversations(prefix="runs") == []  # a run is no message

    def test_a_write_under_an_older_fence_is_refused_and_changes_nothing(self, engine: Any) -> None:
        old = engine.begin_run("fenced", "r1")
        kept = engine.append(Batch("fenced", "a", [Message.user("q1"), Message.assistant("r1")]), fence=old)
        new = engine.begin_run("fenced", "r2")
        before = engine.entries("fenced")
        with pytest.raises(Fenced, match="latest run"):
            engine.append(Batch("fenced", "b", [Message.user("late")]), fence=old)
        latest = engine.latest_turn("fenced")
        with pytest.raises(Fenced):
            engine.replace_turn(Batch("fenced", "c", [Message.user("q1 edited")]), latest.id, "edit", fence=old)
        assert engine.entries("fenced") == before
        # An identical retry of what the old run had accepted is still its receipt (a duplicate first).
        assert engine.append(Batch("fenced", "a", [Message.user("q1"), Message.assistant("r1")]), fence=old) == kept
        # The new run writes, with or without its fence; an unfenced write is as before.
        engine.append(Batch("fenced", "b", [Message.user("q2")]), fence=new)
        engine.replace_turn(Batch("fenced", "c", [Message.user("q2 edited")]), "b/0", "edit", fence=new)
        engine.append(Batch("fenced", "d", [Message.assistant("unfenced")]))
        assert [e.id for e in engine.entries("fenced")] == ["a/0", "a/1", "c/0", "d/0"]
        with pytest.raises(AppendConflict):  # conflict comes before the fence
            engine.append(Batch("fenced", "a", [Message.user("other")]), fence=old)

    def test_what_a_run_wrote_counts_hidden_rows_and_names_its_request(self, engine: Any) -> None:
        c = "run-history"
        engine.append(Batch(c, "inbound", [Message.user("asked before the run began")]))
        f = engine.begin_run(c, "r1")
        assert engine.run_wrote_history(c, "r1") is False
        assert engine.run_request_message(c, "r1", "inbound/0") == "inbound/0"  # the root turn's request
        engine.append(Batch(c, "a", [Message.assistant("answer")], run_id="r1"), fence=f)
        assert engine.run_wrote_history(c, "r1") is True
        assert engine.run_wrote_history(c, "r1", "inbound/0") is True  # it answered in that turn
        assert engine.run_request_message(c, "r1", "inbound/0") == "inbound/0"
        # The fence names the run when the batch does not.
        engine.append(Batch(c, "steer", [Message.user("steer"), Message.assistant("ok")]), fence=f)
        assert engine.run_wrote_history(c, "r1", "steer/0") is True
        assert engine.run_request_message(c, "r1", "inbound/0") == "steer/0"  # the applied input
        engine.replace_turn(Batch(c, "edit", [Message.user("steer, edited")], run_id="r2"), "steer/0", "edit")
        assert engine.run_wrote_history(c, "r1", "steer/0") is True  # hidden rows count
        assert engine.run_request_message(c, "r1", "inbound/0") == "inbound/0"  # its request is hidden now
        assert engine.run_wrote_history(c, "r2", "edit/0") is True
        assert engine.run_wrote_history(c, "r2", "inbound/0") is False
        assert engine.run_wrote_history(c, "never") is False
        with pytest.raises(NotFound):
            engine.run_request_message(c, "r1", "a/0")  # an assistant message is no request
        with pytest.raises(NotFound):
            engine.run_request_message(c, "never", "nope/0")

    def test_runs_refuse_bad_input_before_any_write(self, engine: Any) -> None:
        f = engine.begin_run("runs-bad", "r1")
        batch = Batch("runs-bad", "a", [Message.user("hi")])
        for bad in (1, "r1", ("runs-bad", "r1", 1), Fence("elsewhere", "r1", 1)):
            with pytest.raises(InvalidRequest, match="fence"):
                engine.append(batch, fence=bad)
        for run in ("", " r", "a\x07", None):
            with pytest.raises(InvalidRequest, match="run id"):
                engine.begin_run("runs-bad", run)
        for turn in ("not-a-turn", "a/01", 7):
            with pytest.raises(InvalidRequest, match="root_turn"):
                engine.run_wrote_history("runs-bad", "r1", turn)
        with pytest.raises(InvalidRequest, match="run id"):
            Batch("runs-bad", "a", [Message.user("hi")], run_id="")
        assert engine.entries("runs-bad") == []
        assert engine.append(batch, fence=f).append_id == "a"

    def test_a_cleared_conversation_begins_no_run_and_forgets_its_runs(self, engine: Any) -> None:
        f = engine.begin_run("runs-cleared", "r1")
        engine.append(Batch("runs-cleared", "a", [Message.user("hi")], run_id="r1"), fence=f)
        engine.clear("runs-cleared")
        assert engine.run_wrote_history("runs-cleared", "r1") is False
        with pytest.raises(ConversationClosed):
            engine.begin_run("runs-cleared", "r2")
        with pytest.raises(ConversationClosed):
            engine.append(Batch("runs-cleared", "b", [Message.user("late")]), fence=f)
