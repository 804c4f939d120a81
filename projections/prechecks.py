"""Admission's rules for a batch or a replacement (closed, duplicate, conflict, fenced, slot,
precondition, replaceable; ``precheck``) and for a write's fence (``fence_refusal``): the one home
of each, without effects, applied by the projector in log order (``projections.admission``) and by
a writer's fast path to its local state (``engine.writes``), where they answer only what no later
record can change."""

from __future__ import annotations

from projections import full, keys, runs, slots
from projections.decisions import Decision, Outcome
from projections.full import Rows
from projections.rows import ConversationRow, ReceiptRow, SourceRow
from schemas.batch import Batch
from schemas.events import BatchAppended, TurnReplaced
from schemas.ids import MessageID
from schemas.positions import LogPosition

__all__ = ["conversation_row", "fence_refusal", "precheck"]


def conversation_row(rows: Rows, conversation_id: str) -> ConversationRow | None:
    """The conversation's summary row, or None before its first accepted append or clear."""
    raw = rows.get(keys.conv_key(conversation_id.encode("utf-8")))
    return ConversationRow.decode(raw) if raw is not None else None


def precheck(rows: Rows, row: ConversationRow | None, event: BatchAppended | TurnReplaced, batch: Batch, *,
             in_log_order: bool) -> Decision | None:
    """Admission's rules for a batch or a replacement (closed, duplicate, conflict, precondition,
    replaceable), the one home of each, without effects: the refusal or duplicate ``Decision``,
    or None.

    ``row`` is the conversation's row as read from ``rows`` (``conversation_row``). With
    ``in_log_order=True`` (the projector) ``rows`` is the state just before this record in log
    order, so every rule decides and None means *accept*. With ``in_log_order=False`` (a writer's
    fast path) ``rows`` is some earlier prefix of the log: a rule answers only when no later
    record can change its answer (a closure and a receipt are permanent; an append that is
    known and not the last can never be the last again; turns only move forward), and None means
    *undecided: the event must go through the log*.
    """
    if row is not None and row.closed:
        return Decision(Outcome.REJECTED_CLOSED)
    conv = batch.conversation_id.encode("utf-8")
    raw_receipt = rows.get(keys.receipt_key(conv, batch.append_id.encode("utf-8"))) if row is not None else None
    if raw_receipt is not None:
        prior = ReceiptRow.decode(raw_receipt)
        if prior.digest == batch.digest:  # the content's digest: a sealed event's is in memory only
            return Decision(Outcome.DUPLICATE, prior.digest, LogPosition(prior.partition, prior.offset))
        return Decision(Outcome.CONFLICT, prior.digest)
    refused = fence_refusal(rows, conv, event.fence, in_log_order=in_log_order)
    if refused is not None:
        return refused
    if isinstance(event, BatchAppended) and event.turn_id is not None and event.turn_position is not None:
        why = slots.refusal(rows, conv, row, event.turn_id, event.turn_position, batch, in_log_order=in_log_order)
        if why:
            return Decision(Outcome.SLOT_UNAVAILABLE, reason=why)
    if isinstance(event, TurnReplaced):
        reason = _not_replaceable(rows, conv, row, event, batch, in_log_order)
        return Decision(Outcome.NOT_REPLACEABLE, reason=reason) if reason else None
    expected = event.expected_last
    last = row.last_append if row is not None else ""
    if expected is None or expected == last:
        return None
    if not in_log_order and (row is None or (expected and not _known(rows, conv, expected))):
        return None  # the expected append may still become the last one
    wanted = repr(str(expected)) if expected else "no append yet"  # str: the decoded id is an AppendID
    found = repr(str(last)) if last else "none"
    return Decision(Outcome.PRECONDITION_FAILED, reason=f"expected last append {wanted}, found {found}")


def fence_refusal(rows: Rows, conv: bytes, fence: int | None, *, in_log_order: bool) -> Decision | None:
    """The **fenced** decision of a write with ``fence`` (``runs.fenced``), or None (no fence, or
    not refused: out of log order, not refused *yet*)."""
    if fence is None:
        return None
    latest, refused = runs.fenced(rows, conv, fence, in_log_order=in_log_order)
    if not refused:
        return None
    why = (f"fence {fence} is older than the conversation's latest run (epoch {latest})"
           if fence < latest else f"no run of epoch {fence} has begun (the latest is {latest})")
    return Decision(Outcome.FENCED, reason=why, epoch=latest)


def _known(rows: Rows, conv: bytes, append_id: str) -> bool:
    return rows.get(keys.receipt_key(conv, append_id.encode("utf-8"))) is not None


def _not_replaceable(rows: Rows, conv: bytes, row: ConversationRow | None, event: TurnReplaced, batch: Batch,
                     in_log_order: bool) -> str:
    """Why ``event`` may not replace its turn ("" when it may, or, out of log order, when that is
    not decided yet)."""
    latest = full.latest_turn(rows, conv, row) if row is not None else None
    if latest is None:
        if not in_log_order:
            return ""
        return f"turn {event.old_turn_id!r} is not the latest visible turn (the conversation has no turn)"
    latest_id, first_ord = latest
    if latest_id != event.old_turn_id:
        old_append = MessageID.parse(event.old_turn_id).append_id  # valid: checked with the event
        if not in_log_order and not _known(rows, conv, old_append):
            return ""  # an unknown turn may still become the latest one
        return f"turn {event.old_turn_id!r} is not the latest visible turn ({latest_id!r} is)"
    if in_log_order and event.reason == "retry":
        source = rows.get(keys.source_key(conv, first_ord))
        assert source is not None  # Invariant: visible messages have their N row.
        if SourceRow.decode(source)[6] != batch.messages[0].content_json():
            return "a retry keeps the user message; its content differs from the old turn's (use reason 'edit')"
    return ""
