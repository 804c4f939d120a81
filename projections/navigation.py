"""History navigation over the built-in projections (chat UIs, platform bots): newest-first pages,
time ranges, external ids and pages of open conversations, each in O(what it returns).

* Time ranges: ``created_at`` never decreases within a conversation and a batch's messages share
  one time, so the messages with ``since <= created_at < until`` are one run of ordinals; its ends
  are two seeks into the ``W`` index (one key each), whatever the history's length.
* Newest first: the same ordinal range, read backwards from its end (``limit`` keeps the newest).
* ``locate``: the newest visible message with an external id is the greatest key under its ``X``
  prefix (one floor seek); its neighbours are one scan of the ordinals around it.
* Conversation pages: a seek into the ``O`` index of open conversations, which holds no closed one.

``keys`` holds every key layout named here.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Literal

from projections import keys
from projections.assets import assets_of
from projections.rows import FLAG_ASSETS, HiddenRow, MessageRow
from projections.store import Snapshot
from schemas.batch import Located, StoredMessage
from schemas.ids import AppendID, ConversationID, MessageID
from schemas.messages import Message
from schemas.positions import HistoryPosition
from schemas.times import time_of

__all__ = ["Order", "conversation_page", "hidden_page", "locate", "message_id", "stored", "stored_all",
           "stored_hidden", "time_range", "visible_page"]

Order = Literal["asc", "desc"]

message_id = MessageID.format
"""Stable id of a stored message, ``APPEND_ID/INDEX``: unique within its conversation (append ids are)."""


def _time(ms: int) -> datetime:
    return time_of(ms)  # the one conversion of event times, exact (admission only stores representable ones)


def stored(row: MessageRow, superseded_by: str | None = None, reason: str | None = None,
           snap: Snapshot | None = None, conv: bytes = b"") -> StoredMessage:
    """The ``StoredMessage`` of a message row (and, for a hidden one, why it is hidden); with
    ``snap`` and ``conv``, its assets when its row is flagged (a seek: call it after the scans)."""
    assets = assets_of(snap, conv, row.seq) if snap is not None and row.flags & FLAG_ASSETS else ()
    return StoredMessage(
        message_id(row.append_id, row.index),
        Message.from_stored(row.canonical),
        HistoryPosition(row.turn, row.seq),
        AppendID(row.append_id),
        _time(row.created_at_ms),
        superseded_by,
        reason,
        assets,
    )


def stored_all(snap: Snapshot, conv: bytes, values: list[bytes]) -> list[StoredMessage]:
    """The ``StoredMessage`` of each ``M`` row value, collected from a finished scan: each one
    with linked assets (flagged) costs one seek more, the others none."""
    return [stored(MessageRow.decode(v), None, None, snap, conv) for v in values]


def stored_hidden(value: bytes) -> StoredMessage:
    """The ``StoredMessage`` of an ``H`` row."""
    _, reason, superseded_by, message = HiddenRow.decode(value)
    return stored(MessageRow.decode(message), superseded_by, reason)


def _first_batch_at(snap: Snapshot, conv: bytes, ms: int, count: int) -> int:
    """The first ordinal stored at or after time ``ms`` (``count`` when none is): one seek."""
    for key, _ in snap.scan(keys.time_key(conv, ms, 0), keys.conv_range(keys.TIME, conv)[1]):
        return keys.read_time_key(key)[1]
    return count


def time_range(snap: Snapshot, conv: bytes, count: int, lo: int, hi: int, since_ms: int | None,
               until_ms: int | None) -> tuple[int, int]:
    """``[lo, hi)`` narrowed to the messages with ``since_ms <= created_at < until_ms`` (either
    None: unbounded). Visits at most one key per bound."""
    if since_ms is not None and lo < hi:
        lo = max(lo, _first_batch_at(snap, conv, since_ms, count))
    if until_ms is not None and lo < hi:
        hi = min(hi, _first_batch_at(snap, conv, until_ms, count))
    return lo, max(lo, hi)


def visible_page(snap: Snapshot, conv: bytes, lo: int, hi: int, limit: int | None,
                 order: Order) -> list[StoredMessage]:
    """The visible messages of ordinals ``[lo, hi)``, at most ``limit``: the oldest ones in stored
    order (``asc``) or the newest ones newest first (``desc``). Visits the result plus one key."""
    if order == "asc":
        if limit is not None:
            hi = min(hi, lo + limit)
        rows = snap.scan(keys.message_key(conv, lo), keys.message_key(conv, hi))
    else:
        if limit is not None:
            lo = max(lo, hi - limit)
        rows = snap.scan_reverse(keys.message_key(conv, lo), keys.message_key(conv, hi))
    return stored_all(snap, conv, [v for _, v in rows])


def hidden_page(snap: Snapshot, conv: bytes, after: HistoryPosition | None, before: HistoryPosition | None,
                limit: int | None, order: Order, since_ms: int | None,
                until_ms: int | None) -> list[StoredMessage]:
    """The hidden messages with ``after < position < before`` and ``since <= created_at < until``,
    at most ``limit``, in ``order``: the rows are keyed by position, so the cursors are key bounds
    (the time bounds are a filter: an audit read of replaced turns)."""
    first, end = keys.conv_range(keys.HIDDEN, conv)
    lower = first if after is None else keys.hidden_key(conv, after.turn, after.seq + 1)
    upper = end if before is None else keys.hidden_key(conv, before.turn, before.seq)
    scan = snap.scan if order == "asc" else snap.scan_reverse
    found: list[tuple[MessageRow, str, str]] = []
    for _, value in scan(lower, upper):
        if limit is not None and len(found) >= limit:
            break
        _, reason, superseded_by, raw = HiddenRow.decode(value)
        row = MessageRow.decode(raw)
        ms = row.created_at_ms
        if (since_ms is None or ms >= since_ms) and (until_ms is None or ms < until_ms):
            found.append((row, superseded_by, reason))
    return [stored(row, superseded_by, reason, snap, conv) for row, superseded_by, reason in found]


def locate(snap: Snapshot, conv: bytes, count: int, external_id: str, before: int,
           after: int) -> Located | None:
    """The newest visible message whose metadata ``external_id`` is the JSON string
    ``external_id``, with up to ``before`` visible messages before it and ``after`` after it;
    None when there is none. One floor seek, then one scan of the result."""
    lower, upper = keys.external_range(conv, keys.external_text(external_id))
    found = snap.floor(lower, upper)
    if found is None or not found[0].startswith(lower):
        return None
    at = keys.read_key_u64(found[0])
    lo, hi = max(at - before, 0), min(at + after + 1, count)
    rows = stored_all(snap, conv, [v for _, v in snap.scan(keys.message_key(conv, lo), keys.message_key(conv, hi))])
    k = at - lo
    return Located(rows[k], rows[:k], rows[k + 1:])


def conversation_page(snap: Snapshot, prefix: str, after: str | None, limit: int | None,
                      keep: Callable[[bytes], bool] | None = None) -> list[ConversationID]:
    """Open conversations whose id starts with ``prefix``, after ``after`` (exclusive), in lexical
    order, at most ``limit``; ``keep`` filters ids (a cluster member's own partitions). Visits the
    page plus one key (plus those ``keep`` refuses)."""
    lower, upper = keys.open_range(prefix.encode("utf-8"))
    if after is not None:
        past = keys.open_key(after.encode("utf-8")) + b"\x00"  # the least key after ``after``'s: ids hold no NUL
        lower = max(lower, past)
    out: list[ConversationID] = []
    if limit is not None and limit <= 0:
        return out
    for key, _ in snap.scan(lower, upper):
        conv = keys.read_open_key(key)
        if keep is not None and not keep(conv):
            continue
        out.append(ConversationID(conv.decode("utf-8")))
        if limit is not None and len(out) >= limit:
            break
    return out
