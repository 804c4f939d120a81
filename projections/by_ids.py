"""Reads by message ids (API.md "Runs, slots, assets, deletes": the reference's
``ListHistoryByIDs``): the visible messages a caller names, in history order, each once.

A message id is ``APPEND_ID/INDEX`` (``schemas.ids.MessageID``); its append's receipt row names
the ordinal its batch started at, so a message is two point reads (the receipt, shared by the
ids of one append, and the row at ``first_ord + index``): O(ids), whatever the history's length.
A message whose turn was replaced is hidden: another append's row holds its ordinal now, or a
shorter replacement deleted it, so the row read is checked to be the one named. Ids that name
no visible message (unknown, hidden, deleted, or not a message id at all) are left out; after
deletes, the deleted indexes before a message (its batch's ``D`` row) move it down
(``projections.deletes.ordinal_of``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from projections import deletes, keys
from projections.rows import ConversationRow, ReceiptRow
from projections.store import Snapshot
from schemas.ids import MessageID

__all__ = ["visible_rows"]

T = TypeVar("T")

RowKey = Callable[[bytes, int], bytes]
"""The key of a per-ordinal row (``keys.message_key`` or ``keys.source_key``)."""
Pick = Callable[[bytes, str, int, int], "T | None"]
"""``pick(value, append_id, index, seq)``: the row's read form when it is the message named
(``append_id/index``, stored with ``seq``), else None (the ordinal holds a replacement's row)."""


def visible_rows(snap: Snapshot, conv: bytes, row: ConversationRow, ids: Sequence[MessageID], row_key: RowKey,
                 pick: Pick[T]) -> list[T]:
    """The visible messages ``ids`` names, in history order (by ordinal), each once; ``row`` is
    the conversation's summary row. At most two point reads per id (one receipt per append id),
    and one more (its batch's ``D`` row) in a conversation that had deletes."""
    count = row.messages
    receipts: dict[str, ReceiptRow | None] = {}
    found: dict[int, T] = {}
    for wanted in ids:
        append_id = wanted.append_id
        if append_id in receipts:
            receipt = receipts[append_id]
        else:
            raw = snap.get(keys.receipt_key(conv, append_id.encode("utf-8")))
            receipt = receipts[append_id] = ReceiptRow.decode(raw) if raw is not None else None
        if receipt is None or wanted.index >= receipt.count:
            continue
        ord_ = deletes.ordinal_of(snap, conv, row, append_id.encode("utf-8"), receipt, wanted.index)
        if ord_ is None or ord_ >= count or ord_ in found:
            continue
        value = snap.get(row_key(conv, ord_))
        if value is None:
            continue
        got = pick(value, append_id, wanted.index, receipt.first_seq + wanted.index)
        if got is not None:
            found[ord_] = got
    return [found[o] for o in sorted(found)]
