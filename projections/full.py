"""The full projection: every accepted message by ``(conversation, seq)``, plus the indexes the
window and cursor reads need (system messages, first seq of each turn) and the summary row.

Turn rule (API.md ``HistoryPosition``): the turn position advances at every user message and is
0 before the first one. A turn group starts at each user message, or at the first non-system
message when that is not a user message.
"""

from __future__ import annotations

from projections import keys
from projections.store import Tx
from schemas.batch import Batch

__all__ = ["append", "clear"]

_USER = keys.ROLE_CODES["user"]
_SYSTEM = keys.ROLE_CODES["system"]


def append(tx: Tx, conv: bytes, row: keys.ConversationRow, batch: Batch, created_at_ms: int) -> int:
    """Store the batch's messages after the conversation's last one; update ``row`` in place.

    Returns the first sequence number assigned.
    """
    first_seq = seq = row.next_seq
    aid = batch.append_id.encode("utf-8")
    for index, message in enumerate(batch.messages):
        role = keys.ROLE_CODES[message.role]
        if role == _USER:
            row.turn += 1
            row.turns += 1
            tx.put(keys.turn_key(conv, row.turn), keys.u64(seq))
        else:
            if seq == 1:
                tx.put(keys.turn_key(conv, 0), keys.u64(seq))
            if role != _SYSTEM and row.turn == 0 and row.turns == 0:
                row.turns = 1
        flags = keys.FLAG_INTERRUPTED if message.metadata.get("interrupted") == "true" else 0
        content = message.content_bytes()
        tx.put(keys.message_key(conv, seq), keys.MessageRow.pack(
            row.turn, created_at_ms, index, role, flags, content, aid, message.canonical_json()))
        if role == _SYSTEM:
            tx.put(keys.system_key(conv, seq), b"")
        row.messages += 1
        row.content_bytes += content
        seq += 1
    row.next_seq = seq
    return first_seq


def clear(tx: Tx, conv: bytes) -> None:
    """Drop every row and receipt of the conversation (the caller records the closure)."""
    for prefix in (b"M", b"S", b"T", b"R"):
        tx.delete_range(*keys.conv_range(prefix, conv))
