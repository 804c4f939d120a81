"""One declaration per model: every field of every model in ``schemas`` reaches the model's
canonical form (so the digest), unless it is declared excluded with a reason, and the positional
constructors are the ones the public contract writes."""

from __future__ import annotations

import inspect
import json
from datetime import datetime
from typing import Annotated, Any, Literal, get_origin

import pytest
from pydantic import StrictStr

import schemas
from schemas import (
    ChatDelta,
    ChatRequest,
    ChatResponse,
    Citation,
    InvalidMessage,
    Media,
    MediaPart,
    Message,
    RawJSON,
    ReasoningDelta,
    ReasoningPart,
    RefusalDelta,
    RefusalPart,
    TextDelta,
    TextPart,
    ToolCallDelta,
    ToolCallPart,
    ToolOutput,
    ToolResultPart,
    Usage,
)
from schemas.model import Model, Rule

# Per model, values that together give every field a value other than its default (Media's
# data and uri exclude each other, so it needs two). A field added to a model makes
# test_every_field_reaches_the_canonical_form fail until a sample here gives it a value.
SAMPLES: dict[type[Model], list[Model]] = {
    Citation: [Citation("https://example.com/a", "A page")],
    Media: [Media("image/png", b"\x89PNG", name="a.png"), Media("image/png", uri="https://example.com/a.png")],
    TextPart: [TextPart("hi", [Citation("https://example.com/a")], metadata={"lang": "en"})],
    MediaPart: [MediaPart(Media("audio/wav", uri="https://example.com/a.wav"), metadata={"s": 2})],
    ReasoningPart: [ReasoningPart("thinking", b"\x00\xff", metadata={"effort": RawJSON("1e3")})],
    ToolCallPart: [ToolCallPart("c1", "get_weather", '{"city":"Oslo"}', metadata={"n": 1})],
    ToolOutput: [ToolOutput([TextPart("sunny")], RawJSON('{"t":21.50}'))],
    ToolResultPart: [ToolResultPart("c1", "get_weather", ToolOutput.text("no"), True, metadata={"ms": 3})],
    RefusalPart: [RefusalPart("no", metadata={"policy": "p"})],
    Message: [Message("user", [TextPart("hi")], {"interrupted": True})],
    Usage: [Usage(3, 4)],
    ChatRequest: [ChatRequest([Message.user("hi")], [{"name": "f"}], {"temperature": 0.2})],
    ChatResponse: [ChatResponse(Message.assistant("hi"), "length", Usage(1, 2))],
    TextDelta: [TextDelta("a")],
    ReasoningDelta: [ReasoningDelta("r")],
    ToolCallDelta: [ToolCallDelta("c1", "get_weather", "{")],
    RefusalDelta: [RefusalDelta("no")],
    ChatDelta: [ChatDelta([TextDelta("a")], "stop", Usage(0, 1))],
}

# Canonical forms that are an identity only (equality, hashing), never parsed back.
IDENTITY_ONLY = {ChatRequest}

# The positional constructors as the public contract writes them; a part's metadata is keyword-only.
PARTS = {TextPart, MediaPart, ReasoningPart, ToolCallPart, ToolResultPart, RefusalPart}
POSITIONAL = {
    Citation: ["uri", "title"],
    Media: ["mime_type", "data", "uri", "name"],
    TextPart: ["text", "citations"],
    MediaPart: ["media"],
    ReasoningPart: ["text", "state"],
    ToolCallPart: ["id", "name", "arguments"],
    ToolOutput: ["content", "details"],
    ToolResultPart: ["id", "name", "output", "is_error"],
    RefusalPart: ["text"],
    Message: ["role", "parts", "metadata"],
    Usage: ["input_tokens", "output_tokens"],
    ChatRequest: ["messages", "tools", "options"],
    ChatResponse: ["message", "finish_reason", "usage"],
    TextDelta: ["text"],
    ReasoningDelta: ["text"],
    ToolCallDelta: ["id", "name", "arguments"],
    RefusalDelta: ["text"],
    ChatDelta: ["parts", "finish_reason", "usage"],
}


def _model_classes() -> set[type[Model]]:
    """Every public model class defined in ``schemas`` (imported with the package)."""
    found: set[type[Model]] = set()
    todo = [Model]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("schemas.") and not sub.__name__.startswith("_"):
                found.add(sub)
    return found


def _excluded(cls: type[Model]) -> dict[str, str]:
    """Fields declared out of the canonical form, with the reason given."""
    return {
        name: rule.excluded
        for name, info in cls.model_fields.items()
        for rule in info.metadata
        if isinstance(rule, Rule) and rule.excluded
    }


def _set(value: Model, name: str) -> bool:
    """Whether ``value`` holds something in ``name`` that its canonical form must show: a
    ``Literal`` tag (``kind``) always, any other field when not ``None`` and not its default."""
    info = type(value).model_fields[name]
    held = getattr(value, name)
    tag = get_origin(info.annotation) is Literal
    return tag or (held is not None and (info.is_required() or held != info.default))


def _missing_from_canonical(value: Model) -> list[str]:
    """The fields of ``value`` that hold a value but are absent from its canonical JSON, or
    (for a form that is parsed back) do not survive the round trip through it."""
    cls = type(value)
    tree = json.loads(value.canonical_json())
    missing = [n for n in cls.model_fields if n not in _excluded(cls) and _set(value, n) and n not in tree]
    if cls not in IDENTITY_ONLY:
        back = cls.from_canonical(value.canonical_json())
        missing += [n for n in cls.model_fields
                    if n not in _excluded(cls) and n not in missing and getattr(back, n) != getattr(value, n)]
    return missing


def test_every_model_class_has_samples() -> None:
    assert _model_classes() == set(SAMPLES), "add samples for the new model class to SAMPLES"
    assert set(SAMPLES) == set(POSITIONAL)


@pytest.mark.parametrize("cls", sorted(SAMPLES, key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_every_field_reaches_the_canonical_form(cls: type[Model]) -> None:
    unset = set(cls.model_fields) - set(_excluded(cls))
    for value in SAMPLES[cls]:
        assert _missing_from_canonical(value) == []
        unset -= {n for n in cls.model_fields if _set(value, n)}
    assert unset == set(), f"give {cls.__name__}.{sorted(unset)} a non-default value in SAMPLES"


def test_the_check_catches_a_field_left_out_of_the_canonical_form() -> None:
    class Forgetful(TextPart):
        note: StrictStr = ""

    # A canonical tree written by hand, as models once did, that forgets `note`.
    Forgetful._tree = lambda self: {"kind": "text", "text": self.text}  # type: ignore[method-assign]
    value = Forgetful("hi", note="lost")
    assert value.canonical_json() == TextPart("hi").canonical_json()
    assert _missing_from_canonical(value) == ["note"]


def test_a_model_cannot_write_its_canonical_tree_by_hand() -> None:
    with pytest.raises(TypeError, match=r"HandWritten defines _tree: the canonical tree is derived"):

        class HandWritten(TextPart):
            def _tree(self) -> dict[str, Any]:
                return {"kind": "text", "text": self.text}


def test_a_field_added_without_a_rule_reaches_the_canonical_form() -> None:
    class Noted(TextPart):
        note: StrictStr = ""

    value = Noted("hi", (), "kept")
    assert value.note == "kept"
    assert json.loads(value.canonical_json())["note"] == "kept"
    assert _missing_from_canonical(value) == []
    assert Noted("hi") == Noted("hi", note="")  # a default is omitted, as everywhere


def test_a_field_of_a_type_without_a_canonical_form_cannot_be_declared() -> None:
    with pytest.raises(TypeError, match=r"Stamped\.when: no canonical form .*Rule\(encode=\.\.\.\)"):

        class Stamped(TextPart):
            when: datetime | None = None


def test_an_excluded_field_says_why_and_stays_out_of_the_bytes() -> None:
    class Traced(TextPart):
        trace: Annotated[StrictStr, Rule(excluded="a local debugging aid, not content")] = ""

    assert _excluded(Traced) == {"trace": "a local debugging aid, not content"}
    value = Traced("hi", trace="t-1")
    assert value.canonical_json() == TextPart("hi").canonical_json()
    assert _missing_from_canonical(value) == []


@pytest.mark.parametrize("cls", sorted(POSITIONAL, key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_positional_constructors_follow_the_contract(cls: type[Model]) -> None:
    params = inspect.signature(cls).parameters.values()
    assert [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD] == POSITIONAL[cls]
    keyword = ["metadata"] if cls in PARTS else []
    assert [p.name for p in params if p.kind is p.KEYWORD_ONLY] == keyword
    for value in SAMPLES[cls]:  # rebuilt by position, every value lands in its field
        rebuilt = cls(*(getattr(value, n) for n in POSITIONAL[cls]), **{n: getattr(value, n) for n in keyword})
        assert rebuilt == value


def test_constructor_misuse_is_a_type_error_and_bad_values_an_invalid_message() -> None:
    with pytest.raises(TypeError, match=r"at most 2 positional arguments \(text, citations\), 3"):
        TextPart("a", (), {})
    with pytest.raises(TypeError, match="'text' both by position and by keyword"):
        TextPart("a", text="b")
    with pytest.raises(InvalidMessage, match="text: missing required member"):
        TextPart()
    with pytest.raises(InvalidMessage, match="kind: Input should be 'text'"):
        TextPart("a", kind="media")
    assert TextPart("a", metadata=None) == TextPart("a")  # None metadata means none
    assert ToolResultPart("c", "n", "out").output == ToolOutput.text("out")


def test_schemas_package_exports_every_model() -> None:
    assert {c.__name__ for c in _model_classes()} <= set(schemas.__all__)
