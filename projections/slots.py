"""Turn slots (``TurnAllocated``, ``allocate_turn``; schemas/slots.py): admission's rules for
giving a slot its position and for filing a batch's turn under it, and the ``L`` rows they keep.

* A new slot takes the position after both the conversation's latest turn (``ConversationRow.turn``)
  and its latest slot (``allotted``), which it becomes; the same slot id again keeps its position.
  A turn opened without a slot takes the position after both as well (``full.append``), so a slot's
  position is spent whether or not a turn ever uses it.
* A batch filed under a slot (``BatchAppended.turn_id`` / ``turn_position``) is refused as
  **slot_unavailable** unless the slot was allocated in this conversation with that position, is
  unused, no turn after it exists yet (positions order the history: a turn filed at a position
  below the latest would sit after a later turn), and the batch opens a turn (has a user message
  that starts one). Accepted, it marks the slot used.

Each rule is decided in log order by the projector; a writer's fast path answers only what no
later record changes (a used slot stays used, turns only move forward).
"""

from __future__ import annotations

from projections import feature_keys
from projections.full import Rows
from projections.rows import ConversationRow
from projections.store import Tx
from schemas.batch import Batch
from schemas.messages import starts_turn
from schemas.slots import slot_of_turn

__all__ = ["allocate", "mark_used", "refusal"]


def allocate(tx: Tx, conv: bytes, row: ConversationRow, slot_id: str) -> tuple[int, bool]:
    """The position of slot ``slot_id`` and whether this record allocated it (``row`` is updated
    in place when it did; the caller writes it)."""
    key = feature_keys.slot_key(conv, slot_id.encode("utf-8"))
    raw = tx.get(key)
    if raw is not None:
        return feature_keys.read_slot_value(raw)[0], False
    position = max(row.turn, row.allotted) + 1
    row.allotted = position
    tx.put(key, feature_keys.slot_value(position, used=False))
    return position, True


def refusal(rows: Rows, conv: bytes, row: ConversationRow | None, turn_id: str, position: int, batch: Batch, *,
            in_log_order: bool) -> str:
    """Why ``batch`` may not be filed under slot ``turn_id`` at ``position`` ("" when it may, or,
    out of log order, when that is not decided yet)."""
    if not any(starts_turn(m) for m in batch.messages):
        return f"turn slot {turn_id!r}: the batch has no user message that opens a turn"
    raw = rows.get(feature_keys.slot_key(conv, slot_of_turn(turn_id).encode("utf-8"))) if row is not None else None
    if raw is None:
        return f"no turn slot {turn_id!r} was allocated in this conversation" if in_log_order else ""
    allocated, used = feature_keys.read_slot_value(raw)
    if allocated != position:
        return f"turn slot {turn_id!r} has position {allocated}, not {position}"
    if used:
        return f"turn slot {turn_id!r} was already used"
    assert row is not None  # Invariant: the slot's row was read under the conversation's row.
    if row.turn >= position:
        return (f"turn slot {turn_id!r} (position {position}) is behind the latest turn (position {row.turn}): "
                "a later turn was filed first")
    return ""


def mark_used(tx: Tx, conv: bytes, turn_id: str, position: int) -> None:
    """Spend slot ``turn_id`` for good (its batch was accepted)."""
    tx.put(feature_keys.slot_key(conv, slot_of_turn(turn_id).encode("utf-8")),
           feature_keys.slot_value(position, used=True))
