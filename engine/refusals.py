"""The exceptions that tell a writer why its append was refused: one builder per refusal, used
both by the facade's fast path (local state already proves the answer) and by the answer to the
projector's decision for its own log position, so each message is written once."""

from __future__ import annotations

from projections.admission import Decision, Outcome
from schemas.batch import Batch
from schemas.errors import AppendConflict, ConversationClosed, HistoryError, PreconditionFailed, TurnNotReplaceable

__all__ = ["closed", "conflict", "not_replaceable", "precondition_failed", "refusal"]


def refusal(batch: Batch, decision: Decision) -> HistoryError | None:
    """The exception for a refusing decision (conflict, closed, precondition, not replaceable),
    or None for the others (accepted, duplicate, corrupt: the caller answers those)."""
    outcome = decision.outcome
    if outcome is Outcome.CONFLICT:
        return conflict(batch, decision.digest)
    if outcome is Outcome.REJECTED_CLOSED:
        return closed(batch.conversation_id)
    if outcome is Outcome.PRECONDITION_FAILED:
        return PreconditionFailed(
            f"append {str(batch.append_id)!r} to {str(batch.conversation_id)!r} refused: {decision.reason}; "
            "read the conversation again and retry with its latest receipt as expected_last")
    if outcome is Outcome.NOT_REPLACEABLE:
        return not_replaceable(batch, decision.reason)
    return None


def not_replaceable(batch: Batch, reason: str) -> TurnNotReplaceable:
    return TurnNotReplaceable(
        f"replacement {str(batch.append_id)!r} of {str(batch.conversation_id)!r} refused: {reason}; "
        "read latest_turn() and decide again")


def precondition_failed(batch: Batch, expected: str, last: str) -> PreconditionFailed:
    wanted = repr(expected) if expected else "no append yet"
    return PreconditionFailed(
        f"append {str(batch.append_id)!r} to {str(batch.conversation_id)!r} refused: expected last append {wanted}, "
        f"found {last!r}; read the conversation again and retry with its latest receipt as expected_last")


def closed(c: str) -> ConversationClosed:
    return ConversationClosed(
        f"conversation {str(c)!r} is closed forever (it was cleared); start a new conversation id",
        conversation_id=c)


def conflict(batch: Batch, existing: str) -> AppendConflict:
    return AppendConflict(
        f"append id {str(batch.append_id)!r} of conversation {str(batch.conversation_id)!r} already names "
        f"different content ({existing}, this batch is {batch.digest}); to retry, resend the original "
        "batch; for new content use a new append id",
        conversation_id=batch.conversation_id, append_id=batch.append_id,
        existing_digest=existing, digest=batch.digest)
