"""Queries over the built-in projections. Each query runs on one ``Snapshot`` (a point-in-time
RocksDB iterator), so it never mixes two projector steps. Window queries touch O(window) rows.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Literal

from projections import keys
from projections.store import Snapshot, StateStore
from projections.window import fit_turns, merge_system
from schemas.batch import HistoryLoad, HistoryTurn, Measure, StoredMessage, TurnSource
from schemas.errors import NotFound
from schemas.ids import AppendID, ConversationID
from schemas.messages import Message, Role
from schemas.positions import HistoryPosition, LogPosition

__all__ = ["Reads"]

_SYSTEM = keys.ROLE_CODES["system"]
_ROLES = {code: Role(name) for name, code in keys.ROLE_CODES.items()}
_NO_BOUND = 1 << 63  # an exclusive seq bound past every message

Unit = Literal["turn", "message"]

_FAR = 1 << 62  # past every turn position and seq a conversation can reach
_NOTHING = object()


def _cursors(after: HistoryPosition | None, before: HistoryPosition | None
             ) -> tuple[HistoryPosition | None, HistoryPosition | None] | object:
    """Cursors brought into the key range (``HistoryPosition`` takes any ints): ``(after,
    before)`` selecting the same messages, ``None`` for no bound, or ``_NOTHING`` when no
    message can lie between them."""
    if after is not None:
        if after.turn >= _FAR:
            return _NOTHING
        after = None if after < HistoryPosition(0, 1) else HistoryPosition(after.turn, min(max(after.seq, -1), _FAR))
    if before is not None:
        if before <= HistoryPosition.START:
            return _NOTHING
        before = None if before.turn >= _FAR else HistoryPosition(before.turn, min(max(before.seq, 0), _FAR))
    return after, before


def message_id(append_id: str, index: int) -> str:
    """Stable id of a stored message: unique within its conversation (append ids are)."""
    return f"{append_id}/{index}"


def _time(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def _stored(row: keys.MessageRow, seq: int, superseded_by: str | None = None,
            reason: str | None = None) -> StoredMessage:
    return StoredMessage(
        message_id(row.append_id, row.index),
        Message.from_stored(row.canonical),
        HistoryPosition(row.turn, seq),
        AppendID(row.append_id),
        _time(row.created_at_ms),
        superseded_by,
        reason,
    )


def _hidden(key: bytes, value: bytes) -> StoredMessage:
    _, reason, superseded_by, message = keys.HiddenRow.decode(value)
    return _stored(keys.MessageRow.decode(message), _seq_of(key), superseded_by, reason)


def _source(value: bytes) -> TurnSource:
    _, created, index, role, flags, append_id, content = keys.SourceRow.decode(value)
    return TurnSource(message_id(append_id, index), _ROLES[role], content, _time(created),
                      bool(flags & keys.FLAG_INTERRUPTED))


def _message_head(value: bytes) -> tuple[int, int]:
    turn, _, size = keys.MessageRow.decode_head(value)
    return turn, size


def _seq_of(key: bytes) -> int:
    return keys.read_u64(key, len(key) - 8)


class Reads:
    """Read side of the built-in projections."""

    def __init__(self, store: StateStore) -> None:
        self.store = store

    def conversation(self, conv: str) -> keys.ConversationRow | None:
        raw = self.store.get(keys.conv_key(conv.encode("utf-8")))
        return keys.ConversationRow.decode(raw) if raw is not None else None

    def receipt(self, conv: str, append_id: str) -> keys.ReceiptRow | None:
        raw = self.store.get(keys.receipt_key(conv.encode("utf-8"), append_id.encode("utf-8")))
        return keys.ReceiptRow.decode(raw) if raw is not None else None

    def poison(self) -> list[tuple[LogPosition, str]]:
        """Quarantined poison records in position order."""
        out = []
        for k, v in self.store.iterator().scan(b"Q", b"R"):
            out.append((LogPosition(int.from_bytes(k[1:5], "big"), keys.read_u64(k, 5)), v.decode("utf-8")))
        return out

    def conversations(self) -> list[ConversationID]:
        snap = self.store.iterator()
        out = []
        for k, v in snap.scan(b"C", b"D"):
            if not keys.ConversationRow.decode(v).closed:
                out.append(ConversationID(k[1:].decode("utf-8")))
        return out

    def messages(self, conv: str) -> list[Message]:
        snap = self.store.iterator()
        canonical_of = keys.MessageRow.canonical_of
        return [Message.from_stored(canonical_of(v)) for _, v in snap.scan(*keys.conv_range(b"M", conv.encode()))]

    def entries(self, conv: str, after: HistoryPosition | None, before: HistoryPosition | None,
                limit: int | None, include_hidden: bool = False) -> list[StoredMessage]:
        """Messages with ``after < position < before`` in stored order, at most ``limit``;
        with ``include_hidden``, the messages of replaced turns too (merged by position)."""
        bounds = _cursors(after, before)
        if bounds is _NOTHING:
            return []
        after, before = bounds  # type: ignore[misc]
        snap = self.store.iterator()
        c = conv.encode("utf-8")
        lo, hi = self._seq_range(snap, c, after, before)
        upper = keys.message_key(c, hi) if hi < _NO_BOUND else keys.conv_range(b"M", c)[1]
        out: list[StoredMessage] = []
        for key, value in snap.scan(keys.message_key(c, lo), upper):
            if limit is not None and len(out) >= limit:
                break
            out.append(_stored(keys.MessageRow.decode(value), _seq_of(key)))
        if not include_hidden:
            return out
        return self._with_hidden(c, out, after, before, limit)

    def _with_hidden(self, conv: bytes, visible: list[StoredMessage], after: HistoryPosition | None,
                     before: HistoryPosition | None, limit: int | None) -> list[StoredMessage]:
        """Merge the hidden rows (keyed by position, so the cursors are key bounds) into ``visible``."""
        snap = self.store.iterator()
        if after is None or after < HistoryPosition(0, 1):
            lower = keys.conv_range(b"H", conv)[0]
        else:
            lower = keys.hidden_key(conv, after.turn, after.seq + 1)
        upper = keys.hidden_key(conv, before.turn, before.seq) if before is not None else keys.conv_range(b"H", conv)[1]
        hidden: list[StoredMessage] = []
        for key, value in snap.scan(lower, upper):
            if limit is not None and len(hidden) >= limit:
                break
            hidden.append(_hidden(key, value))
        merged = sorted(visible + hidden, key=lambda m: m.position)
        return merged if limit is None else merged[:limit]

    def turn(self, conv: str, message_id_: str) -> HistoryTurn:
        """The visible turn holding the message ``message_id_``; ``NotFound`` otherwise."""
        snap = self.store.iterator()
        c = conv.encode("utf-8")
        conv = str(conv)
        if self._open_row(snap, c) is None:
            raise NotFound(f"conversation {conv!r} has no message {message_id_!r} (unknown or cleared conversation)")
        append_id, _, index = message_id_.rpartition("/")
        raw = snap.get(keys.receipt_key(c, append_id.encode("utf-8"))) if append_id and index.isdigit() else None
        receipt = keys.ReceiptRow.decode(raw) if raw is not None else None
        if receipt is None or int(index) >= receipt.count:
            raise NotFound(f"conversation {conv!r} has no message {message_id_!r} "
                           "(message ids are APPEND_ID/INDEX, as entries() shows them)")
        value = snap.get(keys.message_key(c, receipt.first_seq + int(index)))
        if value is None:
            raise NotFound(f"message {message_id_!r} of {conv!r} is hidden: its turn was replaced "
                           "(entries(..., include_hidden=True) lists it)")
        turn = keys.MessageRow.decode_head(value)[0]
        if turn == 0:
            raise NotFound(f"message {message_id_!r} of {conv!r} comes before the first user message: "
                           "it belongs to no turn")
        return self._turn(snap, c, turn)

    def latest_turn(self, conv: str) -> HistoryTurn | None:
        """The latest visible user-led turn, or None."""
        snap = self.store.iterator()
        c = conv.encode("utf-8")
        row = self._open_row(snap, c)
        if row is None or row.turn == 0 or row.messages == 0:
            return None
        return self._turn(snap, c, row.turn)

    def _turn(self, snap: Snapshot, conv: bytes, turn: int) -> HistoryTurn:
        raw = snap.get(keys.turn_key(conv, turn))
        assert raw is not None  # Invariant: a visible message's turn is indexed (same WriteBatch).
        messages: list[StoredMessage] = []
        for key, value in snap.scan(keys.message_key(conv, keys.read_u64(raw)), keys.conv_range(b"M", conv)[1]):
            row = keys.MessageRow.decode(value)
            if row.turn != turn:
                break
            messages.append(_stored(row, _seq_of(key)))
        assistant = [m.id for m in messages if m.message.role == Role.ASSISTANT]
        first = messages[0].id
        return HistoryTurn(first, turn, first, assistant[-1] if assistant else None, messages)

    def latest_interrupted_checkpoint(self, conv: str) -> StoredMessage | None:
        """The newest assistant message, if its metadata ``interrupted`` is JSON ``true``: an
        interrupted step no later assistant message completed (user and tool messages after it do
        not cancel it). Walks the narrow rows back to the newest assistant message."""
        snap = self.store.iterator()
        c = conv.encode("utf-8")
        if self._open_row(snap, c) is None:
            return None
        assistant = keys.ROLE_CODES["assistant"]
        for key, value in snap.scan_reverse(*keys.conv_range(b"N", c)):
            _, _, _, role, flags, _, _ = keys.SourceRow.decode(value)
            if role != assistant:
                continue
            if not flags & keys.FLAG_INTERRUPTED:
                return None
            seq = _seq_of(key)
            row = snap.get(keys.message_key(c, seq))
            assert row is not None  # Invariant: N and M rows are written and deleted together.
            return _stored(keys.MessageRow.decode(row), seq)
        return None

    def _first_turn_seq(self, snap: Snapshot, conv: bytes, turn: int) -> int | None:
        """The first seq of the first turn whose position is ``>= turn``."""
        upper = keys.conv_range(b"T", conv)[1]
        for _, v in snap.scan(keys.turn_key(conv, turn), upper):
            return keys.read_u64(v)
        return None

    def _open_row(self, snap: Snapshot, conv: bytes) -> keys.ConversationRow | None:
        raw = snap.get(keys.conv_key(conv))
        row = keys.ConversationRow.decode(raw) if raw is not None else None
        return None if row is None or row.closed else row

    def _seq_range(self, snap: Snapshot, conv: bytes, after: HistoryPosition | None,
                   before: HistoryPosition | None) -> tuple[int, int]:
        """``[lo, hi)``: the seqs of the messages with ``after < position < before`` (position
        order is seq order, so the cursors become a key range in O(1) seeks)."""
        lo = 1 if after is None or after <= HistoryPosition.START else self._first_seq_after(snap, conv, after)
        if before is None:
            return lo, _NO_BOUND
        if before.seq > 0:
            hi = self._first_seq_after(snap, conv, HistoryPosition(before.turn, before.seq - 1))
        else:  # nothing of turn ``before.turn`` or later
            first = self._first_turn_seq(snap, conv, before.turn)
            hi = first if first is not None else _NO_BOUND
        return lo, max(lo, min(hi, _NO_BOUND))

    def _first_seq_after(self, snap: Snapshot, conv: bytes, after: HistoryPosition) -> int:
        """A seq from which every message is ``> after`` and before which none is (turns grow with seq)."""
        big = 1 << 62
        later_turn = self._first_turn_seq(snap, conv, after.turn + 1)
        same_turn = self._first_turn_seq(snap, conv, after.turn)
        same = max(after.seq + 1, same_turn) if same_turn is not None else big
        return min(later_turn if later_turn is not None else big, same)

    def _within_bytes(self, snap: Snapshot, prefix: bytes, conv: bytes, lo: int, hi: int, max_bytes: int,
                      unit: Unit, head: Callable[[bytes], tuple[int, int]]) -> tuple[list[tuple[int, bytes]], bool]:
        """Newest first over the rows ``prefix conv seq`` with ``lo <= seq < hi``: a unit (the rows
        of one turn position, or one row) is kept while the content bytes of the strictly newer
        kept units are below ``max_bytes``. Returns the kept ``(seq, value)`` in stored order and
        whether older rows of the range were left out. Visits the kept rows plus one."""
        lower = prefix + conv + keys.SEP + keys.u64(lo)
        upper = prefix + conv + keys.SEP + keys.u64(hi) if hi < _NO_BOUND else keys.conv_range(prefix, conv)[1]
        kept: list[tuple[int, bytes]] = []
        spent = unit_bytes = 0
        current: int | None = None
        per_message = unit == "message"
        for key, value in snap.scan_reverse(lower, upper):
            turn, size = head(value)
            if per_message or turn != current:
                spent += unit_bytes
                if spent >= max_bytes:
                    kept.reverse()
                    return kept, True
                current, unit_bytes = turn, 0
            unit_bytes += size
            kept.append((_seq_of(key), value))
        kept.reverse()
        return kept, False

    def within_bytes(self, conv: str, max_bytes: int, after: HistoryPosition, before: HistoryPosition | None,
                     unit: Unit) -> HistoryLoad[StoredMessage]:
        """The byte-budgeted window (API.md ``read_within_bytes``) in O(window)."""
        bounds = _cursors(after, before)
        snap = self.store.iterator()
        c = conv.encode("utf-8")
        if bounds is _NOTHING or self._open_row(snap, c) is None:
            return HistoryLoad([], False)
        lo, hi = self._seq_range(snap, c, *bounds)  # type: ignore[misc]
        rows, truncated = self._within_bytes(snap, b"M", c, lo, hi, max_bytes, unit, _message_head)
        return HistoryLoad([_stored(keys.MessageRow.decode(v), seq) for seq, v in rows], truncated)

    def turn_sources(self, conv: str, max_bytes: int, after: HistoryPosition, before: HistoryPosition | None,
                     unit: Unit) -> HistoryLoad[TurnSource]:
        """The same window over the narrow turn-source rows: no message row is read."""
        bounds = _cursors(after, before)
        snap = self.store.iterator()
        c = conv.encode("utf-8")
        if bounds is _NOTHING or self._open_row(snap, c) is None:
            return HistoryLoad([], False)
        lo, hi = self._seq_range(snap, c, *bounds)  # type: ignore[misc]
        rows, truncated = self._within_bytes(snap, b"N", c, lo, hi, max_bytes, unit, keys.SourceRow.decode_head)
        return HistoryLoad([_source(v) for _, v in rows], truncated)

    def measure(self, conv: str, after: HistoryPosition) -> Measure:
        """Messages, content bytes and turns after ``after``: the conversation's totals minus the
        running sums stored before the first message after it (two point reads, no payload)."""
        snap = self.store.iterator()
        c = conv.encode("utf-8")
        row = self._open_row(snap, c)
        bounds = _cursors(after, None)
        if row is None or bounds is _NOTHING:
            return Measure(0, 0, 0)
        lo, _ = self._seq_range(snap, c, *bounds)  # type: ignore[misc]
        for _, value in snap.scan(keys.aggregate_key(c, lo), keys.conv_range(b"A", c)[1]):
            messages, content, turns = keys.AggregateRow.decode(value)
            return Measure(row.messages - messages, row.content_bytes - content, row.turns - turns)
        return Measure(0, 0, 0)

    def window(self, conv: str, limit: int) -> list[Message]:
        """``WindowReader`` semantics in O(limit): the merged system message plus the longest
        suffix of whole turns that fits. Raises ``WindowTooSmall`` as WindowReader does."""
        snap = self.store.iterator()
        c = conv.encode("utf-8")
        raw = snap.get(keys.conv_key(c))
        if raw is None or keys.ConversationRow.decode(raw).closed:
            return []
        system_seqs = [_seq_of(k) for k, _ in snap.scan(*keys.conv_range(b"S", c))]
        system: list[Message] = []
        for seq in system_seqs:
            row_bytes = snap.get(keys.message_key(c, seq))
            assert row_bytes is not None  # Invariant: S rows index existing M rows (same WriteBatch).
            system.append(Message.from_stored(keys.MessageRow.decode(row_bytes).canonical))
        budget = limit - (1 if system else 0)
        # Walk back through non-system rows, one turn group at a time, reading at most budget+2
        # rows: past the budget nothing more can fit. A group cut short by that bound is already
        # larger than what is left, so fit_turns never takes it.
        turns: list[list[bytes]] = []
        current_turn, total = -1, 0
        for _, value in snap.scan_reverse(*keys.conv_range(b"M", c)):
            turn, role, _ = keys.MessageRow.decode_head(value)
            if role == _SYSTEM:
                continue
            if turn != current_turn:
                if total > budget:
                    break
                turns.append([])
                current_turn = turn
            turns[-1].append(value)
            total += 1
            if total > budget + 1:
                break
        parsed = [[Message.from_stored(keys.MessageRow.decode(v).canonical) for v in reversed(t)]
                  for t in turns]
        suffix = fit_turns(parsed, budget)
        return ([merge_system(system)] if system else []) + suffix
