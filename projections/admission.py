"""Admission: the dedup projector (DESIGN.md §4), a pure function of the log prefix.

Applied to each record in log order, per partition, deterministically, so every instance that
consumes the same log reaches the same decisions:

* undecodable value, unknown schema, a key that does not match the event, invalid ids, a digest
  that does not match the stored bytes, bytes that are not the canonical JSON of valid messages
  → **corrupt** (a poison record: counted, quarantined with its position, skipped);
* ``BatchAppended(c, a, d)``: ``c`` closed → **rejected_closed**; a receipt for ``(c, a)``
  exists → same digest: **duplicate** (the original receipt), other digest: **conflict**;
  else **accepted** (receipt evidence stored, message sequence numbers assigned by the full
  projection in the same step);
* ``ConversationCleared(c)``: ``c`` becomes closed forever (**cleared**; a repeated clear is a
  no-op **duplicate**); its receipts and rows are dropped, the closure stays.

The digest is checked before anything else, so a damaged record is poison whatever state it
meets. Messages are parsed only for records that are about to be accepted.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import UTC, datetime

from projections import full, keys
from projections.events import BatchEvent, ClearEvent, ProjectedEvent
from projections.store import Tx
from schemas.batch import Batch, Receipt
from schemas.canonical import digest_of
from schemas.errors import CorruptLog, HistoryError
from schemas.events import BatchAppended, ConversationCleared, decode_event
from schemas.ids import AppendID, ConversationID
from schemas.positions import LogPosition

__all__ = ["Decision", "Outcome", "admit"]

_SEP = b"\x1f"


class Outcome(enum.StrEnum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    CONFLICT = "conflict"
    REJECTED_CLOSED = "rejected_closed"
    CORRUPT = "corrupt"
    CLEARED = "cleared"


@dataclass(frozen=True, slots=True)
class Decision:
    """What admission decided for one log position.

    ``receipt_position`` is where the accepted event of that append id is: this record's own
    position when accepted, the original one for a duplicate. ``digest`` is the accepted
    digest (for a conflict: the one the append id already names).
    """

    outcome: Outcome
    digest: str = ""
    receipt_position: LogPosition | None = None
    reason: str = ""  # corrupt: why

    def receipt(self, conversation_id: ConversationID, append_id: AppendID) -> Receipt:
        """The receipt this decision proves (accepted or duplicate decisions only)."""
        assert self.receipt_position is not None  # Invariant: only accepted/duplicate carry one.
        return Receipt(conversation_id, append_id, self.digest, self.receipt_position)


def _corrupt(reason: str) -> tuple[Decision, None]:
    return Decision(Outcome.CORRUPT, reason=reason), None


Known = dict[tuple[bytes, str], Batch]
"""Batches this process is appending, by (record key, digest): already validated, so the
projector need not parse their bytes again. Records from elsewhere are always parsed."""


def admit(tx: Tx, stats: keys.Stats, position: LogPosition, key: bytes, value: bytes, *,
          known: Known | None = None, want_event: bool = False) -> tuple[Decision, ProjectedEvent | None]:
    """Decide one record and apply its effects to ``tx``; returns the decision and, when the
    record was accepted (or first closed a conversation) and ``want_event``, the event for
    custom projections."""
    decision, event = _admit(tx, position, key, value, known, want_event)
    outcome = decision.outcome
    if outcome is Outcome.ACCEPTED:
        stats.accepted += 1
    elif outcome is Outcome.DUPLICATE:
        stats.duplicates += 1
    elif outcome is Outcome.CONFLICT:
        stats.conflicts += 1
    elif outcome is Outcome.REJECTED_CLOSED:
        stats.rejected_closed += 1
    elif outcome is Outcome.CORRUPT:
        stats.corrupt += 1
        tx.put(keys.poison_key(position.partition, position.offset), decision.reason.encode("utf-8"))
    return decision, event


def _admit(tx: Tx, position: LogPosition, key: bytes, value: bytes, known: Known | None,
           want_event: bool) -> tuple[Decision, ProjectedEvent | None]:
    try:
        event = decode_event(value)
    except CorruptLog as e:
        return _corrupt(e.reason or str(e))
    try:
        conversation_id = ConversationID(event.conversation_id)
        append_id = AppendID(event.append_id) if isinstance(event, BatchAppended) else None
    except HistoryError as e:
        return _corrupt(f"invalid id: {e}")
    conv = conversation_id.encode("utf-8")
    expected_key = conv + _SEP + (append_id.encode("utf-8") if append_id is not None else b"")
    if key != expected_key:
        return _corrupt("record key does not match the event")
    raw_row = tx.get(keys.conv_key(conv))
    row = keys.ConversationRow.decode(raw_row) if raw_row is not None else None

    if isinstance(event, ConversationCleared):
        if row is not None and row.closed:
            return Decision(Outcome.DUPLICATE), None
        full.clear(tx, conv)
        tx.put(keys.conv_key(conv), keys.ConversationRow(closed=True).encode())
        if not want_event:
            return Decision(Outcome.CLEARED), None
        return Decision(Outcome.CLEARED), ClearEvent(conversation_id, position, _time(event.created_at_ms))

    assert append_id is not None  # Invariant: only BatchAppended reaches here.
    if digest_of(event.messages) != event.digest:
        return _corrupt("digest mismatch")
    if row is not None and row.closed:
        return Decision(Outcome.REJECTED_CLOSED), None
    rkey = keys.receipt_key(conv, append_id.encode("utf-8"))
    raw_receipt = tx.get(rkey)
    if raw_receipt is not None:
        prior = keys.ReceiptRow.decode(raw_receipt)
        if prior.digest == event.digest:
            return Decision(Outcome.DUPLICATE, prior.digest, LogPosition(prior.partition, prior.offset)), None
        return Decision(Outcome.CONFLICT, prior.digest), None
    batch = known.get((key, event.digest)) if known else None
    if batch is None or batch.canonical_json() != event.messages:
        try:
            batch = Batch.from_canonical(conversation_id, append_id, event.messages)
        except HistoryError as e:
            return _corrupt(f"messages are not canonical valid messages: {e}")
    if len(batch) != event.message_count or batch.content_bytes() != event.content_bytes:
        return _corrupt("message_count or content_bytes does not match the messages")
    row = row or keys.ConversationRow()
    first_seq = full.append(tx, conv, row, batch, event.created_at_ms)
    row.last = (position.partition, position.offset)
    tx.put(keys.conv_key(conv), row.encode())
    tx.put(rkey, keys.ReceiptRow(event.digest, position.partition, position.offset, first_seq,
                                 len(batch)).encode())
    decision = Decision(Outcome.ACCEPTED, event.digest, position)
    if not want_event:
        return decision, None
    return decision, BatchEvent(conversation_id, append_id, batch.messages, event.digest, position,
                                _time(event.created_at_ms), first_seq)


def _time(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)
