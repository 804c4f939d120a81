"""Anthropic Messages ⇄ histlog messages (the promises are in ``engine.adapters``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from engine.adapters._common import (
    Json,
    _b64,
    _b64decode,
    _dump_args,
    _each,
    _guess_mime,
    _kept,
    _list,
    _load_object,
    _members,
    _obj,
    _plain_text,
    _restored,
    _str,
    _tool_name,
    _usage,
)
from schemas.chat import ChatResponse, FinishReason
from schemas.errors import InvalidMessage
from schemas.messages import (
    AnyPart,
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

__all__ = ["from_anthropic", "from_anthropic_response", "to_anthropic"]



_ANTHROPIC_KEPT = ["cache_control", "citations"]
_DOCUMENT_KEPT = ["cache_control", "citations", "context"]
_REDACTED = "anthropic.redacted"


def from_anthropic(messages: Iterable[Mapping[str, Any]], *, system: str | Sequence[Mapping[str, Any]] | None = None,
                   tool_names: Mapping[str, str] | None = None) -> list[Message]:
    """Anthropic Messages ``messages`` (and the top-level ``system``) → histlog messages.

    Maps: ``system`` (string or text blocks) → one system message first; user ``text``,
    ``image`` and ``document`` blocks (base64, URL, or plain-text sources; a document
    ``title`` becomes the media name) → a user message; a user message's ``tool_result`` blocks
    (which Anthropic requires first) → a tool message placed before the rest of that user
    message (so one user message can become a tool message and a user message); assistant
    ``text`` → text, ``thinking`` → reasoning (``signature`` as the UTF-8 ``state``),
    ``redacted_thinking`` → reasoning with ``data`` as ``state`` (marked ``anthropic.redacted``),
    ``tool_use`` → a tool call whose ``arguments`` is the compact JSON of ``input``.
    ``cache_control``, ``citations`` and a document's ``context`` are kept in part metadata.
    Does not map (raises ``InvalidMessage``): server tools and their results (``server_tool_use``,
    ``web_search_tool_result``, MCP blocks...), ``file`` and ``content`` document sources, and any
    unknown member or block type.
    """
    names: dict[str, str] = dict(tool_names or {})
    out: list[Message] = []
    if system is not None:
        if isinstance(system, str):
            out.append(Message.system(system))
        else:
            try:
                out.append(Message(Role.SYSTEM, [_anthropic_text(b, f"system[{j}]")
                                                 for j, b in enumerate(_list(system, "system"))]))
            except InvalidMessage as exc:
                raise InvalidMessage(f"Anthropic {exc}") from None

    def convert(m: Mapping[str, Any], where: str) -> list[Message]:
        _members(m, ["role", "content"], where)
        role, content = m.get("role"), m.get("content")
        if role not in ("user", "assistant"):
            raise InvalidMessage(f"role {role!r} does not map: Anthropic messages are user or assistant "
                                 "(pass the system prompt as system=)")
        if isinstance(content, str):
            return [Message(Role(role), [TextPart(content)])]
        blocks = [_obj(b, f"{where}.content[{j}]") for j, b in enumerate(_list(content, f"{where}.content"))]
        if role == "assistant":
            return [Message(Role.ASSISTANT, [_anthropic_assistant_block(b, f"{where}.content[{j}]", names)
                                             for j, b in enumerate(blocks)])]
        results: list[ToolResultPart] = []
        rest: list[TextPart | MediaPart] = []
        for j, block in enumerate(blocks):
            w = f"{where}.content[{j}]"
            if block.get("type") == "tool_result":
                if rest:
                    raise InvalidMessage(f"{w}: tool_result blocks must come first in a user message (Anthropic's "
                                         "rule); move it before the other blocks")
                results.append(_anthropic_tool_result(block, w, names))
            else:
                rest.append(_anthropic_user_block(block, w))
        converted = [Message.tool(*results)] if results else []
        if rest or not results:
            converted.append(Message(Role.USER, rest))
        return converted

    return out + _each(messages, "Anthropic", convert)


def _anthropic_text(block: Any, where: str) -> TextPart:
    block = _obj(block, where)
    if block.get("type") != "text":
        raise InvalidMessage(f"{where}: expected a text block, got {block.get('type')!r}")
    _members(block, ["type", "text", *_ANTHROPIC_KEPT], where)
    return TextPart(_str(block, "text", where), metadata=_kept(block, _ANTHROPIC_KEPT, "anthropic"))


def _anthropic_user_block(block: Mapping[str, Any], where: str) -> TextPart | MediaPart:
    kind = block.get("type")
    if kind == "text":
        return _anthropic_text(block, where)
    if kind == "image":
        _members(block, ["type", "source", "cache_control"], where)
        return MediaPart(_anthropic_source(block.get("source"), f"{where}.source", "image/*"),
                         metadata=_kept(block, ["cache_control"], "anthropic"))
    if kind == "document":
        _members(block, ["type", "source", "title", *_DOCUMENT_KEPT], where)
        media = _anthropic_source(block.get("source"), f"{where}.source", "application/pdf")
        title = block.get("title")
        if title is not None:
            media = Media(media.mime_type, media.data, media.uri, _str(block, "title", where))
        return MediaPart(media, metadata=_kept(block, _DOCUMENT_KEPT, "anthropic"))
    raise InvalidMessage(f"{where}: block type {kind!r} does not map in a user message "
                         "(text, image, document, tool_result)")


def _anthropic_source(source: Any, where: str, default_mime: str) -> Media:
    source = _obj(source, where)
    kind = source.get("type")
    if kind == "base64":
        _members(source, ["type", "media_type", "data"], where)
        return Media(_str(source, "media_type", where), data=_b64decode(_str(source, "data", where), f"{where}.data"))
    if kind == "url":
        _members(source, ["type", "url"], where)
        url = _str(source, "url", where, empty=False)
        return Media(_guess_mime(url, default_mime), uri=url)
    if kind == "text":
        _members(source, ["type", "media_type", "data"], where)
        return Media(_str(source, "media_type", where), data=_str(source, "data", where).encode("utf-8"))
    raise InvalidMessage(f"{where}: source type {kind!r} does not map (base64, url, text); "
                         "histlog keeps content, not provider file handles")


def _anthropic_tool_result(block: Mapping[str, Any], where: str, names: Mapping[str, str]) -> ToolResultPart:
    _members(block, ["type", "tool_use_id", "content", "is_error", "cache_control"], where)
    call_id = _str(block, "tool_use_id", where, empty=False)
    content = block.get("content")
    items: list[TextPart | MediaPart]
    if content is None:
        items = []
    elif isinstance(content, str):
        items = [TextPart(content)] if content else []
    else:
        items = [_anthropic_user_block(_obj(b, f"{where}.content[{k}]"), f"{where}.content[{k}]")
                 for k, b in enumerate(_list(content, f"{where}.content"))]
    is_error = block.get("is_error", False)
    if not isinstance(is_error, bool):
        raise InvalidMessage(f"{where}.is_error: expected true or false")
    return ToolResultPart(call_id, _tool_name(names, call_id, where), ToolOutput(items), is_error,
                          metadata=_kept(block, ["cache_control"], "anthropic"))


def _anthropic_assistant_block(block: Mapping[str, Any], where: str, names: dict[str, str]) -> AnyPart:
    kind = block.get("type")
    if kind == "text":
        return _anthropic_text(block, where)
    if kind == "thinking":
        _members(block, ["type", "thinking", "signature"], where)
        return ReasoningPart(_str(block, "thinking", where), _str(block, "signature", where).encode("utf-8"))
    if kind == "redacted_thinking":
        _members(block, ["type", "data"], where)
        return ReasoningPart("", _str(block, "data", where).encode("utf-8"), metadata={_REDACTED: True})
    if kind == "tool_use":
        _members(block, ["type", "id", "name", "input", "cache_control"], where)
        call_id, name = _str(block, "id", where, empty=False), _str(block, "name", where, empty=False)
        if not isinstance(block.get("input"), Mapping):
            raise InvalidMessage(f"{where}.input: expected a JSON object")
        names[call_id] = name
        return ToolCallPart(call_id, name, _dump_args(block["input"]),
                            metadata=_kept(block, ["cache_control"], "anthropic"))
    raise InvalidMessage(f"{where}: block type {kind!r} does not map in an assistant message "
                         "(text, thinking, redacted_thinking, tool_use; server tools are not supported)")


def to_anthropic(messages: Iterable[Message]) -> tuple[str | list[Json] | None, list[Json]]:
    """histlog messages → ``(system, messages)`` for the Anthropic Messages API.

    ``system`` is ``None`` without system messages, a string for one system message of one
    plain text part, else a list of text blocks. A tool message becomes a user message of
    ``tool_result`` blocks; consecutive tool messages, and a user message right after them, are
    merged into that one user message (Anthropic wants every result of an assistant turn in the
    next user message, results first). User content that is one plain text part is written as a
    string; assistant content is always a list of blocks. Reasoning with ``state`` becomes a
    ``thinking`` block (``state`` as the signature) or, when marked ``anthropic.redacted``, a
    ``redacted_thinking`` block; reasoning without ``state`` is left out (Anthropic requires a
    signature; do not send another provider's reasoning). Refusal parts are sent as text
    (Anthropic has no refusal block). Left out: citations objects and metadata other than
    ``anthropic.*``, and tool ``details`` when the output has content (with no content, the
    details' JSON is the content).
    Raises ``InvalidMessage`` for media in an assistant message, tool-call ``arguments`` that
    are not a JSON object, and anything not a ``Message``.
    """
    system: list[Json] = []
    out: list[Json] = []
    merging = False  # the last user message was made of tool results: results and a following user merge into it
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, Message):
            raise InvalidMessage(f"{where}: expected a schemas.Message, got {type(m).__name__}")
        if m.role is Role.SYSTEM:
            for part in m.parts:
                assert isinstance(part, TextPart)  # Invariant: system messages carry text only.
                system.append(_anthropic_text_block(part))
            continue
        if m.role is Role.TOOL:
            blocks = [_anthropic_result_block(p, f"{where}.parts[{j}]") for j, p in enumerate(m.parts)]
            if merging:
                out[-1]["content"].extend(blocks)
            else:
                out.append({"role": "user", "content": blocks})
            merging = True
            continue
        if m.role is Role.USER:
            blocks = [_anthropic_user_dict(p, f"{where}.parts[{j}]") for j, p in enumerate(m.parts)]
            if merging:
                out[-1]["content"].extend(blocks)
            elif len(m.parts) == 1 and _plain_text(m.parts[0]):
                out.append({"role": "user", "content": m.parts[0].text})  # type: ignore[union-attr]
            else:
                out.append({"role": "user", "content": blocks})
        else:
            blocks = [b for j, p in enumerate(m.parts) if (b := _anthropic_assistant_dict(p, f"{where}.parts[{j}]"))]
            out.append({"role": "assistant", "content": blocks})
        merging = False
    if not system:
        return None, out
    if len(system) == 1 and set(system[0]) == {"type", "text"}:
        return system[0]["text"], out
    return system, out


def _anthropic_text_block(part: TextPart) -> Json:
    return {"type": "text", "text": part.text, **_restored(part.metadata, "anthropic", _ANTHROPIC_KEPT)}


def _anthropic_source_dict(media: Media) -> Json:
    if media.uri is not None:
        return {"type": "url", "url": media.uri}
    assert media.data is not None  # Invariant: Media has exactly one of data and uri.
    if media.mime_type == "text/plain":
        return {"type": "text", "media_type": "text/plain", "data": media.data.decode("utf-8")}
    return {"type": "base64", "media_type": media.mime_type, "data": _b64(media.data)}


def _anthropic_user_dict(part: AnyPart, where: str) -> Json:
    if isinstance(part, TextPart):
        return _anthropic_text_block(part)
    assert isinstance(part, MediaPart)  # Invariant: user content is text or media.
    media = part.media
    if media.mime_type.startswith("image/"):
        return {"type": "image", "source": _anthropic_source_dict(media),
                **_restored(part.metadata, "anthropic", ["cache_control"])}
    block: Json = {"type": "document", "source": _anthropic_source_dict(media)}
    if media.name is not None:
        block["title"] = media.name
    return {**block, **_restored(part.metadata, "anthropic", _DOCUMENT_KEPT)}


def _anthropic_result_block(part: AnyPart, where: str) -> Json:
    assert isinstance(part, ToolResultPart)  # Invariant: tool messages carry tool results only.
    output = part.output
    content: str | list[Json]
    if not output.content:
        content = str(output.details) if output.details is not None else ""
    elif len(output.content) == 1 and _plain_text(output.content[0]):
        content = output.content[0].text  # type: ignore[union-attr]
    else:
        content = [_anthropic_user_dict(c, f"{where}.output.content[{k}]") for k, c in enumerate(output.content)]
    block: Json = {"type": "tool_result", "tool_use_id": part.id, "content": content}
    if part.is_error:
        block["is_error"] = True
    return {**block, **_restored(part.metadata, "anthropic", ["cache_control"])}


def _anthropic_assistant_dict(part: AnyPart, where: str) -> Json | None:
    if isinstance(part, TextPart):
        return _anthropic_text_block(part)
    if isinstance(part, RefusalPart):
        return {"type": "text", "text": part.text}
    if isinstance(part, ReasoningPart):
        if not part.state:
            return None
        if _REDACTED in part.metadata:
            return {"type": "redacted_thinking", "data": part.state.decode("utf-8")}
        return {"type": "thinking", "thinking": part.text, "signature": part.state.decode("utf-8")}
    if isinstance(part, ToolCallPart):
        return {"type": "tool_use", "id": part.id, "name": part.name, "input": _load_object(part.arguments, where),
                **_restored(part.metadata, "anthropic", ["cache_control"])}
    raise InvalidMessage(f"{where}: an Anthropic assistant message cannot carry {part.kind}")


_ANTHROPIC_FINISH = {"end_turn": FinishReason.STOP, "stop_sequence": FinishReason.STOP,
                     "max_tokens": FinishReason.LENGTH, "model_context_window_exceeded": FinishReason.LENGTH,
                     "tool_use": FinishReason.TOOL_CALLS, "refusal": FinishReason.REFUSAL}


def from_anthropic_response(message: Mapping[str, Any], *,
                            tool_names: Mapping[str, str] | None = None) -> ChatResponse:
    """An Anthropic Messages response body → ``ChatResponse`` (``stop_reason`` mapped: end_turn and
    stop_sequence → stop, max_tokens → length, tool_use → tool_calls, refusal → refusal, others →
    other; an empty ``content`` → no message)."""
    body = _obj(message, "Anthropic response")
    content = _list(body.get("content"), "Anthropic response.content")
    parsed = from_anthropic([{"role": "assistant", "content": content}], tool_names=tool_names) if content else []
    finish = _ANTHROPIC_FINISH.get(str(body.get("stop_reason")), FinishReason.OTHER)
    return ChatResponse(parsed[0] if parsed else None, finish,
                        _usage(body, "input_tokens", "output_tokens", "Anthropic response"))
