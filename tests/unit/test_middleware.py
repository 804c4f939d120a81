"""HistoryMiddleware: one specification, run over the sync face (call/stream) and the asyncio face
(acall/astream), against a real embedded engine with spies that count calls and inject failures."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import HistoryEngine, HistoryMiddleware, MiddlewareConfig, WindowReader
from schemas import (
    AppendID,
    Batch,
    ChatDelta,
    ChatRequest,
    ChatResponse,
    CommitError,
    ConversationClosed,
    HistoryError,
    InvalidAppendID,
    InvalidComponent,
    InvalidConversationID,
    InvalidMessage,
    InvalidReceipt,
    LogUnavailable,
    Message,
    Receipt,
    TextDelta,
    ToolCallDelta,
    ToolCallPart,
    ToolOutput,
    ToolResultPart,
    Usage,
)
from tests.unit.middleware_support import SYSTEM, AsyncFace, Face, SpyModel, SpyStore, SpyStreamer, middleware

CONV = "support-4711"
CALL = ToolCallPart("call_01", "lookup_order", '{"order_id": "A1042"}')
RESULT = ToolResultPart("call_01", "lookup_order", ToolOutput.text("in_transit eta=tomorrow"))


@pytest.fixture(params=["sync", "async"])
def face(request: pytest.FixtureRequest) -> Iterator[Face]:
    f = Face() if request.param == "sync" else AsyncFace()
    yield f
    f.close()


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[HistoryEngine]:
    with HistoryEngine.open(tmp_path / "data") as eng:
        yield eng


@pytest.fixture
def prior(engine: HistoryEngine) -> list[Message]:
    """A stored history: a stored system message and one completed turn."""
    engine.append(Batch(CONV, "setup", [Message.system("stored system prompt (must not reach the model)")]))
    engine.append(Batch(CONV, "turn-1", [Message.user("Hi, where is A1042?"),
                                         Message.assistant("It ships tomorrow.")]))
    return engine.read(CONV)


def ask(text: str = "Can you send it to my office?") -> ChatRequest:
    return ChatRequest([SYSTEM, Message.user(text)])


def answer(text: str = "Done.", finish: str = "stop") -> ChatResponse:
    return ChatResponse(Message.assistant(text), finish, Usage(120, 8))


def chunks(*texts: str, finish: str = "stop") -> list[ChatDelta]:
    return [*(ChatDelta([TextDelta(t)]) for t in texts), ChatDelta(finish_reason=finish, usage=Usage(10, 3))]


# --------------------------------------------------------------------------- what the model sees, what is saved


def test_the_model_sees_request_system_then_stored_turns_then_the_open_turn(
        face: Face, engine: HistoryEngine, prior: list[Message]) -> None:
    store, model = SpyStore(engine), SpyModel(answer())
    face.call(middleware(store), model, ask("And the address?"))
    assert model.calls == 1 and store.reads == 1
    assert list(model.requests[0].messages) == [SYSTEM, *prior[1:], Message.user("And the address?")]
    assert all(m.text() != "stored system prompt (must not reach the model)" for m in model.requests[0].messages)


def test_only_the_open_turn_and_the_answer_are_saved(face: Face, engine: HistoryEngine, prior: list[Message]) -> None:
    store, model = SpyStore(engine), SpyModel(answer("Redirected."))
    response = face.call(middleware(store), model, ask("Send it to the office"), append_id="turn-2")
    assert response == answer("Redirected.")
    assert [len(b) for b in store.appends] == [2]
    assert store.appends[0].append_id == "turn-2"
    assert engine.read(CONV) == [*prior, Message.user("Send it to the office"), Message.assistant("Redirected.")]


def test_the_stream_sees_the_same_request_and_saves_the_same_turn(
        face: Face, engine: HistoryEngine, prior: list[Message]) -> None:
    store, streamer = SpyStore(engine), SpyStreamer(*chunks("Redi", "rected."))
    face.stream(middleware(store), streamer, ask("Office please"))
    assert list(streamer.requests[0].messages) == [SYSTEM, *prior[1:], Message.user("Office please")]
    assert engine.read(CONV)[len(prior):] == [Message.user("Office please"), Message.assistant("Redirected.")]


def test_a_tool_round_saves_nothing_then_the_whole_turn_is_saved_as_one_batch(face: Face,
                                                                             engine: HistoryEngine) -> None:
    store = SpyStore(engine)
    model = SpyModel(ChatResponse(Message.assistant(CALL), "tool_calls"), answer("It arrives tomorrow."))
    mw = middleware(store)
    first = face.call(mw, model, ask("Where is A1042?"))
    assert first.finish_reason == "tool_calls" and store.appends == [] and engine.read(CONV) == []
    turn = [Message.user("Where is A1042?"), Message.assistant(CALL), Message.tool(RESULT)]
    face.call(mw, model, ChatRequest([SYSTEM, *turn]), append_id="turn-1")
    assert model.calls == 2 and store.reads == 2
    assert list(model.requests[1].messages) == [SYSTEM, *turn]
    assert [len(b) for b in store.appends] == [4]
    assert engine.read(CONV) == [*turn, Message.assistant("It arrives tomorrow.")]


def test_a_streamed_tool_round_saves_nothing(face: Face, engine: HistoryEngine) -> None:
    store = SpyStore(engine)
    streamer = SpyStreamer(ChatDelta([ToolCallDelta("call_01", "lookup_order", '{"order_id"')]),
                           ChatDelta([ToolCallDelta("call_01", arguments=': "A1042"}')], finish_reason="tool_calls"))
    got = face.stream(middleware(store), streamer, ask())
    assert len(got) == 2 and streamer.closed and store.appends == [] and engine.read(CONV) == []


def test_a_response_without_a_message_saves_nothing(face: Face, engine: HistoryEngine) -> None:
    store, model = SpyStore(engine), SpyModel(ChatResponse(None, "content_filter"))
    assert face.call(middleware(store), model, ask()).message is None
    assert store.appends == [] and engine.read(CONV) == []


def test_the_finish_reason_does_not_decide_a_cut_off_answer_is_saved(face: Face, engine: HistoryEngine) -> None:
    store, model = SpyStore(engine), SpyModel(answer("It arrives tom", finish="length"))
    face.call(middleware(store), model, ask())
    assert engine.read(CONV)[-1] == Message.assistant("It arrives tom")


def test_the_append_id_is_the_callers_or_a_new_uuid7(face: Face, engine: HistoryEngine) -> None:
    store = SpyStore(engine)
    mw = middleware(store)
    face.call(mw, SpyModel(answer("a")), ask("one"), append_id="mine-1")
    face.call(mw, SpyModel(answer("b")), ask("two"))
    face.call(mw, SpyModel(answer("c")), ask("three"))
    ids = [b.append_id for b in store.appends]
    assert ids[0] == "mine-1"
    made = [uuid.UUID(i) for i in ids[1:]]
    assert [u.version for u in made] == [7, 7] and made[0] < made[1]


def test_the_same_append_id_twice_is_an_idempotent_retry(face: Face, engine: HistoryEngine) -> None:
    store = SpyStore(engine)
    mw = middleware(store)
    face.call(mw, SpyModel(answer("same")), ask("q"), append_id="turn-9")
    face.call(mw, SpyModel(answer("same")), ask("q"), append_id="turn-9")
    assert len(store.appends) == 2 and engine.read(CONV) == [Message.user("q"), Message.assistant("same")]


def test_a_window_reader_bounds_what_the_model_sees(face: Face, engine: HistoryEngine) -> None:
    for i in range(5):
        engine.append(Batch(CONV, f"t{i}", [Message.user(f"q{i}"), Message.assistant(f"a{i}")]))
    store = SpyStore(engine)
    model = SpyModel(answer())
    mw = HistoryMiddleware(MiddlewareConfig(WindowReader(store, 4), store, CONV))
    face.call(mw, model, ask("q5"))
    assert [m.text() for m in model.requests[0].messages] == [SYSTEM.text(), "q3", "a3", "q4", "a4", "q5"]


# --------------------------------------------------------------------------- invalid input: nothing runs


def test_an_invalid_conversation_id_is_rejected_at_construction(engine: HistoryEngine) -> None:
    store = SpyStore(engine)
    for bad in ["", " padded", "bell\x07", "x" * 1025]:
        with pytest.raises(InvalidConversationID):
            MiddlewareConfig(store, store, bad)
    assert store.reads == 0 and store.appends == []


def test_a_reader_or_writer_without_the_method_is_rejected_at_construction(engine: HistoryEngine) -> None:
    with pytest.raises(TypeError, match="read"):
        MiddlewareConfig(object(), engine, CONV)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="append"):
        MiddlewareConfig(engine, WindowReader(engine, 5), CONV)  # type: ignore[arg-type]


@pytest.mark.parametrize("reader", [None, object(), "engine"])
def test_a_reader_without_read_is_a_typed_error_at_construction_saying_what_to_pass(
        engine: HistoryEngine, reader: object) -> None:
    what = r"has no read\(conversation_id\) method; pass a HistoryEngine"
    for construct in (lambda: WindowReader(reader, 3), lambda: MiddlewareConfig(reader, engine, CONV)):  # type: ignore[arg-type]
        with pytest.raises(InvalidComponent, match=what) as info:
            construct()
        assert isinstance(info.value, TypeError) and isinstance(info.value, HistoryError)
    with pytest.raises(InvalidComponent, match=r"writer NoneType has no append\(\) method; pass a HistoryEngine"):
        MiddlewareConfig(engine, None, CONV)  # type: ignore[arg-type]


BAD_REQUESTS = {
    "not a request": ([Message.user("q")], "expected a schemas.ChatRequest"),
    "only system messages": (ChatRequest([SYSTEM]), "no open turn"),
    "starts with the assistant": (ChatRequest([SYSTEM, Message.assistant("hi")]), "must start with the user"),
    "two user messages": (ChatRequest([Message.user("old"), Message.assistant(CALL), Message.tool(RESULT),
                                       Message.user("new")]), "second user message"),
    "resent history": (ChatRequest([Message.user("q1"), Message.assistant("a1"), Message.user("q2")]),
                       "without a tool call ends a turn"),
    "unanswered call": (ChatRequest([Message.user("q"), Message.assistant(CALL)]), "has no result"),
    "call unanswered before the next call": (
        ChatRequest([Message.user("q"), Message.assistant(CALL),
                     Message.assistant(ToolCallPart("call_02", "lookup_order", "{}"))]), "before the next assistant"),
    "result without a call": (ChatRequest([Message.user("q"), Message.tool(RESULT)]), "answers no open tool call"),
    "result twice": (ChatRequest([Message.user("q"), Message.assistant(CALL), Message.tool(RESULT),
                                  Message.tool(RESULT)]), "answers no open tool call"),
    "call id reused": (ChatRequest([Message.user("q"), Message.assistant(CALL), Message.tool(RESULT),
                                    Message.assistant(CALL), Message.tool(RESULT)]), "used twice"),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_an_invalid_open_turn_fails_before_any_store_or_model_call(face: Face, engine: HistoryEngine,
                                                                    case: str) -> None:
    request, reason = BAD_REQUESTS[case]
    store, model, streamer = SpyStore(engine), SpyModel(answer()), SpyStreamer(*chunks("x"))
    mw = middleware(store)
    with pytest.raises(InvalidMessage, match=reason):
        face.call(mw, model, request)
    with pytest.raises(InvalidMessage, match=reason):  # streams check at the call, before the first next()
        face.open_stream(mw, streamer, request)
    assert store.reads == 0 and model.calls == 0 and streamer.calls == 0 and store.appends == []


def test_an_invalid_append_id_fails_before_any_store_or_model_call(face: Face, engine: HistoryEngine) -> None:
    store, model, streamer = SpyStore(engine), SpyModel(answer()), SpyStreamer(*chunks("x"))
    with pytest.raises(InvalidAppendID):
        face.call(middleware(store), model, ask(), append_id=" spaced")
    with pytest.raises(InvalidAppendID):
        face.open_stream(middleware(store), streamer, ask(), append_id="")
    assert store.reads == 0 and model.calls == 0 and streamer.calls == 0


@pytest.mark.parametrize("stored", [[Message.user("ok"), {"role": "user", "parts": []}], ("not", "messages"), "text"])
def test_an_invalid_stored_message_fails_before_the_model_runs(face: Face, engine: HistoryEngine,
                                                               stored: object) -> None:
    store, model, streamer = SpyStore(engine, stored=[]), SpyModel(answer()), SpyStreamer(*chunks("x"))
    store.stored = stored  # type: ignore[assignment]
    store.read = lambda cid: stored  # type: ignore[assignment,method-assign,return-value]
    with pytest.raises(InvalidMessage, match="reader"):
        face.call(middleware(store), model, ask())
    with pytest.raises(InvalidMessage, match="reader"):
        face.open_stream(middleware(store), streamer, ask()).next()
    assert model.calls == 0 and streamer.calls == 0 and store.appends == []


def test_a_model_that_returns_no_chat_response_saves_nothing(face: Face, engine: HistoryEngine) -> None:
    store = SpyStore(engine)
    with pytest.raises(InvalidMessage, match=r"not a schemas\.ChatResponse"):
        face.call(middleware(store), SpyModel({"content": "hi"}), ask())
    assert store.appends == []


# --------------------------------------------------------------------------- failures


def test_a_model_error_propagates_unchanged_and_saves_nothing(face: Face, engine: HistoryEngine) -> None:
    boom = TimeoutError("upstream model timed out")
    store, model = SpyStore(engine), SpyModel(boom)
    with pytest.raises(TimeoutError) as info:
        face.call(middleware(store), model, ask())
    assert info.value is boom and model.calls == 1 and store.appends == [] and engine.read(CONV) == []


def test_a_write_error_raises_commit_error_with_the_exact_batch_and_a_retry_completes_it(
        face: Face, engine: HistoryEngine, prior: list[Message]) -> None:
    cause = LogUnavailable("log fail-stopped (injected)")
    store, model = SpyStore(engine, fail_appends=1, error=cause), SpyModel(answer("Redirected."))
    with pytest.raises(CommitError) as info:
        face.call(middleware(store), model, ask("Office"), append_id="turn-2")
    err = info.value
    assert model.calls == 1 and len(store.appends) == 1
    assert err.batch is store.appends[0]
    assert err.batch == Batch(CONV, "turn-2", [Message.user("Office"), Message.assistant("Redirected.")])
    assert err.receipt is None and err.response == answer("Redirected.") and err.__cause__ is cause
    assert "engine.append(err.batch)" in str(err)
    assert engine.read(CONV) == prior  # nothing stored yet
    end = engine.log.end_offsets()
    first = engine.append(err.batch)
    assert engine.read(CONV) == [*prior, *err.batch.messages]
    assert engine.append(err.batch) == first
    assert engine.log.end_offsets() == [end[0] + 1]  # the second retry appended nothing
    assert model.calls == 1


def test_a_closed_conversation_surfaces_as_commit_error(face: Face, engine: HistoryEngine) -> None:
    engine.clear(CONV)
    store, model = SpyStore(engine), SpyModel(answer())
    with pytest.raises(CommitError) as info:
        face.call(middleware(store), model, ask())
    assert isinstance(info.value.__cause__, ConversationClosed) and model.calls == 1


class _WrongReceiptStore(SpyStore):
    def append(self, batch: Batch) -> Receipt:
        receipt = super().append(batch)
        return Receipt(receipt.conversation_id, "someone-else", receipt.digest, receipt.position)


def test_a_receipt_that_does_not_name_the_batch_is_a_commit_error_carrying_it(face: Face,
                                                                              engine: HistoryEngine) -> None:
    store = _WrongReceiptStore(engine)
    with pytest.raises(CommitError) as info:
        face.call(middleware(store), SpyModel(answer()), ask(), append_id="turn-1")
    assert info.value.receipt is not None and info.value.receipt.append_id == "someone-else"
    assert isinstance(info.value.__cause__, InvalidReceipt)


# --------------------------------------------------------------------------- streams


def test_a_stream_is_lazy_nothing_is_read_before_the_first_next(face: Face, engine: HistoryEngine) -> None:
    store, streamer = SpyStore(engine), SpyStreamer(*chunks("Hel", "lo"))
    stepper = face.open_stream(middleware(store), streamer, ask())
    assert store.reads == 0 and streamer.calls == 0
    stepper.next()
    assert store.reads == 1 and streamer.calls == 1
    stepper.close()


def test_a_stream_passes_chunks_through_unchanged_and_saves_after_the_last_one(face: Face,
                                                                              engine: HistoryEngine) -> None:
    script = chunks("It arrives ", "tomorrow.")
    store, streamer = SpyStore(engine), SpyStreamer(*script)
    stepper = face.open_stream(middleware(store), streamer, ask("When?"), append_id="turn-1")
    got = [stepper.next() for _ in script]
    assert all(a is b for a, b in zip(got, script, strict=True))
    assert store.appends == []  # the last chunk is out, upstream not yet exhausted: nothing saved yet
    with pytest.raises(StopIteration):
        stepper.next()
    assert [b.append_id for b in store.appends] == ["turn-1"]
    assert engine.read(CONV) == [Message.user("When?"), Message.assistant("It arrives tomorrow.")]


def test_closing_a_stream_early_closes_upstream_and_saves_nothing(face: Face, engine: HistoryEngine) -> None:
    script = chunks("It arrives ", "tomorrow.")
    store, streamer = SpyStore(engine), SpyStreamer(*script)
    stepper = face.open_stream(middleware(store), streamer, ask())
    for _ in script:  # even right after the finish chunk
        stepper.next()
    stepper.close()
    assert streamer.closed and streamer.sent == len(script)
    assert store.appends == [] and engine.read(CONV) == []


def test_closing_a_stream_mid_way_closes_upstream(face: Face, engine: HistoryEngine) -> None:
    store, streamer = SpyStore(engine), SpyStreamer(*chunks("a", "b", "c"))
    stepper = face.open_stream(middleware(store), streamer, ask())
    stepper.next()
    stepper.close()
    assert streamer.closed and streamer.sent == 1 and store.appends == []


def test_an_upstream_error_propagates_once_unchanged_and_saves_nothing(face: Face, engine: HistoryEngine) -> None:
    boom = ConnectionResetError("provider dropped the stream")
    store, streamer = SpyStore(engine), SpyStreamer(ChatDelta([TextDelta("It")]), boom)
    stepper = face.open_stream(middleware(store), streamer, ask())
    stepper.next()
    with pytest.raises(ConnectionResetError) as info:
        stepper.next()
    assert info.value is boom
    with pytest.raises(StopIteration):  # once: the stream is over
        stepper.next()
    assert store.appends == [] and engine.read(CONV) == []


@pytest.mark.parametrize("bad", [{"text": "raw dict"}, "after-finish"])
def test_a_malformed_chunk_raises_closes_upstream_and_saves_nothing(face: Face, engine: HistoryEngine,
                                                                    bad: object) -> None:
    script: list[object] = [ChatDelta([TextDelta("ok")])]
    script += [ChatDelta(finish_reason="stop"), ChatDelta([TextDelta("late")])] if bad == "after-finish" else [bad]
    store, streamer = SpyStore(engine), SpyStreamer(*script, ChatDelta(finish_reason="stop"))
    with pytest.raises(InvalidMessage, match="nothing was stored"):
        face.stream(middleware(store), streamer, ask())
    assert streamer.closed and store.appends == [] and engine.read(CONV) == []


def test_a_stream_that_ends_without_a_finish_reason_saves_nothing(face: Face, engine: HistoryEngine) -> None:
    store, streamer = SpyStore(engine), SpyStreamer(ChatDelta([TextDelta("It arrives")]))
    with pytest.raises(InvalidMessage, match="without a finish reason"):
        face.stream(middleware(store), streamer, ask())
    assert store.appends == []


def test_a_stream_commit_error_comes_after_the_last_chunk(face: Face, engine: HistoryEngine) -> None:
    script = chunks("It arrives ", "tomorrow.")
    store, streamer = SpyStore(engine, fail_appends=1), SpyStreamer(*script)
    stepper = face.open_stream(middleware(store), streamer, ask("When?"), append_id="turn-1")
    got = [stepper.next() for _ in script]
    assert len(got) == len(script)
    with pytest.raises(CommitError) as info:
        stepper.next()
    err = info.value
    assert err.batch == Batch(CONV, "turn-1", [Message.user("When?"), Message.assistant("It arrives tomorrow.")])
    assert err.response.text() == "It arrives tomorrow." and isinstance(err.__cause__, OSError)
    assert streamer.calls == 1 and engine.read(CONV) == []
    receipt = engine.append(err.batch)
    assert engine.read(CONV) == list(err.batch.messages) and engine.append(err.batch) == receipt


# --------------------------------------------------------------------------- concurrency


def test_many_conversations_through_one_middleware_each_concurrently(face: Face, engine: HistoryEngine) -> None:
    conversations, turns = 8, 3
    store = SpyStore(engine)

    def scripted(c: int) -> SpyModel:
        return SpyModel(*(answer(f"c{c} a{t}") for t in range(turns)))

    if face.name == "sync":
        errors: list[BaseException] = []

        def run(c: int) -> None:
            mw, model = middleware(store, f"conv-{c}"), scripted(c)
            try:
                for t in range(turns):
                    mw.call(model)(ask(f"c{c} q{t}"))
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=run, args=(c,)) for c in range(conversations)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert errors == []
    else:
        async def run_async(c: int) -> None:
            mw, model = middleware(store, f"conv-{c}"), scripted(c)
            for t in range(turns):
                await mw.acall(model.acall)(ask(f"c{c} q{t}"))

        async def main() -> None:
            await asyncio.gather(*(run_async(c) for c in range(conversations)))

        asyncio.run(main())
    assert len(store.appends) == conversations * turns
    for c in range(conversations):
        expected = [text for t in range(turns) for text in (f"c{c} q{t}", f"c{c} a{t}")]
        assert [m.text() for m in engine.read(f"conv-{c}")] == expected


def test_the_appended_batch_ids_are_valid_append_ids(face: Face, engine: HistoryEngine) -> None:
    store = SpyStore(engine)
    face.call(middleware(store), SpyModel(answer()), ask())
    assert AppendID(store.appends[0].append_id) == store.appends[0].append_id
