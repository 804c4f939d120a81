"""Queries over the built-in projections. Each query runs on one ``Snapshot`` (a point-in-time
RocksDB iterator), so it never mixes two projector steps. Window queries touch O(window) rows.
The prologue every query shares (``_open``) and the reads of turns are ``turn_reads``'; the
cursor-to-ordinal rules and the row decoders are here; the larger pieces live beside it:
``navigation``, ``by_ids``, ``window``, ``runs``, ``assets``.

Visible rows are keyed by ordinal (``keys``). Cursors are positions ``(turn, seq)``; the turn
index maps a turn position to its first message's ``(seq, ordinal)``, and within a visible turn
seqs and ordinals are both contiguous, so a cursor becomes an ordinal bound in O(1) seeks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Literal

from projections import assets, by_ids, feature_keys, keys, navigation, runs
from projections.navigation import Order, message_id
from projections.rows import FLAG_INTERRUPTED, AggregateRow, ConversationRow, MessageRow, SourceRow
from projections.store import Snapshot
from projections.turn_reads import Opened, TurnReads
from projections.window import fit_turns, merge_system
from schemas.assets import AssetRef
from schemas.batch import HistoryLoad, Located, Measure, StoredMessage, StoredWindow, TurnSource
from schemas.errors import NotFound
from schemas.ids import ConversationID, MessageID
from schemas.messages import Message, Role
from schemas.positions import HistoryPosition, LogPosition
from schemas.times import time_of

__all__ = ["Reads"]

_SYSTEM = keys.ROLE_CODES["system"]
_USER = keys.ROLE_CODES["user"]
_ROLES = {code: Role(name) for name, code in keys.ROLE_CODES.items()}

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


_stored = navigation.stored
_hidden = navigation.stored_hidden


def _time(ms: int) -> datetime:
    return time_of(ms)  # the one conversion of event times, exact (admission only stores representable ones)


def _source(value: bytes) -> TurnSource:
    _, created, index, role, flags, append_id, content = SourceRow.decode(value)
    return TurnSource(message_id(append_id, index), _ROLES[role], content, _time(created),
                      bool(flags & FLAG_INTERRUPTED))


def _message_head(value: bytes) -> tuple[int, int]:
    turn, _, size = MessageRow.decode_head(value)
    return turn, size


_ord_of = keys.read_key_u64


class Reads(TurnReads):
    """Read side of the built-in projections (the prologue every read shares and the reads of
    turns are ``projections.turn_reads``')."""

    def conversation(self, conv: str) -> ConversationRow | None:
        raw = self.store.get(keys.conv_key(conv.encode("utf-8")))
        return ConversationRow.decode(raw) if raw is not None else None

    def poison(self) -> list[tuple[LogPosition, str]]:
        """Quarantined poison records in position order."""
        out = []
        for k, v in self.store.iterator().scan(*keys.poison_range()):
            out.append((LogPosition(*keys.read_poison_key(k)), v.decode("utf-8")))
        return out

    def conversations(self) -> list[ConversationID]:
        """Every open conversation, in lexical order (the ``O`` index: no closed one is visited)."""
        return self.conversation_page("", None, None)

    def closed(self, conv: str) -> bool:
        """Whether ``conv`` was cleared (one point read)."""
        raw = self.store.iterator().get(keys.conv_key(conv.encode("utf-8")))
        return raw is not None and ConversationRow.decode(raw).closed

    # -- positions -------------------------------------------------------------------------------
    def _first_ord_after(self, snap: Snapshot, conv: bytes, row: ConversationRow, after: HistoryPosition) -> int:
        """The first ordinal whose message is ``> after`` (``row.messages`` when none is)."""
        later = self._turn_at(snap, conv, after.turn + 1)
        bound = later[2] if later is not None else row.messages
        same = self._turn_at(snap, conv, after.turn)
        if same is not None and same[0] == after.turn:
            if not row.deleted:  # inside turn ``after.turn``: seqs run with ordinals
                return min(bound, same[2] + max(after.seq + 1 - same[1], 0))
            lo, hi = same[2], bound  # deletes left gaps in its seqs: a bisection, O(log turn) point reads
            while lo < hi:
                mid = (lo + hi) // 2
                value = snap.get(keys.message_key(conv, mid))
                assert value is not None  # Invariant: ordinals below the count are all visible rows.
                if MessageRow.decode(value).seq > after.seq:
                    hi = mid
                else:
                    lo = mid + 1
            return lo
        return bound

    def _ord_range(self, snap: Snapshot, conv: bytes, row: ConversationRow, after: HistoryPosition | None,
                   before: HistoryPosition | None) -> tuple[int, int]:
        """``[lo, hi)``: the ordinals of the visible messages with ``after < position < before``."""
        count = row.messages
        lo = 0 if after is None else self._first_ord_after(snap, conv, row, after)
        if before is None:
            return lo, count
        if before.seq > 0:
            hi = self._first_ord_after(snap, conv, row, HistoryPosition(before.turn, before.seq - 1))
        else:  # nothing of turn ``before.turn`` or later
            first = self._turn_at(snap, conv, before.turn)
            hi = first[2] if first is not None else count
        return lo, max(lo, hi)

    # -- the full history ----------------------------------------------------------------------
    def messages(self, conv: str) -> list[Message]:
        opened = self._open(conv)
        if opened is None:
            return []
        snap, c, row = opened
        canonical_of = MessageRow.canonical_of
        return [Message.from_stored(canonical_of(v))
                for _, v in snap.scan(keys.message_key(c, 0), keys.message_key(c, row.messages))]

    def entries(self, conv: str, after: HistoryPosition | None, before: HistoryPosition | None,
                limit: int | None, include_hidden: bool = False, order: Order = "asc",
                since_ms: int | None = None, until_ms: int | None = None) -> list[StoredMessage]:
        """Messages with ``after < position < before`` and ``since_ms <= created_at < until_ms``,
        at most ``limit``: the oldest in stored order (``asc``) or the newest, newest first
        (``desc``); with ``include_hidden``, the messages of replaced turns too (merged by
        position). Visits the result plus O(1) keys (``navigation``)."""
        bounds = _cursors(after, before)
        opened = None if bounds is _NOTHING else self._open(conv)
        if opened is None:
            return []
        snap, c, row = opened
        after, before = bounds  # type: ignore[misc]
        lo, hi = self._ord_range(snap, c, row, after, before)
        lo, hi = navigation.time_range(snap, c, row.messages, lo, hi, since_ms, until_ms)
        out = navigation.visible_page(snap, c, lo, hi, limit, order)
        if not include_hidden:
            return out
        hidden = navigation.hidden_page(snap, c, after, before, limit, order, since_ms, until_ms)
        merged = sorted(out + hidden, key=lambda m: m.position, reverse=order == "desc")
        return merged if limit is None else merged[:limit]

    def position_of(self, conv: str, message_id_: str) -> HistoryPosition:
        """The position of the visible message ``message_id_``; ``NotFound`` otherwise (two point reads)."""
        _, _, _, message = self._visible_message(conv, message_id_)
        return HistoryPosition(message.turn, message.seq)

    def locate(self, conv: str, external_id: str, before: int, after: int) -> Located:
        """``navigation.locate``; ``NotFound`` when no visible message has that external id."""
        conv = str(conv)
        opened = self._open(conv)
        found = None if opened is None else navigation.locate(opened.snap, opened.conv, opened.row.messages,
                                                              external_id, before, after)
        if found is None:
            raise NotFound(f"conversation {conv!r} has no visible message with external_id {external_id!r}")
        return found

    def conversation_page(self, prefix: str, after: str | None, limit: int | None,
                          keep: Callable[[bytes], bool] | None = None) -> list[ConversationID]:
        """``navigation.conversation_page`` on one snapshot."""
        return navigation.conversation_page(self.store.iterator(), prefix, after, limit, keep)

    def entries_by_ids(self, conv: str, ids: Sequence[MessageID]) -> list[StoredMessage]:
        """The visible messages ``ids`` names, in history order, each once (``projections.by_ids``)."""
        opened = self._open(conv)
        if opened is None:
            return []

        snap, c, _ = opened

        def pick(value: bytes, append_id: str, index: int, seq: int) -> StoredMessage | None:
            row = MessageRow.decode(value)
            return _stored(row, None, None, snap, c) if row.seq == seq else None  # between point reads

        return by_ids.visible_rows(snap, c, opened.row, ids, keys.message_key, pick)

    def turn_sources_by_ids(self, conv: str, ids: Sequence[MessageID]) -> list[TurnSource]:
        """``entries_by_ids`` narrowed to ``TurnSource`` (the ``N`` rows: no metadata is read)."""
        opened = self._open(conv)
        if opened is None:
            return []

        def pick(value: bytes, append_id: str, index: int, seq: int) -> TurnSource | None:
            _, created, at, role, flags, stored_append, content = SourceRow.decode(value)
            if stored_append != append_id or at != index:  # a replacement's row holds the ordinal
                return None
            return TurnSource(message_id(append_id, index), _ROLES[role], content, _time(created),
                              bool(flags & FLAG_INTERRUPTED))

        return by_ids.visible_rows(opened.snap, opened.conv, opened.row, ids, keys.source_key, pick)

    def message_assets(self, conv: str, message_id_: str) -> tuple[AssetRef, ...] | None:
        """The assets of the visible message ``message_id_`` in ordinal order; None when it is not
        visible (unknown, hidden, or the conversation unknown or cleared). Three point reads and a seek."""
        opened = self._open(conv)
        if opened is None:
            return None
        found = assets.visible_seq(opened.snap, opened.conv, message_id_, opened.row)
        return None if isinstance(found, str) else assets.assets_of(opened.snap, opened.conv, found[0])

    # -- runs (projections.runs) ----------------------------------------------------------------
    def run_epoch(self, conv: str, run_id: str) -> int:
        """The epoch of run ``run_id`` (0: not begun here, or cleared). One point read."""
        return runs.epoch_of(self.store, conv.encode("utf-8"), run_id)

    def run_of_epoch(self, conv: str, epoch: int) -> str | None:
        """The run that has ``epoch`` in ``conv``, or None. One point read."""
        return runs.run_of_epoch(self.store, conv.encode("utf-8"), epoch)

    def run_wrote_history(self, conv: str, run_id: str, root_turn: str | None) -> bool:
        """Whether the run wrote a message, hidden ones included (in turn ``root_turn`` if given)."""
        return runs.wrote_history(self.store.iterator(), conv.encode("utf-8"), run_id, root_turn)

    def run_request(self, conv: str, run_id: str, root_turn: str) -> MessageID | None:
        """The run's newest visible user message, else ``root_turn`` when it is a visible user
        message, else None: a seek, then two point reads per hidden request stepped over."""
        opened = self._open(conv)
        if opened is None:
            return None
        snap, c, row = opened

        def pick(value: bytes, append_id: str, index: int, seq: int) -> bool | None:
            head = MessageRow.decode(value)
            return True if head.seq == seq and head.role == _USER else None

        for wanted in runs.run_requests(snap, c, run_id):
            if by_ids.visible_rows(snap, c, row, [wanted], keys.message_key, pick):
                return wanted
        root = MessageID.parse(root_turn)
        slot = snap.get(feature_keys.slot_key(c, root.append_id.encode("utf-8"))) if root.index == 0 else None
        if slot is not None:  # a slotted turn: its request is the first message of its T row
            raw = snap.get(keys.turn_key(c, feature_keys.read_slot_value(slot)[0]))
            if raw is None or keys.read_turn_id(raw) != root_turn:
                return None
            value = snap.get(keys.message_key(c, keys.read_turn_value(raw)[1]))
            assert value is not None  # Invariant: T rows index visible M rows (same WriteBatch).
            head = MessageRow.decode(value)
            if head.role != _USER:  # its request was deleted
                return None
            return MessageID.parse(MessageID.format(head.append_id, head.index))
        return root if by_ids.visible_rows(snap, c, row, [root], keys.message_key, pick) else None

    def latest_interrupted_checkpoint(self, conv: str) -> StoredMessage | None:
        """The newest assistant message, if its metadata ``interrupted`` is JSON ``true``: an
        interrupted step no later assistant message completed (user and tool messages after it do
        not cancel it). Walks the narrow rows back to the newest assistant message."""
        opened = self._open(conv)
        if opened is None:
            return None
        snap, c, row = opened
        assistant = keys.ROLE_CODES["assistant"]
        for key, value in snap.scan_reverse(keys.source_key(c, 0), keys.source_key(c, row.messages)):
            _, _, _, role, flags, _, _ = SourceRow.decode(value)
            if role != assistant:
                continue
            if not flags & FLAG_INTERRUPTED:
                return None
            message = snap.get(keys.message_key(c, _ord_of(key)))
            assert message is not None  # Invariant: N and M rows are written together.
            return _stored(MessageRow.decode(message), None, None, snap, c)  # the scan stops here
        return None

    # -- budgets and measures ----------------------------------------------------------------------
    def _within_bytes(self, snap: Snapshot, key: Callable[[bytes, int], bytes], conv: bytes, lo: int, hi: int,
                      max_bytes: int, unit: Unit, head: Callable[[bytes], tuple[int, int]]) -> tuple[list[bytes], bool]:
        """Newest first over the rows ``key(conv, ord)`` with ``lo <= ord < hi``: a unit (the rows
        of one turn position, or one row) is kept while the content bytes of the strictly newer
        kept units are below ``max_bytes``. Returns the kept rows in stored order and whether
        older rows of the range were left out. Visits the kept rows plus one."""
        kept: list[bytes] = []
        spent = unit_bytes = 0
        current: int | None = None
        per_message = unit == "message"
        for _, value in snap.scan_reverse(key(conv, lo), key(conv, hi)):
            turn, size = head(value)
            if per_message or turn != current:
                spent += unit_bytes
                if spent >= max_bytes:
                    kept.reverse()
                    return kept, True
                current, unit_bytes = turn, 0
            unit_bytes += size
            kept.append(value)
        kept.reverse()
        return kept, False

    def within_bytes(self, conv: str, max_bytes: int, after: HistoryPosition, before: HistoryPosition | None,
                     unit: Unit) -> HistoryLoad[StoredMessage]:
        """The byte-budgeted window (``read_within_bytes``, docs/design.md §5.2) in O(window)."""
        opened = self._open(conv)
        rows, truncated = self._budget(opened, max_bytes, after, before, unit, keys.message_key, _message_head)
        return HistoryLoad(_stored_rows(opened, rows), truncated)

    def turn_sources(self, conv: str, max_bytes: int, after: HistoryPosition, before: HistoryPosition | None,
                     unit: Unit) -> HistoryLoad[TurnSource]:
        """The same window over the narrow turn-source rows: no message row is read."""
        rows, truncated = self._budget(self._open(conv), max_bytes, after, before, unit, keys.source_key,
                                       SourceRow.decode_head)
        return HistoryLoad([_source(v) for v in rows], truncated)

    def _budget(self, opened: Opened | None, max_bytes: int, after: HistoryPosition, before: HistoryPosition | None,
                unit: Unit, key: Callable[[bytes, int], bytes], head: Callable[[bytes], tuple[int, int]]
                ) -> tuple[list[bytes], bool]:
        bounds = _cursors(after, before)
        if opened is None or bounds is _NOTHING:
            return [], False
        snap, c, row = opened
        lo, hi = self._ord_range(snap, c, row, *bounds)  # type: ignore[misc]
        return self._within_bytes(snap, key, c, lo, hi, max_bytes, unit, head)

    def measure(self, conv: str, after: HistoryPosition) -> Measure:
        """Messages, content bytes and turns after ``after``: the conversation's totals minus the
        running sums stored before the first message after it (the summary row, the cursor's turn rows
        and the ``A`` row of that message's batch, found by one floor seek: no payload)."""
        bounds = _cursors(after, None)
        opened = None if bounds is _NOTHING else self._open(conv)
        if opened is None:
            return Measure(0, 0, 0)
        snap, c, row = opened
        lo, _ = self._ord_range(snap, c, row, *bounds)  # type: ignore[misc]
        if lo >= row.messages:
            return Measure(0, 0, 0)
        found = snap.floor(keys.aggregate_key(c, 0), keys.aggregate_key(c, lo))
        assert found is not None  # Invariant: ordinal 0 starts a batch, and every visible batch has its A row.
        first, value = found
        k = lo - keys.read_key_u64(first)  # the batch's ordinals are contiguous from its first
        assert k < AggregateRow.count(value)  # Invariant: the floor batch holds ``lo`` (full.append).
        content, turns = AggregateRow.at(value, k)
        return Measure(row.messages - lo, row.content_bytes - content, row.turns - turns)

    # -- the message-count window ------------------------------------------------------------------
    def window(self, conv: str, limit: int, before: HistoryPosition | None = None) -> list[Message]:
        """``WindowReader`` semantics in O(limit): the merged system message plus the longest
        suffix of whole turns that fits. Raises ``WindowTooSmall`` as WindowReader does. The
        rows are ``_window_rows``'s, so ``window_entries`` shows where each of these is stored. With
        ``before``, the window of the messages before that position (a retry's history)."""
        system, suffix = self._window_rows(self._open(conv), limit, before)
        head = [merge_system([_message(v) for v in system])] if system else []
        return head + [_message(v) for v in suffix]

    def window_canonical(self, conv: str, limit: int, before: HistoryPosition | None = None) -> list[bytes]:
        """``window``'s messages as their canonical JSON, the suffix's straight from the rows it
        stored (no decoding, no re-validation: what the service sends as it is)."""
        system, suffix = self._window_rows(self._open(conv), limit, before)
        head = [merge_system([_message(v) for v in system]).canonical_json()] if system else []
        return head + [MessageRow.canonical_of(v) for v in suffix]

    # -- reads whose result carries where each message is stored ----------------------------------
    def _window_rows(self, opened: Opened | None, limit: int, before: HistoryPosition | None = None
                     ) -> tuple[list[bytes], list[bytes]]:
        """The M rows of the window (of the messages before ``before``, when given): the system
        messages' (to merge) and those of the longest suffix of whole turns that fits next to
        them, in stored order. Visits O(limit) rows."""
        bounds = _cursors(None, before)
        if opened is None or bounds is _NOTHING:
            return [], []
        snap, c, row = opened
        _, end = self._ord_range(snap, c, row, *bounds)  # type: ignore[misc]
        system: list[bytes] = []
        system_ords = [_ord_of(k) for k, _ in snap.scan(keys.system_key(c, 0), keys.system_key(c, end))]
        for ord_ in system_ords:  # after the scan: a point read moves the snapshot's one iterator
            value = snap.get(keys.message_key(c, ord_))
            assert value is not None  # Invariant: S rows index visible M rows (same WriteBatch).
            system.append(value)
        budget = limit - (1 if system else 0)
        # Walk back through non-system rows, one turn group at a time, reading at most budget+2
        # rows: past the budget nothing more can fit. A group cut short by that bound is already
        # larger than what is left, so fit_turns never takes it.
        turns: list[list[bytes]] = []
        current_turn, total = -1, 0
        for _, value in snap.scan_reverse(keys.message_key(c, 0), keys.message_key(c, end)):
            turn, role, _ = MessageRow.decode_head(value)
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
        return system, fit_turns([t[::-1] for t in turns], budget)

    def window_entries(self, conv: str, limit: int) -> StoredWindow:
        """``window``'s messages from the same rows, with their stored form (positions, ids)."""
        opened = self._open(conv)
        system, suffix = self._window_rows(opened, limit)
        merged = merge_system([_message(v) for v in system]) if system else None
        return StoredWindow(merged, _stored_rows(opened, suffix))

def _stored_rows(opened: Opened | None, values: list[bytes]) -> list[StoredMessage]:
    """``navigation.stored_all`` of a read's ``M`` rows, on the snapshot they were read from."""
    return navigation.stored_all(opened.snap, opened.conv, values) if opened is not None else []


def _message(value: bytes) -> Message:
    """The message of an M row, without decoding the rest of the row."""
    return Message.from_stored(MessageRow.canonical_of(value))

