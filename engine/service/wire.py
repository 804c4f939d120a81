"""SERVICE.md's representations, written once: the server renders with them and the clients parse
with them, so the two cannot drift.

Two kinds of thing live here:

- **Converters** between the schemas' value types and their JSON trees: ``receipt_json`` /
  ``receipt_of``, ``stored_json`` / ``stored_of``, ``turn_json`` / ``turn_of``, ``source_of``,
  ``history_position_of`` / ``log_position_of`` (the ``TURN:SEQ`` and ``PARTITION:OFFSET`` texts),
  ``stats_json`` / ``stats_of``. Rendering reuses the schemas' own ``to_json`` (one spelling of each
  field); parsing validates through the pydantic models below, then builds the value type.
- **Pydantic models** of every request and response body (``extra="forbid"``): they validate
  request bodies and are what ``/openapi.json`` is generated from, so the document describes what
  the code checks, not a hand-written copy.

Every parse error is a typed ``HistoryError`` naming the field (``messages[1].parts[0].text: ...``,
``query parameter limit: ...``), never a pydantic traceback.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from engine.facade import EngineStats
from engine.service.wire_assets import AssetModel, refs_of
from engine.service.wire_cluster import ClusterOut, MemberOut, cluster_json, cluster_of
from engine.service.wire_slots import TurnIn
from schemas.batch import HistoryLoad, HistoryTurn, Located, Measure, Receipt, StoredMessage, TurnSource
from schemas.canonical import RawJSON, _Num, loads_exact
from schemas.errors import HistoryError, InvalidBatch, InvalidRequest
from schemas.ids import AppendID
from schemas.invalid import invalid
from schemas.messages import Message, Role
from schemas.positions import HistoryPosition, LogPosition

__all__ = [
    "FORWARDED_HEADER",
    "AppendBody",
    "CheckpointOut",
    "ClusterOut",
    "ConversationsPage",
    "LatestTurnOut",
    "LocatedOut",
    "MeasureOut",
    "MemberOut",
    "PositionOut",
    "Problem",
    "ReceiptModel",
    "Replaces",
    "SourcesOut",
    "StatsOut",
    "StoredLoadOut",
    "StoredMessageModel",
    "StoredMessagesOut",
    "TurnModel",
    "TurnSourceModel",
    "WindowOut",
    "append_body_of",
    "body_tree",
    "cluster_json",
    "cluster_of",
    "history_position_of",
    "load_json",
    "located_json",
    "located_of",
    "log_position_of",
    "measure_of",
    "messages_json",
    "receipt_json",
    "receipt_of",
    "source_of",
    "stats_json",
    "stats_of",
    "stored_json",
    "stored_of",
    "time_of_text",
    "time_text",
    "turn_json",
    "turn_of",
]

_STRICT = ConfigDict(extra="forbid")
_POSITION = r"^[0-9]+:[0-9]+$"
MAX_INT = 2**63 - 1
"""The largest integer a query parameter or a position may carry (a signed 64-bit value)."""
FORWARDED_HEADER = "X-Histlog-Forwarded"
"""On a request (value ``1``): it already took its one hop (a member forwarded it, or a client
routed it by ``/v1/cluster``), so a member that does not own its partition answers 421
``NotOwner`` instead of forwarding it again."""


# ----- models (request and response bodies; the OpenAPI document is generated from these)
class Position(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    partition: Annotated[int, Field(ge=0, le=MAX_INT)]
    offset: Annotated[int, Field(ge=0, le=MAX_INT)]


class ReceiptModel(BaseModel):
    """A Receipt: proof a whole batch was accepted, and where its event sits in the log."""
    model_config = _STRICT
    conversation_id: str
    append_id: str
    digest: Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]
    position: Position


class Replaces(BaseModel):
    """Replace the latest visible turn ``turn_id`` (``replace_turn``)."""
    model_config = _STRICT
    turn_id: str
    reason: Literal["edit", "retry"]


class AppendBody(BaseModel):
    """The body of ``PUT .../appends/{a}``: the batch's messages, plus at most one of
    ``expected_last`` (a Receipt, or ``"empty"``) and ``replaces``; ``fence``: the epoch of the
    writer's run (``begin_run``), ``run_id``: the run that writes the batch (traceability);
    ``turn``: the turn slot (``allocate_turn``) the batch's user-led turn is filed under (not with
    ``replaces``)."""
    model_config = _STRICT
    messages: list[Message]
    expected_last: ReceiptModel | Literal["empty"] | None = None
    replaces: Replaces | None = None
    fence: Annotated[StrictInt, Field(ge=1)] | None = None
    run_id: str | None = None
    turn: TurnIn | None = None


class StoredMessageModel(BaseModel):
    model_config = _STRICT
    id: str
    message: Message
    position: Annotated[str, Field(pattern=_POSITION)]
    append_id: str
    created_at: Annotated[str, Field(json_schema_extra={"format": "date-time"})]
    superseded_by: str | None = None
    reason: Literal["edit", "retry"] | None = None
    assets: list[AssetModel] | None = None  # when it has some (link_assets)


class TurnModel(BaseModel):
    model_config = _STRICT
    id: str
    position: Annotated[int, Field(ge=0)]
    request_message_id: str
    assistant_message_id: str | None
    messages: list[StoredMessageModel]


class TurnSourceModel(BaseModel):
    model_config = _STRICT
    id: str
    role: Role
    content: Any
    created_at: Annotated[str, Field(json_schema_extra={"format": "date-time"})]
    interrupted: bool


class ConversationsPage(BaseModel):
    model_config = _STRICT
    conversations: list[str]
    next: str | None


class StoredMessagesOut(BaseModel):
    model_config = _STRICT
    messages: list[StoredMessageModel]



class LocatedOut(BaseModel):
    model_config = _STRICT
    message: StoredMessageModel
    before: list[StoredMessageModel]
    after: list[StoredMessageModel]


class PositionOut(BaseModel):
    model_config = _STRICT
    position: Annotated[str, Field(pattern=_POSITION)]


class WindowOut(BaseModel):
    model_config = _STRICT
    messages: list[Message]


class StoredLoadOut(BaseModel):
    model_config = _STRICT
    messages: list[StoredMessageModel]
    truncated: bool


class SourcesOut(BaseModel):
    model_config = _STRICT
    sources: list[TurnSourceModel]
    truncated: bool


class MeasureOut(BaseModel):
    model_config = _STRICT
    messages: Annotated[int, Field(ge=0)]
    content_bytes: Annotated[int, Field(ge=0)]
    turns: Annotated[int, Field(ge=0)]


class LatestTurnOut(BaseModel):
    model_config = _STRICT
    turn: TurnModel | None


class CheckpointOut(BaseModel):
    model_config = _STRICT
    message: StoredMessageModel | None


class PoisonOut(BaseModel):
    model_config = _STRICT
    position: Annotated[str, Field(pattern=_POSITION)]
    reason: str


class StatsOut(BaseModel):
    """The ``histlog stats --json`` object: EngineStats' fields plus the poison records."""
    model_config = _STRICT
    end_offsets: list[int]
    applied_offsets: list[int]
    lag: list[int]
    accepted: int
    duplicates: int
    conflicts: int
    rejected_closed: int
    corrupt: int
    precondition_failed: int
    not_replaceable: int
    owned_partitions: list[int] = []
    applied_since_open: list[int] = []
    cleared: int = 0
    erased: int = 0
    fenced: int = 0
    deleted: int = 0
    poison: list[PoisonOut]


class Problem(BaseModel):
    """An error (RFC 9457 problem+json); ``title`` is the histlog exception class."""
    type: str
    title: str
    status: int
    detail: str


# ----- request parsing
def body_tree(body: bytes) -> Any:
    """The JSON tree of a request body, numbers kept exactly (metadata spellings survive, so the
    digest is the one the client computes). ``InvalidRequest`` when it is not JSON."""
    try:
        return loads_exact(body)
    except ValueError as exc:
        raise InvalidRequest(f"request body: {exc}") from None


_BATCH_FIELDS = (("messages",), ("replaces", "turn_id"), ("replaces", "reason"))
"""The members of an append body whose bad values are the facade's ``InvalidBatch`` (a message;
``replace_turn``'s turn id and reason), so a caller sees the same class in process and over HTTP."""


def _fail(exc: ValidationError, what: str, batch_fields: tuple[tuple[str, ...], ...] = ()) -> HistoryError:
    """A ValidationError as the typed error of the field it names: ``InvalidBatch`` for one of
    ``batch_fields``, ``InvalidRequest`` for the rest of the envelope; the detail names the field."""
    err = invalid(exc, what)
    text = str(err)
    first = tuple(exc.errors(include_url=False)[0].get("loc", ())) if exc.errors() else ()
    if any(first[:len(f)] == f for f in batch_fields):
        return InvalidBatch(text)
    return InvalidRequest(text)


def append_body_of(body: bytes) -> AppendBody:
    """Parse and validate the body of an append. Raises ``InvalidRequest`` (not JSON, unknown
    member, wrong type; ``expected_last`` or ``turn`` with ``replaces``), ``InvalidBatch`` (a
    message, or ``replaces``' turn id or reason, as ``replace_turn`` does)."""
    tree = body_tree(body)
    if not isinstance(tree, dict):
        raise InvalidRequest(f'request body: expected a JSON object {{"messages": [...]}}, got {_kind(tree)}')
    try:
        parsed = AppendBody.model_validate({k: v if k == "messages" else _plain(v, k) for k, v in tree.items()})
    except ValidationError as exc:
        raise _fail(exc, "request", _BATCH_FIELDS) from None
    if parsed.expected_last is not None and parsed.replaces is not None:
        raise InvalidRequest("request body: give expected_last or replaces, not both")
    if parsed.turn is not None and parsed.replaces is not None:
        raise InvalidRequest("request body: turn goes with an append, not with replaces (a replacement keeps the "
                             "position of the turn it replaces); send one of them")
    return parsed


def _plain(tree: Any, field: str) -> Any:
    """``tree`` (the value of the envelope member ``field``, around the messages, whose number
    spellings do not matter) with its exact numbers as Python numbers. ``InvalidRequest`` naming
    the member for a number no double holds (``1e999``, 400 nines): nothing in the envelope takes
    one, so it is refused here, as a bad value of that member."""
    if isinstance(tree, dict):
        return {k: _plain(v, f"{field}.{k}") for k, v in tree.items()}
    if isinstance(tree, list):
        return [_plain(v, f"{field}[{i}]") for i, v in enumerate(tree)]
    if isinstance(tree, _Num):
        try:
            return orjson.loads(tree.text)
        except orjson.JSONDecodeError:
            shown = tree.text if len(tree.text) <= 24 else f"{tree.text[:20]}... ({len(tree.text)} characters)"
            raise InvalidRequest(f"request body: {field}: the number {shown} is out of range (no member of "
                                 "an append body takes a number beyond a 64-bit float); send it as the "
                                 "contract says (docs/service.md)") from None
    return tree


def _kind(tree: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(tree), "a number")


def history_position_of(text: str, field: str) -> HistoryPosition:
    """``TURN:SEQ`` as a HistoryPosition; ``InvalidRequest`` naming ``field`` otherwise."""
    try:
        if not text.isascii():  # int() would read other scripts' digits
            raise ValueError(text)
        position = HistoryPosition.parse(text)
    except ValueError:
        raise InvalidRequest(f"{field}: expected TURN:SEQ (two integers >= 0, e.g. 3:7), got {text!r}") from None
    if position.turn > MAX_INT or position.seq > MAX_INT:
        raise InvalidRequest(f"{field}: {text!r} is out of range (each number at most {MAX_INT})")
    return position


def log_position_of(text: str, field: str) -> LogPosition:
    """``PARTITION:OFFSET`` as a LogPosition; ``InvalidRequest`` naming ``field`` otherwise."""
    partition, sep, offset = text.partition(":")
    if not sep or not partition.isdigit() or not offset.isdigit() or not partition.isascii() or not offset.isascii():
        raise InvalidRequest(f"{field}: expected PARTITION:OFFSET (two integers >= 0, e.g. 0:42), got {text!r}")
    p, o = int(partition), int(offset)
    if p > MAX_INT or o > MAX_INT:
        raise InvalidRequest(f"{field}: {text!r} is out of range (each number at most {MAX_INT})")
    return LogPosition(p, o)


# ----- rendering (server) and parsing (clients)
def receipt_json(receipt: Receipt) -> bytes:
    return receipt.to_json()


def receipt_of(tree: Any) -> Receipt:
    """A Receipt from its JSON tree (``Receipt.to_dict`` form). Raises ``InvalidReceipt``."""
    return Receipt.from_dict(tree)


def stored_json(stored: StoredMessage) -> orjson.Fragment:
    return orjson.Fragment(stored.to_json())


def messages_json(rows: list[StoredMessage]) -> list[orjson.Fragment]:
    return [orjson.Fragment(row.to_json()) for row in rows]


def stored_of(tree: Any) -> StoredMessage:
    """A StoredMessage from its JSON tree. Raises ``InvalidRequest`` naming the field."""
    try:
        model = StoredMessageModel.model_validate(tree)
    except ValidationError as exc:
        raise InvalidRequest(str(invalid(exc, "stored message"))) from None
    return StoredMessage(model.id, model.message, HistoryPosition.parse(model.position), AppendID(model.append_id),
                         datetime.fromisoformat(model.created_at.replace("Z", "+00:00")),
                         model.superseded_by, model.reason, refs_of(model.assets) if model.assets else ())


def located_json(found: Located) -> dict[str, Any]:
    return {"message": stored_json(found.message), "before": messages_json(found.before),
            "after": messages_json(found.after)}


def located_of(tree: Any) -> Located:
    """A ``Located`` from its JSON tree. Raises ``InvalidRequest`` naming the field."""
    if not isinstance(tree, dict) or not all(isinstance(tree.get(k), list) for k in ("before", "after")):
        raise InvalidRequest("located: expected an object with message, before and after")
    return Located(stored_of(tree.get("message")), [stored_of(m) for m in tree["before"]],
                   [stored_of(m) for m in tree["after"]])


def time_text(when: datetime) -> str:
    """A time-range bound as the query spells it: ISO 8601 in UTC to the microsecond (a bound
    between two stored milliseconds must stay between them)."""
    return when.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def time_of_text(text: str, field: str) -> datetime:
    """An ISO 8601 time with a timezone (``Z`` or an offset) as an aware datetime; ``InvalidRequest``
    naming ``field`` otherwise (a time without a zone names no instant)."""
    try:
        when = datetime.fromisoformat(text) if text.isascii() else None
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise InvalidRequest(f"{field}: expected an ISO 8601 time with a timezone (e.g. 2025-03-13T10:04:11.402Z), "
                             f"got {text!r}")
    return when


def turn_json(turn: HistoryTurn) -> dict[str, Any]:
    return {"id": turn.id, "position": turn.position, "request_message_id": turn.request_message_id,
            "assistant_message_id": turn.assistant_message_id, "messages": messages_json(turn.messages)}


def turn_of(tree: Any) -> HistoryTurn:
    """A HistoryTurn from its JSON tree. Raises ``InvalidRequest`` naming the field."""
    if not isinstance(tree, dict) or not isinstance(tree.get("messages"), list):
        raise InvalidRequest("turn: expected an object with messages")
    head = {k: v for k, v in tree.items() if k != "messages"}
    try:
        TurnModel.model_validate({**head, "messages": []})
    except ValidationError as exc:
        raise InvalidRequest(str(invalid(exc, "turn"))) from None
    return HistoryTurn(tree["id"], tree["position"], tree["request_message_id"], tree["assistant_message_id"],
                       [stored_of(m) for m in tree["messages"]])


def source_of(tree: Any) -> TurnSource:
    """A TurnSource from its JSON tree (``content`` re-serialised canonically, as stored)."""
    try:
        model = TurnSourceModel.model_validate(tree)
    except ValidationError as exc:
        raise InvalidRequest(str(invalid(exc, "turn source"))) from None
    try:  # the full canonical writer: numbers beyond 64 bits and exact spellings as stored
        content = RawJSON.of(tree["content"]).encode()
    except HistoryError as exc:
        raise InvalidRequest(f"turn source content: {exc}") from None
    return TurnSource(model.id, model.role, content,
                      datetime.fromisoformat(model.created_at.replace("Z", "+00:00")), model.interrupted)


def load_json(load: HistoryLoad[Any], key: str) -> dict[str, Any]:
    return {key: [orjson.Fragment(row.to_json()) for row in load.messages], "truncated": load.truncated}


def measure_of(tree: Any) -> Measure:
    try:
        model = MeasureOut.model_validate(tree)
    except ValidationError as exc:
        raise InvalidRequest(str(invalid(exc, "measure"))) from None
    return Measure(model.messages, model.content_bytes, model.turns)


def stats_json(stats: EngineStats, poison: list[tuple[LogPosition, str]]) -> dict[str, Any]:
    """The ``histlog stats --json`` object."""
    return {**asdict(stats), "poison": [{"position": str(p), "reason": r} for p, r in poison]}


def stats_of(tree: Any) -> EngineStats:
    try:
        model = StatsOut.model_validate(tree)
    except ValidationError as exc:
        raise InvalidRequest(str(invalid(exc, "stats"))) from None
    return EngineStats(**model.model_dump(exclude={"poison"}))
