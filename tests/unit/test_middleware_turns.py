"""Edit and retry through the middleware: ``retry``/``edit`` (and the asyncio twins) replace the
latest visible turn with ``replace_turn``, on a real embedded engine."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine import HistoryEngine, HistoryMiddleware, MiddlewareConfig, WindowReader
from schemas import (
    Batch,
    ChatDelta,
    ChatRequest,
    ChatResponse,
    CommitError,
    FinishReason,
    InvalidAppendID,
    InvalidMessage,
    Message,
    Receipt,
    TextDelta,
    ToolCallPart,
    ToolOutput,
    ToolResultPart,
    TurnNotReplaceable,
)
from tests.unit.middleware_support import SYSTEM, SpyModel, SpyStore, SpyStreamer, Stepper

C = "conv-1"


def answer(text: str) -> ChatResponse:
    return ChatResponse(Message.assistant(text), FinishReason.STOP)


@pytest.fixture
def engine(tmp_path: Path) -> HistoryEngine:
    with HistoryEngine.open(tmp_path / "data") as e:
        e.append(Batch(C, "t1", [Message.user("Where is A1?"), Message.assistant("In Leipzig.")]))
        e.append(Batch(C, "t2", [Message.user("And A2?"), Message.assistant("It was delivered.")]))
        yield e


def texts(engine: HistoryEngine) -> list[str]:
    return [m.text() for m in engine.read(C)]


def test_retry_regenerates_the_latest_answer_from_the_history_before_it(engine: HistoryEngine) -> None:
    model = SpyModel(answer("A2 arrived yesterday."))
    mw = HistoryMiddleware(MiddlewareConfig(engine, engine, C))
    response = mw.retry(model)(ChatRequest([SYSTEM]), append_id="t2-retry")
    assert response.text() == "A2 arrived yesterday."
    assert [m.text() for m in model.requests[0].messages] == [
        SYSTEM.text(), "Where is A1?", "In Leipzig.", "And A2?"]  # the old answer is not shown
    assert texts(engine) == ["Where is A1?", "In Leipzig.", "And A2?", "A2 arrived yesterday."]
    hidden = [e for e in engine.entries(C, include_hidden=True) if e.hidden]
    assert [(e.id, e.superseded_by, e.reason) for e in hidden] == [
        ("t2/0", "t2-retry/0", "retry"), ("t2/1", "t2-retry/0", "retry")]


def test_edit_answers_the_new_user_message(engine: HistoryEngine) -> None:
    model = SpyModel(answer("A3 ships Monday."))
    mw = HistoryMiddleware(MiddlewareConfig(engine, engine, C))
    mw.edit(model)(ChatRequest([SYSTEM, Message.user("And A3?")]), append_id="t2-edit")
    assert model.requests[0].messages[-1].text() == "And A3?"
    assert texts(engine) == ["Where is A1?", "In Leipzig.", "And A3?", "A3 ships Monday."]
    latest = engine.latest_turn(C)
    assert latest is not None and latest.id == "t2-edit/0" and latest.assistant_message_id == "t2-edit/1"


def test_a_retry_with_another_user_message_or_without_a_turn_fails_before_the_model(
        engine: HistoryEngine, tmp_path: Path) -> None:
    model = SpyModel(answer("never"))
    mw = HistoryMiddleware(MiddlewareConfig(engine, engine, C))
    with pytest.raises(TurnNotReplaceable, match="use edit"):
        mw.retry(model)(ChatRequest([SYSTEM, Message.user("Something else")]))
    with pytest.raises(InvalidMessage, match="no user message"):
        mw.edit(model)(ChatRequest([SYSTEM]))
    empty = HistoryMiddleware(MiddlewareConfig(engine, engine, "never-written"))
    with pytest.raises(TurnNotReplaceable, match="no turn to retry"):
        empty.retry(model)(ChatRequest([SYSTEM]))
    assert model.calls == 0 and len(engine.read(C)) == 4


def test_a_writer_that_cannot_replace_turns_is_refused_when_wrapping(engine: HistoryEngine) -> None:
    spy = SpyStore(engine)  # read + append only
    with pytest.raises(TypeError, match="latest_turn"):
        HistoryMiddleware(MiddlewareConfig(spy, spy, C)).retry(SpyModel())


def test_a_failed_replacement_raises_commit_error_that_completes_without_the_model(
        engine: HistoryEngine) -> None:
    class Failing:
        def __init__(self) -> None:
            self.calls = 0

        def __getattr__(self, name: str) -> object:
            return getattr(engine, name)

        def replace_turn(self, batch: Batch, old_turn_id: str, reason: str) -> object:
            self.calls += 1
            raise OSError("disk full (injected)")

    failing = Failing()
    model = SpyModel(answer("A2 arrived yesterday."))
    mw = HistoryMiddleware(MiddlewareConfig(engine, failing, C))  # type: ignore[arg-type]
    with pytest.raises(CommitError) as info:
        mw.retry(model)(ChatRequest([SYSTEM]), append_id="r1")
    err = info.value
    assert (err.old_turn_id, err.reason, failing.calls, model.calls) == ("t2/0", "retry", 1, 1)
    assert isinstance(err.__cause__, OSError) and texts(engine)[-1] == "It was delivered."
    receipt = engine.replace_turn(err.batch, err.old_turn_id, err.reason)
    assert engine.replace_turn(err.batch, err.old_turn_id, err.reason) == receipt
    assert texts(engine)[-1] == "A2 arrived yesterday." and model.calls == 1


def test_a_turn_replaced_meanwhile_makes_the_second_replacement_fail(engine: HistoryEngine) -> None:
    mw = HistoryMiddleware(MiddlewareConfig(engine, engine, C))

    def racing(request: ChatRequest) -> ChatResponse:  # another instance retries first
        engine.replace_turn(Batch(C, "other", [Message.user("And A2?"), Message.assistant("Other.")]), "t2/0",
                            "retry")
        return answer("Mine.")

    with pytest.raises(CommitError) as info:
        mw.retry(racing)(ChatRequest([SYSTEM]))
    assert isinstance(info.value.__cause__, TurnNotReplaceable)
    assert texts(engine)[-1] == "Other."


def test_a_window_reader_limits_the_history_before_the_turn(engine: HistoryEngine) -> None:
    engine.append(Batch(C, "t3", [Message.user("And A3?"), Message.assistant("Monday.")]))
    model = SpyModel(answer("Monday, 10:00."))
    mw = HistoryMiddleware(MiddlewareConfig(WindowReader(engine, 2), engine, C))
    mw.retry(model)(ChatRequest([SYSTEM]))
    assert [m.text() for m in model.requests[0].messages] == [  # turn 1 did not fit the window of 2
        SYSTEM.text(), "And A2?", "It was delivered.", "And A3?"]


def test_async_twins_replace_the_turn(engine: HistoryEngine) -> None:
    mw = HistoryMiddleware(MiddlewareConfig(engine, engine, C))
    retry_model = SpyModel(answer("Async retry."))
    asyncio.run(mw.aretry(retry_model.acall)(ChatRequest([SYSTEM]), append_id="ar"))
    assert texts(engine)[-2:] == ["And A2?", "Async retry."]
    edit_model = SpyModel(answer("Async edit."))
    asyncio.run(mw.aedit(edit_model.acall)(ChatRequest([SYSTEM, Message.user("And A4?")]), append_id="ae"))
    assert texts(engine)[-2:] == ["And A4?", "Async edit."]
    assert [e.superseded_by for e in engine.entries(C, include_hidden=True) if e.hidden] == [
        "ar/0", "ar/0", "ae/0", "ae/0"]


# --------------------------------------------------------------------------- streamed retry and edit

STREAM_FORMS = {"retry_stream": False, "aretry_stream": True, "edit_stream": False, "aedit_stream": True}
NEW_ANSWER = [ChatDelta([TextDelta("A2 arrived ")]), ChatDelta([TextDelta("yesterday.")]),
              ChatDelta(finish_reason="stop")]


class CountingEngine:
    """The engine as a writer, counting the calls that reach it."""

    def __init__(self, engine: HistoryEngine, *, fail_replace: bool = False) -> None:
        self.engine = engine
        self.fail_replace = fail_replace
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.engine, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return method(*args, **kwargs)

        return counted

    def replace_turn(self, batch: Batch, old_turn_id: str, reason: str) -> Receipt:
        self.calls.append("replace_turn")
        if self.fail_replace:
            raise OSError("disk full (injected)")
        return self.engine.replace_turn(batch, old_turn_id, reason)


@pytest.fixture(params=sorted(STREAM_FORMS))
def form(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def runner() -> Iterator[asyncio.Runner]:
    with asyncio.Runner() as r:
        yield r


def open_stream(mw: HistoryMiddleware, form: str, streamer: SpyStreamer, request: object, runner: asyncio.Runner,
                **kw: Any) -> Stepper:
    """The stream of ``form``, stepped one ``next()`` at a time (the async forms on ``runner``)."""
    if STREAM_FORMS[form]:
        return Stepper(getattr(mw, form)(streamer.astream)(request, **kw), runner)
    return Stepper(getattr(mw, form)(streamer)(request, **kw), None)


def replacement(form: str) -> ChatRequest:
    return ChatRequest([SYSTEM]) if "retry" in form else ChatRequest([SYSTEM, Message.user("And A2, really?")])


def test_a_streamed_retry_or_edit_replaces_the_turn_when_upstream_is_exhausted(
        engine: HistoryEngine, form: str, runner: asyncio.Runner) -> None:
    streamer = SpyStreamer(*NEW_ANSWER)
    mw = HistoryMiddleware(MiddlewareConfig(engine, engine, C))
    stepper = open_stream(mw, form, streamer, replacement(form), runner, append_id="t2-new")
    got = [stepper.next() for _ in NEW_ANSWER]
    assert all(a is b for a, b in zip(got, NEW_ANSWER, strict=True))
    assert texts(engine)[-1] == "It was delivered."  # the last chunk is out, upstream not yet exhausted
    with pytest.raises(StopIteration):
        stepper.next()
    user = "And A2?" if "retry" in form else "And A2, really?"
    assert [m.text() for m in streamer.requests[0].messages] == [SYSTEM.text(), "Where is A1?", "In Leipzig.", user]
    assert texts(engine) == ["Where is A1?", "In Leipzig.", user, "A2 arrived yesterday."]
    assert [(e.superseded_by, e.reason) for e in engine.entries(C, include_hidden=True) if e.hidden] == [
        ("t2-new/0", form.removeprefix("a").removesuffix("_stream"))] * 2


def test_a_streamed_replacement_is_lazy_and_validates_its_input_at_the_call(
        engine: HistoryEngine, form: str, runner: asyncio.Runner) -> None:
    writer, streamer = CountingEngine(engine), SpyStreamer(*NEW_ANSWER)
    mw = HistoryMiddleware(MiddlewareConfig(engine, writer, C))
    stepper = open_stream(mw, form, streamer, replacement(form), runner)
    assert writer.calls == [] and streamer.calls == 0  # nothing read before the first next()
    stepper.next()
    assert writer.calls[:1] == ["latest_turn"] and streamer.calls == 1
    stepper.close()
    bad = ChatRequest([SYSTEM]) if "edit" in form else ChatRequest([SYSTEM, Message.assistant("no user")])
    with pytest.raises(InvalidMessage):
        open_stream(mw, form, streamer, bad, runner)
    with pytest.raises(InvalidAppendID):
        open_stream(mw, form, streamer, replacement(form), runner, append_id=" spaced")
    assert writer.calls == ["latest_turn", "entries"] and streamer.calls == 1


def test_a_streamed_replacement_closed_early_or_failing_upstream_replaces_nothing(
        engine: HistoryEngine, form: str, runner: asyncio.Runner) -> None:
    mw = HistoryMiddleware(MiddlewareConfig(engine, engine, C))
    streamer = SpyStreamer(*NEW_ANSWER)
    stepper = open_stream(mw, form, streamer, replacement(form), runner)
    for _ in NEW_ANSWER:  # even right after the finish chunk
        stepper.next()
    stepper.close()
    assert streamer.closed and texts(engine)[-2:] == ["And A2?", "It was delivered."]
    boom = ConnectionResetError("provider dropped the stream")
    failing = SpyStreamer(NEW_ANSWER[0], boom)
    stepper = open_stream(mw, form, failing, replacement(form), runner)
    stepper.next()
    with pytest.raises(ConnectionResetError) as info:
        stepper.next()
    assert info.value is boom and failing.closed
    assert texts(engine)[-2:] == ["And A2?", "It was delivered."] and engine.entries(C, include_hidden=True) == \
        engine.entries(C)


def test_a_streamed_replacement_commit_error_comes_after_the_last_chunk(
        engine: HistoryEngine, form: str, runner: asyncio.Runner) -> None:
    writer, streamer = CountingEngine(engine, fail_replace=True), SpyStreamer(*NEW_ANSWER)
    mw = HistoryMiddleware(MiddlewareConfig(engine, writer, C))
    stepper = open_stream(mw, form, streamer, replacement(form), runner, append_id="r1")
    assert len([stepper.next() for _ in NEW_ANSWER]) == len(NEW_ANSWER)
    with pytest.raises(CommitError) as info:
        stepper.next()
    err = info.value
    assert (err.old_turn_id, err.reason) == ("t2/0", form.removeprefix("a").removesuffix("_stream"))
    assert isinstance(err.__cause__, OSError) and err.response.text() == "A2 arrived yesterday."
    assert texts(engine)[-1] == "It was delivered."
    assert err.old_turn_id is not None and err.reason is not None
    engine.replace_turn(err.batch, err.old_turn_id, err.reason)
    assert texts(engine)[-1] == "A2 arrived yesterday." and streamer.calls == 1


def test_a_cancellation_during_an_in_flight_replacement_waits_for_it_and_says_so(engine: HistoryEngine) -> None:
    entered, release = threading.Event(), threading.Event()

    class Blocking(CountingEngine):
        def replace_turn(self, batch: Batch, old_turn_id: str, reason: str) -> Receipt:
            entered.set()
            assert release.wait(10.0), "the replacement was never released"
            return super().replace_turn(batch, old_turn_id, reason)

    mw = HistoryMiddleware(MiddlewareConfig(engine, Blocking(engine), C))
    model = SpyModel(answer("A2 arrived yesterday."))

    async def main() -> None:
        call = asyncio.ensure_future(mw.aretry(model.acall)(ChatRequest([SYSTEM]), append_id="r1"))
        await asyncio.to_thread(entered.wait, 10.0)
        call.cancel()
        for _ in range(20):  # give the cancellation every chance to end the task early
            await asyncio.sleep(0)
        assert not call.done(), "the task ended while its replacement was still in flight"
        release.set()
        with pytest.raises(asyncio.CancelledError) as info:
            await call
        assert any("replacement of turn 't2/0'" in n and "may be stored" in n for n in info.value.__notes__)

    asyncio.run(main())
    assert texts(engine)[-1] == "A2 arrived yesterday."


def test_internal_feedback_is_accepted_inside_the_open_turn_and_stored_in_it(engine: HistoryEngine) -> None:
    """A harness's injected feedback (a user message with metadata internal_feedback: true) after
    a tool round is part of the open turn: the model sees it, and the stored turn keeps it."""
    feedback = Message.user("tests failed, try again", metadata={"internal_feedback": True})
    call = Message.assistant(ToolCallPart("c1", "run", "{}"))
    result = Message.tool(ToolResultPart("c1", "run", ToolOutput.text("1 failed")))
    model = SpyModel(answer("Fixed now."))
    mw = HistoryMiddleware(MiddlewareConfig(engine, engine, C))
    mw.call(model)(ChatRequest([SYSTEM, Message.user("Fix A3"), call, result, feedback]), append_id="t3")
    assert model.requests[0].messages[-1] == feedback
    latest = engine.latest_turn(C)
    assert latest is not None and latest.id == "t3/0"
    assert [m.message.text() for m in latest.messages][-2:] == ["tests failed, try again", "Fixed now."]
    with pytest.raises(InvalidMessage, match="internal feedback"):  # it cannot open the turn itself
        mw.call(SpyModel(answer("never")))(ChatRequest([SYSTEM, feedback]))
    with pytest.raises(InvalidMessage, match="second user message"):  # a real user message still can't follow
        mw.call(SpyModel(answer("never")))(ChatRequest([SYSTEM, Message.user("a"), Message.user("b")]))
