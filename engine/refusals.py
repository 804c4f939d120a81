"""The one mapping from an admission ``Decision`` to what a writer gets: the receipt it proves,
or the exception that says why the write was refused. Used for the fast path's decisions (local
state already proves the answer, ``projections.admission.precheck``) and for the projector's
decision for the writer's own log position alike, so each message is written once."""

from __future__ import annotations

from projections.admission import Decision, Outcome
from schemas.batch import Batch, Receipt
from schemas.errors import (
    AppendConflict,
    ConversationClosed,
    Fenced,
    HistoryError,
    PreconditionFailed,
    SlotUnavailable,
    TurnNotReplaceable,
)

__all__ = ["answer", "refusal"]


def answer(batch: Batch, decision: Decision) -> Receipt | None:
    """The receipt of an accepted or duplicate decision; raises the refusal of a refusing one;
    None for the others (a corrupt record: the caller says what was written where)."""
    if decision.outcome in (Outcome.ACCEPTED, Outcome.DUPLICATE) and decision.receipt_position is not None:
        return decision.receipt(batch.conversation_id, batch.append_id)
    refused = refusal(batch, decision)
    if refused is not None:
        raise refused
    return None


def refusal(batch: Batch, decision: Decision) -> HistoryError | None:
    """The exception for a refusing decision (conflict, closed, precondition, not replaceable,
    fenced, slot unavailable), or None for the others (accepted, duplicate, corrupt)."""
    outcome = decision.outcome
    c, a = str(batch.conversation_id), str(batch.append_id)
    if outcome is Outcome.CONFLICT:
        return AppendConflict(
            f"append id {a!r} of conversation {c!r} already names different content ({decision.digest}, this "
            f"batch is {batch.digest}); to retry, resend the original batch; for new content use a new append id",
            conversation_id=batch.conversation_id, append_id=batch.append_id,
            existing_digest=decision.digest, digest=batch.digest)
    if outcome is Outcome.REJECTED_CLOSED or outcome is Outcome.ERASED:  # erased: cleared since it was written
        return ConversationClosed(f"conversation {c!r} is closed forever (it was cleared); start a new conversation id",
                                  conversation_id=batch.conversation_id)
    if outcome is Outcome.PRECONDITION_FAILED:
        return PreconditionFailed(
            f"append {a!r} to {c!r} refused: {decision.reason}; "
            "read the conversation again and retry with its latest receipt as expected_last")
    if outcome is Outcome.FENCED:
        return Fenced(f"write {a!r} to {c!r} refused: {decision.reason}; another run owns the conversation's "
                      "writes now: stop this run (its successor writes from here on)",
                      conversation_id=batch.conversation_id, latest=decision.epoch)
    if outcome is Outcome.SLOT_UNAVAILABLE:
        return SlotUnavailable(f"append {a!r} to {c!r} refused: {decision.reason}; a slot is spent once: "
                               "allocate_turn again and append under the new slot",
                               conversation_id=batch.conversation_id)
    if outcome is Outcome.NOT_REPLACEABLE:
        return TurnNotReplaceable(f"replacement {a!r} of {c!r} refused: {decision.reason}; "
                                  "read latest_turn() and decide again")
    return None

