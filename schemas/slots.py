"""What ``allocate_turn`` returns: a ``TurnSlot``, a turn named before any of its rows exist
(docs/runs.md, "Turn slots").

Admission gives a new slot the conversation's next turn position (``HistoryPosition.turn``) in log
order, so every instance agrees on it, and an append filed under the slot (``append(batch,
turn=slot)``) opens its user-led turn with that id and position. The position is spent whether or
not a turn ever uses it: positions are compared, never counted, so a released slot leaves a gap
that costs nothing, while using a slot twice would file two turns under one number
(``SlotUnavailable``).

A slot's id is an id like an append id, written by the engine (``slot-`` and a UUIDv7); the turn
it names has the id ``<slot id>/0``, shaped like every turn id (the id of a message), so every
call that takes a turn id (``replace_turn``, ``run_wrote_history``'s ``root_turn`` ...) takes it.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.errors import InvalidRequest, NotFound, SlotUnavailable
from schemas.ids import AppendID, ConversationID, MessageID

__all__ = ["TurnSlot", "check_slot", "slot_of_turn", "slot_turn_id"]


def slot_turn_id(slot_id: str) -> str:
    """The id of the turn slot ``slot_id`` names: ``<slot id>/0``."""
    return MessageID.format(slot_id, 0)


def slot_of_turn(turn_id: str) -> AppendID:
    """The slot id of a slot's turn id (``slot_turn_id``'s inverse). ``InvalidRequest`` for a
    string that is no ``<slot id>/0``."""
    try:
        parsed = MessageID.parse(turn_id)
    except NotFound as e:
        raise InvalidRequest(f"invalid turn slot: turn_id {turn_id!r} is not a slot's turn id ({e})") from None
    if parsed.index != 0:
        raise InvalidRequest(f"invalid turn slot: turn_id {turn_id!r} is not a slot's turn id (<slot id>/0)")
    return parsed.append_id


@dataclass(frozen=True, slots=True)
class TurnSlot:
    """A reserved turn of a conversation: ``turn_id`` (``<slot id>/0``) and ``position`` (its
    ``HistoryPosition.turn``, at least 1). Pass it to ``append(batch, turn=slot)``."""

    conversation_id: ConversationID
    turn_id: str
    position: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "conversation_id", ConversationID(self.conversation_id))
        if not isinstance(self.turn_id, str):
            raise InvalidRequest(f"invalid turn slot: turn_id must be a str, got {type(self.turn_id).__name__}")
        slot_of_turn(self.turn_id)
        if type(self.position) is not int or not 1 <= self.position < 1 << 63:
            raise InvalidRequest(f"invalid turn slot: position must be an int of at least 1, got {self.position!r}; "
                                 "pass the TurnSlot that allocate_turn returned")

    @property
    def slot_id(self) -> AppendID:
        """The slot's own id (its ``TurnAllocated`` record's key)."""
        return slot_of_turn(self.turn_id)


def check_slot(slot: object, conversation_id: str) -> TurnSlot | None:
    """``slot`` as an append's turn slot: None, or a ``TurnSlot`` of ``conversation_id``. Raises
    ``InvalidRequest`` for anything else and ``SlotUnavailable`` for another conversation's slot,
    both before any I/O."""
    if slot is None:
        return None
    if not isinstance(slot, TurnSlot):
        raise InvalidRequest(f"invalid turn: expected the TurnSlot that allocate_turn returned (or None), "
                             f"got {type(slot).__name__}")
    if slot.conversation_id != conversation_id:
        raise SlotUnavailable(f"turn slot {slot.turn_id!r} is conversation {str(slot.conversation_id)!r}'s, not "
                              f"{str(conversation_id)!r}'s; allocate a turn of this conversation",
                              conversation_id=str(conversation_id), turn_id=slot.turn_id)
    return slot
