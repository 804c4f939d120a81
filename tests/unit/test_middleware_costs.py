"""``engine.window(c, limit, before=position)``: the window of what precedes a position (what
a middleware retry shows the model), checked against the reference window of those messages.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import HistoryEngine
from schemas import (
    Batch,
    HistoryPosition,
    InvalidWindow,
    Message,
    ToolCallPart,
    ToolOutput,
    ToolResultPart,
    WindowTooSmall,
)
from tests.conformance.reads_contract import reference_window


def _turn(k: int, tools: int) -> list[Message]:
    out = [Message.user(f"question {k}")]
    for r in range(tools):
        call = f"call-{k}-{r}"
        out.append(Message.assistant(ToolCallPart(call, "lookup", f'{{"k": {k}}}')))
        out.append(Message.tool(ToolResultPart(call, "lookup", ToolOutput.text(f"result {k}/{r}"))))
    out.append(Message.assistant(f"answer {k}"))
    return out


def _history() -> list[Message]:
    """System messages at the start and in the middle, a turn before the first user message,
    tool rounds and turns of every size up to 5 messages."""
    return [Message.system("first system"), Message.assistant("a greeting before any user message"),
            *_turn(0, 1), Message.system("a later system message"), *_turn(1, 0), *_turn(2, 2),
            *_turn(3, 0), *_turn(4, 1)]


def test_the_window_before_a_position_is_the_reference_window_of_what_precedes_it(tmp_path: Path) -> None:
    with HistoryEngine.open(tmp_path / "data") as engine:
        engine.append(Batch("c", "all", _history()))
        entries = engine.entries("c")
        cursors = [e.position for e in entries] + [HistoryPosition(e.position.turn + 1, 0) for e in entries]
        cursors += [HistoryPosition.START, HistoryPosition(10**9, 0)]
        for before in cursors:
            prior = [e.message for e in entries if e.position < before]
            for limit in range(1, 14):
                try:
                    want = reference_window(prior, limit)
                except WindowTooSmall:
                    with pytest.raises(WindowTooSmall):
                        engine.window("c", limit, before=before)
                    continue
                assert engine.window("c", limit, before=before) == want, (before, limit)
        assert engine.window("c", 9, before=None) == engine.window("c", 9)
        with pytest.raises(InvalidWindow, match="HistoryPosition"):
            engine.window("c", 4, before=(3, 0))  # type: ignore[arg-type]
