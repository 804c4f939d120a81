"""OpenAI Chat Completions ⇄ histlog messages (the promises are in ``engine.adapters``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from engine.adapters._common import (
    Json,
    _b64,
    _b64decode,
    _data_url,
    _each,
    _guess_mime,
    _kept,
    _list,
    _members,
    _obj,
    _parse_data_url,
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

__all__ = ["from_openai", "from_openai_response", "to_openai"]



_OPENAI_MEDIA = {"audio/wav": "wav", "audio/x-wav": "wav", "audio/mpeg": "mp3", "audio/mp3": "mp3"}
_OPENAI_FORMAT = {"wav": "audio/wav", "mp3": "audio/mpeg"}


def from_openai(messages: Iterable[Mapping[str, Any]], *,
                tool_names: Mapping[str, str] | None = None) -> list[Message]:
    """OpenAI Chat Completions ``messages`` → histlog messages, one for one.

    Maps: ``system`` and ``developer`` → system (``developer`` kept as ``openai.role``); user text,
    ``image_url`` (URL or data URL; ``detail`` kept), ``input_audio`` (wav, mp3) and ``file`` with
    ``file_data`` → text and media parts; assistant ``content`` (string or text/refusal parts),
    ``refusal``, ``tool_calls`` (function calls; ``arguments`` kept as the exact text) and
    ``reasoning_content`` (the field DeepSeek and vLLM-style servers use) → text, refusal,
    tool-call and reasoning parts; a ``tool`` message → a tool message with one result (string or
    text-part content). A message ``name`` and non-empty ``annotations`` are kept in message metadata.
    Does not map (raises ``InvalidMessage``): the ``function`` role and ``function_call``,
    custom (non-function) tool calls, assistant ``audio``, ``file`` parts by ``file_id``, and any
    unknown member or part type.
    """
    names: dict[str, str] = dict(tool_names or {})

    def convert(m: Mapping[str, Any], where: str) -> list[Message]:
        role = m.get("role")
        meta = _kept(m, ["name"], "openai")
        if role in ("system", "developer"):
            _members(m, ["role", "content", "name"], where)
            if role == "developer":
                meta["openai.role"] = "developer"
            return [Message(Role.SYSTEM, _openai_texts(m.get("content"), f"{where}.content"), meta)]
        if role == "user":
            _members(m, ["role", "content", "name"], where)
            return [Message(Role.USER, _openai_user_content(m.get("content"), f"{where}.content"), meta)]
        if role == "assistant":
            return [_openai_assistant(m, where, meta, names)]
        if role == "tool":
            _members(m, ["role", "content", "tool_call_id"], where)
            call_id = _str(m, "tool_call_id", where, empty=False)
            content = m.get("content")
            output = ToolOutput(_openai_texts(content, f"{where}.content", allow_empty=True))
            return [Message.tool(ToolResultPart(call_id, _tool_name(names, call_id, where), output))]
        raise InvalidMessage(f"role {role!r} does not map: use system, developer, user, assistant or tool "
                             "(the legacy function role and function_call are not supported)")

    return _each(messages, "OpenAI", convert)


def _openai_texts(content: Any, where: str, *, allow_empty: bool = False) -> list[TextPart]:
    if isinstance(content, str):
        return [TextPart(content)] if content or not allow_empty else []
    parts = []
    for j, item in enumerate(_list(content, where)):
        item = _obj(item, f"{where}[{j}]")
        if item.get("type") != "text":
            raise InvalidMessage(f"{where}[{j}]: part type {item.get('type')!r} is not allowed here (text only)")
        _members(item, ["type", "text"], f"{where}[{j}]")
        parts.append(TextPart(_str(item, "text", f"{where}[{j}]")))
    return parts


def _openai_user_content(content: Any, where: str) -> list[TextPart | MediaPart]:
    if isinstance(content, str):
        return [TextPart(content)]
    parts: list[TextPart | MediaPart] = []
    for j, item in enumerate(_list(content, where)):
        w = f"{where}[{j}]"
        item = _obj(item, w)
        kind = item.get("type")
        if kind == "text":
            _members(item, ["type", "text"], w)
            parts.append(TextPart(_str(item, "text", w)))
        elif kind == "image_url":
            _members(item, ["type", "image_url"], w)
            image = _obj(item.get("image_url"), f"{w}.image_url")
            _members(image, ["url", "detail"], f"{w}.image_url")
            url = _str(image, "url", f"{w}.image_url", empty=False)
            inline = _parse_data_url(url, f"{w}.image_url.url")
            media = (Media(inline[0], data=inline[1]) if inline is not None
                     else Media(_guess_mime(url, "image/*"), uri=url))
            parts.append(MediaPart(media, metadata=_kept(image, ["detail"], "openai")))
        elif kind == "input_audio":
            _members(item, ["type", "input_audio"], w)
            audio = _obj(item.get("input_audio"), f"{w}.input_audio")
            _members(audio, ["data", "format"], f"{w}.input_audio")
            fmt = _str(audio, "format", f"{w}.input_audio")
            if fmt not in _OPENAI_FORMAT:
                raise InvalidMessage(f"{w}.input_audio.format: {fmt!r} is not wav or mp3")
            data = _b64decode(_str(audio, "data", f"{w}.input_audio"), f"{w}.input_audio.data")
            parts.append(MediaPart(Media(_OPENAI_FORMAT[fmt], data=data)))
        elif kind == "file":
            _members(item, ["type", "file"], w)
            file = _obj(item.get("file"), f"{w}.file")
            _members(file, ["file_data", "filename", "file_id"], f"{w}.file")
            if file.get("file_data") is None:
                raise InvalidMessage(f"{w}.file: a file by file_id does not map (histlog keeps content, not "
                                     "provider file handles); send it inline as file_data")
            inline = _parse_data_url(_str(file, "file_data", f"{w}.file"), f"{w}.file.file_data")
            if inline is None:
                raise InvalidMessage(f"{w}.file.file_data: expected a data URL (data:<type>;base64,<data>)")
            name = file.get("filename")
            parts.append(MediaPart(Media(inline[0], data=inline[1], name=name if isinstance(name, str) else None)))
        else:
            raise InvalidMessage(f"{w}: part type {kind!r} does not map (text, image_url, input_audio, file)")
    return parts


def _openai_assistant(m: Mapping[str, Any], where: str, meta: dict[str, Any], names: dict[str, str]) -> Message:
    _members(m, ["role", "content", "refusal", "tool_calls", "name", "reasoning_content", "annotations",
                 "audio", "function_call"], where)
    for key in ("audio", "function_call"):
        if m.get(key) is not None:
            raise InvalidMessage(f"{where}.{key}: does not map (assistant audio and the legacy function_call "
                                 "are not supported)")
    if m.get("annotations"):
        meta["openai.annotations"] = m["annotations"]
    parts: list[AnyPart] = []
    reasoning = m.get("reasoning_content")
    if reasoning:
        parts.append(ReasoningPart(_str(m, "reasoning_content", where)))
    content = m.get("content")
    if isinstance(content, str):
        if content:
            parts.append(TextPart(content))
    elif content is not None:
        for j, item in enumerate(_list(content, f"{where}.content")):
            w = f"{where}.content[{j}]"
            item = _obj(item, w)
            if item.get("type") == "text":
                _members(item, ["type", "text"], w)
                parts.append(TextPart(_str(item, "text", w)))
            elif item.get("type") == "refusal":
                _members(item, ["type", "refusal"], w)
                parts.append(RefusalPart(_str(item, "refusal", w)))
            else:
                raise InvalidMessage(f"{w}: part type {item.get('type')!r} does not map (text or refusal)")
    if m.get("refusal") is not None:
        parts.append(RefusalPart(_str(m, "refusal", where)))
    for j, call in enumerate(_list(m.get("tool_calls") or [], f"{where}.tool_calls")):
        w = f"{where}.tool_calls[{j}]"
        call = _obj(call, w)
        if call.get("type", "function") != "function":
            raise InvalidMessage(f"{w}: tool call type {call.get('type')!r} does not map (function only)")
        _members(call, ["id", "type", "function"], w)
        fn = _obj(call.get("function"), f"{w}.function")
        _members(fn, ["name", "arguments"], f"{w}.function")
        call_id, name = _str(call, "id", w, empty=False), _str(fn, "name", f"{w}.function", empty=False)
        names[call_id] = name
        parts.append(ToolCallPart(call_id, name, _str(fn, "arguments", f"{w}.function")))
    if not parts:
        raise InvalidMessage("an assistant message with no content, refusal, reasoning or tool call")
    return Message(Role.ASSISTANT, parts, meta)


def to_openai(messages: Iterable[Message], *, reasoning_content: bool = False) -> list[Json]:
    """histlog messages → OpenAI Chat Completions ``messages``.

    A tool message becomes one ``tool`` message per result. Content that is one plain text part
    is written as a string, otherwise as a list of parts. Assistant text goes to ``content``
    (``None`` when there is none), refusals to ``refusal`` (joined), tool calls to
    ``tool_calls``; with ``reasoning_content=True`` reasoning text goes to ``reasoning_content``
    (DeepSeek/vLLM style), otherwise reasoning is left out: the Chat Completions API takes no
    reasoning input, and opaque reasoning ``state`` never maps. Left out too: ``is_error`` of a
    tool result (no such field: say it in the result text if the model must know), tool
    ``details`` when the output has content (with no content, the details' JSON is the content),
    citations, and metadata other than ``openai.*``.
    Raises ``InvalidMessage`` for media in assistant messages or tool results, media given by URL
    that is not an image, and anything not a ``Message``.
    """
    out: list[Json] = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, Message):
            raise InvalidMessage(f"{where}: expected a schemas.Message, got {type(m).__name__}")
        meta = m.metadata
        extra = _restored(meta, "openai", ["name"])
        if m.role is Role.SYSTEM:
            role = meta["openai.role"].value() if "openai.role" in meta else "system"
            out.append({"role": role, "content": _openai_content(m.parts, where), **extra})
        elif m.role is Role.USER:
            out.append({"role": "user", "content": _openai_content(m.parts, where), **extra})
        elif m.role is Role.TOOL:
            for j, part in enumerate(m.parts):
                assert isinstance(part, ToolResultPart)  # Invariant: tool messages carry tool results only.
                out.append({"role": "tool", "tool_call_id": part.id,
                            "content": _openai_tool_content(part.output, f"{where}.parts[{j}]")})
        else:
            out.append(_openai_assistant_dict(m, where, extra, reasoning_content))
    return out


def _openai_content(parts: Sequence[AnyPart], where: str) -> str | list[Json]:
    if len(parts) == 1 and _plain_text(parts[0]):
        return parts[0].text  # type: ignore[union-attr]
    items: list[Json] = []
    for j, part in enumerate(parts):
        if isinstance(part, TextPart):
            items.append({"type": "text", "text": part.text})
        elif isinstance(part, MediaPart):
            items.append(_openai_media(part, f"{where}.parts[{j}]"))
        else:  # Invariant: system and user messages carry only text and media.
            raise AssertionError(part.kind)
    return items


def _openai_media(part: MediaPart, where: str) -> Json:
    media = part.media
    if media.mime_type.startswith("image/"):
        url = media.uri if media.uri is not None else _data_url(media)
        return {"type": "image_url", "image_url": {"url": url, **_restored(part.metadata, "openai", ["detail"])}}
    if media.data is None:
        raise InvalidMessage(f"{where}: OpenAI takes only images by URL; inline this {media.mime_type} as data")
    if media.mime_type in _OPENAI_MEDIA:
        audio = {"data": _b64(media.data), "format": _OPENAI_MEDIA[media.mime_type]}
        return {"type": "input_audio", "input_audio": audio}
    file: Json = {"file_data": _data_url(media)}
    if media.name is not None:
        file["filename"] = media.name
    return {"type": "file", "file": file}


def _openai_tool_content(output: ToolOutput, where: str) -> str | list[Json]:
    if any(not isinstance(c, TextPart) for c in output.content):
        raise InvalidMessage(f"{where}: an OpenAI tool message holds text only; this result has media")
    texts = [c.text for c in output.content if isinstance(c, TextPart)]
    if not texts:
        return str(output.details) if output.details is not None else ""
    if len(texts) == 1:
        return texts[0]
    return [{"type": "text", "text": t} for t in texts]


def _openai_assistant_dict(m: Message, where: str, extra: Json, reasoning_content: bool) -> Json:
    texts: list[str] = []
    refusals: list[str] = []
    reasoning: list[str] = []
    calls: list[Json] = []
    for j, part in enumerate(m.parts):
        if isinstance(part, TextPart):
            texts.append(part.text)
        elif isinstance(part, RefusalPart):
            refusals.append(part.text)
        elif isinstance(part, ReasoningPart):
            reasoning.append(part.text)
        elif isinstance(part, ToolCallPart):
            calls.append({"id": part.id, "type": "function",
                          "function": {"name": part.name, "arguments": part.arguments}})
        else:
            raise InvalidMessage(f"{where}.parts[{j}]: an OpenAI assistant message cannot carry {part.kind}")
    content: str | list[Json] | None = None
    if len(texts) == 1:
        content = texts[0]
    elif texts:
        content = [{"type": "text", "text": t} for t in texts]
    out: Json = {"role": "assistant", "content": content, **extra}
    if refusals:
        out["refusal"] = "".join(refusals)
    if calls:
        out["tool_calls"] = calls
    if reasoning_content and any(reasoning):
        out["reasoning_content"] = "".join(reasoning)
    return out


_OPENAI_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "tool_calls": FinishReason.TOOL_CALLS,
                  "content_filter": FinishReason.CONTENT_FILTER, "function_call": FinishReason.TOOL_CALLS}


def from_openai_response(completion: Mapping[str, Any], *, tool_names: Mapping[str, str] | None = None,
                         choice: int = 0) -> ChatResponse:
    """A Chat Completions response body → ``ChatResponse`` (its ``choices[choice]``; usage from
    ``prompt_tokens``/``completion_tokens``; an unknown finish reason → ``other``)."""
    body = _obj(completion, "OpenAI response")
    choices = _list(body.get("choices"), "OpenAI response.choices")
    if not 0 <= choice < len(choices):
        raise InvalidMessage(f"OpenAI response.choices: no choice {choice} (it has {len(choices)})")
    picked = _obj(choices[choice], f"OpenAI response.choices[{choice}]")
    raw = picked.get("message")
    message = from_openai([raw], tool_names=tool_names)[0] if raw is not None and _has_content(raw) else None
    finish = _OPENAI_FINISH.get(str(picked.get("finish_reason")), FinishReason.OTHER)
    return ChatResponse(message, finish, _usage(body, "prompt_tokens", "completion_tokens", "OpenAI response"))


def _has_content(raw: Any) -> bool:
    return isinstance(raw, Mapping) and any(raw.get(k) for k in ("content", "refusal", "tool_calls",
                                                                  "reasoning_content"))
