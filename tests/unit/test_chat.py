"""Chat types and the streaming accumulator."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from schemas import (
    ChatDelta,
    ChatRequest,
    ChatResponse,
    FinishReason,
    InvalidMessage,
    Message,
    ReasoningDelta,
    RefusalDelta,
    ResponseAccumulator,
    TextDelta,
    ToolCallDelta,
    ToolCallPart,
    Usage,
)


def test_finish_reason_is_a_str_enum() -> None:
    assert FinishReason("tool_calls") is FinishReason.TOOL_CALLS == "tool_calls"
    assert {f.value for f in FinishReason} == {
        "stop",
        "length",
        "tool_calls",
        "content_filter",
        "refusal",
        "other",
    }


def test_request_rules() -> None:
    req = ChatRequest(
        [Message.system("a"), Message.system("b"), Message.user("q")], options={"temperature": 0.2}
    )
    assert len(req.messages) == 3 and req.options["temperature"] == 0.2
    with pytest.raises(InvalidMessage, match="at least one message"):
        ChatRequest([])
    with pytest.raises(
        InvalidMessage, match=r"messages\[1\]: a system message may only appear in the leading prefix"
    ):
        ChatRequest([Message.user("q"), Message.system("late")])
    with pytest.raises(TypeError):
        req.options["x"] = 1  # type: ignore[index]


def test_response_rules() -> None:
    r = ChatResponse(Message.assistant("hi", "!"), "stop", Usage(1, 2))
    assert r.text() == "hi!" and r.finish_reason is FinishReason.STOP and r.usage == Usage(1, 2)
    assert ChatResponse(None, "length").text() == ""
    with pytest.raises(InvalidMessage, match="assistant"):
        ChatResponse(Message.user("x"), "stop")
    with pytest.raises(InvalidMessage):
        ChatResponse(Message.assistant("x"), "done")
    with pytest.raises(InvalidMessage):
        Usage(-1, 0)


def test_empty_delta_is_malformed() -> None:
    with pytest.raises(InvalidMessage, match="empty delta"):
        ChatDelta()
    with pytest.raises(InvalidMessage):
        ChatDelta([])
    assert ChatDelta(usage=Usage(1, 1)).usage is not None


def test_accumulator_builds_parts_in_order() -> None:
    acc = ResponseAccumulator()
    acc.add(ChatDelta([ReasoningDelta("think"), ReasoningDelta("ing")]))
    acc.add(ChatDelta([TextDelta("Hel"), TextDelta("lo")]))
    acc.add(ChatDelta([ToolCallDelta("c1", "get_weather", '{"ci'), ToolCallDelta("c2", "time", "")]))
    acc.add(ChatDelta([ToolCallDelta("c1", "", 'ty":"Oslo"}'), ToolCallDelta("c2", "time", "{}")]))
    acc.add(ChatDelta(finish_reason="tool_calls", usage=Usage(10, 5)))
    r = acc.response()
    assert r.finish_reason == "tool_calls" and r.usage == Usage(10, 5)
    assert r.message is not None
    assert [p.kind for p in r.message.parts] == ["reasoning", "text", "tool_call", "tool_call"]
    assert r.message.parts[2] == ToolCallPart("c1", "get_weather", '{"city":"Oslo"}')
    assert r.message.parts[3] == ToolCallPart("c2", "time", "{}")
    assert r.text() == "Hello"


def test_refusal_deltas_merge() -> None:
    acc = ResponseAccumulator()
    acc.add(ChatDelta([RefusalDelta("I can"), RefusalDelta("not")], finish_reason="refusal"))
    assert acc.response().message == Message.assistant(*[__import__("schemas").RefusalPart("I cannot")])


def test_add_is_atomic() -> None:
    acc = ResponseAccumulator()
    acc.add(ChatDelta([ToolCallDelta("c1", "f", "{")]))
    with pytest.raises(InvalidMessage, match="named 'f'"):
        acc.add(ChatDelta([TextDelta("partial"), ToolCallDelta("c1", "g", "}")], finish_reason="stop"))
    assert acc.finish_reason is None  # the rejected delta's finish reason and text did not land
    acc.add(ChatDelta([ToolCallDelta("c1", "f", "}")], finish_reason="tool_calls"))
    msg = acc.response().message
    assert msg is not None and msg.parts == (ToolCallPart("c1", "f", "{}"),)


def test_nothing_after_finish() -> None:
    acc = ResponseAccumulator()
    acc.add(ChatDelta([TextDelta("x")], finish_reason="stop"))
    before = acc.response()
    with pytest.raises(InvalidMessage, match="finish"):
        acc.add(ChatDelta(usage=Usage(1, 1)))
    assert acc.response() == before


def test_response_without_finish_fails() -> None:
    acc = ResponseAccumulator()
    acc.add(ChatDelta([TextDelta("x")]))
    with pytest.raises(InvalidMessage, match="no finish reason"):
        acc.response()


def test_finish_without_parts_gives_no_message() -> None:
    acc = ResponseAccumulator()
    acc.add(ChatDelta(finish_reason="length"))
    assert acc.response().message is None


def test_non_delta_rejected_and_errors_are_never_validation_errors() -> None:
    acc = ResponseAccumulator()
    with pytest.raises(InvalidMessage):
        acc.add("x")  # type: ignore[arg-type]
    for build in (lambda: ToolCallDelta(""), lambda: TextDelta(5), lambda: ChatDelta([{"kind": "x"}])):
        with pytest.raises(InvalidMessage) as info:
            build()
        assert not isinstance(info.value, ValidationError)
