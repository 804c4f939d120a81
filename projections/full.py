"""The full projection: every accepted message by ``(conversation, seq)``, plus the indexes the
window, budget, turn-source, measure and cursor reads need (system messages, narrowed turn
sources, running sums, first seq of each turn) and the summary row.

Turn rule (API.md ``HistoryPosition``): the turn position advances at every user message and is
0 before the first one. A turn group starts at each user message, or at the first non-system
message when that is not a user message.
"""

from __future__ import annotations

from projections import keys
from projections.store import Tx
from schemas.batch import Batch

__all__ = ["append", "clear", "hide_latest_turn", "latest_turn", "turn_id"]

_USER = keys.ROLE_CODES["user"]
_SYSTEM = keys.ROLE_CODES["system"]


def append(tx: Tx, conv: bytes, row: keys.ConversationRow, batch: Batch, created_at_ms: int) -> int:
    """Store the batch's messages after the conversation's last one; update ``row`` in place.

    Per message: the full row (``M``), the turn-source row (``N``), the running sums before it
    (``A``), the system index (``S``) and, when it opens a turn, the turn index (``T``).
    Returns the first sequence number assigned.
    """
    first_seq = seq = row.next_seq
    aid = batch.append_id.encode("utf-8")
    for index, message in enumerate(batch.messages):
        role = keys.ROLE_CODES[message.role]
        if role == _USER:
            row.turn += 1
        if role == _USER or row.messages == 0:  # the first message of a turn position
            row.turns += 1
            tx.put(keys.turn_key(conv, row.turn), keys.u64(seq))
        flags = keys.FLAG_INTERRUPTED if message.metadata.get("interrupted") == "true" else 0
        content = message.content_json()
        size = len(content)
        tx.put(keys.message_key(conv, seq), keys.MessageRow.pack(
            row.turn, created_at_ms, index, role, flags, size, aid, message.canonical_json()))
        tx.put(keys.source_key(conv, seq), keys.SourceRow.pack(
            row.turn, created_at_ms, index, role, flags, aid, content))
        tx.put(keys.aggregate_key(conv, seq), keys.AggregateRow.pack(row.messages, row.content_bytes, row.turns - 1))
        if role == _SYSTEM:
            tx.put(keys.system_key(conv, seq), b"")
        row.messages += 1
        row.content_bytes += size
        seq += 1
    row.next_seq = seq
    return first_seq


def turn_id(append_id: str, index: int) -> str:
    """The id of a turn: the id of its first message (its user message), ``append_id/index``."""
    return f"{append_id}/{index}"


def latest_turn(tx: Tx, conv: bytes, row: keys.ConversationRow) -> tuple[str, int] | None:
    """``(turn id, first seq)`` of the latest visible user-led turn, or None.

    Every turn starts at a user message and a replacement always opens a new one, so the
    latest visible user-led turn is the latest turn position given, when it is not 0."""
    if row.turn == 0 or row.messages == 0:
        return None
    raw = tx.get(keys.turn_key(conv, row.turn))
    if raw is None:
        return None
    seq = keys.read_u64(raw)
    message = tx.get(keys.message_key(conv, seq))
    assert message is not None  # Invariant: T rows index visible M rows (same WriteBatch).
    head = keys.MessageRow.decode(message)
    return turn_id(head.append_id, head.index), seq


def hide_latest_turn(tx: Tx, conv: bytes, row: keys.ConversationRow, first_seq: int, superseded_by: str,
                     reason: str, at_ms: int) -> range:
    """Move the latest visible turn (``first_seq`` to the last message) out of every read
    projection into the hidden rows, and roll the summary back to what it was before that turn
    (its running sums say so). Point deletes only: a turn is small, and range tombstones would
    pile up under many retries. Returns the hidden seqs."""
    raw = tx.get(keys.aggregate_key(conv, first_seq))
    assert raw is not None  # Invariant: every visible message has its A row (same WriteBatch).
    row.messages, row.content_bytes, row.turns = keys.AggregateRow.decode(raw)
    hidden = range(first_seq, row.next_seq)
    for seq in hidden:
        message = tx.get(keys.message_key(conv, seq))
        assert message is not None  # Invariant: the latest turn is the tail, and the tail is visible.
        tx.put(keys.hidden_key(conv, row.turn, seq), keys.HiddenRow.pack(at_ms, reason, superseded_by, message))
        for key in (keys.message_key, keys.source_key, keys.aggregate_key, keys.system_key):
            tx.delete(key(conv, seq))
    tx.delete(keys.turn_key(conv, row.turn))
    return hidden


def clear(tx: Tx, conv: bytes) -> None:
    """Drop every row and receipt of the conversation (the caller records the closure)."""
    for prefix in (b"M", b"N", b"A", b"S", b"T", b"H", b"R"):
        tx.delete_range(*keys.conv_range(prefix, conv))
