"""The outcomes of the writes whose answer is not a batch's receipt (that one is
``engine.refusals``): a run's fence, a turn slot, a message's assets, a delete's count, a graph
checkpoint change, or why each was refused. Each ``Written`` carries its concluder, so the thread
face (``engine.writes.Writes.settle``) and the asyncio face (``engine.aio``) share one home per
answer. ``closed`` is what any write to a cleared conversation raises.
"""

from __future__ import annotations

from typing import Protocol

from projections.admission import Decision, Outcome
from schemas.assets import AssetRef
from schemas.errors import AppendConflict, ConversationClosed, CorruptLog, Fenced, NotFound
from schemas.ids import ConversationID, RunID
from schemas.positions import LogPosition
from schemas.runs import Fence
from schemas.slots import TurnSlot, slot_turn_id

__all__ = ["checkpointed", "closed", "deleted_count", "fence_outcome", "link_conflict", "linked_outcome",
           "slot_outcome"]


class _AssetReads(Protocol):
    def message_assets(self, conv: str, message_id: str) -> tuple[AssetRef, ...] | None: ...


def closed(c: ConversationID) -> ConversationClosed:
    """What a write to the cleared conversation ``c`` raises."""
    return ConversationClosed(f"conversation {str(c)!r} is closed forever (it was cleared); start a new "
                              "conversation id", conversation_id=c)


def _not_accepted(position: LogPosition | None, decision: Decision, call: str) -> CorruptLog:
    return CorruptLog(f"the event written at {position} was not accepted ({decision.reason}); "
                      f"run `histlog stats` and `histlog log verify`, then {call} again",
                      reason=decision.reason, position=position)


def fence_outcome(c: ConversationID, run: RunID, decision: Decision, position: LogPosition | None) -> Fence:
    """A run's begin: its fence (a new epoch, or the one it had)."""
    if decision.outcome in (Outcome.BEGUN, Outcome.DUPLICATE):
        return Fence(c, run, decision.epoch)
    if decision.outcome is Outcome.REJECTED_CLOSED:
        raise closed(c)
    raise _not_accepted(position, decision, "call begin_run")


def slot_outcome(c: ConversationID, slot_id: str, decision: Decision, position: LogPosition | None) -> TurnSlot:
    """A slot's allocation: the slot and its position."""
    if decision.outcome in (Outcome.ALLOCATED, Outcome.DUPLICATE):
        return TurnSlot(c, slot_turn_id(slot_id), decision.position)
    if decision.outcome is Outcome.REJECTED_CLOSED:
        raise closed(c)
    raise _not_accepted(position, decision, "call allocate_turn")


def link_conflict(c: ConversationID, m: str, ordinal: int | None, reason: str = "") -> AppendConflict:
    why = reason or f"message {m!r} already links another asset at ordinal {ordinal}"
    return AppendConflict(f"cannot link assets in {str(c)!r}: {why}; link the new asset at a free ordinal",
                          conversation_id=c)


def linked_outcome(reads: _AssetReads, c: ConversationID, m: str, decision: Decision,
                   position: LogPosition | None) -> tuple[AssetRef, ...]:
    """A link's outcome: the message's assets (read after the decision), or why it was refused."""
    outcome = decision.outcome
    if outcome in (Outcome.LINKED, Outcome.DUPLICATE):
        linked = reads.message_assets(c, m)
        if linked is not None:
            return linked
        outcome = Outcome.UNKNOWN_MESSAGE  # its turn was replaced since: what a new link would meet
    if outcome is Outcome.CONFLICT:
        raise link_conflict(c, m, None, decision.reason)
    if outcome is Outcome.UNKNOWN_MESSAGE:
        raise NotFound(f"cannot link assets in {str(c)!r}: {decision.reason or f'{m!r} is not visible'}; "
                       "assets link to visible messages (read entries() for their ids)")
    if outcome in (Outcome.REJECTED_CLOSED, Outcome.ERASED):
        raise closed(c)
    raise _not_accepted(position, decision, "call link_assets")


def deleted_count(c: ConversationID, decision: Decision, position: LogPosition | None) -> int:
    """How many of a delete's messages were visible (now gone from every read), or why it was
    refused: ``ConversationClosed`` once cleared, ``Fenced`` under a stale fence."""
    outcome = decision.outcome
    if outcome is Outcome.DELETED:
        return decision.count  # a compaction that did not complete leaves no row readable: the count holds
    if outcome in (Outcome.REJECTED_CLOSED, Outcome.ERASED):
        raise ConversationClosed(f"conversation {str(c)!r} is closed forever (it was cleared): its messages are "
                                 "erased already; start a new conversation id", conversation_id=c)
    if outcome is Outcome.FENCED:
        raise Fenced(f"delete of messages of {str(c)!r} refused: {decision.reason}; another run owns the "
                     "conversation's writes now: stop this run (its successor writes from here on)",
                     conversation_id=c, latest=decision.epoch)
    raise _not_accepted(position, decision, "call delete_messages")


def checkpointed(c: ConversationID, decision: Decision, position: LogPosition | None) -> None:
    """A checkpoint change's outcome: None once applied; ``ConversationClosed`` once the thread was
    deleted (cleared)."""
    if decision.outcome is Outcome.CHECKPOINTED:
        return None
    if decision.outcome in (Outcome.REJECTED_CLOSED, Outcome.ERASED):
        raise ConversationClosed(f"thread {str(c)!r} was deleted (its conversation is cleared, closed forever); "
                                 "start a new thread id", conversation_id=c)
    raise _not_accepted(position, decision, "write it")
