"""The prologue every read of one conversation shares (a snapshot, the key bytes, the summary
row: ``TurnReads._open``; the turn index: ``_turn_at``) and the reads of its turns (``turn``,
``latest_turn``, ``turns``), a slotted turn's id included (``projections.slots``). A base of
``projections.reads.Reads``, which keeps the other queries.
"""

from __future__ import annotations

from typing import NamedTuple

from projections import deletes, feature_keys, full, keys, navigation
from projections.rows import ConversationRow, MessageRow, ReceiptRow
from projections.store import Snapshot, StateStore
from schemas.batch import HistoryTurn, StoredMessage
from schemas.errors import NotFound
from schemas.ids import MessageID
from schemas.messages import Role

__all__ = ["Opened", "TurnReads"]


class Opened(NamedTuple):
    """What every read of one conversation starts from (``TurnReads._open``)."""

    snap: Snapshot
    conv: bytes  # the conversation id's UTF-8 bytes, as keys take it
    row: ConversationRow  # its summary row: the conversation is open


class TurnReads:
    """The prologue of every read of one conversation (``_open``, ``_turn_at``) and the reads of
    its turns; ``projections.reads.Reads`` builds the rest on them."""

    def __init__(self, store: StateStore) -> None:
        self.store = store

    def _open(self, conv: str) -> Opened | None:
        """The one prologue of every read of one conversation: a snapshot (so the read never mixes
        two projector steps), the key bytes of ``conv`` and its summary row; None when ``conv`` is
        unknown or cleared (the read has nothing to return). One point read."""
        snap = self.store.iterator()
        c = conv.encode("utf-8")
        raw = snap.get(keys.conv_key(c))
        row = ConversationRow.decode(raw) if raw is not None else None
        return None if row is None or row.closed else Opened(snap, c, row)

    def _turn_at(self, snap: Snapshot, conv: bytes, turn: int) -> tuple[int, int, int] | None:
        """``(turn, first seq, first ordinal)`` of the first visible turn whose position is ``>= turn``."""
        for key, value in snap.scan(keys.turn_key(conv, turn), keys.conv_range(keys.TURN, conv)[1]):
            return (keys.read_key_u64(key), *keys.read_turn_value(value))
        return None

    # -- turns ---------------------------------------------------------------------------------
    def turn(self, conv: str, message_id_: str) -> HistoryTurn:
        """The visible turn holding the message ``message_id_``; ``NotFound`` otherwise."""
        conv = str(conv)
        try:
            wanted = MessageID.parse(message_id_)  # before any read: a malformed id names no message
        except NotFound as e:
            raise NotFound(f"conversation {conv!r}: {e}") from None
        slotted = self._slotted_turn(conv, message_id_, wanted) if wanted.index == 0 else None
        if slotted is not None:
            return slotted
        snap, c, row, message = self._visible_message(conv, message_id_, wanted)
        if message.turn == 0:
            raise NotFound(f"message {message_id_!r} of {conv!r} comes before the first user message: "
                           "it belongs to no turn")
        return self._turn(snap, c, row.messages, message.turn, row.named_turns)

    def _slotted_turn(self, conv: str, turn_id: str, wanted: MessageID) -> HistoryTurn | None:
        """The visible turn filed under slot ``turn_id`` (``<slot id>/0``), None when no slot has
        that id; ``NotFound`` when the slot's turn has no visible rows (unused, or replaced)."""
        opened = self._open(conv)
        if opened is None:
            return None
        snap, c, row = opened
        slot = snap.get(feature_keys.slot_key(c, wanted.append_id.encode("utf-8")))
        if slot is None:
            return None
        position = feature_keys.read_slot_value(slot)[0]
        raw = snap.get(keys.turn_key(c, position))
        if raw is None or keys.read_turn_id(raw) != turn_id:
            raise NotFound(f"turn slot {turn_id!r} of {conv!r} has no visible turn (unused, or its turn was replaced)")
        return self._turn(snap, c, row.messages, position, row.named_turns)

    def _visible_message(self, conv: str, message_id_: str, wanted: MessageID | None = None
                         ) -> tuple[Snapshot, bytes, ConversationRow, MessageRow]:
        """The row of the visible message ``message_id_`` (its receipt names its ordinal);
        ``NotFound`` for an unknown, malformed or hidden one."""
        if wanted is None:
            try:
                wanted = MessageID.parse(message_id_)
            except NotFound as e:
                raise NotFound(f"conversation {conv!r}: {e}") from None
        opened = self._open(conv)
        if opened is None:
            raise NotFound(f"conversation {conv!r} has no message {message_id_!r} (unknown or cleared conversation)")
        snap, c, row = opened
        raw = snap.get(keys.receipt_key(c, wanted.append_id.encode("utf-8")))
        receipt = ReceiptRow.decode(raw) if raw is not None else None
        if receipt is None or wanted.index >= receipt.count:
            raise NotFound(f"conversation {conv!r} has no message {message_id_!r} "
                           "(message ids are APPEND_ID/INDEX, as entries() shows them)")
        ord_ = deletes.ordinal_of(snap, c, row, wanted.append_id.encode("utf-8"), receipt, wanted.index)
        if ord_ is None:
            raise NotFound(f"message {message_id_!r} of {conv!r} was deleted (delete_messages)")
        seq = receipt.first_seq + wanted.index
        value = snap.get(keys.message_key(c, ord_)) if ord_ < row.messages else None
        message = MessageRow.decode(value) if value is not None else None
        if message is None or message.seq != seq:  # its turn was replaced: another message has the ordinal now
            raise NotFound(f"message {message_id_!r} of {conv!r} is hidden: its turn was replaced "
                           "(entries(..., include_hidden=True) lists it)")
        return snap, c, row, message

    def latest_turn(self, conv: str) -> HistoryTurn | None:
        """The latest visible user-led turn, or None."""
        opened = self._open(conv)
        if opened is None:
            return None
        snap, c, row = opened
        turn = full.visible_turn(snap, c, row)
        if turn == 0:
            return None
        return self._turn(snap, c, row.messages, turn, row.named_turns)

    def _turn(self, snap: Snapshot, conv: bytes, count: int, turn: int, named: bool) -> HistoryTurn:
        found = self._turn_at(snap, conv, turn)
        assert found is not None and found[0] == turn  # Invariant: a visible message's turn is indexed.
        # Before the scan (a snapshot has one iterator); only a conversation with slots or deletes has one.
        slotted = self._slotted_ids(snap, conv, turn, turn + 1) if named else {}
        values: list[bytes] = []
        for _, value in snap.scan(keys.message_key(conv, found[2]), keys.message_key(conv, count)):
            if MessageRow.decode_head(value)[0] != turn:
                break
            values.append(value)
        return _as_turn(turn, navigation.stored_all(snap, conv, values), slotted.get(turn))

    def _slotted_ids(self, snap: Snapshot, conv: bytes, lo: int, hi: int) -> dict[int, str]:
        """The ids kept in the ``T`` rows of the visible turns of positions ``[lo, hi)`` (a slot's, or
        that of a turn whose first message was deleted; one scan of their ``T`` rows: O(turns); the
        callers skip it unless ``ConversationRow.named_turns``)."""
        found: dict[int, str] = {}
        for key, value in snap.scan(keys.turn_key(conv, lo), keys.turn_key(conv, hi)):
            slotted = keys.read_turn_id(value)
            if slotted is not None:
                found[keys.read_key_u64(key)] = slotted
        return found
    def turns(self, conv: str) -> list[HistoryTurn]:
        """Every visible user-led turn in order, each as ``turn()`` builds it, from one scan of
        the message rows starting at the first turn's first message (the rows before it belong
        to no turn): O(messages returned). The last one is ``latest_turn()``."""
        opened = self._open(conv)
        if opened is None:
            return []
        snap, c, row = opened
        first = self._turn_at(snap, c, 1) if row.turn > 0 else None
        if first is None:
            return []
        slotted = self._slotted_ids(snap, c, first[0], row.turn + 1) if row.named_turns else {}
        groups: list[list[bytes]] = []
        current = -1
        for _, value in snap.scan(keys.message_key(c, first[2]), keys.message_key(c, row.messages)):
            turn = MessageRow.decode_head(value)[0]
            if turn != current:
                groups.append([])
                current = turn
            groups[-1].append(value)
        turns = [navigation.stored_all(snap, c, group) for group in groups]  # the scan is done: assets may seek
        return [_as_turn(group[0].position.turn, group, slotted.get(group[0].position.turn)) for group in turns]


def _as_turn(turn: int, messages: list[StoredMessage], slotted: str | None = None) -> HistoryTurn:
    """The ``HistoryTurn`` of turn position ``turn`` from its visible messages in stored order;
    its id is ``slotted`` (its slot's) when it was filed under a slot, else its first message's."""
    assistant = [m.id for m in messages if m.message.role == Role.ASSISTANT]
    first = messages[0].id
    return HistoryTurn(slotted or first, turn, first, assistant[-1] if assistant else None, messages)
