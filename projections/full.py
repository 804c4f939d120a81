"""The full projection: every visible message by ``(conversation, ordinal)``, plus the indexes
the window, budget, turn-source, measure and cursor reads need (system messages, narrowed turn
sources, running sums, each turn's first message) and the summary row; the hidden messages of
replaced turns by position. ``keys`` explains why the visible rows are keyed by ordinal.

Turn rule (``HistoryPosition``, docs/design.md §5.3): the turn position advances at every user message
that starts a turn (``schemas.messages.starts_turn``: not internal feedback) and is 0 before the
first one. A turn group starts at each such message, or at the first non-system message when that
is not one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import orjson

from projections import keys
from projections.rows import (
    FLAG_INTERRUPTED,
    AggregateRow,
    ConversationRow,
    HiddenRow,
    MessageRow,
    ReceiptRow,
    SourceRow,
)
from projections.store import Tx
from schemas.batch import Batch
from schemas.ids import MessageID
from schemas.messages import Message, starts_turn
from schemas.positions import HistoryPosition

__all__ = ["Rows", "append", "clear", "external_of_row", "latest_turn", "positions", "replace_latest_turn", "turn_id",
           "visible_turn"]


class Rows(Protocol):
    """Point reads of the state: a step's ``Tx``, a ``Snapshot`` or the ``StateStore`` itself."""

    def get(self, key: bytes) -> bytes | None: ...

_USER = keys.ROLE_CODES["user"]
_SYSTEM = keys.ROLE_CODES["system"]
_ROLE_CODES = keys.ROLE_CODES
_u64 = keys.u64
_pack_message = MessageRow.pack
_pack_source = SourceRow.pack


def append(tx: Tx, conv: bytes, row: ConversationRow, batch: Batch, created_at_ms: int,
           slot: tuple[str, int] | None = None) -> tuple[int, int, list[int]]:
    """Store the batch's messages after the conversation's last visible one; update ``row`` in
    place. Per message: the full row (``M``), the turn-source row (``N``), the system index
    (``S``), when it opens a turn, the turn index (``T``) and, when its metadata ``external_id``
    is a JSON string, the external-id index (``X``); per batch, the running sums before each of
    its messages (``A``, keyed by its first ordinal) and its time (``W``, keyed by time and first
    ordinal: the time index of range reads). A 2-message turn writes 7 keys here.

    A turn opens at the position after both the latest turn and the latest slot's (``allotted``);
    with ``slot`` (its turn id and position, which admission checked is after the latest turn),
    the batch's first turn opens at the slot's position and its ``T`` row keeps the slot's id.

    Returns the first sequence number and the first ordinal assigned, and the messages' turn
    positions (``positions`` makes their ``HistoryPosition``s, for the events that need them).
    """
    first_seq = seq = row.next_seq
    first_ord = ord_ = row.messages
    turns_of: list[int] = []
    sums: list[int] = []
    aid = batch.append_id.encode("utf-8")
    m_prefix, n_prefix, s_prefix = keys.message_keys(conv)
    turn, turns, content_total, allotted = row.turn, row.turns, row.content_bytes, row.allotted
    put = tx.put
    # The first message opens a turn row when nothing visible is in its turn: a new conversation,
    # or one whose latest turn's messages were all deleted (it reappears: a later message never
    # sorts before an earlier one).
    fresh = ord_ == 0 or (row.deleted > 0 and tx.get(keys.turn_key(conv, turn)) is None)
    for index, message in enumerate(batch.messages):
        role = _ROLE_CODES[message.role]
        opens = role == _USER and starts_turn(message)
        if opens:
            if slot is None:
                turn = (turn if turn > allotted else allotted) + 1
                put(keys.turn_key(conv, turn), keys.turn_value(seq, ord_))
            else:
                turn = slot[1]
                put(keys.turn_key(conv, turn), keys.turn_value(seq, ord_, slot[0].encode("utf-8")))
                slot = None
            turns += 1
            fresh = False
        elif fresh:  # the first message of a turn position (0: before the first user message)
            turns += 1
            put(keys.turn_key(conv, turn), keys.turn_value(seq, ord_))
            fresh = False
        metadata = message.metadata
        flags = FLAG_INTERRUPTED if metadata.get("interrupted") == "true" else 0
        if metadata:
            external = external_of(metadata)
            if external is not None:
                put(keys.external_key(conv, external, ord_), b"")
        canonical = message.canonical_json()
        content = message.content_json()  # without metadata: ``canonical`` itself, no copy
        size = len(content)
        at = _u64(ord_)
        put(m_prefix + at, _pack_message(turn, seq, created_at_ms, index, role, flags, size, aid, canonical))
        put(n_prefix + at, _pack_source(turn, created_at_ms, index, role, flags, aid, content))
        if role == _SYSTEM:
            put(s_prefix + at, b"")
        sums += (content_total, turns - 1)
        turns_of.append(turn)
        ord_ += 1
        content_total += size
        seq += 1
    put(keys.aggregate_key(conv, first_ord), AggregateRow.pack(sums))
    put(keys.time_key(conv, created_at_ms, first_ord), b"")
    row.turn, row.turns, row.content_bytes, row.messages, row.next_seq = turn, turns, content_total, ord_, seq
    row.last_ms = created_at_ms
    return first_seq, first_ord, turns_of


def positions(first_seq: int, turns: list[int]) -> tuple[HistoryPosition, ...]:
    """The positions of a batch's messages from ``append``'s first seq and turns (built only for
    the events that carry them: a replay without subscribers never needs them)."""
    return tuple(HistoryPosition(turn, first_seq + i) for i, turn in enumerate(turns))


def external_of(metadata: Mapping[str, str]) -> bytes | None:
    """The ``X`` key text of a message's metadata ``external_id`` when it is a JSON string (a
    platform's own message id), else None: any other JSON value names no platform message."""
    raw = metadata.get("external_id")
    if raw is None or not raw.startswith('"'):
        return None
    return keys.external_text(orjson.loads(str(raw)))


def turn_id(append_id: str, index: int) -> str:
    """The id of a turn of no slot: the id of its first message (its user message),
    ``append_id/index``. A slotted turn's id is its slot's, in its ``T`` row."""
    return MessageID.format(append_id, index)


def latest_turn(tx: Rows, conv: bytes, row: ConversationRow) -> tuple[str, int] | None:
    """``(turn id, first ordinal)`` of the latest visible user-led turn, or None.

    Every turn starts at a user message and a replacement always opens a new one, so the
    latest visible user-led turn is the latest turn position given, when it is not 0."""
    if row.turn == 0 or row.messages == 0:
        return None
    turn = visible_turn(tx, conv, row)
    raw = tx.get(keys.turn_key(conv, turn)) if turn else None
    if raw is None:
        return None
    _, first_ord = keys.read_turn_value(raw)
    slotted = keys.read_turn_id(raw)
    if slotted is not None:
        return slotted, first_ord
    message = tx.get(keys.message_key(conv, first_ord))
    assert message is not None  # Invariant: T rows index visible M rows (same WriteBatch).
    head = MessageRow.decode(message)
    return turn_id(head.append_id, head.index), first_ord


def visible_turn(rows: Rows, conv: bytes, row: ConversationRow) -> int:
    """The turn position of the conversation's last visible message (0: none): ``row.turn``,
    unless deletes removed every message of its latest turns (then one point read)."""
    if not row.deleted or row.messages == 0:
        return row.turn if row.messages else 0
    last = rows.get(keys.message_key(conv, row.messages - 1))
    assert last is not None  # Invariant: ordinals below the count are all visible rows.
    return MessageRow.decode_head(last)[0]


def replace_latest_turn(tx: Tx, conv: bytes, row: ConversationRow, first_ord: int, batch: Batch,
                        reason: str, created_at_ms: int) -> tuple[int, int, range, list[int]]:
    """Hide the latest visible turn (``first_ord`` to the last visible message) and append
    ``batch`` as the next turn, in ``tx``; update ``row``.

    The hidden messages move to ``H`` (keyed by position, with the replacing turn's id and the
    reason); the summary rolls back to its running sums before the turn; the replacement's rows
    overwrite the hidden ones' ordinals, and ordinals it does not reach are deleted (they lie past
    the new last message). The ``A`` rows of batches that start inside the turn are deleted; one
    that starts before it keeps its row, whose sums of the visible prefix stay exact, and the
    replacement's own row, at the turn's first ordinal, is the floor of every ordinal after.
    Returns the replacement's first seq and ordinal, the hidden seqs and the replacement's turns.
    """
    first = tx.get(keys.message_key(conv, first_ord))
    assert first is not None  # Invariant: the latest turn's first message is visible.
    opening = MessageRow.decode(first)
    k = opening.index  # the turn's first message is its batch's k-th visible one
    if row.deleted:  # some may be deleted: its receipt has the batch's first visible ordinal
        receipt = tx.get(keys.receipt_key(conv, opening.append_id.encode("utf-8")))
        assert receipt is not None  # Invariant: a visible message has its receipt.
        k = first_ord - ReceiptRow.decode(receipt).first_ord
    sums = tx.get(keys.aggregate_key(conv, first_ord - k))
    assert sums is not None  # Invariant: every visible batch has its A row (same WriteBatch).
    content_before, turns_before = AggregateRow.at(sums, k)
    old_count = row.messages
    superseded_by = turn_id(batch.append_id, 0)
    hidden_first_seq = row.next_seq
    previous = opening.append_id if k else ""
    for ord_ in range(first_ord, old_count):
        message = tx.get(keys.message_key(conv, ord_))
        assert message is not None  # Invariant: ordinals below the count are all visible rows.
        head = MessageRow.decode(message)
        starts = head.append_id != previous  # its batch's first visible message
        previous = head.append_id
        if starts and ord_ > first_ord:  # a hidden batch's sums: no floor read may find them
            tx.delete(keys.aggregate_key(conv, ord_))
        if starts:  # nor a time seek its first ordinal (the replacement writes its own)
            tx.delete(keys.time_key(conv, head.created_at_ms, ord_))
        external = external_of_row(head.canonical)
        if external is not None:
            tx.delete(keys.external_key(conv, external, ord_))
        hidden_first_seq = min(hidden_first_seq, head.seq)
        tx.put(keys.hidden_key(conv, head.turn, head.seq),
               HiddenRow.pack(created_at_ms, reason, superseded_by, message))
        if head.role == _SYSTEM:
            tx.delete(keys.system_key(conv, ord_))
    row.messages, row.content_bytes, row.turns = first_ord, content_before, turns_before
    tx.delete(keys.turn_key(conv, opening.turn))
    hidden = range(hidden_first_seq, row.next_seq)
    first_seq, new_first_ord, turns = append(tx, conv, row, batch, created_at_ms)
    for ord_ in range(row.messages, old_count):  # the replacement is shorter than what it hid
        for key in _VISIBLE:
            tx.delete(key(conv, ord_))
    return first_seq, new_first_ord, hidden, turns


def external_of_row(canonical: bytes) -> bytes | None:
    """``external_of`` a stored message's metadata (its canonical JSON; only a replacement reads it)."""
    if b'"external_id"' not in canonical:
        return None
    return external_of(Message.from_stored(canonical).metadata)


_VISIBLE = (keys.message_key, keys.source_key)
"""The per-ordinal keyspaces a shorter replacement leaves rows of past its end."""


def clear(tx: Tx, conv: bytes) -> None:
    """Drop every row and receipt of the conversation (the caller records the closure)."""
    for lower, upper in keys.conversation_ranges(conv):
        tx.delete_range(lower, upper)
