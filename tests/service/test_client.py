"""``HistoryClient`` and ``AsyncHistoryClient`` against a real server: every method through both
faces (one suite, parametrised over the faces), paging, auth, ids that need percent-encoding, and
``WindowReader`` / ``HistoryMiddleware`` over a client unchanged. Retries and timeouts are in
test_client_retries.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from engine import (
    EMPTY,
    AsyncHistoryClient,
    EngineStats,
    HistoryClient,
    HistoryMiddleware,
    MiddlewareConfig,
    WindowReader,
)
from engine.client import calls
from schemas import (
    AppendConflict,
    Batch,
    ChatRequest,
    ChatResponse,
    ConversationClosed,
    HistoryLoad,
    HistoryPosition,
    InvalidConversationID,
    InvalidWindow,
    Measure,
    Message,
    NotFound,
    PreconditionFailed,
    RawJSON,
    Receipt,
    TurnNotReplaceable,
    Unauthorized,
    WindowTooSmall,
)
from tests.service.conftest import Served
from tests.service.server_support import serving

Call = Callable[..., Any]


@pytest.fixture(params=["sync", "async"])
def call(request: pytest.FixtureRequest, served: Served) -> Iterator[Call]:
    """``call("method", *args)``: the method of a HistoryClient, or of an AsyncHistoryClient run
    to completion on one event loop (the client's connections belong to it)."""
    if request.param == "sync":
        with HistoryClient(served.url, timeout=10) as client:
            yield lambda name, *a, **k: getattr(client, name)(*a, **k)
        return
    loop = asyncio.new_event_loop()
    aclient = AsyncHistoryClient(served.url, timeout=10)
    try:
        yield lambda name, *a, **k: loop.run_until_complete(getattr(aclient, name)(*a, **k))
    finally:
        loop.run_until_complete(aclient.close())
        loop.close()


def turn(c: str, a: str, q: str, answer: str | None = None, **meta: Any) -> Batch:
    return Batch(c, a, [Message.user(q), Message.assistant(answer or f"answer to {q}", metadata=meta or None)])


C = "bot 7/conv é%"  # a space, a slash, UTF-8 and a percent sign: every path is percent-encoded


def test_writes_and_their_refusals(call: Call, served: Served) -> None:
    b = turn(C, "a/1", "one")
    r = call("append", b, expected_last=EMPTY)
    assert isinstance(r, Receipt) and r == served.engine.append(b)  # the same receipt in process
    assert call("append", Batch.from_json(b.to_json())) == r
    with pytest.raises(AppendConflict):
        call("append", turn(C, "a/1", "changed"))
    with pytest.raises(PreconditionFailed):
        call("append", turn(C, "a2", "two"), expected_last=EMPTY)
    r2 = call("append", turn(C, "a2", "two"), expected_last=r)
    r3 = call("replace_turn", turn(C, "a3", "two", "better"), "a2/0", "retry")
    assert r3.position > r2.position
    with pytest.raises(TurnNotReplaceable):
        call("replace_turn", turn(C, "a4", "x"), "a2/0", "edit")
    call("clear", C)
    call("clear", C)  # idempotent
    with pytest.raises(ConversationClosed):
        call("append", b)
    with pytest.raises(InvalidConversationID):
        call("read", " padded")


def test_every_read_equals_the_engine(call: Call, served: Served) -> None:
    eng = served.engine
    eng.append(Batch(C, "s", [Message.system("be brief")]))
    r = eng.append(turn(C, "a1", "one", interrupted=True))
    eng.append(turn(C, "a2", "two", score=RawJSON("1.50")))
    assert call("read", C) == eng.read(C)
    assert call("read", C, at_least=r) == eng.read(C)
    assert call("read", C)[-1].metadata["score"] == RawJSON("1.50")  # the number as it was spelled
    mid = HistoryPosition(1, 2)
    assert call("entries", C) == eng.entries(C)
    assert call("entries", C, after=mid, limit=1) == eng.entries(C, after=mid, limit=1)
    assert call("entries", C, before=mid, include_hidden=True) == eng.entries(C, before=mid, include_hidden=True)
    assert call("window", C, 3) == eng.window(C, 3)
    assert call("window_entries", C, 3) == eng.window_entries(C, 3)
    with pytest.raises(WindowTooSmall):
        call("window", C, 1)
    with pytest.raises(InvalidWindow):
        call("window", C, 0)
    for unit in ("turn", "message"):
        load = call("read_within_bytes", C, 60, after=HistoryPosition.START, unit=unit)
        assert isinstance(load, HistoryLoad) and load == eng.read_within_bytes(C, 60, unit=unit)
    for budget, cursor in ((-1, HistoryPosition(-1, 0)), (2**70, HistoryPosition(1, 2**64))):  # past the wire's range
        assert call("read_within_bytes", C, budget, after=cursor) == eng.read_within_bytes(C, budget, after=cursor)
        assert call("entries", C, before=cursor) == eng.entries(C, before=cursor)
    assert call("turn_sources", C, 1000) == eng.turn_sources(C, 1000)
    assert call("turn_sources", C, 1000, after=mid) == eng.turn_sources(C, 1000, after=mid)
    m = call("measure", C, mid)
    assert isinstance(m, Measure) and m == eng.measure(C, mid)
    assert call("turn", C, "a1/1") == eng.turn(C, "a1/1")
    for missing in ("nope/0", "", "s/0"):
        with pytest.raises(NotFound):
            call("turn", C, missing)
    assert call("latest_turn", C) == eng.latest_turn(C)
    assert call("latest_turn", "nobody") is None
    assert call("turns", C) == eng.turns(C)
    assert call("latest_interrupted_checkpoint", C) == eng.latest_interrupted_checkpoint(C)
    assert call("latest_interrupted_checkpoint", "nobody") is None
    stats = call("stats")
    assert isinstance(stats, EngineStats) and stats == eng.stats()
    assert call("poison") == []


def test_conversations_follow_every_page_and_filter_by_prefix(call: Call, served: Served,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(calls, "_PAGE", 2)  # five ids: three pages
    ids = ["b/2", "a", "b/1", "é", "b/3"]
    for c in ids:
        served.engine.append(Batch(c, "a1", [Message.user("x")]))
    assert call("conversations") == sorted(ids)
    assert call("conversations", "b/") == ["b/1", "b/2", "b/3"]
    assert call("conversations", "zzz") == []


def test_a_token_is_sent_and_a_missing_one_is_unauthorized(served: Served) -> None:
    with serving(served.engine, token="s3cret") as url:
        with HistoryClient(url, token="s3cret") as good:
            assert good.conversations() == []
        with HistoryClient(url) as anonymous, pytest.raises(Unauthorized):
            anonymous.read("c")


def test_window_reader_and_the_middleware_work_over_a_client(served: Served) -> None:
    seen: list[ChatRequest] = []

    def model(request: ChatRequest) -> ChatResponse:
        seen.append(request)
        return ChatResponse(Message.assistant(f"reply {len(seen)}"), "stop")

    with HistoryClient(served.url, timeout=10) as client:
        wrapped = HistoryMiddleware(MiddlewareConfig(client, client, "mw")).call(model)
        wrapped(ChatRequest([Message.system("sys"), Message.user("one")]), append_id="t1")
        wrapped(ChatRequest([Message.user("two")]), append_id="t2")
        assert [m.text() for m in seen[1].messages] == ["one", "reply 1", "two"]
        assert [m.text() for m in served.engine.read("mw")] == ["one", "reply 1", "two", "reply 2"]
        assert WindowReader(client, 2).read("mw") == served.engine.window("mw", 2)
        again = HistoryMiddleware(MiddlewareConfig(WindowReader(client, 2), client, "mw")).call(model)
        again(ChatRequest([Message.user("three")]), append_id="t3")
        assert [m.text() for m in seen[-1].messages] == ["two", "reply 2", "three"]
        retried = HistoryMiddleware(MiddlewareConfig(client, client, "mw")).retry(model)
        retried(ChatRequest([Message.system("sys")]), append_id="t4")
        assert [m.text() for m in served.engine.read("mw")][-2:] == ["three", "reply 4"]
        assert served.engine.latest_turn("mw") is not None


def test_the_async_middleware_runs_over_a_client(served: Served) -> None:
    async def amodel(request: ChatRequest) -> ChatResponse:
        return ChatResponse(Message.assistant("async reply"), "stop")

    with HistoryClient(served.url, timeout=10) as client:
        wrapped = HistoryMiddleware(MiddlewareConfig(client, client, "amw")).acall(amodel)
        async def main() -> ChatResponse:
            return await wrapped(ChatRequest([Message.user("hi")]), append_id="x1")

        assert asyncio.run(main()).text() == "async reply"
    assert [m.text() for m in served.engine.read("amw")] == ["hi", "async reply"]


def test_numbers_beyond_64_bits_and_exact_spellings_come_back_in_turn_sources(call: Call, served: Served) -> None:
    """A tool result's details may hold any JSON number; the client re-serialises a turn
    source's content with the full canonical writer (orjson alone refused integers past 64 bits)."""
    from schemas.messages import ToolCallPart, ToolOutput, ToolResultPart

    details = RawJSON('{"big":123456789012345678901234567890,"neg":-98765432109876543210987654321,"x":1.50}')
    eng = served.engine
    eng.append(Batch(C, "t1", [Message.user("run it"), Message.assistant(ToolCallPart("call-1", "calc", "{}")),
                               Message.tool(ToolResultPart("call-1", "calc", ToolOutput.text("ok", details=details)))]))
    sources = call("turn_sources", C, 10_000)
    assert sources == eng.turn_sources(C, 10_000)
    assert b"123456789012345678901234567890" in b"".join(s.content for s in sources.messages)
