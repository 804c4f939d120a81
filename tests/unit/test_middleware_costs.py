"""What a middleware ``retry``/``edit`` reads: only what comes before the replaced turn, bounded
by the window, counted in RocksDB keys visited (``StateStore.keys_read``), not timed.

The history before the turn comes from ``engine.window(c, limit, before=position)``, checked here
against the reference window over the messages before that position.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import HistoryEngine, HistoryMiddleware, MiddlewareConfig, WindowReader
from schemas import (
    Batch,
    ChatRequest,
    ChatResponse,
    FinishReason,
    HistoryPosition,
    InvalidWindow,
    Message,
    Role,
    ToolCallPart,
    ToolOutput,
    ToolResultPart,
    WindowTooSmall,
)
from tests.conformance.turns_model import reference_window
from tests.unit.middleware_support import SYSTEM

LIMIT = 6
SLACK = 12  # seeks of the turn index and the one key past each range end


def _turn(k: int, tools: int) -> list[Message]:
    out = [Message.user(f"question {k}")]
    for r in range(tools):
        call = f"call-{k}-{r}"
        out.append(Message.assistant(ToolCallPart(call, "lookup", f'{{"k": {k}}}')))
        out.append(Message.tool(ToolResultPart(call, "lookup", ToolOutput.text(f"result {k}/{r}"))))
    out.append(Message.assistant(f"answer {k}"))
    return out


def _write(engine: HistoryEngine, conv: str, messages: list[Message]) -> None:
    """Append ``messages`` in batches of about 100 that end before a user message."""
    pending: list[Message] = []
    for i, m in enumerate(messages):
        pending.append(m)
        if len(pending) >= 100 and (i + 1 == len(messages) or messages[i + 1].role is Role.USER):
            engine.append(Batch(conv, f"b{i}", pending))
            pending = []
    if pending:
        engine.append(Batch(conv, "last", pending))


TAIL = [m for k in range(5) for m in _turn(10_000 + k, k % 2)] + _turn(99_999, 0)  # the last turn is retried


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HistoryEngine]:
    """Two conversations with the same tail: "short" (about 40 messages before it) and "long"
    (about 4,000): a read bounded by the window costs the same on both."""
    with HistoryEngine.open(tmp_path_factory.mktemp("retry-costs"), fsync="never") as eng:
        for conv, turns in (("short", 10), ("long", 1_000)):
            history = [Message.system("Be brief.")] + [m for k in range(turns) for m in _turn(k, k % 3)]
            _write(eng, conv, history + TAIL)
        yield eng


def _retry_cost(engine: HistoryEngine, conv: str) -> tuple[ChatRequest, int]:
    """The request the model got and the keys visited before it was called (the reads only)."""
    seen: list[tuple[ChatRequest, int]] = []
    start = engine._store.keys_read

    def model(request: ChatRequest) -> ChatResponse:
        seen.append((request, engine._store.keys_read - start))
        return ChatResponse(Message.assistant("a new answer"), FinishReason.STOP)

    mw = HistoryMiddleware(MiddlewareConfig(WindowReader(engine, LIMIT), engine, conv))
    mw.retry(model)(ChatRequest([SYSTEM]), append_id=f"retry-{conv}")
    return seen[0]


def test_a_retry_reads_only_the_window_before_the_turn_not_the_history(engine: HistoryEngine) -> None:
    before_long = engine.entries("long", before=HistoryPosition(engine.latest_turn("long").position, 0))  # type: ignore[union-attr]
    assert len(before_long) > 3_000  # what the model must not cost
    short_request, short_keys = _retry_cost(engine, "short")
    long_request, long_keys = _retry_cost(engine, "long")
    window = reference_window([e.message for e in before_long], LIMIT)
    expected = [SYSTEM, *(m for m in window if m.role is not Role.SYSTEM), Message.user("question 99999")]
    assert list(long_request.messages) == expected
    assert list(short_request.messages) == expected  # the same tail, so the same window
    assert long_keys == short_keys, (short_keys, long_keys)
    assert long_keys <= 2 * (LIMIT + 2) + SLACK, long_keys


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
