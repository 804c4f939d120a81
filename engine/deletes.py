"""``delete_messages`` on ``HistoryEngine`` (API.md "Runs, slots, assets, deletes"; the rule and
the state's side are ``projections.deletes``): the conclusion of a delete's decision, which the
thread face (``engine.writes.Writes.settle``) and the asyncio face (``engine.aio``) share."""

from __future__ import annotations

from projections.admission import Decision, Outcome
from schemas.errors import ConversationClosed, CorruptLog, Fenced
from schemas.ids import ConversationID
from schemas.positions import LogPosition

__all__ = ["deleted_count"]


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
    raise CorruptLog(f"the delete written at {position} was not accepted ({decision.reason}); "
                     "run `histlog stats` and `histlog log verify`, then call delete_messages again",
                     reason=decision.reason, position=position)
