"""The log's event records as Python values: one frozen dataclass per Avro record
(``schemas/*.avsc``). ``schemas.events`` is their codec and the home of their wire format;
``schemas.event_rules`` the rules a decoded record's fields must meet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Final

from schemas.errors import InvalidBatch
from schemas.event_rules import turn_id_problem
from schemas.sealed import Sealed
from schemas.times import check_time_ms

if TYPE_CHECKING:  # pragma: no cover
    from schemas.batch import Batch
    from schemas.runs import Fence
    from schemas.slots import TurnSlot

__all__ = [
    "NAMESPACE",
    "AssetsLinked",
    "BatchAppended",
    "Checkpointed",
    "ConversationCleared",
    "Event",
    "MessagesDeleted",
    "RunBegun",
    "TurnAllocated",
    "TurnReplaced",
]

NAMESPACE: Final = "histlog.events"


@dataclass(frozen=True, slots=True)
class BatchAppended:
    """One atomic append of a batch (``schemas/batch_appended.v5.avsc``).

    ``messages`` is the canonical JSON array that ``digest`` (``"sha256:" + hex``) was computed
    over; admission recomputes the digest from these bytes.
    """

    AVRO_NAME: ClassVar[str] = f"{NAMESPACE}.BatchAppended"

    conversation_id: str
    append_id: str
    digest: str
    messages: bytes
    message_count: int
    content_bytes: int
    created_at_ms: int
    expected_last: str | None = None
    """Precondition (version 2): ``None`` none; ``""`` no accepted append yet; else the append id
    of the conversation's last accepted append."""
    sealed: Sealed | None = None
    """Version 3: the content sealed under the conversation's data key (``digest`` is then ``""``
    and ``messages`` empty); None for a plain record."""
    fence: int | None = None
    """Version 4: the epoch of the writer's run (``begin_run``); None: no fence."""
    run_id: str | None = None
    """Version 4: the run that wrote it (traceability, ``run_wrote_history``); None: none."""
    turn_id: str | None = None
    """Version 5: the turn slot's id (``<slot id>/0``) its first user-led turn is filed under; None: none."""
    turn_position: int | None = None
    """Version 5: that slot's position (set with ``turn_id``)."""

    @classmethod
    def of(cls, batch: Batch, created_at_ms: int, expected_last: str | None = None,
           fence: Fence | None = None, slot: TurnSlot | None = None) -> BatchAppended:
        """The event that appends ``batch`` (the one place a Batch becomes an event); its run is
        the batch's ``run_id``, else the fence's; ``slot`` files its user-led turn under a slot.

        Raises ``InvalidConfiguration`` for an unrepresentable ``created_at_ms``."""
        if fence is None and slot is None:  # the common case: a batch's own run, no fence, no slot
            return cls(batch.conversation_id, batch.append_id, batch.digest, batch.canonical_json(), len(batch),
                       batch.content_bytes(), check_time_ms(created_at_ms), expected_last, None, None, batch.run_id)
        run_id = batch.run_id if batch.run_id is not None or fence is None else fence.run_id
        return cls(batch.conversation_id, batch.append_id, batch.digest, batch.canonical_json(), len(batch),
                   batch.content_bytes(), check_time_ms(created_at_ms), expected_last, None,
                   None if fence is None else fence.epoch, run_id,
                   None if slot is None else slot.turn_id, None if slot is None else slot.position)


@dataclass(frozen=True, slots=True)
class ConversationCleared:
    """Closes a conversation forever (``schemas/conversation_cleared.avsc``).

    Its record key has an empty append id.
    """

    AVRO_NAME: ClassVar[str] = f"{NAMESPACE}.ConversationCleared"

    conversation_id: str
    created_at_ms: int


@dataclass(frozen=True, slots=True)
class RunBegun:
    """A run now owns the conversation's writes (``schemas/run_begun.avsc``): admission gives it
    the conversation's next epoch, or the one it already has. Its record key's second part is
    the run id."""

    AVRO_NAME: ClassVar[str] = f"{NAMESPACE}.RunBegun"

    conversation_id: str
    run_id: str
    created_at_ms: int


@dataclass(frozen=True, slots=True)
class TurnAllocated:
    """A turn slot of the conversation (``schemas/turn_allocated.avsc``, ``allocate_turn``):
    admission gives a new slot the conversation's next turn position, or the one it already has.
    Its record key's second part is the slot id."""

    AVRO_NAME: ClassVar[str] = f"{NAMESPACE}.TurnAllocated"

    conversation_id: str
    slot_id: str
    created_at_ms: int


@dataclass(frozen=True, slots=True)
class AssetsLinked:
    """Media references linked to a visible message (``schemas/assets_linked.avsc``,
    ``link_assets``): ``assets`` is the canonical JSON array of the refs (``schemas.assets``), or
    empty when ``sealed`` holds it. Its record key's second part is the message id."""

    AVRO_NAME: ClassVar[str] = f"{NAMESPACE}.AssetsLinked"

    conversation_id: str
    message_id: str
    assets: bytes
    created_at_ms: int
    sealed: Sealed | None = None


@dataclass(frozen=True, slots=True)
class Checkpointed:
    """A change to a thread's graph checkpoints (``schemas/checkpointed.avsc``): ``kind`` ``put``,
    ``writes`` or ``prune``, its ``content`` (``schemas.checkpoints``) empty when ``sealed`` holds
    it. Its record key's second part is ``record_id``."""

    AVRO_NAME: ClassVar[str] = f"{NAMESPACE}.Checkpointed"

    conversation_id: str
    record_id: str
    kind: str
    content: bytes
    created_at_ms: int
    sealed: Sealed | None = None


@dataclass(frozen=True, slots=True)
class MessagesDeleted:
    """Messages removed from every read and from the state (``schemas/messages_deleted.avsc``,
    ``delete_messages``): ``message_ids`` are message ids (``APPEND_ID/INDEX``), ``fence`` the
    writer's (None: none). Its record key's second part is ``delete_id``."""

    AVRO_NAME: ClassVar[str] = f"{NAMESPACE}.MessagesDeleted"

    conversation_id: str
    delete_id: str
    message_ids: tuple[str, ...]
    fence: int | None
    created_at_ms: int


@dataclass(frozen=True, slots=True)
class TurnReplaced:
    """Edit or retry (``schemas/turn_replaced.v3.avsc``): hides the latest visible turn
    ``old_turn_id`` and appends the replacement turn, atomically. Keyed like a batch."""

    AVRO_NAME: ClassVar[str] = f"{NAMESPACE}.TurnReplaced"

    conversation_id: str
    append_id: str
    digest: str
    messages: bytes
    message_count: int
    content_bytes: int
    created_at_ms: int
    old_turn_id: str
    reason: str
    sealed: Sealed | None = None
    """Version 2: the replacement's content sealed (as ``BatchAppended.sealed``); None when plain."""
    fence: int | None = None
    """Version 3: the epoch of the writer's run; None: no fence."""
    run_id: str | None = None
    """Version 3: the run that wrote it; None: none."""

    @classmethod
    def of(cls, batch: Batch, created_at_ms: int, old_turn_id: str, reason: str,
           fence: Fence | None = None) -> TurnReplaced:
        """The event that replaces turn ``old_turn_id`` with ``batch``.

        Raises ``InvalidConfiguration`` for an unrepresentable ``created_at_ms`` and
        ``InvalidBatch`` when ``old_turn_id`` is not a turn id (``HistoryTurn.id``): such an
        event would be poison. ``reason`` is the caller's to check (the engine does), so tests
        can still build a poison replacement on purpose."""
        if not isinstance(old_turn_id, str) or turn_id_problem(old_turn_id):
            raise InvalidBatch(f"invalid old_turn_id {old_turn_id!r}: expected a turn id (HistoryTurn.id, "
                               "e.g. 'a-2/0'); read latest_turn() for the id of the latest visible turn")
        run_id = batch.run_id if batch.run_id is not None or fence is None else fence.run_id
        return cls(batch.conversation_id, batch.append_id, batch.digest, batch.canonical_json(), len(batch),
                   batch.content_bytes(), check_time_ms(created_at_ms), old_turn_id, reason, None,
                   None if fence is None else fence.epoch, run_id)


Event = (BatchAppended | ConversationCleared | TurnReplaced | RunBegun | TurnAllocated | AssetsLinked | MessagesDeleted
         | Checkpointed)
