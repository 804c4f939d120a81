"""The example projections (examples/projections.py) on a real embedded engine: live updates,
turn replacement, clear, reopen, and rebuild giving the identical state."""

from __future__ import annotations

from pathlib import Path

from engine import HistoryEngine
from examples.projections import ToolUsage, WordIndex
from schemas import Batch, Message, ToolCallPart, ToolOutput, ToolResultPart


def tool_turn(conv: str, append_id: str, question: str, answer: str) -> Batch:
    return Batch(conv, append_id, [
        Message.user(question),
        Message.assistant(ToolCallPart(f"{append_id}-call", "lookup_order", '{"id": "A1"}')),
        Message.tool(ToolResultPart(f"{append_id}-call", "lookup_order", ToolOutput.text("in transit"))),
        Message.assistant(answer),
    ])


def state(engine: HistoryEngine, name: str) -> list[tuple[bytes, bytes]]:
    return engine.view(name).scan()


def test_word_index_follows_the_visible_history(tmp_path: Path) -> None:
    with HistoryEngine.open(tmp_path) as engine:
        engine.register(WordIndex())
        engine.register(ToolUsage())
        engine.append(tool_turn("alice", "t1", "Where is parcel A1?", "Parcel A1 arrives Monday."))
        engine.append(tool_turn("bob", "t1", "Parcel status please", "Yours arrives Friday."))
        view = engine.view("word-index")
        assert WordIndex.search(view, "PARCEL") == [("alice", 1), ("alice", 4), ("bob", 1)]
        assert WordIndex.search(view, "monday") == [("alice", 4)]

        latest = engine.latest_turn("alice")
        assert latest is not None
        engine.replace_turn(tool_turn("alice", "t2", "Where is parcel A1?", "Parcel A1 arrives Tuesday."),
                            latest.id, "retry")
        assert WordIndex.search(view, "monday") == []  # the hidden answer left the index
        assert WordIndex.search(view, "tuesday") == [("alice", 8)]
        assert engine.view("tool-usage").get(b"lookup_order") == b"3"  # replaced turns still ran their tools

        engine.clear("bob")
        assert WordIndex.search(view, "friday") == []
        assert [c for c, _ in WordIndex.search(view, "parcel")] == ["alice", "alice"]
        live = {name: state(engine, name) for name in ("word-index", "tool-usage")}

    with HistoryEngine.open(tmp_path) as engine:  # resumes from its checkpoint: nothing applied twice
        engine.register(WordIndex())
        engine.register(ToolUsage())
        assert {name: state(engine, name) for name in live} == live
        for name in live:
            engine.rebuild(name)
        # The replay gives only bob's clear (his content is erased), so his tool call no longer counts.
        assert {name: state(engine, name) for name in live} == {**live, "tool-usage": [(b"lookup_order", b"2")]}
