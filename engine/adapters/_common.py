"""What both provider adapters share: typed readers of a JSON payload that raise ``InvalidMessage``
saying where, base64 and data URLs, provider metadata kept under a prefix, tool names by call id."""

from __future__ import annotations

import base64
import binascii
import json
import mimetypes
from collections.abc import Iterable, Mapping
from typing import Any

from schemas.chat import Usage
from schemas.errors import InvalidMessage
from schemas.messages import (
    AnyPart,
    Media,
    Message,
    TextPart,
)

__all__: list[str] = []

Json = dict[str, Any]



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
