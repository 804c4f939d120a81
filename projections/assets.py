"""Assets linked to stored messages (``AssetsLinked``, ``link_assets``; schemas/assets.py):
admission's rule for a link and the ``G`` rows it keeps, and the reads' lookup of them.

* A link names a **visible** message by id (its receipt gives the ordinal, whose row must still
  hold it): an unknown, malformed or hidden one → **unknown_message** (nothing linked).
* A message's refs are one row, ``G conv 1F seq``: their canonical JSON array in ordinal order
  (keyed by the message's seq, so a message keeps its assets when a replacement hides its turn;
  one row, so a read of them is one point read). A ref at an ordinal the message already links to
  another ref → **conflict** (nothing linked); refs all linked already → **duplicate**
  (idempotent); else **linked**: the row rewritten with the new refs merged in, and the message's
  row flagged (``FLAG_ASSETS``) the first time, so a read looks its assets up only when it has some.

A clear drops the ``G`` rows with the conversation's other rows; in the log the refs are sealed
under the conversation's data key, so the clear's erasure destroys them there too.
"""

from __future__ import annotations

from projections import deletes, feature_keys, keys
from projections.full import Rows
from projections.rows import FLAG_ASSETS, ConversationRow, MessageRow, ReceiptRow
from projections.store import Snapshot, Tx
from schemas.assets import AssetRef, assets_json, trusted_assets
from schemas.errors import NotFound
from schemas.ids import MessageID

__all__ = ["assets_of", "link", "visible_seq"]


def visible_seq(rows: Rows, conv: bytes, message_id: str, summary: ConversationRow | None
                ) -> tuple[int, int, bytes] | str:
    """``(seq, ordinal, row)`` of the visible message ``message_id`` of a conversation whose
    summary row is ``summary`` (None: no message yet), or why there is none (unknown, malformed,
    hidden or deleted)."""
    try:
        wanted = MessageID.parse(message_id)
    except NotFound as e:
        return str(e)
    raw = rows.get(keys.receipt_key(conv, wanted.append_id.encode("utf-8")))
    receipt = ReceiptRow.decode(raw) if raw is not None else None
    if summary is None or receipt is None or wanted.index >= receipt.count:
        return f"the conversation has no message {message_id!r}"
    ord_ = deletes.ordinal_of(rows, conv, summary, wanted.append_id.encode("utf-8"), receipt, wanted.index)
    if ord_ is None:
        return f"message {message_id!r} was deleted"
    seq = receipt.first_seq + wanted.index
    value = rows.get(keys.message_key(conv, ord_)) if ord_ < summary.messages else None
    if value is None or MessageRow.decode(value).seq != seq:
        return f"message {message_id!r} is hidden (its turn was replaced): assets link to visible messages"
    return seq, ord_, value


def link(tx: Tx, conv: bytes, summary: ConversationRow | None, message_id: str,
         refs: tuple[AssetRef, ...]) -> tuple[str, str]:
    """Apply a link of ``refs`` to ``message_id`` in ``tx``: ``(outcome, reason)`` with outcome
    ``"linked"``, ``"duplicate"``, ``"conflict"`` or ``"unknown_message"``."""
    found = visible_seq(tx, conv, message_id, summary)
    if isinstance(found, str):
        return "unknown_message", found
    seq, ord_, row = found
    key = feature_keys.assets_key(conv, seq)
    raw = tx.get(key)
    linked = {a.ordinal: a for a in trusted_assets(raw)} if raw is not None else {}
    for ref in refs:
        if linked.setdefault(ref.ordinal, ref) != ref:
            return "conflict", (f"message {message_id!r} already links another asset at ordinal {ref.ordinal}; "
                                "link it at a free ordinal")
    merged = assets_json(linked[o] for o in sorted(linked))
    if merged == raw:
        return "duplicate", ""
    tx.put(key, merged)
    if raw is None:
        tx.put(keys.message_key(conv, ord_), MessageRow.flagged(row, FLAG_ASSETS))
    return "linked", ""


def assets_of(rows: Snapshot, conv: bytes, seq: int) -> tuple[AssetRef, ...]:
    """Message ``seq``'s assets in ordinal order (one point read; call it between scans, never
    inside one: a snapshot has one iterator)."""
    raw = rows.get(feature_keys.assets_key(conv, seq))
    return trusted_assets(raw) if raw is not None else ()
