"""Provider adapters: realistic OpenAI Chat Completions and Anthropic Messages payloads round-trip
through histlog messages, map to the right parts, and what does not map raises InvalidMessage."""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import pytest

from engine import HistoryEngine, HistoryMiddleware, MiddlewareConfig
from engine.adapters import (
    from_anthropic,
    from_anthropic_response,
    from_openai,
    from_openai_response,
    to_anthropic,
    to_openai,
)
from schemas import (
    ChatRequest,
    ChatResponse,
    FinishReason,
    InvalidMessage,
    Media,
    MediaPart,
    Message,
    ReasoningPart,
    RefusalPart,
    Role,
    TextPart,
    ToolCallPart,
    ToolOutput,
    ToolResultPart,
    Usage,
)

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01").decode()
PDF = base64.b64encode(b"%PDF-1.7\n1 0 obj << /Type /Catalog >> endobj\n%%EOF").decode()
WAV = base64.b64encode(b"RIFF$\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00").decode()

OPENAI: list[dict[str, Any]] = [
    {"role": "developer", "content": "You are Nova, Parcelly's support assistant. Never guess a delivery date."},
    {"role": "user", "name": "customer_42", "content": [
        {"type": "text", "text": "What does this label say, and where is my parcel?"},
        {"type": "image_url", "image_url": {"url": "https://cdn.parcelly.example/labels/A1042.png", "detail": "high"}},
    ]},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_Qx1bV9", "type": "function",
         "function": {"name": "lookup_order", "arguments": "{\"order_id\": \"A1042\", \"include\": [\"shipping\"]}"}},
        {"id": "call_Qx2cW0", "type": "function",
         "function": {"name": "track_parcel", "arguments": "{\"carrier\":\"DHL\",\"id\":\"JJD0001\"}"}},
    ]},
    {"role": "tool", "tool_call_id": "call_Qx1bV9", "content": "status=in_transit eta=2025-03-14"},
    {"role": "tool", "tool_call_id": "call_Qx2cW0", "content": [
        {"type": "text", "text": "last scan: Leipzig hub"}, {"type": "text", "text": "next: out for delivery"}]},
    {"role": "assistant", "content": "The label is for A1042; DHL scanned it in Leipzig and it arrives tomorrow.",
     "reasoning_content": "Both tools agree on the ETA, so I can state it."},
    {"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": WAV, "format": "wav"}},
        {"type": "file", "file": {"file_data": f"data:application/pdf;base64,{PDF}", "filename": "invoice.pdf"}},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
    ]},
    {"role": "assistant", "content": None, "refusal": "I can't open invoices of other customers."},
]

ANTHROPIC_SYSTEM: list[dict[str, Any]] = [
    {"type": "text", "text": "You are Nova, Parcelly's support assistant.", "cache_control": {"type": "ephemeral"}},
]
ANTHROPIC: list[dict[str, Any]] = [
    {"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        {"type": "text", "text": "Where is this parcel?"},
    ]},
    {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "The label shows order A1042; look it up before answering.",
         "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"},
        {"type": "text", "text": "Let me check that order."},
        {"type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9", "name": "lookup_order",
         "input": {"order_id": "A1042", "include": ["shipping"], "verbose": False, "max_events": 3}},
    ]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_01A09q90qw90lq917835lq9",
         "content": "status=in_transit eta=2025-03-14"},
        {"type": "text", "text": "Also, can you send me the invoice?"},
    ]},
    {"role": "assistant", "content": [
        {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDdj5dKw=="},
        {"type": "tool_use", "id": "toolu_02B7x", "name": "fetch_invoice", "input": {"order_id": "A1042"}},
    ]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_02B7x", "cache_control": {"type": "ephemeral"}, "content": [
            {"type": "text", "text": "invoice attached"},
            {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": PDF},
             "title": "invoice-A1042.pdf", "citations": {"enabled": True}},
        ]},
    ]},
    {"role": "assistant", "content": [
        {"type": "text", "text": "Your invoice total is 42.00 EUR.", "citations": [
            {"type": "char_location", "cited_text": "Total: 42.00 EUR", "document_index": 0,
             "document_title": "invoice-A1042.pdf", "start_char_index": 120, "end_char_index": 136}]},
    ]},
    {"role": "user", "content": "Thanks! And the delivery note?"},
    {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_03", "name": "fetch_document", "input": {"kind": "delivery_note"}}]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_03", "content": "not found", "is_error": True}]},
]


# --------------------------------------------------------------------------- OpenAI


def test_openai_messages_round_trip_exactly() -> None:
    original = copy.deepcopy(OPENAI)
    assert to_openai(from_openai(OPENAI), reasoning_content=True) == original
    assert original == OPENAI  # the input is not modified


def test_openai_messages_map_to_the_right_parts() -> None:
    msgs = from_openai(OPENAI)
    assert [m.role for m in msgs] == ["system", "user", "assistant", "tool", "tool", "assistant", "user", "assistant"]
    assert msgs[0].metadata["openai.role"].value() == "developer"
    assert msgs[1].metadata["openai.name"].value() == "customer_42"
    image = msgs[1].parts[1]
    assert isinstance(image, MediaPart) and image.media.uri == "https://cdn.parcelly.example/labels/A1042.png"
    assert image.media.mime_type == "image/png" and image.metadata["openai.detail"].value() == "high"
    calls = msgs[2].parts
    assert calls == (ToolCallPart("call_Qx1bV9", "lookup_order",
                                  "{\"order_id\": \"A1042\", \"include\": [\"shipping\"]}"),
                     ToolCallPart("call_Qx2cW0", "track_parcel", "{\"carrier\":\"DHL\",\"id\":\"JJD0001\"}"))
    assert msgs[3] == Message.tool(ToolResultPart("call_Qx1bV9", "lookup_order",
                                                  ToolOutput.text("status=in_transit eta=2025-03-14")))
    assert msgs[4].parts[0].name == "track_parcel"  # type: ignore[union-attr]
    assert [p.kind for p in msgs[5].parts] == ["reasoning", "text"]
    audio, pdf, inline = msgs[6].parts
    assert isinstance(audio, MediaPart) and audio.media.mime_type == "audio/wav" and audio.media.data is not None
    assert isinstance(pdf, MediaPart) and pdf.media.name == "invoice.pdf" and pdf.media.data == base64.b64decode(PDF)
    assert isinstance(inline, MediaPart) and inline.media.mime_type == "image/png"
    assert msgs[7].parts == (RefusalPart("I can't open invoices of other customers."),)


def test_openai_reasoning_is_left_out_unless_asked_for() -> None:
    out = to_openai([Message.assistant(ReasoningPart("think", b"opaque"), "answer")])
    assert out == [{"role": "assistant", "content": "answer"}]


def test_openai_response_body_becomes_a_chat_response() -> None:
    completion = {
        "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG", "object": "chat.completion", "created": 1741570283,
        "model": "gpt-4o-2024-08-06",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "logprobs": None, "message": {
            "role": "assistant", "content": None, "refusal": None, "annotations": [],
            "tool_calls": [{"id": "call_9", "type": "function",
                            "function": {"name": "lookup_order", "arguments": "{\"order_id\":\"A1042\"}"}}]}}],
        "usage": {"prompt_tokens": 82, "completion_tokens": 17, "total_tokens": 99},
    }
    response = from_openai_response(completion)
    call = ToolCallPart("call_9", "lookup_order", "{\"order_id\":\"A1042\"}")
    assert response == ChatResponse(Message.assistant(call), FinishReason.TOOL_CALLS, Usage(82, 17))
    empty = {"choices": [{"finish_reason": "content_filter", "message": {"role": "assistant", "content": None}}]}
    assert from_openai_response(empty) == ChatResponse(None, "content_filter")


@pytest.mark.parametrize(("payload", "reason"), [
    ([{"role": "function", "name": "f", "content": "x"}], r"role 'function' does not map"),
    ([{"role": "user", "content": [{"type": "file", "file": {"file_id": "file-abc"}}]}], "file_id"),
    ([{"role": "user", "content": [{"type": "video_url", "video_url": {}}]}], r"content\[0\]: part type 'video_url'"),
    ([{"role": "user", "content": "hi", "audio": {"id": "a"}}], "unsupported member 'audio'"),
    ([{"role": "tool", "tool_call_id": "call_unknown", "content": "x"}], "answers no tool call"),
    ([{"role": "assistant", "content": None}], "no content"),
    ([{"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "custom", "custom": {}}]}],
     "type 'custom' does not map"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png,not-base64"}}]}],
     "base64"),
    ("not a list", "expected a list"),
])
def test_openai_input_that_does_not_map_raises_saying_where(payload: Any, reason: str) -> None:
    with pytest.raises(InvalidMessage, match=reason) as info:
        from_openai(payload)
    if isinstance(payload, list):
        assert str(info.value).startswith("OpenAI messages[0]")


def test_a_tool_result_without_its_call_in_the_list_takes_the_name_from_tool_names() -> None:
    msgs = from_openai([{"role": "tool", "tool_call_id": "call_1", "content": "ok"}], tool_names={"call_1": "ping"})
    assert msgs[0].parts[0].name == "ping"  # type: ignore[union-attr]


@pytest.mark.parametrize(("message", "reason"), [
    (Message.assistant(MediaPart(Media("image/png", data=b"x"))), "cannot carry media"),
    (Message.tool(ToolResultPart("c", "t", ToolOutput([MediaPart(Media("image/png", data=b"x"))]))), "text only"),
    (Message.user(MediaPart(Media("application/pdf", uri="https://x.example/a.pdf"))), "only images by URL"),
])
def test_histlog_content_openai_cannot_take_raises(message: Message, reason: str) -> None:
    with pytest.raises(InvalidMessage, match=reason):
        to_openai([message])


def test_tool_details_without_content_are_sent_as_json_and_dropped_otherwise() -> None:
    out = to_openai([Message.tool(ToolResultPart("c", "t", ToolOutput((), {"eta": "2025-03-14"})),
                                  ToolResultPart("d", "t", ToolOutput.text("ok", details={"x": 1})))])
    assert out == [{"role": "tool", "tool_call_id": "c", "content": '{"eta":"2025-03-14"}'},
                   {"role": "tool", "tool_call_id": "d", "content": "ok"}]


# --------------------------------------------------------------------------- Anthropic


def test_anthropic_messages_round_trip_exactly() -> None:
    original = copy.deepcopy(ANTHROPIC)
    assert to_anthropic(from_anthropic(ANTHROPIC, system=ANTHROPIC_SYSTEM)) == (ANTHROPIC_SYSTEM, original)
    assert to_anthropic(from_anthropic(ANTHROPIC[6:7], system="Be brief.")) == ("Be brief.", ANTHROPIC[6:7])


def test_anthropic_messages_map_to_the_right_parts() -> None:
    msgs = from_anthropic(ANTHROPIC, system=ANTHROPIC_SYSTEM)
    assert [m.role for m in msgs] == ["system", "user", "assistant", "tool", "user", "assistant", "tool",
                                      "assistant", "user", "assistant", "tool"]
    thinking, text, call = msgs[2].parts
    assert isinstance(thinking, ReasoningPart) and thinking.state.startswith(b"EqQB")
    assert text == TextPart("Let me check that order.")
    assert isinstance(call, ToolCallPart) and call.name == "lookup_order"
    assert call.arguments == '{"order_id":"A1042","include":["shipping"],"verbose":false,"max_events":3}'
    assert msgs[3].parts[0].name == "lookup_order"  # type: ignore[union-attr]
    assert msgs[4] == Message.user("Also, can you send me the invoice?")  # split off the tool results
    redacted = msgs[5].parts[0]
    assert isinstance(redacted, ReasoningPart) and redacted.text == "" and redacted.metadata["anthropic.redacted"]
    invoice = msgs[6].parts[0]
    assert isinstance(invoice, ToolResultPart) and invoice.name == "fetch_invoice"
    doc = invoice.output.content[1]
    assert isinstance(doc, MediaPart) and doc.media.name == "invoice-A1042.pdf"
    assert doc.media.data == base64.b64decode(PDF)
    assert msgs[10].parts[0].is_error is True  # type: ignore[union-attr]


def test_anthropic_response_body_becomes_a_chat_response() -> None:
    body = {"id": "msg_01XFDUDYJgAACzvnptvVoYEL", "type": "message", "role": "assistant",
            "model": "claude-sonnet-4-5", "stop_reason": "tool_use", "stop_sequence": None,
            "content": [{"type": "text", "text": "Looking it up."},
                        {"type": "tool_use", "id": "toolu_9", "name": "lookup_order", "input": {"order_id": "A1042"}}],
            "usage": {"input_tokens": 2095, "output_tokens": 503, "cache_read_input_tokens": 0}}
    response = from_anthropic_response(body)
    assert response.finish_reason is FinishReason.TOOL_CALLS and response.usage == Usage(2095, 503)
    assert response.message == Message.assistant("Looking it up.",
                                                 ToolCallPart("toolu_9", "lookup_order", '{"order_id":"A1042"}'))
    refused = from_anthropic_response({"content": [], "stop_reason": "refusal"})
    assert refused == ChatResponse(None, "refusal")


@pytest.mark.parametrize(("payload", "reason"), [
    ([{"role": "system", "content": "x"}], "pass the system prompt as system="),
    ([{"role": "assistant", "content": [{"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}}]}],
     "server tools are not supported"),
    ([{"role": "user", "content": [{"type": "text", "text": "x"},
                                   {"type": "tool_result", "tool_use_id": "t", "content": "y"}]}], "must come first"),
    ([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "unknown", "content": "y"}]}],
     "answers no tool call"),
    ([{"role": "user", "content": [{"type": "document", "source": {"type": "file", "file_id": "f"}}]}],
     "source type 'file' does not map"),
    ([{"role": "user", "content": [{"type": "text", "text": "x", "colour": "red"}]}], "unsupported member 'colour'"),
    ([{"role": "user", "content": []}], "at least one part"),
])
def test_anthropic_input_that_does_not_map_raises_saying_where(payload: Any, reason: str) -> None:
    with pytest.raises(InvalidMessage, match=reason) as info:
        from_anthropic(payload)
    assert str(info.value).startswith("Anthropic messages[0]")


def test_anthropic_needs_json_object_arguments_and_no_assistant_media() -> None:
    with pytest.raises(InvalidMessage, match="not a JSON object"):
        to_anthropic([Message.assistant(ToolCallPart("c", "t", "not json"))])
    with pytest.raises(InvalidMessage, match="cannot carry media"):
        to_anthropic([Message.assistant(MediaPart(Media("image/png", data=b"x")))])


def test_tool_results_from_openai_merge_into_one_anthropic_user_message() -> None:
    system, msgs = to_anthropic(from_openai(OPENAI[:6]))
    assert system == "You are Nova, Parcelly's support assistant. Never guess a delivery date."
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant"]
    assert [b["type"] for b in msgs[2]["content"]] == ["tool_result", "tool_result"]
    assert msgs[1]["content"][0]["input"] == {"order_id": "A1042", "include": ["shipping"]}
    assert msgs[3]["content"] == [{"type": "text", "text": msgs[3]["content"][0]["text"]}]  # reasoning without state


def test_anthropic_reasoning_state_and_openai_reasoning_content_cross_over() -> None:
    msgs = from_anthropic(ANTHROPIC[1:2])
    assert to_openai(msgs, reasoning_content=True)[0]["reasoning_content"] == ANTHROPIC[1]["content"][0]["thinking"]


# --------------------------------------------------------------------------- with the middleware


def test_a_provider_shaped_model_wrapped_by_the_middleware(tmp_path: Path) -> None:
    seen: list[list[dict[str, Any]]] = []

    def openai_model(request: ChatRequest) -> ChatResponse:
        seen.append(to_openai(request.messages))
        return from_openai_response({"choices": [{"finish_reason": "stop", "message": {
            "role": "assistant", "content": f"answer {len(seen)}"}}]})

    with HistoryEngine.open(tmp_path / "data") as engine:
        mw = HistoryMiddleware(MiddlewareConfig(engine, engine, "c"))
        chat = mw.call(openai_model)
        for text in ("first", "second"):
            chat(ChatRequest(from_openai([{"role": "system", "content": "Be brief."},
                                          {"role": "user", "content": text}])))
        assert [m.role for m in engine.read("c")] == [Role.USER, Role.ASSISTANT] * 2
    assert seen[1] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "first"},
                       {"role": "assistant", "content": "answer 1"}, {"role": "user", "content": "second"}]
