"""The field rules of decoded event records: what ``decode_event`` checks before it returns an
event, so that nothing a producer can put on the log reaches admission invalid (the table is in
``docs/events.md`` §5). Each ``check_*_record`` takes the record dict fastavro decoded, raises
``InvalidField`` naming the field, and replaces the ids by their ``ConversationID`` /
``AppendID`` values. The time range is defined in ``schemas/times.py``.
"""

from __future__ import annotations

from typing import Any, Final

from schemas.assets import AssetRef, assets_from_json, assets_json, check_assets
from schemas.canonical import DIGEST_PATTERN
from schemas.checkpoints import KINDS as CHECKPOINT_KINDS
from schemas.checkpoints import PruneContent, PutContent, WritesContent
from schemas.errors import HistoryError, NotFound
from schemas.ids import AppendID, ConversationID, MessageID, RunID
from schemas.sealed import TAG_BYTES, key_id_problem
from schemas.times import time_problem

__all__ = [
    "INT_MAX",
    "INT_MIN",
    "LONG_MAX",
    "LONG_MIN",
    "REPLACE_REASONS",
    "InvalidField",
    "check_allocated_record",
    "check_batch_record",
    "check_checkpointed_record",
    "check_cleared_record",
    "check_deleted_record",
    "check_linked_record",
    "check_replaced_record",
    "check_run_record",
    "checkpointed_content",
    "linked_refs",
    "slot_turn_problem",
    "turn_id_problem",
]

INT_MIN: Final = -(1 << 31)
INT_MAX: Final = (1 << 31) - 1
LONG_MIN: Final = -(1 << 63)
LONG_MAX: Final = (1 << 63) - 1

REPLACE_REASONS: Final = ("edit", "retry")
"""The reasons a ``TurnReplaced`` may give (their order is the state's reason code)."""


class InvalidField(ValueError):
    """A decoded field breaks its rule: ``field`` and why (becomes ``CorruptLog``)."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"{field}: {why}")
        self.field = field


def turn_id_problem(value: str) -> str:
    """Why ``value`` is not a turn id, the ``MessageID`` of its first message ("" when it is)."""
    try:
        MessageID.parse(value)
    except NotFound as e:
        return f"not a turn id: {e}"
    return ""


def _valid_id(rec: dict[str, Any], field: str, kind: type[ConversationID] | type[AppendID] | type[RunID]) -> None:
    try:
        rec[field] = kind(rec[field])
    except HistoryError as e:
        raise InvalidField(field, str(e)) from None


def _valid_int(rec: dict[str, Any], field: str, lo: int, hi: int) -> None:
    if not lo <= rec[field] <= hi:
        raise InvalidField(field, f"{rec[field]} is outside {lo}..{hi}")


def _valid_common(rec: dict[str, Any]) -> None:
    """The rules of the fields every event has (``conversation_id``, ``created_at_ms``)."""
    _valid_id(rec, "conversation_id", ConversationID)
    problem = time_problem(rec["created_at_ms"])
    if problem:
        raise InvalidField("created_at_ms", problem)


def _valid_batch_fields(rec: dict[str, Any]) -> None:
    """The rules of the fields ``BatchAppended`` and ``TurnReplaced`` share; ``messages`` itself
    is checked by ``event_batch``."""
    _valid_common(rec)
    _valid_id(rec, "append_id", AppendID)
    sealed = rec.get("sealed")
    if sealed is not None:  # the sealed form (BatchAppended v3, TurnReplaced v2): no plain content at all
        if rec["digest"] != "" or rec["messages"] != b"":
            raise InvalidField("sealed", "a sealed record carries no digest and no messages (both must be empty)")
        problem = key_id_problem(sealed["key_id"])
        if problem:
            raise InvalidField("sealed", problem)
        if len(sealed["ciphertext"]) < TAG_BYTES:
            raise InvalidField("sealed", f"the ciphertext is shorter than its {TAG_BYTES}-byte tag")
    elif DIGEST_PATTERN.fullmatch(rec["digest"]) is None:
        raise InvalidField("digest", f"{rec['digest'][:80]!r} is not 'sha256:' + 64 lowercase hex digits")
    _valid_int(rec, "message_count", 1, INT_MAX)
    _valid_int(rec, "content_bytes", 0, LONG_MAX)
    if rec.get("fence") is not None:  # version 4 / 3: an epoch begin_run gave (the first is 1)
        _valid_int(rec, "fence", 1, LONG_MAX)
    if rec.get("run_id") is not None:
        _valid_id(rec, "run_id", RunID)


def check_batch_record(rec: dict[str, Any]) -> None:
    """A ``BatchAppended`` record's fields (``messages`` is checked by ``event_batch``)."""
    _valid_batch_fields(rec)
    if rec["expected_last"]:  # None (no precondition) and "" (no append yet) need no check
        _valid_id(rec, "expected_last", AppendID)
    turn_id, position = rec.get("turn_id"), rec.get("turn_position")
    if turn_id is not None or position is not None:  # version 5: a turn slot, both fields or neither
        if turn_id is None or position is None:
            raise InvalidField("turn_id" if turn_id is None else "turn_position",
                               "a turn slot has both turn_id and turn_position")
        problem = slot_turn_problem(turn_id)
        if problem:
            raise InvalidField("turn_id", problem)
        _valid_int(rec, "turn_position", 1, LONG_MAX)


def slot_turn_problem(value: str) -> str:
    """Why ``value`` is not a turn slot's id, ``<slot id>/0`` ("" when it is)."""
    problem = turn_id_problem(value)
    if problem:
        return problem
    return "" if MessageID.parse(value).index == 0 else "not a turn slot's id (<slot id>/0)"


def check_linked_record(rec: dict[str, Any]) -> None:
    """An ``AssetsLinked`` record's fields (its refs are checked by ``linked_refs`` once opened)."""
    _valid_common(rec)
    problem = turn_id_problem(rec["message_id"])
    if problem:
        raise InvalidField("message_id", problem.replace("turn id", "message id"))
    sealed = rec.get("sealed")
    if sealed is not None:
        if rec["assets"] != b"":
            raise InvalidField("sealed", "a sealed record carries no plain assets (assets must be empty)")
        problem = key_id_problem(sealed["key_id"])
        if problem:
            raise InvalidField("sealed", problem)
        if len(sealed["ciphertext"]) < TAG_BYTES:
            raise InvalidField("sealed", f"the ciphertext is shorter than its {TAG_BYTES}-byte tag")
    else:
        linked_refs(rec["assets"])


def linked_refs(data: bytes) -> tuple[AssetRef, ...]:
    """The refs an ``AssetsLinked`` carries (its plain ``assets``, or its opened content), checked:
    exactly the canonical JSON ``schemas.assets.assets_json`` writes of 1 to ``MAX_ASSETS`` valid
    refs, one per ordinal, in ordinal order; ``InvalidField("assets", ...)`` otherwise."""
    try:
        refs = assets_from_json(data)
        checked = check_assets(refs)
    except HistoryError as e:
        raise InvalidField("assets", str(e)) from None
    if assets_json(checked) != data:
        raise InvalidField("assets", "not the canonical JSON of refs sorted by ordinal, one per ordinal")
    return checked


def _valid_sealed(rec: dict[str, Any], plain: str) -> bool:
    """Whether the record is sealed, its ``sealed`` checked (then its ``plain`` field must be empty)."""
    sealed = rec.get("sealed")
    if sealed is None:
        return False
    if rec[plain] != b"":
        raise InvalidField("sealed", f"a sealed record carries no plain {plain} ({plain} must be empty)")
    problem = key_id_problem(sealed["key_id"])
    if problem:
        raise InvalidField("sealed", problem)
    if len(sealed["ciphertext"]) < TAG_BYTES:
        raise InvalidField("sealed", f"the ciphertext is shorter than its {TAG_BYTES}-byte tag")
    return True


def check_checkpointed_record(rec: dict[str, Any]) -> None:
    """A ``Checkpointed`` record's fields (its content is checked by ``checkpointed_content``
    once opened)."""
    _valid_common(rec)
    _valid_id(rec, "record_id", AppendID)
    if rec["kind"] not in CHECKPOINT_KINDS:
        raise InvalidField("kind", f"{rec['kind'][:40]!r} is not one of {', '.join(CHECKPOINT_KINDS)}")
    if not _valid_sealed(rec, "content"):
        checkpointed_content(rec["kind"], rec["content"])


def checkpointed_content(kind: str, data: bytes) -> PutContent | WritesContent | PruneContent:
    """The content of a ``Checkpointed`` of ``kind`` (plain, or opened), checked;
    ``InvalidField("content", ...)`` otherwise."""
    try:
        if kind == "put":
            return PutContent.decode(data)
        if kind == "writes":
            return WritesContent.decode(data)
        return PruneContent.decode(data)
    except ValueError as e:
        raise InvalidField("content", f"not a {kind}'s content: {e}"[:300]) from None


def check_allocated_record(rec: dict[str, Any]) -> None:
    """A ``TurnAllocated`` record's fields."""
    _valid_common(rec)
    _valid_id(rec, "slot_id", AppendID)


MAX_DELETE_IDS: Final = 10_000
"""At most this many message ids in one ``MessagesDeleted`` (``delete_messages``' bound)."""


def check_deleted_record(rec: dict[str, Any]) -> None:
    """A ``MessagesDeleted`` record's fields: 1 to ``MAX_DELETE_IDS`` message ids (made a tuple)."""
    _valid_common(rec)
    _valid_id(rec, "delete_id", AppendID)
    ids = rec["message_ids"]
    if not 1 <= len(ids) <= MAX_DELETE_IDS:
        raise InvalidField("message_ids", f"{len(ids)} ids; a delete names 1 to {MAX_DELETE_IDS}")
    for text in ids:
        problem = turn_id_problem(text)
        if problem:
            raise InvalidField("message_ids", problem.replace("turn id", "message id"))
    rec["message_ids"] = tuple(ids)
    if rec["fence"] is not None:
        _valid_int(rec, "fence", 1, LONG_MAX)


def check_cleared_record(rec: dict[str, Any]) -> None:
    """A ``ConversationCleared`` record's fields."""
    _valid_common(rec)


def check_run_record(rec: dict[str, Any]) -> None:
    """A ``RunBegun`` record's fields."""
    _valid_common(rec)
    _valid_id(rec, "run_id", RunID)


def check_replaced_record(rec: dict[str, Any]) -> None:
    """A ``TurnReplaced`` record's fields."""
    _valid_batch_fields(rec)
    problem = turn_id_problem(rec["old_turn_id"])
    if problem:
        raise InvalidField("old_turn_id", problem)
    if rec["reason"] not in REPLACE_REASONS:
        raise InvalidField("reason", f"turn replacement reason {rec['reason'][:80]!r} is not one of "
                                     f"{', '.join(REPLACE_REASONS)}")
