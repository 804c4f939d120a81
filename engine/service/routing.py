"""How a request finds its operation and its engine: the raw-path route, query parameters
described once (parsed from it, documented from it), and the ``Router``.

- Paths are matched on their raw segments by ``engine.service.dispatch``; each ``{name}``
  segment is percent-decoded (UTF-8, strict) by ``segment``.
- ``Param`` is a query parameter's name, kind and bounds; ``parse_query`` checks a request
  against the operation's list (unknown, repeated, malformed or out-of-range parameters are a 400
  naming the parameter) and ``engine.service.openapi`` documents the same list.
- ``Router.serving(conversation_id)`` is THE decision of which engine serves a conversation:
  the local one, or ``Forward`` to its partition's owner (a cluster's ``OwnershipMap``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import parse_qsl, unquote_to_bytes

from starlette.requests import Request

from engine.aio import AsyncHistoryEngine
from engine.cluster.ownership import OwnershipMap
from engine.service.wire import MAX_INT, history_position_of, log_position_of, time_of_text
from schemas.errors import InvalidRequest, NotOwner, NotReady
from schemas.records import partition_for_key, record_key

__all__ = ["CHOICES", "Forward", "Ownership", "Param", "Router", "parse_query", "segment"]

Ownership = Callable[[], OwnershipMap]
"""Where a cluster member reads its current ``OwnershipMap`` (membership's latest), once per decision."""

Kind = Literal["int", "history", "log", "bool", "unit", "order", "view", "time", "str"]
CHOICES: dict[str, tuple[str, ...]] = {"unit": ("turn", "message"), "order": ("asc", "desc"),
                                       "view": ("messages", "turn-sources")}
"""The kinds whose value is one of a few words (parsed and documented from this table)."""


@dataclass(frozen=True, slots=True)
class Param:
    """A query parameter: ``int`` (``minimum``..2**63-1), ``history`` (``TURN:SEQ``), ``log``
    (``PARTITION:OFFSET``), ``bool`` (``true``/``false``), ``unit`` (``turn``/``message``),
    ``order`` (``asc``/``desc``), ``view`` (``messages``/``turn-sources``), ``time`` (ISO 8601 with a
    timezone), ``str``."""

    name: str
    kind: Kind
    description: str
    required: bool = False
    minimum: int = 0
    example: str | None = None
    """A value the parameter accepts, shown in ``/openapi.json`` (as its type: ``"20"`` is 20)."""


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
    if param.kind == "order":
        if text not in ("asc", "desc"):
            raise InvalidRequest(f"{where}: expected asc (oldest first) or desc (newest first), got {text!r}")
        return text
    if param.kind == "view":
        if text not in CHOICES["view"]:
            raise InvalidRequest(f"{where}: expected messages (StoredMessages) or turn-sources, got {text!r}")
        return text
    if param.kind == "time":
        return time_of_text(text, where)
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


@dataclass(frozen=True, slots=True)
class Forward:
    """The decision "relay this request to ``url``, the owner of ``partition``"."""

    url: str
    partition: int


class Router:
    """Which engine serves each request: the one home of that decision.

    Without an ownership source (a single server, or a full replica) every conversation is served
    by the local engine. With one, a conversation is served here when this member owns its
    partition (``schemas.records``' partitioner, the log's own), else forwarded to the owner; a
    request that was already forwarded once is never forwarded again (``NotOwner``, 421: no
    loops), and a partition without a known owner (mid-rebalance) is ``NotReady`` (503).
    """

    def __init__(self, local: AsyncHistoryEngine, ownership: Ownership | None = None) -> None:
        self.local = local
        self.ownership = ownership

    @property
    def clustered(self) -> bool:
        """Whether a cluster's ownership decides (else every request is served here)."""
        return self.ownership is not None

    def current(self) -> OwnershipMap | None:
        """The ownership map now (None without a cluster)."""
        return None if self.ownership is None else self.ownership()

    @staticmethod
    def partition_of(conversation_id: str, partitions: int) -> int:
        """The partition of ``conversation_id`` among ``partitions`` (the log's partitioner)."""
        return partition_for_key(record_key(conversation_id), partitions)

    def serving(self, conversation_id: str, *, forwarded: bool = False) -> AsyncHistoryEngine | Forward:
        """The local engine when it serves ``conversation_id``, else where to forward it.
        ``forwarded``: the request already took its one hop, so only the local engine may
        serve it (``NotOwner`` otherwise)."""
        owners = self.current()
        if owners is None:
            return self.local
        partition = self.partition_of(conversation_id, owners.partitions)
        if owners.owns(partition):
            return self.local
        owner = owners.owner_of(partition)
        if forwarded:
            raise NotOwner(f"this member ({owners.self_url}) does not own partition {partition} of the conversation "
                           f"(its owner is {owner or 'unknown right now'}): read /v1/cluster and send it there")
        if owner is None:
            raise NotReady(f"partition {partition} has no owner right now (the group is rebalancing); retry shortly")
        return Forward(owner, partition)

    def engine(self, conversation_id: str) -> AsyncHistoryEngine:
        """The local engine for a request the app decided to serve here (``NotOwner`` when the
        ownership moved in between: clients retry)."""
        decided = self.serving(conversation_id, forwarded=True)
        assert not isinstance(decided, Forward)  # Invariant: serving(forwarded=True) never forwards.
        return decided

    def owns(self, conversation_id: str) -> bool:
        """Whether this member serves ``conversation_id`` now (always without a cluster)."""
        owners = self.current()
        return owners is None or owners.owns(self.partition_of(conversation_id, owners.partitions))
