"""Message deletes (API.md "Runs, slots, assets, deletes": ``delete_messages``): admission's
``MessagesDeleted`` rule and the one home of how a deleted message leaves the state.

The visible keyspaces are keyed by ordinal without holes (``keys``), so a delete does not leave a
gap: every visible row from the first ordinal of the batch that held the earliest deleted
message to the end of the history is rewritten one place lower per deleted message before it
(``M``, ``N``, ``S``, ``X``, the ``T`` rows of the turns that start there, the ``W`` and ``A``
rows of its batches, the ``first_ord`` of their receipts): **O(tail)** for the delete, and every
read still visits only what it returns. Hidden messages (of replaced turns) leave ``H`` by one
scan of the conversation's hidden rows. A deleted message's assets (``G``) go with it.

What stays: the receipts (a resent append of a deleted message is still a duplicate: a message is
never resurrected), the seqs and turn positions (cursors stay valid; a turn whose messages are
all deleted disappears, and a message appended after it still sorts after every earlier one),
and the turn ids (a turn whose first message was deleted keeps its id in its ``T`` row, as a
slotted turn does). Each batch with deleted messages has a ``D`` row listing their indexes, so a
message id still finds its ordinal in two point reads (``ordinal_of``): its receipt's first
ordinal plus its index, less the deleted indexes before it. ``ConversationRow.deleted`` counts
them; while it is 0 no ``D`` row exists and no read looks for one.

The log keeps the records that carried the deleted messages, sealed under the conversation's
data keys, until the conversation is cleared (its keys destroyed): a delete removes them from
every read and from the state, and a rebuild from the log applies the same delete again.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from projections import feature_keys, keys
from projections.full import Rows, external_of_row, turn_id
from projections.rows import AggregateRow, ConversationRow, MessageRow, ReceiptRow
from projections.store import Tx
from schemas.ids import MessageID

__all__ = ["apply", "deleted_before", "ordinal_of"]

_SYSTEM = keys.ROLE_CODES["system"]


def deleted_before(rows: Rows, conv: bytes, append_id: bytes) -> tuple[int, ...]:
    """The deleted indexes of the batch of ``append_id``, ascending (its ``D`` row; () without one)."""
    raw = rows.get(feature_keys.deleted_key(conv, append_id))
    return feature_keys.read_deleted_value(raw) if raw is not None else ()


def ordinal_of(rows: Rows, conv: bytes, row: ConversationRow, append_id: bytes, receipt: ReceiptRow,
               index: int) -> int | None:
    """The ordinal message ``index`` of the batch of ``append_id`` has while it is visible (the
    caller checks the row there is its own: a replaced turn's messages are hidden), or None when
    it was deleted. One point read (the ``D`` row) only in a conversation that had deletes."""
    if not row.deleted:
        return receipt.first_ord + index
    gone = deleted_before(rows, conv, append_id)
    if index in gone:
        return None
    return receipt.first_ord + index - bisect_left(gone, index)


def apply(tx: Tx, conv: bytes, row: ConversationRow, message_ids: Sequence[str]) -> tuple[int, list[str]]:
    """Delete the named messages that are still stored (``MessagesDeleted``, in log order), in
    ``tx``; update ``row``. Returns how many were visible and the ids removed (visible and
    hidden, in the order named). Unknown and already deleted ids change nothing."""
    receipts: dict[str, ReceiptRow | None] = {}
    visible: dict[int, MessageID] = {}  # ordinal -> id
    hidden: dict[int, MessageID] = {}  # seq -> id
    for text in dict.fromkeys(message_ids):
        wanted = MessageID.parse(text)  # valid: the event's rule
        append_id = wanted.append_id
        if append_id not in receipts:
            raw = tx.get(keys.receipt_key(conv, append_id.encode("utf-8")))
            receipts[append_id] = ReceiptRow.decode(raw) if raw is not None else None
        receipt = receipts[append_id]
        if receipt is None or wanted.index >= receipt.count:
            continue
        ord_ = ordinal_of(tx, conv, row, append_id.encode("utf-8"), receipt, wanted.index)
        if ord_ is None:
            continue  # deleted already
        seq = receipt.first_seq + wanted.index
        value = tx.get(keys.message_key(conv, ord_)) if ord_ < row.messages else None
        if value is not None and MessageRow.decode(value).seq == seq:
            visible[ord_] = wanted
        else:
            hidden[seq] = wanted
    removed = _drop_hidden(tx, conv, hidden) if hidden else []
    if visible:
        first = visible[min(visible)]
        start = receipts[first.append_id]
        assert start is not None  # Invariant: a visible message has its receipt.
        _rewrite_tail(tx, conv, row, start.first_ord, visible)
    ids = [*visible.values(), *removed]
    _note_deleted(tx, conv, ids)
    row.deleted += len(ids)
    named = {(m.append_id, m.index) for m in ids}
    return len(visible), [str(m) for m in map(MessageID.parse, dict.fromkeys(message_ids))
                          if (m.append_id, m.index) in named]


def _drop_hidden(tx: Tx, conv: bytes, hidden: dict[int, MessageID]) -> list[MessageID]:
    """Delete the hidden rows of the seqs in ``hidden`` (one scan of the conversation's ``H`` rows)."""
    removed = []
    for key, _ in tx.scan(*keys.conv_range(keys.HIDDEN, conv)):
        seq = keys.read_hidden_seq(key)
        if seq in hidden:
            tx.delete(key)
            tx.delete(feature_keys.assets_key(conv, seq))
            removed.append(hidden[seq])
    return removed


def _note_deleted(tx: Tx, conv: bytes, ids: list[MessageID]) -> None:
    """Add ``ids`` to their batches' ``D`` rows."""
    by_append: dict[str, list[int]] = {}
    for m in ids:
        by_append.setdefault(m.append_id, []).append(m.index)
    for append_id, indexes in by_append.items():
        a = append_id.encode("utf-8")
        merged = sorted({*deleted_before(tx, conv, a), *indexes})
        tx.put(feature_keys.deleted_key(conv, a), feature_keys.deleted_value(merged))


def _rewrite_tail(tx: Tx, conv: bytes, row: ConversationRow, start: int, visible: dict[int, MessageID]) -> None:
    """Remove the visible messages at the ordinals of ``visible`` and move every later one down
    over them, from ``start`` (the first ordinal of the batch holding the earliest of them) to
    the end; ``row``'s counts follow."""
    old_count = row.messages
    region = tx.scan(keys.message_key(conv, start), keys.message_key(conv, old_count))
    sums = tx.get(keys.aggregate_key(conv, start))
    assert sums is not None  # Invariant: ``start`` is a visible batch's first ordinal: its A row.
    content_total, turns_before = AggregateRow.at(sums, 0)
    last_turn: int | None = None
    if start > 0:
        before = tx.get(keys.message_key(conv, start - 1))
        assert before is not None  # Invariant: ordinals below the count are all visible rows.
        last_turn = MessageRow.decode_head(before)[0]
    first_turn = MessageRow.decode_head(region[0][1])[0]
    distinct = turns_before + (1 if last_turn == first_turn else 0)  # turn positions in [0, start)
    old_turn, old_append = last_turn, ""  # what the old layout had just before each row
    turn_ids: dict[int, bytes] = {}  # turn -> the id its T row keeps (b"": its first message's)
    new_turn, new_append = last_turn, ""
    batch: list[int] = []
    batch_first = start
    at = start
    for i, (_, value) in enumerate(region):
        old = start + i
        head = MessageRow.decode(value)
        gone = old in visible
        if head.append_id != old_append:  # a batch starts here in the old layout
            tx.delete(keys.aggregate_key(conv, old))
            tx.delete(keys.time_key(conv, head.created_at_ms, old))
        if head.turn != old_turn:  # so does a turn
            raw = tx.get(keys.turn_key(conv, head.turn))
            assert raw is not None  # Invariant: a visible message's turn is indexed.
            slotted = keys.read_turn_id(raw)
            own = slotted.encode("utf-8") if slotted is not None else b""
            if gone and not own:
                own = turn_id(head.append_id, head.index).encode("utf-8")
            turn_ids[head.turn] = own
            tx.delete(keys.turn_key(conv, head.turn))
        old_turn, old_append = head.turn, head.append_id
        external = external_of_row(head.canonical)
        if external is not None:
            tx.delete(keys.external_key(conv, external, old))
        if head.role == _SYSTEM:
            tx.delete(keys.system_key(conv, old))
        if gone:
            tx.delete(feature_keys.assets_key(conv, head.seq))
            continue
        if head.turn != new_turn:  # the first visible message of its turn now
            distinct += 1
            # Invariant: a turn begun before ``start`` (its T row stays) continues ``new_turn``.
            tx.put(keys.turn_key(conv, head.turn), keys.turn_value(head.seq, at, turn_ids[head.turn]))
        if head.append_id != new_append:  # the first visible message of its batch now
            if batch:
                tx.put(keys.aggregate_key(conv, batch_first), AggregateRow.pack(batch))
            batch, batch_first = [], at
            tx.put(keys.time_key(conv, head.created_at_ms, at), b"")
            _move_receipt(tx, conv, head.append_id, at)
        new_turn, new_append = head.turn, head.append_id
        batch += (content_total, distinct - 1)
        content_total += head.content_bytes
        if at != old:
            source = tx.get(keys.source_key(conv, old))
            assert source is not None  # Invariant: visible messages have their N row.
            tx.put(keys.message_key(conv, at), value)
            tx.put(keys.source_key(conv, at), source)
        if head.role == _SYSTEM:
            tx.put(keys.system_key(conv, at), b"")
        if external is not None:
            tx.put(keys.external_key(conv, external, at), b"")
        at += 1
    if batch:
        tx.put(keys.aggregate_key(conv, batch_first), AggregateRow.pack(batch))
    for old in range(at, old_count):
        tx.delete(keys.message_key(conv, old))
        tx.delete(keys.source_key(conv, old))
    row.messages, row.content_bytes, row.turns = at, content_total, distinct


def _move_receipt(tx: Tx, conv: bytes, append_id: str, first_ord: int) -> None:
    """Set the first ordinal of the receipt of ``append_id`` (its batch's first visible message)."""
    key = keys.receipt_key(conv, append_id.encode("utf-8"))
    raw = tx.get(key)
    assert raw is not None  # Invariant: a visible message has its receipt.
    receipt = ReceiptRow.decode(raw)
    if receipt.first_ord != first_ord:
        tx.put(key, ReceiptRow.pack(receipt.digest, receipt.partition, receipt.offset, receipt.first_seq,
                                    receipt.count, first_ord))
