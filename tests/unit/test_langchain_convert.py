"""``to_langchain`` / ``from_langchain`` (engine/integrations/lc_messages.py): both round trips
as hypothesis properties, the mapping on named cases, and the typed refusals."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("langchain_core")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
)

from engine.integrations.langchain import ConversionError, from_langchain, to_langchain
from schemas import (
    Citation,
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
)
from schemas.canonical import RawJSON

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
NAME = st.text(st.characters(whitelist_categories=("Ll", "Nd")), min_size=1, max_size=6)
NUMBER_SPELLINGS = st.sampled_from(["1e3", "1.50", "-0.0", "10E-2", "0.1", "12345678901234567890"]).map(RawJSON)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(NAME, inner, max_size=3),
    max_leaves=6,
)
META_KEYS = st.sampled_from(["id", "name", "usage", "response_metadata", "additional_kwargs", "langchain",
                             "langchain_content", "internal_feedback", "external_id"]) | NAME
USAGE = st.fixed_dictionaries({"input_tokens": st.integers(0, 10**6), "output_tokens": st.integers(0, 10**6),
                               "total_tokens": st.integers(0, 10**6)})
META_VALUES = (JSON | NUMBER_SPELLINGS | USAGE | st.sampled_from(["blocks", "ordered"])
               | st.fixed_dictionaries({"error": st.none() | TEXT}))
METADATA = st.dictionaries(META_KEYS, META_VALUES, max_size=3)
STATES = st.binary(max_size=8) | st.sampled_from([
    b'{"signature":"sig=="}', b'{"type":"thinking","signature":"abc"}', b'{"type":"redacted_thinking","data":"x"}',
    b'{"extras":{"signature":"s"}}', b'{"a": 1}', b'{"a":1e3}', b'{"extras":{"histlog_state":"AA=="}}', b"[1]"])
ARGUMENTS = TEXT | st.sampled_from(['{"a":1}', '{"a": 1}', '{"q":"x","n":[1,2]}', '{"a":1e3}', "[1]", "zz", "{}",
                                    '{"a":1,"a":2}', "NaN", '{"a":NaN}'])
MIMES = st.sampled_from(["image/png", "audio/wav", "video/mp4", "application/pdf", "text/plain"])


def _media() -> st.SearchStrategy[Media]:
    data = st.builds(lambda m, d, n: Media(m, data=d, name=n), MIMES, st.binary(min_size=1, max_size=6),
                     st.none() | NAME)
    uri = st.builds(lambda m, u, n: Media(m, uri=u, name=n), MIMES, st.text(min_size=1, max_size=8), st.none() | NAME)
    return data | uri


TEXT_PART = st.builds(lambda t, c, m: TextPart(t, tuple(c), metadata=m), TEXT,
                      st.lists(st.builds(Citation, NAME, st.just("") | NAME), max_size=2), METADATA)
MEDIA_PART = st.builds(lambda m, md: MediaPart(m, metadata=md), _media(), METADATA)
REASONING = st.builds(lambda t, s, m: ReasoningPart(t, s, metadata=m), TEXT, STATES, METADATA)
CALL = st.builds(lambda n, a, m: ToolCallPart("x", n, a, metadata=m), NAME, ARGUMENTS, METADATA)
REFUSAL = st.builds(lambda t, m: RefusalPart(t, metadata=m), TEXT, METADATA)
OUTPUT = st.builds(lambda c, d: ToolOutput(tuple(c), d), st.lists(TEXT_PART | MEDIA_PART, max_size=2),
                   st.none() | JSON.map(RawJSON.of) | NUMBER_SPELLINGS)
RESULT = st.builds(lambda n, o, e, m: ToolResultPart("r", n, o, e, metadata=m), NAME, OUTPUT, st.booleans(), METADATA)


def _unique_calls(parts: list[Any]) -> list[Any]:
    """Give every call (or result) of one message its own id, as a model does."""
    out = []
    for i, p in enumerate(parts):
        if isinstance(p, ToolCallPart):
            p = ToolCallPart(f"call-{i}", p.name, p.arguments, metadata=p.metadata)
        elif isinstance(p, ToolResultPart):
            p = ToolResultPart(f"call-{i}", p.name, p.output, p.is_error, metadata=p.metadata)
        out.append(p)
    return out


HISTLOG = st.one_of(
    st.builds(lambda ps, m: Message(Role.SYSTEM, ps, m), st.lists(TEXT_PART, min_size=1, max_size=2), METADATA),
    st.builds(lambda ps, m: Message(Role.USER, ps, m), st.lists(TEXT_PART | MEDIA_PART, min_size=1, max_size=3),
              METADATA),
    st.builds(lambda ps, m: Message(Role.ASSISTANT, _unique_calls(ps), m),
              st.lists(TEXT_PART | MEDIA_PART | REASONING | CALL | REFUSAL, min_size=1, max_size=4), METADATA),
    st.builds(lambda ps, m: Message(Role.TOOL, _unique_calls(ps), m), st.lists(RESULT, min_size=1, max_size=3),
              METADATA),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(HISTLOG, max_size=4))
def test_histlog_to_langchain_and_back_is_identical(messages: list[Message]) -> None:
    back = from_langchain(to_langchain(messages))
    assert [m.canonical_json() for m in back] == [m.canonical_json() for m in messages]


# ----- LangChain messages within what histlog holds

LC_KEY = st.text(st.characters(whitelist_categories=("Ll",)), min_size=1, max_size=5)
LC_JSON_DICT = st.dictionaries(LC_KEY, JSON, min_size=1, max_size=2)
LC_TEXT_BLOCK = st.builds(lambda t: {"type": "text", "text": t}, TEXT) | st.builds(
    lambda t, u: {"type": "text", "text": t, "annotations": [{"type": "citation", "url": u}]}, TEXT, NAME) | st.builds(
    lambda t, i: {"type": "text", "text": t, "id": i,
                  "annotations": [{"type": "citation", "url": "u", "cited_text": i}]}, TEXT, NAME)
LC_IMAGE = st.builds(lambda u, m: {"type": "image", "url": u, "mime_type": m}, NAME, MIMES) | st.builds(
    lambda d: {"type": "file", "base64": "aGk=", "mime_type": d, "extras": {"filename": "f.bin"}}, MIMES)
LC_REASONING = st.builds(lambda t: {"type": "reasoning", "reasoning": t}, TEXT) | st.builds(
    lambda t, s: {"type": "reasoning", "reasoning": t, "extras": {"signature": s}}, TEXT, TEXT) | st.builds(
    lambda t, s: {"type": "thinking", "thinking": t, "signature": s}, TEXT, TEXT) | st.builds(
    lambda d: {"type": "redacted_thinking", "data": d}, TEXT)
LC_REFUSAL = st.builds(lambda t: {"type": "refusal", "refusal": t}, TEXT)
COMMON = {"id": st.none() | NAME, "response_metadata": st.just({}) | LC_JSON_DICT,
          "additional_kwargs": st.just({}) | LC_JSON_DICT}


def _human(content: Any, name: Any, **common: Any) -> HumanMessage:
    return HumanMessage(content=content, name=name, **common)


def _ai(content: Any, calls: list[Any], bad: list[Any], usage: Any, **common: Any) -> AIMessage:
    calls = [{**c, "id": f"t{i}"} for i, c in enumerate(calls)]
    bad = [{**c, "id": f"b{i}"} for i, c in enumerate(bad)]
    return AIMessage(content=content, tool_calls=calls, invalid_tool_calls=bad, usage_metadata=usage, **common)


LC_CALL = st.builds(lambda n, a: {"name": n, "args": a, "id": "", "type": "tool_call"}, NAME,
                    LC_JSON_DICT | st.just({}))
LC_BAD_CALL = st.builds(lambda n, a, e: {"name": n, "args": a, "id": "", "error": e, "type": "invalid_tool_call"},
                        NAME, ARGUMENTS, st.none() | TEXT)
LANGCHAIN = st.one_of(
    st.builds(SystemMessage, content=TEXT | st.lists(LC_TEXT_BLOCK, min_size=1, max_size=2), **COMMON),
    st.builds(_human, TEXT | st.lists(LC_TEXT_BLOCK | LC_IMAGE, min_size=1, max_size=2), st.none() | NAME, **COMMON),
    st.builds(_ai, TEXT | st.lists(LC_TEXT_BLOCK | LC_IMAGE | LC_REASONING | LC_REFUSAL, min_size=1, max_size=3),
              st.lists(LC_CALL, max_size=2), st.lists(LC_BAD_CALL, max_size=1),
              st.none() | st.builds(lambda i, o: {"input_tokens": i, "output_tokens": o, "total_tokens": i + o},
                                    st.integers(0, 99), st.integers(0, 99)), **COMMON),
    st.builds(lambda c, n, s, a, i: ToolMessage(content=c, tool_call_id="t0", name=n, status=s, artifact=a, id=i),
              TEXT | st.lists(LC_TEXT_BLOCK, max_size=2), NAME, st.sampled_from(["success", "error"]), JSON,
              st.none() | NAME),
)


def _valid(m: BaseMessage) -> bool:
    return not (isinstance(m, AIMessage) and not m.content and not m.tool_calls and not m.invalid_tool_calls
                and isinstance(m.content, list))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(st.lists(LANGCHAIN.filter(_valid), max_size=4))
def test_langchain_to_histlog_and_back_is_identical(messages: list[BaseMessage]) -> None:
    back = to_langchain(from_langchain(messages))
    assert [m.model_dump() for m in back] == [m.model_dump() for m in messages]


# ----- the mapping, on named cases


def test_tool_round_maps_to_langchain_fields() -> None:
    ai = Message.assistant(ReasoningPart("thinking", b'{"signature":"Ek0KAQ=="}'), TextPart("let me look"),
                           ToolCallPart("c1", "search", '{"q": "kafka"}'),
                           metadata={"id": "m-1", "usage": {"input_tokens": 3, "output_tokens": 5, "total_tokens": 8}})
    tool = Message.tool(ToolResultPart("c1", "search", ToolOutput.text("no hits", details={"hits": 0}), is_error=True))
    lc_ai, lc_tool = to_langchain([ai, tool])
    assert isinstance(lc_ai, AIMessage) and isinstance(lc_tool, ToolMessage)
    assert lc_ai.id == "m-1" and lc_ai.usage_metadata == {"input_tokens": 3, "output_tokens": 5, "total_tokens": 8}
    assert lc_ai.tool_calls == [{"name": "search", "args": {"q": "kafka"}, "id": "c1", "type": "tool_call"}]
    assert lc_ai.content[0] == {"type": "reasoning", "reasoning": "thinking", "signature": "Ek0KAQ=="}
    # the model's exact argument text (with its space) travels beside the parsed args
    assert lc_ai.additional_kwargs["histlog_tool_calls"] == {"c1": {"arguments": '{"q": "kafka"}'}}
    assert (lc_tool.tool_call_id, lc_tool.name, lc_tool.status, lc_tool.content, lc_tool.artifact) == (
        "c1", "search", "error", "no hits", {"hits": 0})
    back_ai, back_tool = from_langchain([lc_ai, lc_tool])
    assert back_ai.parts[2].arguments == '{"q": "kafka"}'
    assert back_ai.parts[0].state == b'{"signature":"Ek0KAQ=="}'
    assert back_tool.parts[0].is_error is True


def test_reasoning_state_that_is_not_json_is_kept_byte_exact() -> None:
    state = b"\x00\xffopaque"
    (lc,) = to_langchain([Message.assistant(ReasoningPart("r", state), "ok")])
    assert lc.content[0]["extras"] == {"histlog_state": "AP9vcGFxdWU="}
    assert from_langchain([lc])[0].parts[0].state == state


def test_one_tool_message_with_two_results_is_two_tool_messages_and_back_one() -> None:
    tool = Message.tool(ToolResultPart("a", "f", "1"), ToolResultPart("b", "g", "2"), metadata={"id": "t"})
    lcs = to_langchain([tool])
    marks = [(m.tool_call_id, m.additional_kwargs["histlog_tool_message"]) for m in lcs]
    assert marks == [("a", [0, 2]), ("b", [1, 2])]
    assert from_langchain(lcs) == [tool]
    with pytest.raises(ConversionError, match="2 of 2 is missing"):
        from_langchain(lcs[:1])


def test_metadata_number_spelling_survives() -> None:
    m = Message.user("hi", metadata={"score": RawJSON("1.50"), "usage": RawJSON('{"input_tokens":1e1}')})
    (lc,) = to_langchain([m])
    assert lc.additional_kwargs["histlog_metadata"] == {"score": "1.50", "usage": '{"input_tokens":1e1}'}
    assert from_langchain([lc])[0].canonical_json() == m.canonical_json()


def test_langchain_v1_ordered_content_keeps_its_tool_call_blocks() -> None:
    ai = AIMessage(content=[{"type": "text", "text": "a"}, {"type": "tool_call", "id": "c", "name": "f", "args": {}}],
                   tool_calls=[{"name": "f", "args": {}, "id": "c", "type": "tool_call"}])
    (m,) = from_langchain([ai])
    assert [p.kind for p in m.parts] == ["text", "tool_call"]
    assert to_langchain([m]) == [ai]


@pytest.mark.parametrize(("message", "match"), [
    (RemoveMessage(id="x"), "RemoveMessage has no histlog form"),
    (ChatMessage(content="x", role="critic"), "ChatMessage has no histlog form"),
    (HumanMessage(content=[{"type": "image", "file_id": "file-1", "mime_type": "image/png"}]), "file_id"),
    (HumanMessage(content=[{"type": "image", "url": "http://x"}]), "needs a mime_type"),
    (HumanMessage(content=[{"type": "server_tool_call", "id": "s"}]), "'server_tool_call' has no histlog part"),
    (SystemMessage(content=[{"type": "image", "url": "u", "mime_type": "image/png"}]), "not allowed for role"),
    (AIMessage(content="x", tool_calls=[{"name": "f", "args": {}, "id": None}]), "needs an id"),
    (ToolMessage(content="x", tool_call_id="c"), "needs the tool's name"),
    (ToolMessage(content="x", tool_call_id="c", name="f", artifact=object()), "not a JSON value"),
    (HumanMessage(content="x", additional_kwargs={"histlog_other": 1}), "reserved"),
    (HumanMessage(content=[{"type": "image", "base64": "aGk", "mime_type": "image/png"}]), "base64"),
])
def test_what_histlog_cannot_hold_raises_a_typed_error(message: BaseMessage, match: str) -> None:
    with pytest.raises(ConversionError, match=match) as info:
        from_langchain([HumanMessage("fine"), message])
    assert isinstance(info.value, InvalidMessage)
    assert "messages[1]" in str(info.value)


def test_to_langchain_refuses_what_is_not_a_message() -> None:
    with pytest.raises(ConversionError, match=r"expected a schemas\.Message"):
        to_langchain([{"role": "user"}])  # type: ignore[list-item]


def test_duplicate_call_ids_in_one_message_are_refused() -> None:
    ai = AIMessage(content="", tool_calls=[{"name": "f", "args": {}, "id": "c"}, {"name": "g", "args": {}, "id": "c"}])
    with pytest.raises(ConversionError, match="used twice"):
        from_langchain([ai])


def test_json_args_text_is_langchains_compact_form() -> None:
    ai = AIMessage(content="", tool_calls=[{"name": "f", "args": {"b": "é", "a": [1]}, "id": "c"}])
    (m,) = from_langchain([ai])
    assert m.parts[0].arguments == json.dumps({"b": "é", "a": [1]}, separators=(",", ":"), ensure_ascii=False)
