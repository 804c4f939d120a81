"""Provider adapters: pure conversions between histlog messages and the message dicts of the
OpenAI Chat Completions API and the Anthropic Messages API (long, ≈760 lines, because it holds
both providers in both directions with their error messages; one module per provider is the
natural split). No SDK is imported; the dicts are
the JSON payloads (what ``json.loads`` of a request or response body gives, or an SDK's
``model_dump()``).

Promises:

* **Provider → histlog** (``from_openai``, ``from_anthropic``, ``*_response``) never drops what
  it does not understand: an unknown role, block type or member raises ``InvalidMessage``
  saying where (``OpenAI messages[3].content[1]: ...``). Provider members histlog has no field
  for but that matter on the way back (image ``detail``, ``cache_control``, citations, a
  message ``name``, the ``developer`` role) are kept in part or message metadata under
  ``openai.*`` / ``anthropic.*`` keys and restored by the reverse conversion.
* **histlog → provider** (``to_openai``, ``to_anthropic``) raises ``InvalidMessage`` for
  content the provider cannot take and the model would need (e.g. media in an assistant
  message); what the model never sees is left out: message and part metadata other than the
  provider's own keys, ``Citation`` objects, tool ``details`` when the output has content.
* **Round trips** provider → histlog → provider give the same payload, up to the
  normalisations listed per function (e.g. a single text part is written as a string).

Tool results name their tool in histlog (``ToolResultPart.name``) but not in either provider's
format: the name is taken from the assistant tool call with the same id earlier in the same
list, or from ``tool_names={call_id: name}`` (for a list that starts after the call).
"""

from __future__ import annotations

import base64
import binascii
import json
import mimetypes
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from schemas.chat import ChatResponse, FinishReason, Usage
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

__all__ = [
    "from_anthropic",
    "from_anthropic_response",
    "from_openai",
    "from_openai_response",
    "to_anthropic",
    "to_openai",
]

Json = dict[str, Any]

# --------------------------------------------------------------------------- shared helpers


def _obj(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidMessage(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value


def _str(obj: Mapping[str, Any], key: str, where: str, *, empty: bool = True) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or (not empty and not value):
        raise InvalidMessage(f"{where}.{key}: expected a {'non-empty ' if not empty else ''}string, "
                             f"got {type(value).__name__ if value is not None else 'nothing'}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise InvalidMessage(f"{where}: expected a JSON array, got {type(value).__name__}")
    return value


def _members(obj: Mapping[str, Any], allowed: Iterable[str], where: str) -> None:
    unknown = sorted(set(obj) - set(allowed))
    if unknown:
        raise InvalidMessage(f"{where}: unsupported member {unknown[0]!r}; histlog cannot keep it, "
                             "remove it or store the conversation in histlog's own format")


def _kept(obj: Mapping[str, Any], keys: Iterable[str], prefix: str) -> dict[str, Any]:
    """Provider members without a histlog field, kept as ``prefix.key`` metadata."""
    return {f"{prefix}.{k}": obj[k] for k in keys if obj.get(k) is not None}


def _restored(metadata: Mapping[str, Any], prefix: str, keys: Iterable[str]) -> Json:
    out: Json = {}
    for k in keys:
        raw = metadata.get(f"{prefix}.{k}")
        if raw is not None:
            out[k] = raw.value()
    return out


def _b64decode(data: str, where: str) -> bytes:
    try:
        return base64.b64decode(data.encode("ascii"), validate=True)
    except (UnicodeEncodeError, binascii.Error):
        raise InvalidMessage(f"{where}: not standard base64") from None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _data_url(media: Media) -> str:
    assert media.data is not None  # Invariant: callers check data before.
    return f"data:{media.mime_type};base64,{_b64(media.data)}"


def _parse_data_url(url: str, where: str) -> tuple[str, bytes] | None:
    if not url.startswith("data:"):
        return None
    head, sep, payload = url[5:].partition(",")
    if not sep or not head.endswith(";base64"):
        raise InvalidMessage(f"{where}: a data URL must be base64 (data:<type>;base64,<data>)")
    return head.removesuffix(";base64"), _b64decode(payload, where)


def _guess_mime(url: str, default: str) -> str:
    guessed, _ = mimetypes.guess_type(url.split("?", 1)[0])
    return guessed or default


def _tool_name(names: Mapping[str, str], call_id: str, where: str) -> str:
    name = names.get(call_id)
    if name is None:
        raise InvalidMessage(f"{where}: tool result {call_id!r} answers no tool call earlier in the list; "
                             "include the assistant message that made the call, or pass tool_names={id: name}")
    return name


def _plain_text(part: AnyPart) -> bool:
    return isinstance(part, TextPart) and not part.metadata and not part.citations


def _each(messages: Iterable[Any], provider: str, convert: Any) -> list[Message]:
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Iterable):
        raise InvalidMessage(f"{provider} messages: expected a list of message objects, got {type(messages).__name__}")
    out: list[Message] = []
    for i, m in enumerate(messages):
        where = f"{provider} messages[{i}]"
        try:
            out.extend(convert(_obj(m, where), where))
        except InvalidMessage as exc:
            text = str(exc)
            raise InvalidMessage(text if text.startswith(where) else f"{where}: {text}") from None
    return out


def _usage(body: Mapping[str, Any], inputs: str, outputs: str, where: str) -> Usage | None:
    raw = body.get("usage")
    if raw is None:
        return None
    counts = _obj(raw, f"{where}.usage")
    n_in, n_out = counts.get(inputs), counts.get(outputs)
    if not isinstance(n_in, int) or not isinstance(n_out, int) or min(n_in, n_out) < 0:
        raise InvalidMessage(f"{where}.usage: expected non-negative integers {inputs} and {outputs}")
    return Usage(n_in, n_out)


def _dump_args(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _load_object(arguments: str, where: str) -> Json:
    try:
        value = json.loads(arguments)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise InvalidMessage(f"{where}: tool call arguments {arguments[:40]!r} are not a JSON object, which "
                             "Anthropic's tool_use input must be")
    return value


# --------------------------------------------------------------------------- OpenAI Chat Completions

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


# --------------------------------------------------------------------------- Anthropic Messages

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
