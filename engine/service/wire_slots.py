"""The bodies of turn slots on the wire (SERVICE.md, docs/runs.md "Turn slots"): a slot
(``POST .../turn-slots``) and the ``"turn"`` an append files under (``PUT .../appends/{a}``).
Kept beside ``engine.service.wire`` with the same rules: the models generate ``/openapi.json`` and
check what a client reads back (a bad answer is an ``InvalidRequest`` naming the field), and a bad
``"turn"`` in a request is an ``InvalidRequest`` naming ``turn`` (or its member), never a 500.

This module imports nothing of ``engine.service.wire`` (which takes ``TurnIn`` into its append
body), so the two cannot import each other in a circle.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from schemas.errors import InvalidRequest
from schemas.invalid import invalid
from schemas.slots import TurnSlot

__all__ = ["TurnIn", "TurnSlotOut", "slot_json", "slot_of", "turn_json", "turn_slot_of"]

_STRICT = ConfigDict(extra="forbid")
_MAX_POSITION = 2**63 - 1
"""The largest turn position (a signed 64-bit value, as ``TurnSlot`` takes it)."""


class TurnIn(BaseModel):
    """The turn slot an append files its user-led turn under (``allocate_turn``'s answer, without
    its conversation: the path names it): exactly a ``turn_id`` (``<slot id>/0``) and a
    ``position`` (an int >= 1)."""
    model_config = _STRICT
    turn_id: StrictStr
    position: Annotated[StrictInt, Field(ge=1, le=_MAX_POSITION)]


class TurnSlotOut(BaseModel):
    """A reserved turn: an append gives ``{"turn_id", "position"}`` as ``"turn"`` to open it."""
    model_config = _STRICT
    conversation_id: str
    turn_id: str
    position: Annotated[StrictInt, Field(ge=1, le=_MAX_POSITION)]


def slot_json(slot: TurnSlot) -> dict[str, Any]:
    """The ``TurnSlotOut`` object of ``slot`` (the allocation's answer)."""
    return {"conversation_id": str(slot.conversation_id), "turn_id": slot.turn_id, "position": slot.position}


def turn_json(slot: TurnSlot) -> dict[str, Any]:
    """What an append sends as ``"turn"`` for ``slot``."""
    return {"turn_id": slot.turn_id, "position": slot.position}


def slot_of(tree: Any) -> TurnSlot:
    """A ``TurnSlotOut`` answer as a ``TurnSlot`` (``InvalidRequest`` when it is not one)."""
    try:
        parsed = TurnSlotOut.model_validate(tree)
    except ValidationError as exc:
        raise InvalidRequest(str(invalid(exc, "allocate_turn answer"))) from None
    try:
        return TurnSlot(parsed.conversation_id, parsed.turn_id, parsed.position)  # type: ignore[arg-type]
    except InvalidRequest as exc:
        raise InvalidRequest(f"allocate_turn answer: {exc}") from None


def turn_slot_of(conversation_id: str, turn: TurnIn | None) -> TurnSlot | None:
    """An append body's ``"turn"`` as the ``TurnSlot`` of ``conversation_id`` (None without one);
    ``InvalidRequest`` naming ``turn`` for a slot ``TurnSlot`` refuses (a ``turn_id`` that is no
    slot's ``<slot id>/0``), before any I/O."""
    if turn is None:
        return None
    try:
        return TurnSlot(conversation_id, turn.turn_id, turn.position)  # type: ignore[arg-type]
    except InvalidRequest as exc:
        raise InvalidRequest(f"invalid request: turn: {exc}") from None
