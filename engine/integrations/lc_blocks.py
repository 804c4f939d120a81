"""The pieces of the LangChain conversion below the message: content blocks <-> parts, message
metadata <-> LangChain message fields, and the JSON helpers both directions share
(``engine/integrations/lc_messages.py`` has the promises and uses these).

Every helper either returns an exact counterpart or raises ``ConversionError``; none drops a
member: what histlog has no field for travels under the reserved ``histlog_*`` keys (LangChain
side) or the ``langchain`` / ``langchain_content`` metadata keys (histlog side)."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, TypeVar

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from schemas.canonical import RawJSON
from schemas.errors import InvalidMessage
from schemas.messages import (
    AnyPart,
    Citation,
    Media,
    MediaPart,
    ReasoningPart,
    RefusalPart,
    TextPart,
)

__all__ = [
    "MISSING", "ConversionError", "bag_in", "block_part", "build", "compact_json", "exact_value", "fail",
    "fields_out", "loads_json", "meta_from", "part_block", "to_raw",
]


class ConversionError(InvalidMessage):
    """A message, or a member of one, has no form on the other side; nothing was converted."""


RAW: Final = "histlog_metadata"  # metadata keys with no LangChain field, as JSON text
TOOL_CALLS: Final = "histlog_tool_calls"  # per call id: exact argument text, part metadata
TOOL_GROUP: Final = "histlog_tool_message"  # [index, count] of ToolMessages split from one message
PART_META: Final = "histlog_part_metadata"  # a ToolMessage's tool-result part metadata
DETAILS: Final = "histlog_details"  # a ToolMessage's details when the artifact loses a spelling
STATE: Final = "histlog_state"  # reasoning state bytes that are not a JSON object (base64)
EXTRA: Final = "langchain"  # part metadata: the block's members histlog has no field for
FORM: Final = "langchain_content"  # metadata: content as "blocks" / "ordered" where a string would do
_RESERVED: Final = frozenset({RAW, TOOL_CALLS, TOOL_GROUP, PART_META, DETAILS})
_MEDIA: Final = frozenset({"image", "audio", "video", "file"})
_REASONING: Final = frozenset({"reasoning", "thinking", "redacted_thinking"})
MISSING: Final = object()
_T = TypeVar("_T")


def fail(where: str, why: str) -> ConversionError:
    return ConversionError(f"cannot convert {where}: {why}")


def compact_json(value: Any) -> str:
    """LangChain's JSON text for a value: compact, insertion order, non-ASCII kept."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _no_constant(name: str) -> Any:
    raise ValueError(name)


def loads_json(text: str | bytes) -> Any:
    """Parse JSON (NaN/Infinity refused); ``MISSING`` when it is not JSON."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError):
        return MISSING


def to_raw(value: Any, where: str) -> RawJSON:
    try:
        return RawJSON.of(value)
    except InvalidMessage as exc:
        raise fail(where, f"not a JSON value ({exc})") from None


def exact_value(raw: RawJSON) -> Any:
    """The Python value of ``raw`` if it serialises back to exactly ``raw``, else ``MISSING``."""
    if raw.startswith('"') and "\\" not in raw:  # a string without escapes (ids): itself, exactly
        return str.__str__(raw)[1:-1]
    value = raw.value()
    return value if RawJSON.of(value) == raw else MISSING


def bag_in(bag: object, where: str) -> dict[str, RawJSON]:
    if bag is None:
        return {}
    if not isinstance(bag, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in bag.items()):
        raise fail(where, f"{RAW} must map keys to JSON text")
    try:
        return {k: RawJSON(v) for k, v in bag.items()}
    except InvalidMessage as exc:
        raise fail(where, f"{RAW}: {exc}") from None


def build(where: str, build: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """Construct a histlog value, turning its validation error into a ``ConversionError``."""
    try:
        return build(*args, **kwargs)
    except InvalidMessage as exc:
        raise fail(where, str(exc)) from None


# --------------------------------------------------------------------------- content blocks


def _media_type(mime: str) -> str:
    major = mime.split("/", 1)[0]
    return major if major in ("image", "audio", "video") else "file"


def _state_block(text: str, state: bytes) -> dict[str, Any] | None:
    """The reasoning block that spells ``state`` as its own members, or None if it cannot."""
    obj = loads_json(state)
    if not isinstance(obj, dict) or not obj or RAW in obj:
        return None
    try:
        if compact_json(obj).encode() != state:
            return None
    except (ValueError, UnicodeEncodeError):
        return None
    kind = obj.get("type")
    if kind == "thinking" and "thinking" not in obj:
        return {**obj, "thinking": text}
    if kind == "redacted_thinking" and not text:
        return dict(obj)
    if kind is None and "reasoning" not in obj and not _is_state_extras(obj):
        return {"type": "reasoning", "reasoning": text, **obj}
    return None


def _is_state_extras(obj: Mapping[str, Any]) -> bool:
    return list(obj) == ["extras"] and isinstance(obj["extras"], dict) and list(obj["extras"]) == [STATE]


def _meta_out(metadata: Mapping[str, RawJSON], block: dict[str, Any], overridable: Iterable[str] = (),
              spread: bool = True) -> None:
    """Put part metadata on ``block``: ``langchain`` members spread back (unless ``spread`` is
    false: a reasoning block's own members are its state), the rest as JSON text."""
    bag: dict[str, str] = {}
    free = set(overridable)
    for key, raw in metadata.items():
        if key == EXTRA and spread:
            extra = exact_value(raw)
            if isinstance(extra, dict) and extra and RAW not in extra and not (set(extra) & (set(block) - free)):
                block.update(extra)
                continue
        bag[key] = str(raw)
    if bag:
        block[RAW] = bag


def _meta_in(bag: dict[str, RawJSON], rest: dict[str, Any], where: str) -> dict[str, RawJSON]:
    """Part metadata from a block: its ``histlog_metadata`` plus leftover members under ``langchain``."""
    if rest:
        if EXTRA in bag:
            raise fail(where, f"both {RAW}[{EXTRA!r}] and block members {sorted(rest)} (ambiguous)")
        bag = {**bag, EXTRA: to_raw(rest, where)}
    return bag


def _citations(annotations: object) -> tuple[Citation, ...] | None:
    """Annotations as citations, or None unless every one is ``{type: citation, url[, title]}``."""
    if not isinstance(annotations, list) or not annotations:
        return None
    out = []
    for a in annotations:
        if not (isinstance(a, dict) and a.get("type") == "citation" and set(a) <= {"type", "url", "title"}):
            return None
        url, title = a.get("url"), a.get("title", MISSING)
        if not isinstance(url, str) or not url or not (title is MISSING or (isinstance(title, str) and title)):
            return None
        out.append(Citation(url, "" if title is MISSING else title))
    return tuple(out)


def part_block(part: AnyPart) -> dict[str, Any]:
    """One text, media, reasoning or refusal part as a LangChain v1 content block."""
    block: dict[str, Any]
    overridable: tuple[str, ...] = ()
    if isinstance(part, TextPart):
        block = {"type": "text", "text": part.text}
        if part.citations:
            block["annotations"] = [
                {"type": "citation", "url": c.uri, **({"title": c.title} if c.title else {})} for c in part.citations]
    elif isinstance(part, MediaPart):
        media = part.media
        block = {"type": _media_type(media.mime_type), "mime_type": media.mime_type}
        if media.data is not None:
            block["base64"] = base64.b64encode(media.data).decode("ascii")
        else:
            block["url"] = media.uri
        if media.name is not None:
            block["extras"] = {"filename": media.name}
        overridable = ("type",)
    elif isinstance(part, ReasoningPart):
        spelled = _state_block(part.text, part.state) if part.state else None
        if spelled is not None:
            block = spelled
        else:
            block = {"type": "reasoning", "reasoning": part.text}
            if part.state:
                block["extras"] = {STATE: base64.b64encode(part.state).decode("ascii")}
    elif isinstance(part, RefusalPart):
        block = {"type": "refusal", "refusal": part.text}
    else:  # Invariant: callers route tool calls and results elsewhere.
        raise AssertionError(part.kind)
    _meta_out(part.metadata, block, overridable, spread=not isinstance(part, ReasoningPart))
    return block


def block_part(block: object, where: str) -> AnyPart | str:
    """A content block as a part; a tool-call block gives its call id (a marker of its place)."""
    if isinstance(block, str):
        return TextPart(block)
    if not isinstance(block, dict):
        raise fail(where, f"a content item must be a str or a dict, got {type(block).__name__}")
    rest = dict(block)
    kind = rest.pop("type", None)
    bag = bag_in(rest.pop(RAW, None), where)
    if kind in ("tool_call", "invalid_tool_call"):
        call_id = block.get("id")
        if not isinstance(call_id, str):
            raise fail(where, f"a {kind} block needs its call id")
        return call_id
    if kind == "text":
        text = rest.pop("text", None)
        if not isinstance(text, str):
            raise fail(where, "a text block needs a str text")
        citations = _citations(rest.get("annotations"))
        if citations is not None:
            del rest["annotations"]
        return build(where, TextPart, text, citations or (), metadata=_meta_in(bag, rest, where))
    if kind in _MEDIA:
        return _media_part(str(kind), rest, bag, where)
    if kind in _REASONING:
        text_key = {"reasoning": "reasoning", "thinking": "thinking"}.get(str(kind))
        text = rest.pop(text_key, "") if text_key else ""
        if not isinstance(text, str):
            raise fail(where, f"a {kind} block needs a str {text_key}")
        members = rest if kind == "reasoning" else {"type": kind, **rest}
        if kind == "reasoning" and _is_state_extras(members):
            state = _b64(members["extras"][STATE], where)
            if _state_block(text, state) is not None:
                raise fail(where, f"extras.{STATE} holds a JSON object; give its members instead")
        else:
            try:
                state = compact_json(members).encode() if members else b""
            except (ValueError, TypeError, UnicodeEncodeError) as exc:
                raise fail(where, f"reasoning members are not JSON ({exc})") from None
        return build(where, ReasoningPart, text, state, metadata=bag)
    if kind == "refusal":
        text = rest.pop("refusal", None)
        if not isinstance(text, str):
            raise fail(where, "a refusal block needs a str refusal")
        return build(where, RefusalPart, text, metadata=_meta_in(bag, rest, where))
    raise fail(where, f"content block type {kind!r} has no histlog part (histlog holds text, image, audio, "
                       "video, file, reasoning and refusal blocks)")


def _b64(text: object, where: str) -> bytes:
    if not isinstance(text, str):
        raise fail(where, "base64 data must be a str")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise fail(where, "invalid base64 data") from None
    if base64.b64encode(data).decode("ascii") != text:
        raise fail(where, "base64 data is not in canonical form (padding, line breaks)")
    return data


def _media_part(kind: str, rest: dict[str, Any], bag: dict[str, RawJSON], where: str) -> MediaPart:
    mime = rest.pop("mime_type", None)
    if not isinstance(mime, str):
        raise fail(where, f"a {kind} block needs a mime_type (histlog media always has one)")
    if "file_id" in rest:
        raise fail(where, f"a {kind} block by file_id (a provider's file store) has no histlog form; "
                           "give url or base64")
    if ("base64" in rest) == ("url" in rest):
        raise fail(where, f"a {kind} block needs exactly one of url or base64")
    data = _b64(rest.pop("base64"), where) if "base64" in rest else None
    uri = rest.pop("url", None)
    name = None
    extras = rest.get("extras")
    if isinstance(extras, dict) and list(extras) == ["filename"] and isinstance(extras["filename"], str):
        name = rest.pop("extras")["filename"]
    if kind != _media_type(mime):
        rest["type"] = kind
    media = build(where, Media, mime, data=data, uri=uri, name=name)
    return build(where, MediaPart, media, metadata=_meta_in(bag, rest, where))


# --------------------------------------------------------------------------- message metadata

_USAGE_KEYS: Final = frozenset({"input_tokens", "output_tokens", "total_tokens",
                                "input_token_details", "output_token_details"})


def _native(key: str, value: Any, kind: type[BaseMessage]) -> bool:
    """Whether metadata ``key`` with ``value`` is the LangChain field of the same name."""
    if key == "id":
        return isinstance(value, str)
    if key == "name":
        return isinstance(value, str) and kind is not ToolMessage
    if key == "usage":
        return (kind is AIMessage and isinstance(value, dict) and set(value) <= _USAGE_KEYS
                and all(isinstance(value.get(k), int) and not isinstance(value.get(k), bool)
                        for k in ("input_tokens", "output_tokens", "total_tokens")))
    if key in ("response_metadata", "additional_kwargs"):
        return isinstance(value, dict) and bool(value) and not (set(value) & _RESERVED)
    return False


_FIELD: Final = {"id": "id", "name": "name", "usage": "usage_metadata",
                 "response_metadata": "response_metadata", "additional_kwargs": "additional_kwargs"}


def fields_out(metadata: Mapping[str, RawJSON], kind: type[BaseMessage], skip: str = "") -> dict[str, Any]:
    """LangChain constructor fields for message metadata (``skip``: a key the caller consumed)."""
    fields: dict[str, Any] = {}
    bag: dict[str, str] = {}
    for key, raw in metadata.items():
        if key == skip:
            continue
        value = exact_value(raw) if key in _FIELD else MISSING
        if value is not MISSING and _native(key, value, kind):
            fields[_FIELD[key]] = value
        else:
            bag[key] = str(raw)
    kwargs = dict(fields.get("additional_kwargs", {}))
    if bag:
        kwargs[RAW] = bag
    fields["additional_kwargs"] = kwargs
    return fields


def meta_from(msg: BaseMessage, kwargs: dict[str, Any], where: str) -> dict[str, RawJSON]:
    """Message metadata from a LangChain message; ``kwargs`` is its additional_kwargs with the
    histlog keys other than ``histlog_metadata`` already taken out."""
    kwargs = dict(kwargs)
    bag = bag_in(kwargs.pop(RAW, None), where)
    reserved = [k for k in kwargs if k.startswith("histlog_")]
    if reserved:
        raise fail(where, f"additional_kwargs key {reserved[0]!r}: the histlog_ prefix is reserved")
    meta: dict[str, RawJSON] = {}
    if msg.id is not None:
        meta["id"] = to_raw(msg.id, where)
    if msg.name is not None and not isinstance(msg, ToolMessage):
        meta["name"] = to_raw(msg.name, where)
    usage = getattr(msg, "usage_metadata", None)
    if usage is not None:
        meta["usage"] = to_raw(dict(usage), f"{where}.usage_metadata")
    if msg.response_metadata:
        meta["response_metadata"] = to_raw(msg.response_metadata, f"{where}.response_metadata")
    if kwargs:
        meta["additional_kwargs"] = to_raw(kwargs, f"{where}.additional_kwargs")
    for key, raw in bag.items():
        if key in meta:
            raise fail(where, f"metadata {key!r} given twice (as a field and in {RAW})")
        meta[key] = raw
    return meta


