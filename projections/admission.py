"""Admission: the dedup projector (docs/design.md §4), a pure function of the log prefix.

Applied to each record in log order, per partition, deterministically, so every instance that
consumes the same log reaches the same decisions:

* a value that is not a valid event (``decode_event`` in ``schemas/events.py`` and ``event_batch``
  in ``schemas/event_content.py`` are the one home of that rule: undecodable, unknown schema, any
  field out of its range, a digest that does not match the stored bytes, bytes that are not the
  canonical JSON of valid messages...) or a key that does not match the event → **corrupt** (a
  poison record: counted, quarantined with its position, skipped);
* ``BatchAppended(c, a, d)``: ``c`` closed → **rejected_closed**; a receipt for ``(c, a)``
  exists → same digest: **duplicate** (the original receipt), other digest: **conflict**;
  else **accepted** (receipt evidence stored, message sequence numbers assigned by the full
  projection in the same step; its messages' ``created_at`` is the later of the record's time
  and the conversation's previous message's, so it never decreases, on every instance alike);
  with a precondition ``expected_last`` that does not name the conversation's last accepted
  append (``""``: that there is none) → **precondition_failed** (an identical retry of an
  accepted batch is a duplicate first, whatever its precondition);
* ``TurnReplaced(c, a, d, old_turn_id, reason)``: closed, duplicate and conflict as above;
  ``old_turn_id`` not the latest visible turn, or a ``retry`` whose user message content
  differs from the old turn's → **not_replaceable**; else **accepted**: the old turn is hidden
  (``full.hide_latest_turn``) and the replacement appended as the next turn, in one step;
* ``ConversationCleared(c)``: ``c`` becomes closed forever (**cleared**; a repeated clear is a
  no-op **duplicate**); its receipts and rows are dropped, the closure stays;
* ``RunBegun(c, run)``: closed → **rejected_closed**; a run already begun → **duplicate** with
  its epoch; else **begun**: the conversation's next epoch (``projections.runs``);
* a batch or replacement with a ``fence`` (after the closed, duplicate and conflict rules)
  that is not the conversation's latest epoch → **fenced**; an accepted one with a ``run_id``
  records what the run wrote;
* ``TurnAllocated(c, slot)``: closed → **rejected_closed**; a slot already allocated →
  **duplicate** with its position; else **allocated**: the conversation's next turn position
  (``projections.slots``); a batch filed under a slot that cannot take it (used, unknown, another
  position, behind a later turn, no turn opened) → **slot_unavailable** (after the fence rule);
* ``AssetsLinked(c, message, refs)``: closed → **rejected_closed**; the message not visible →
  **unknown_message**; another ref at a linked ordinal → **conflict**; every ref linked already →
  **duplicate**; else **linked** (``projections.assets``);
* ``MessagesDeleted(c, delete, ids)``: closed → **rejected_closed**; a ``fence`` that is not the
  conversation's latest epoch → **fenced**; else **deleted**: every named message still stored
  leaves every read and the state (``projections.deletes``); ``count`` says how many were visible.

The batch and replacement rules (closed, duplicate, conflict, precondition, replaceable) are
written once, in ``precheck`` (``projections.prechecks``; the decisions' vocabulary is
``projections.decisions``): the projector applies them in log order, and a writer's fast path
applies them to its local state, where they answer only what no later record can change.

Whether a record is poison is decided from its key and value alone, before any state is read,
so a damaged record is poison whatever state it meets, on every instance, with or without custom
projections: a record that is not poison always fits the state's rows (``keys``). Messages are
decoded, opened and parsed for every record except the bytes this process wrote itself (``Known``).
"""

from __future__ import annotations

from dataclasses import dataclass

from projections import assets, checkpoints, deletes, full, keys, runs, slots
from projections.decisions import Decision, Outcome
from projections.erasure import DataKeys, open_content
from projections.events import BatchEvent, ClearEvent, ProjectedEvent, TurnReplacedEvent
from projections.events import MessagesDeleted as DeletedEvent
from projections.full import Rows
from projections.prechecks import conversation_row, fence_refusal, precheck
from projections.rows import ConversationRow, ReceiptRow, Stats
from projections.store import Tx
from schemas.assets import AssetRef
from schemas.batch import Batch
from schemas.checkpoints import PruneContent, PutContent, WritesContent
from schemas.errors import CorruptLog, KeyErased
from schemas.event_content import event_batch
from schemas.event_rules import InvalidField, checkpointed_content, linked_refs
from schemas.events import (
    AssetsLinked,
    BatchAppended,
    Checkpointed,
    ConversationCleared,
    MessagesDeleted,
    RunBegun,
    TurnAllocated,
    TurnReplaced,
    decode_event,
)
from schemas.ids import ConversationID
from schemas.positions import LogPosition
from schemas.records import record_key_bytes
from schemas.sealed import DataKey
from schemas.times import time_of

__all__ = ["Decision", "Known", "Outcome", "Own", "Rows", "admit", "conversation_row", "fence_refusal", "precheck"]


def _corrupt(reason: str) -> tuple[Decision, None]:
    return Decision(Outcome.CORRUPT, reason=reason), None


@dataclass(frozen=True, slots=True)
class Own:
    """A record this process is producing, as it built it: ``event`` the event it encoded (sealed
    under ``key``, or plain with ``key`` None) and ``batch`` the validated batch it carries."""

    event: BatchAppended | TurnReplaced
    batch: Batch
    key: DataKey | None


Known = dict[tuple[bytes, bytes], Own]
"""The records this process is producing, by (record key, value bytes). A record whose bytes are
exactly these is the event this process encoded, so admission takes its decoded, opened and
validated forms from here instead of decoding, opening and parsing the bytes again: the same
verdict (``decode_event``, ``open_event`` and ``event_batch`` are pure functions of the bytes and
the key, and give back exactly the valid event they were built from), except for what does not
depend on the bytes alone, which is still checked: the key store's key for it (a destroyed
one is ``KeyErased``, a different one takes the full path), the record key, the state. Records
from elsewhere, and any byte changed, take the full path."""


_COUNTERS = {
    Outcome.ACCEPTED: "accepted",
    Outcome.DUPLICATE: "duplicates",
    Outcome.CONFLICT: "conflicts",
    Outcome.REJECTED_CLOSED: "rejected_closed",
    Outcome.PRECONDITION_FAILED: "precondition_failed",
    Outcome.NOT_REPLACEABLE: "not_replaceable",
    Outcome.CORRUPT: "corrupt",
    Outcome.ERASED: "erased",
    Outcome.CLEARED: "cleared",
    Outcome.FENCED: "fenced",
}
"""The ``rows.Stats`` counter of each outcome (a repeated clear, a duplicate, counts nowhere)."""


def admit(tx: Tx, stats: Stats, position: LogPosition, key: bytes, value: bytes, *,
          known: Known | None = None, want_event: bool = False,
          keys_: DataKeys | None = None) -> tuple[Decision, ProjectedEvent | None]:
    """Decide one record and apply its effects to ``tx``; returns the decision and, when the
    record was accepted (or first closed a conversation) and ``want_event``, the event for
    custom projections. ``keys_`` opens sealed content (``projections.erasure``); without it a
    sealed record raises ``KeyStoreDamaged`` (it is never skipped as poison)."""
    decision, event = _admit(tx, stats, position, key, value, known, want_event, keys_)
    counter = _COUNTERS.get(decision.outcome)
    if counter is not None:
        setattr(stats, counter, getattr(stats, counter) + 1)
    if decision.outcome is Outcome.CORRUPT:
        tx.put(keys.poison_key(position.partition, position.offset), decision.reason.encode("utf-8"))
    return decision, event


def _admit(tx: Tx, stats: Stats, position: LogPosition, key: bytes, value: bytes, known: Known | None,
           want_event: bool, keys_: DataKeys | None) -> tuple[Decision, ProjectedEvent | None]:
    opened = ""  # the key id of the sealed content opened, once it opened
    content: bytes | None = None  # that content
    try:
        own = known.get((key, value)) if known else None  # this process's bytes: decoded and checked
        event = decode_event(value) if own is None else own.event  # only valid events: ids, ranges, times
        if isinstance(event, ConversationCleared):
            batch = None
            append_id = b""
        elif isinstance(event, RunBegun):
            batch = None
            append_id = event.run_id.encode("utf-8")
        elif isinstance(event, TurnAllocated):
            batch = None
            append_id = event.slot_id.encode("utf-8")
        elif isinstance(event, MessagesDeleted):
            batch = None
            append_id = event.delete_id.encode("utf-8")
        elif isinstance(event, Checkpointed):
            batch = None
            append_id = event.record_id.encode("utf-8")
            if event.sealed is not None:
                content = open_content(event, keys_)  # DecryptionFailed or KeyErased
                opened = event.sealed.key_id
            change = content_of(event.kind, event.content if content is None else content)
        elif isinstance(event, AssetsLinked):
            batch = None
            append_id = event.message_id.encode("utf-8")
            if event.sealed is not None:
                content = open_content(event, keys_)  # DecryptionFailed or KeyErased
                opened = event.sealed.key_id
            refs = linked_refs_of(event.assets if content is None else content)
        else:
            if event.sealed is not None:  # the key store still decides: KeyErased, or another key
                key_id = event.sealed.key_id
                own = own if own is not None and _same_key(keys_, event, own.key) else None
                content = open_content(event, keys_) if own is None else None  # DecryptionFailed or KeyErased
                opened = key_id
            # The event stays sealed: its content's digest is the batch's (computed once, in memory).
            batch = event_batch(event, content=content) if own is None else own.batch
            append_id = event.append_id.encode("utf-8")
    except CorruptLog as e:
        if opened:  # opened, then refused by event_batch: its key was used all the same
            # Invariant: only these open.
            assert isinstance(event, BatchAppended | TurnReplaced | AssetsLinked | Checkpointed)
            conv = event.conversation_id.encode("utf-8")
            if key == record_key_bytes(conv, _bound_id(event)):
                _note_key(tx, conv, opened, None)  # rare: written without reading the row
        return _corrupt(e.reason or str(e))
    except KeyErased:
        # Its conversation was cleared (every key of it is destroyed only after the clear is in the
        # log): the content is gone on purpose and the record has no effect; a writer still
        # waiting for it is told the conversation is closed.
        # Invariant: only sealed content.
        assert isinstance(event, BatchAppended | TurnReplaced | AssetsLinked | Checkpointed)
        assert event.sealed is not None and keys_ is not None  # Invariant: open_content raised it.
        if key != record_key_bytes(event.conversation_id.encode("utf-8"), _bound_id(event)):
            return _corrupt("record key does not match the event")
        # A key a writer bound to the conversation before the clear and sealed with after it is
        # in no K row the clear read: destroyed here (a no-op for a key already gone).
        keys_.destroy(event.conversation_id, [event.sealed.key_id])
        row = conversation_row(tx, event.conversation_id)
        return Decision(Outcome.REJECTED_CLOSED if row is not None and row.closed else Outcome.ERASED), None
    conversation_id = ConversationID(event.conversation_id)  # already one: returned as is
    conv = conversation_id.encode("utf-8")
    if key != record_key_bytes(conv, append_id):
        return _corrupt("record key does not match the event")
    row = conversation_row(tx, conversation_id)
    if opened:  # whatever is decided below: accepted, a duplicate or any refusal
        _note_key(tx, conv, opened, row)

    if isinstance(event, ConversationCleared):
        if row is not None and row.closed:
            return Decision(Outcome.DUPLICATE), None
        had_runs = runs.latest_epoch(tx, conv) > 0  # read before the clear drops the F rows
        checkpoints.clear_runs(tx, conv, position.partition)  # read before the clear drops the Y rows
        full.clear(tx, conv)  # leaves the K rows: projections.erasure.destroy_keys reads them
        tx.delete(keys.open_key(conv))
        tx.put(keys.conv_key(conv), ConversationRow(closed=True).encode())
        # Always pending until projections.erasure.finish: its keys (K rows, even of records all
        # refused) to destroy, and, if it had rows (a run's, before any message, too), its files
        # to compact.
        had_rows = row is not None or had_runs
        tx.put(keys.erasing_key(conv), keys.ERASE_COMPACT if had_rows else keys.ERASE_KEYS_ONLY)
        if not want_event:
            return Decision(Outcome.CLEARED), None
        return Decision(Outcome.CLEARED), ClearEvent(conversation_id, position, time_of(event.created_at_ms))

    if isinstance(event, RunBegun):
        if row is not None and row.closed:
            return Decision(Outcome.REJECTED_CLOSED), None
        epoch, new = runs.begin(tx, conv, event.run_id)
        return Decision(Outcome.BEGUN if new else Outcome.DUPLICATE, epoch=epoch), None

    if isinstance(event, AssetsLinked):
        if row is not None and row.closed:
            return Decision(Outcome.REJECTED_CLOSED), None
        outcome, why = assets.link(tx, conv, row, event.message_id, refs)
        return Decision(_LINK_OUTCOMES[outcome], reason=why), None

    if isinstance(event, MessagesDeleted):
        return _delete(tx, stats, position, conv, row, event, want_event)

    if isinstance(event, Checkpointed):
        if row is not None and row.closed:
            return Decision(Outcome.REJECTED_CLOSED), None
        if row is None or (opened and row.last_key != opened):  # a thread's first record makes its row
            row = ConversationRow() if row is None else row
            row.last_key = opened or row.last_key  # its K row was just noted
            tx.put(keys.conv_key(conv), row.encode())
        checkpoints.apply(tx, conv, position.partition, change)
        return Decision(Outcome.CHECKPOINTED), None

    if isinstance(event, TurnAllocated):
        if row is not None and row.closed:
            return Decision(Outcome.REJECTED_CLOSED), None
        if row is None:  # a slot is no message: the conversation is listed from its first append on
            row = ConversationRow()
        turn_position, new = slots.allocate(tx, conv, row, event.slot_id)
        if new:
            tx.put(keys.conv_key(conv), row.encode())
        return Decision(Outcome.ALLOCATED if new else Outcome.DUPLICATE, position=turn_position), None

    assert batch is not None  # Invariant: only BatchAppended and TurnReplaced reach here.
    refused = precheck(tx, row, event, batch, in_log_order=True)
    if refused is not None:
        return refused, None
    if row is None or row.next_seq == 1:  # the conversation's first accepted append: it is open from now on
        row = ConversationRow() if row is None else row  # (a row without messages: a turn slot's)
        tx.put(keys.open_key(conv), b"")
    hidden = range(0)
    created_ms = max(row.last_ms, event.created_at_ms)  # never earlier than the message before it
    run_id = event.run_id
    before = ConversationRow.decode(row.encode()) if run_id is not None else row  # what the batch follows
    if isinstance(event, TurnReplaced):
        latest = full.latest_turn(tx, conv, row)
        assert latest is not None  # Invariant: precheck refuses a replacement without a latest turn.
        first_seq, first_ord, hidden, turns = full.replace_latest_turn(tx, conv, row, latest[1], batch,
                                                                       event.reason, created_ms)
    else:
        slot = None if event.turn_id is None or event.turn_position is None else (event.turn_id, event.turn_position)
        first_seq, first_ord, turns = full.append(tx, conv, row, batch, created_ms, slot)
        if slot is not None:
            slots.mark_used(tx, conv, *slot)
    if run_id is not None:
        runs.note_writes(tx, conv, run_id, before, batch, first_seq, turns,
                         opens_new_turn=isinstance(event, TurnReplaced),
                         slot=None if isinstance(event, TurnReplaced) else event.turn_id)
    row.last_append = batch.append_id
    if opened:
        row.last_key = opened  # its K row was just noted
    tx.put(keys.conv_key(conv), row.encode())
    tx.put(keys.receipt_key(conv, append_id), ReceiptRow.pack(batch.digest, position.partition, position.offset,
                                                                   first_seq, len(batch), first_ord))
    decision = Decision(Outcome.ACCEPTED, batch.digest, position)
    if not want_event:
        return decision, None
    created = time_of(created_ms)
    positions = full.positions(first_seq, turns)
    if isinstance(event, TurnReplaced):
        return decision, TurnReplacedEvent(conversation_id, event.old_turn_id, event.reason, batch.append_id,
                                           batch.messages, batch.digest, position, created, first_seq, hidden,
                                           positions)
    return decision, BatchEvent(conversation_id, batch.append_id, batch.messages, batch.digest, position, created,
                                first_seq, positions)


def _delete(tx: Tx, stats: Stats, position: LogPosition, conv: bytes, row: ConversationRow | None,
            event: MessagesDeleted, want_event: bool) -> tuple[Decision, ProjectedEvent | None]:
    """A ``MessagesDeleted``: its fence, then ``projections.deletes.apply``."""
    if row is not None and row.closed:
        return Decision(Outcome.REJECTED_CLOSED), None
    refused = fence_refusal(tx, conv, event.fence, in_log_order=True)
    if refused is not None:
        return refused, None
    if row is None:
        return Decision(Outcome.DELETED), None
    visible, removed = deletes.apply(tx, conv, row, event.message_ids)
    if not removed:
        return Decision(Outcome.DELETED), None
    tx.put(keys.conv_key(conv), row.encode())
    stats.deleted += len(removed)
    decision = Decision(Outcome.DELETED, count=visible, removed=len(removed))
    if not want_event:
        return decision, None
    return decision, DeletedEvent(ConversationID(event.conversation_id), tuple(removed), position,
                                  time_of(event.created_at_ms))


_LINK_OUTCOMES = {"linked": Outcome.LINKED, "duplicate": Outcome.DUPLICATE, "conflict": Outcome.CONFLICT,
                  "unknown_message": Outcome.UNKNOWN_MESSAGE}


def _bound_id(event: BatchAppended | TurnReplaced | AssetsLinked | Checkpointed) -> bytes:
    """The second part of the record key of a sealed event (an append id, a link's message id, a
    checkpoint change's record id)."""
    if isinstance(event, Checkpointed):
        return event.record_id.encode("utf-8")
    return (event.message_id if isinstance(event, AssetsLinked) else event.append_id).encode("utf-8")


def content_of(kind: str, data: bytes) -> PutContent | WritesContent | PruneContent:
    """``schemas.event_rules.checkpointed_content`` as a ``CorruptLog`` (poison) when it is not valid."""
    try:
        return checkpointed_content(kind, data)
    except InvalidField as e:
        raise CorruptLog(f"undecodable event value (invalid {e})", reason=f"invalid {e}"[:300]) from None


def linked_refs_of(data: bytes) -> tuple[AssetRef, ...]:
    """``schemas.event_rules.linked_refs`` as a ``CorruptLog`` (poison) when the refs are not valid."""
    try:
        return linked_refs(data)
    except InvalidField as e:
        raise CorruptLog(f"undecodable event value (invalid {e})", reason=f"invalid {e}"[:300]) from None


def _note_key(tx: Tx, conv: bytes, key_id: str, row: ConversationRow | None) -> None:
    """Record (a ``K`` row) that a record of ``conv`` was sealed under ``key_id``: what its
    ``clear`` destroys. Nothing to write when it is the key of the conversation's last accepted
    record (``row.last_key``: its K row exists); else the row is written without reading it
    first (writing an existing empty row again changes nothing). The caller checked the record's
    key matches its event (a record keyed otherwise is poison, maybe in another partition than
    its conversation, and no writer's)."""
    if row is None or row.last_key != key_id:
        tx.put(keys.key_id_key(conv, key_id), b"")


def _same_key(keys_: DataKeys | None, event: BatchAppended | TurnReplaced, key: DataKey | None) -> bool:
    """Whether the key store gives ``key`` for the sealed ``event`` (``KeyErased`` once destroyed)."""
    assert event.sealed is not None  # Invariant: asked of sealed events only.
    return keys_ is not None and key is not None and keys_.get(event.conversation_id, event.sealed.key_id) == key
