"""How a request finds its operation and its engine: the raw-path route, query parameters
described once (parsed from it, documented from it), and the ``Router``.

- Paths are matched on their raw segments by ``engine.service.dispatch``; each ``{name}``
  segment is percent-decoded (UTF-8, strict) by ``segment``.
- ``Param`` is a query parameter's name, kind and bounds; ``parse_query`` checks a request
  against the operation's list (unknown, repeated, malformed or out-of-range parameters are a 400
  naming the parameter) and ``engine.service.openapi`` documents the same list.
- ``Router.serving(conversation_id)`` is THE decision of which engine serves a conversation
  (today: the local one; with ``--group`` it will name the owner or say "forward").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import parse_qsl, unquote_to_bytes

from starlette.requests import Request

from engine.aio import AsyncHistoryEngine
from engine.service.wire import MAX_INT, history_position_of, log_position_of
from schemas.errors import InvalidRequest

__all__ = ["Param", "Router", "parse_query", "segment"]

Kind = Literal["int", "history", "log", "bool", "unit", "str"]


@dataclass(frozen=True, slots=True)
class Param:
    """A query parameter: ``int`` (``minimum``..2**63-1), ``history`` (``TURN:SEQ``), ``log``
    (``PARTITION:OFFSET``), ``bool`` (``true``/``false``), ``unit`` (``turn``/``message``), ``str``."""

    name: str
    kind: Kind
    description: str
    required: bool = False
    minimum: int = 0


def _value(param: Param, text: str) -> Any:
    where = f"query parameter {param.name}"
    if param.kind == "int":
        valid = text.isascii() and text.isdigit() and len(text) <= 19
        if not valid or not param.minimum <= int(text) <= MAX_INT:
            raise InvalidRequest(f"{where}: expected an int >= {param.minimum} (at most {MAX_INT}), got {text!r}")
        return int(text)
    if param.kind == "history":
        return history_position_of(text, where)
    if param.kind == "log":
        return log_position_of(text, where)
    if param.kind == "bool":
        if text not in ("true", "false"):
            raise InvalidRequest(f"{where}: expected true or false, got {text!r}")
        return text == "true"
    if param.kind == "unit":
        if text not in ("turn", "message"):
            raise InvalidRequest(f"{where}: expected turn or message, got {text!r}")
        return text
    return text


def parse_query(request: Request, params: tuple[Param, ...]) -> dict[str, Any]:
    """The request's query parameters by name (absent optional ones are left out)."""
    known = {p.name: p for p in params}
    try:
        pairs = parse_qsl(request.scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True,
                          strict_parsing=False, encoding="utf-8", errors="strict")
    except UnicodeDecodeError:
        raise InvalidRequest("query string: not UTF-8 after percent-decoding") from None
    out: dict[str, Any] = {}
    for name, text in pairs:
        param = known.get(name)
        if param is None:
            allowed = ", ".join(known) or "none"
            raise InvalidRequest(f"query parameter {name!r} is unknown here (allowed: {allowed})")
        if name in out:
            raise InvalidRequest(f"query parameter {name}: given twice")
        out[name] = _value(param, text)
    for param in params:
        if param.required and param.name not in out:
            raise InvalidRequest(f"query parameter {param.name}: missing (required)")
    return out


def segment(request: Request, name: str) -> str:
    """Path segment ``name`` percent-decoded (RFC 3986, UTF-8). ``InvalidRequest`` if it is not UTF-8."""
    raw: str = request.path_params[name]
    try:
        return unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequest(f"path segment {name}: not UTF-8 after percent-decoding ({raw!r})") from None


class Router:
    """Which engine serves each request: the one home of that decision. Today every conversation
    is served by the local engine; the cluster will answer with the partition's owner here."""

    def __init__(self, local: AsyncHistoryEngine) -> None:
        self.local = local

    def serving(self, conversation_id: str) -> AsyncHistoryEngine:
        """The engine that serves ``conversation_id``."""
        return self.local
