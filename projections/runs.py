"""Runs and fences (API.md "Runs, slots, assets, deletes"): a run's epoch, the fence rule, and
what each run wrote. The rows are ``keys``' ``F`` and ``J``; admission (``projections.admission``)
calls ``begin`` for a ``RunBegun``, ``fenced`` in ``precheck`` and ``note_writes`` for an
accepted write that names its run.

* **Epochs.** A conversation's first run gets epoch 1 and each new run the next one, in log
  order (``F conv 1F`` holds the latest, ``F conv 1F 00 epoch`` the run of each epoch, so a
  fence given as its epoch alone, as HTTP gives it, names its run); the same run again keeps
  its epoch.
* **The fence rule.** A write that carries a fence is accepted only while its epoch is the
  conversation's latest: a later ``RunBegun`` before it in the log refuses it (``fenced``), and
  so does an epoch no run has been given yet. Epochs only grow, so a writer's local state may
  refuse a fence older than the latest it knows without the log.
* **What a run wrote.** For every accepted write with a ``run_id``: one ``J ... t turn`` row per
  turn its messages are in (turn positions 0, before the first user message, are in no turn)
  and one ``J ... u seq`` row per user message. They are never deleted when a turn is replaced,
  so ``wrote_history`` counts hidden rows too (a request that was removed is not restored);
  a clear drops them with the conversation.
"""

from __future__ import annotations

from collections.abc import Iterator

from projections import feature_keys, full, keys
from projections.full import Rows
from projections.rows import ConversationRow
from projections.store import Snapshot, Tx
from schemas.batch import Batch
from schemas.ids import MessageID
from schemas.messages import starts_turn

__all__ = ["begin", "epoch_of", "fenced", "latest_epoch", "note_writes", "run_of_epoch", "run_requests",
           "wrote_history"]

_USER = "user"


def latest_epoch(rows: Rows, conv: bytes) -> int:
    """The conversation's latest epoch (0: no run began)."""
    raw = rows.get(feature_keys.run_key(conv, b""))
    return keys.read_u64(raw) if raw is not None else 0


def epoch_of(rows: Rows, conv: bytes, run_id: str) -> int:
    """The epoch of run ``run_id`` (0: it never began, or its conversation was cleared)."""
    raw = rows.get(feature_keys.run_key(conv, run_id.encode("utf-8")))
    return keys.read_u64(raw) if raw is not None else 0


def run_of_epoch(rows: Rows, conv: bytes, epoch: int) -> str | None:
    """The id of the run that has ``epoch``, or None (no run of that epoch began here)."""
    raw = rows.get(feature_keys.run_epoch_key(conv, epoch))
    return raw.decode("utf-8") if raw is not None else None


def begin(tx: Tx, conv: bytes, run_id: str) -> tuple[int, bool]:
    """Begin run ``run_id``: ``(its epoch, whether it is new)``. A new run gets the next epoch and
    becomes the latest (3 keys: its epoch, the latest, the run of that epoch); a known one
    changes nothing."""
    known = epoch_of(tx, conv, run_id)
    if known:
        return known, False
    epoch = latest_epoch(tx, conv) + 1
    value = keys.u64(epoch)
    run = run_id.encode("utf-8")
    tx.put(feature_keys.run_key(conv, run), value)
    tx.put(feature_keys.run_key(conv, b""), value)
    tx.put(feature_keys.run_epoch_key(conv, epoch), run)
    return epoch, True


def fenced(rows: Rows, conv: bytes, fence: int, *, in_log_order: bool) -> tuple[int, bool]:
    """``(latest epoch, refused)`` for a write with ``fence``. In log order it is refused unless
    ``fence`` is the latest epoch; out of log order (a writer's earlier prefix) only when it is
    older than the latest, which no later record can undo."""
    latest = latest_epoch(rows, conv)
    if fence == latest:
        return latest, False
    return latest, in_log_order or fence < latest


def note_writes(tx: Tx, conv: bytes, run_id: str, row_before: ConversationRow, batch: Batch, first_seq: int,
                turns: list[int], *, opens_new_turn: bool = False, slot: str | None = None) -> None:
    """Record what run ``run_id`` wrote: ``batch``, stored from ``first_seq`` with the turn
    positions ``turns`` (``full.append``'s). ``row_before`` is the conversation's row before the
    batch (its latest turn is the one a batch that does not open a turn continues);
    ``opens_new_turn``: a replacement, whose first message opens its turn; ``slot``: the turn id
    of the slot the batch's first turn was filed under."""
    run = run_id.encode("utf-8")
    group: str | None = None  # the id of the turn the message is in
    previous_turn = -1
    for index, (message, turn) in enumerate(zip(batch.messages, turns, strict=True)):
        if turn != previous_turn:
            previous_turn = turn
            if turn == 0:
                group = None
            elif message.role == _USER and starts_turn(message):
                group = full.turn_id(batch.append_id, index) if slot is None else slot
                slot = None
            elif index == 0 and not opens_new_turn:
                latest = full.latest_turn(tx, conv, row_before)
                group = latest[0] if latest is not None else None
            if group is not None:
                tx.put(feature_keys.run_turn_key(conv, run, group.encode("utf-8")), b"")
        if message.role == _USER:
            tx.put(feature_keys.run_request_key(conv, run, first_seq + index),
                   full.turn_id(batch.append_id, index).encode("utf-8"))


def wrote_history(rows: Rows | Snapshot, conv: bytes, run_id: str, root_turn: str | None) -> bool:
    """Whether run ``run_id`` wrote any message (visible or hidden since), in turn ``root_turn``
    when given: one point read, or one seek."""
    run = run_id.encode("utf-8")
    if root_turn is not None:
        return rows.get(feature_keys.run_turn_key(conv, run, root_turn.encode("utf-8"))) is not None
    assert isinstance(rows, Snapshot)  # Invariant: the reads pass a snapshot (a seek).
    for _ in rows.scan(*feature_keys.run_writes_range(conv, run)):
        return True
    return False


def run_requests(snap: Snapshot, conv: bytes, run_id: str) -> Iterator[MessageID]:
    """The ids of the user messages run ``run_id`` wrote, newest first (hidden ones too), read
    lazily: a caller that stops at the first visible one reads no further. Each id is one seek of
    its own, so the caller may read ``snap`` between them (a snapshot has one iterator)."""
    lower, upper = feature_keys.run_requests_range(conv, run_id.encode("utf-8"))
    while True:
        scan = snap.scan_reverse(lower, upper)
        try:
            found = next(scan, None)
        finally:
            scan.close()
        if found is None:
            return
        upper, value = found
        yield MessageID.parse(value.decode("utf-8"))
