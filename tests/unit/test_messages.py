"""Message rules: construction, per-role kinds, metadata, immutability, errors (never ValidationError)."""

from __future__ import annotations

import copy
import pickle

import pytest
from pydantic import ValidationError

from schemas import (
    Citation,
    InvalidMessage,
    Media,
    MediaPart,
    Message,
    RawJSON,
    ReasoningPart,
    RefusalPart,
    Role,
    TextPart,
    ToolCallPart,
    ToolOutput,
    ToolResultPart,
)

PARTS = {
    "text": TextPart("hi"),
    "media": MediaPart(Media("image/png", data=b"\x89PNG")),
    "reasoning": ReasoningPart("thinking", b"\x00"),
    "tool_call": ToolCallPart("c1", "get_weather", '{"city":"Oslo"}'),
    "tool_result": ToolResultPart("c1", "get_weather", ToolOutput.text("sunny")),
    "refusal": RefusalPart("no"),
}
ALLOWED = {
    "system": {"text"},
    "user": {"text", "media"},
    "assistant": {"text", "media", "reasoning", "tool_call", "refusal"},
    "tool": {"tool_result"},
}


def test_positional_construction() -> None:
    m = Message("user", [TextPart("hi")])
    assert m.role == Role.USER == "user"
    assert m.parts == (TextPart("hi"),)
    call = ToolCallPart("c1", "get_weather", '{"city":"Oslo"}')
    assert (call.id, call.name, call.arguments, call.kind) == (
        "c1",
        "get_weather",
        '{"city":"Oslo"}',
        "tool_call",
    )


@pytest.mark.parametrize("role", sorted(ALLOWED))
@pytest.mark.parametrize("kind", sorted(PARTS))
def test_per_role_kinds(role: str, kind: str) -> None:
    if kind in ALLOWED[role]:
        assert Message(role, [PARTS[kind]]).parts[0].kind == kind
    else:
        with pytest.raises(
            InvalidMessage, match=rf"parts\[1\]: kind '{kind}' is not allowed for role '{role}'"
        ):
            Message(role, [PARTS["tool_result" if role == "tool" else "text"], PARTS[kind]])


def test_helpers() -> None:
    assert Message.system("be brief").role == "system"
    user = Message.user("a", PARTS["media"], "b")
    assert [p.kind for p in user.parts] == ["text", "media", "text"]
    assert user.text() == "ab"
    assert Message.assistant("x", PARTS["tool_call"]).text() == "x"
    assert Message.tool(PARTS["tool_result"]).role == "tool"


def test_at_least_one_part() -> None:
    with pytest.raises(InvalidMessage, match="at least one part"):
        Message("user", [])
    with pytest.raises(InvalidMessage, match="at least one part"):
        Message.user()


@pytest.mark.parametrize(
    "build",
    [
        lambda: Message.user("x", metadata={"": 1}),
        lambda: TextPart("x", metadata={"": 1}),
        lambda: Message.user("x", metadata={1: 1}),
        lambda: Message.user("x", metadata={"k": float("nan")}),
        lambda: Message.user("x", metadata={"k": float("inf")}),
        lambda: Message.user("x", metadata={"k": object()}),
        lambda: Message.user("x", metadata={"k": {1: 2}}),
        lambda: Message.user("x", metadata=[("k", 1)]),
        lambda: Message.user("x", metadata={"k": RawJSON("{")}),
        lambda: Message.user("\ud800"),
        lambda: Message.user("x", metadata={"k": "\udc00"}),
        lambda: Message.user("x", metadata={"k\ud800": 1}),
        lambda: ToolCallPart("c1", "f", "\ud800"),
        lambda: TextPart("x", [Citation("u", "\ud800")]),
        lambda: ToolCallPart("", "f", "{}"),
        lambda: ToolCallPart("c", "", "{}"),
        lambda: Media("image/png"),
        lambda: Media("image/png", data=b"x", uri="http://x"),
        lambda: Media("png", data=b"x"),
        lambda: Media("image/png", data=""),
        lambda: Media("image/png", data="not base64!"),
        lambda: Message("admin", [TextPart("x")]),
        lambda: Message("user", "hello"),
        lambda: Message("user", [{"kind": "nope"}]),
        lambda: Message("user", [{"kind": "text"}]),
        lambda: Message("user", [TextPart("x")], extra_field=1),
        lambda: TextPart(5),
        lambda: TextPart(b"bytes"),
        lambda: ToolResultPart("c", "n", ToolOutput(), is_error="yes"),
        lambda: ToolOutput(details=float("nan")),
        lambda: ToolOutput([PARTS["reasoning"]]),
        lambda: Message(),
    ],
)
def test_invalid_messages_raise_invalid_message_not_validation_error(build: object) -> None:
    with pytest.raises(InvalidMessage) as info:
        build()  # type: ignore[operator]
    assert not isinstance(info.value, ValidationError)
    assert str(info.value).startswith("invalid ")


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('{"role":"user","parts":[{"kind":"text","text":"x","zz":1}]}', r"parts\[0\]\.zz: unknown member"),
        ('{"role":"user","parts":[{"kind":"text","text":"x"}],"zz":1}', "zz: unknown member"),
        ('{"role":"user","parts":[{"kind":"text","text":"\\ud800"}]}', "lone surrogate"),
        (
            '{"role":"user","parts":[{"kind":"text","text":"x"}],"metadata":{"a":1,"a":2}}',
            "duplicate object key",
        ),
        ('{"role":"user","parts":[{"kind":"text","text":"x"}],"metadata":{"a":NaN}}', "NaN"),
        ('{"role":"user","parts":[{"kind":"text","text":"x"}],"metadata":{"":1}}', "empty key"),
        (
            '{"role":"user","parts":[{"kind":"tool_call","id":"c","name":"n","arguments":"{}"}]}',
            "not allowed",
        ),
        ('{"role":"user","parts":[{"kind":"text","text":5}]}', r"parts\[0\]\.text"),
        ('{"role":"user","parts":[{"kind":"text","text":"x"}]', "invalid JSON"),
        (b'{"role":"user","parts":[{"kind":"text","text":"\xff"}]}', "UTF-8"),
    ],
)
def test_json_errors_say_what_and_where(text: str | bytes, where: str) -> None:
    with pytest.raises(InvalidMessage, match=where):
        Message.model_validate_json(text)


def test_model_validate_translates_errors() -> None:
    with pytest.raises(InvalidMessage, match=r"parts\[0\]"):
        Message.model_validate({"role": "user", "parts": [{"kind": "text"}]})


def test_metadata_values_are_rawjson_and_keep_spelling() -> None:
    m = Message.user(
        "x", metadata={"n": RawJSON("1e3"), "f": 0.5, "s": "str", "o": {"b": 1, "a": [True, None]}}
    )
    assert m.metadata == {"n": "1e3", "f": "0.5", "s": '"str"', "o": '{"a":[true,null],"b":1}'}
    assert all(isinstance(v, RawJSON) for v in m.metadata.values())
    assert m.canonical_json() == (
        b'{"metadata":{"f":0.5,"n":1e3,"o":{"a":[true,null],"b":1},"s":"str"},'
        b'"parts":[{"kind":"text","text":"x"}],"role":"user"}'
    )


def test_deep_immutability_and_snapshot() -> None:
    parts = [TextPart("hi")]
    meta = {"k": [1, 2]}
    m = Message("user", parts, meta)
    before = m.canonical_json()
    parts.append(TextPart("more"))
    meta["k"].append(3)
    meta["j"] = 1
    assert m.canonical_json() == before
    assert isinstance(m.parts, tuple)
    with pytest.raises(TypeError):
        m.metadata["x"] = RawJSON("1")  # type: ignore[index]
    with pytest.raises(ValidationError):  # pydantic's frozen-instance error on attribute assignment
        m.role = Role.SYSTEM  # type: ignore[misc]
    assert hash(m) == hash(Message("user", [TextPart("hi")], {"k": [1, 2]}))


def test_equality_hash_copy_pickle() -> None:
    a = Message.user("x", metadata={"b": 1, "a": 2})
    b = Message.user("x", metadata={"a": 2, "b": 1})
    assert a == b and hash(a) == hash(b)
    assert a != Message.user("y")
    assert copy.deepcopy(a) is a
    clone = pickle.loads(pickle.dumps(a))
    assert clone == a and clone.canonical_json() == a.canonical_json()
    assert a.model_copy(update={"role": "system"}).role == "system"
    with pytest.raises(InvalidMessage):
        Message.user("x").model_copy(update={"role": "tool"})


def test_canonical_omits_defaults() -> None:
    r = ToolResultPart("c", "n", ToolOutput(), is_error=False)
    assert r.canonical_json() == b'{"id":"c","kind":"tool_result","name":"n","output":{}}'
    assert ReasoningPart().canonical_json() == b'{"kind":"reasoning"}'
    assert TextPart("x", []).canonical_json() == b'{"kind":"text","text":"x"}'
    assert ToolOutput(details=RawJSON("null")).details is None


def test_content_bytes_drop_message_metadata_only() -> None:
    plain = Message.user(TextPart("x", metadata={"p": 1}))
    tagged = Message.user(TextPart("x", metadata={"p": 1}), metadata={"interrupted": True})
    assert tagged.content_bytes() == plain.content_bytes() == len(plain.canonical_json())
    assert tagged.content_json() == plain.canonical_json()
    assert len(tagged.canonical_json()) > tagged.content_bytes()


def test_json_round_trip_keeps_spellings() -> None:
    m = Message.tool(
        ToolResultPart(
            "c", "n", ToolOutput.text("t", details=RawJSON("[1.50,-0]")), metadata={"x": RawJSON("1E3")}
        )
    )
    text = m.model_dump_json()
    assert Message.model_validate_json(text) == m
    assert Message.model_validate_json(text).canonical_json() == m.canonical_json()
    assert Message.model_validate(m.model_dump()) == m


def test_bytes_are_base64_in_json() -> None:
    m = Message.assistant(ReasoningPart(state=b"\xff\x00"))
    assert b'"state":"/wA="' in m.canonical_json()
    assert Message.model_validate_json(m.canonical_json()).parts[0].state == b"\xff\x00"  # type: ignore[union-attr]


def test_tool_result_accepts_a_plain_string_output() -> None:
    assert ToolResultPart("c", "n", "sunny").output == ToolOutput.text("sunny")


def test_from_canonical_round_trips_and_keeps_number_spellings() -> None:
    from schemas import InvalidMessage, Message, RawJSON

    plain = Message.user("hello")
    assert Message.from_canonical(plain.canonical_json()) == plain
    spelled = Message.user("x", metadata={"n": RawJSON("1e3"), "f": RawJSON("1.50")})
    back = Message.from_canonical(spelled.canonical_json())
    assert back.canonical_json() == spelled.canonical_json()
    assert back.metadata["n"] == "1e3"
    with pytest.raises(InvalidMessage):
        Message.from_canonical(b'{"parts":[],"role":"user"}')
    with pytest.raises(InvalidMessage):
        Message.from_canonical(b"not json")


@pytest.mark.parametrize("message", [
    Message.user("hello", "world"),
    Message.assistant(ToolCallPart("c1", "lookup", '{"id": 1.50}')),
    Message.user("x", metadata={"n": RawJSON("1e3"), "nested": RawJSON('[1.50, {"b": 2e-3}]')}),
    Message.tool(ToolResultPart("c1", "lookup", ToolOutput(details=RawJSON("1.0")))),
    Message.user('a text that says "metadata" and "details"'),
])
def test_from_stored_equals_the_original_including_number_spellings(message: Message) -> None:
    back = Message.from_stored(message.canonical_json())
    assert back == message
    assert back.canonical_json() == message.canonical_json()
    assert back.content_bytes() == message.content_bytes()
    assert [p.canonical_json() for p in back.parts] == [p.canonical_json() for p in message.parts]
    assert dict(back.metadata) == dict(message.metadata)
