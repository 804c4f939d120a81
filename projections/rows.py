"""The value formats of histlog's state rows (their keys, and the table of which row lives under
which key, are ``projections.keys``; ``keys.STATE_FORMAT`` versions both): fixed-width big-endian
headers (``struct``) followed by the canonical JSON where a row holds content. Every field holds
whatever admission accepts (the bounds are argued in ``projections.keys``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from schemas.events import REPLACE_REASONS

__all__ = [
    "FLAG_ASSETS",
    "FLAG_INTERRUPTED",
    "REASONS",
    "AggregateRow",
    "ConversationRow",
    "HiddenRow",
    "MessageRow",
    "ReceiptRow",
    "SourceRow",
    "Stats",
    "checkpoint_value",
    "read_checkpoint_stats",
]

_U64 = struct.Struct(">Q")


_CONV = struct.Struct(">BQQQQQQQQB")


@dataclass(slots=True)
class ConversationRow:
    """Per-conversation summary of the *visible* history. ``closed`` is permanent; a closed row
    keeps no counts.

    ``turns`` counts the distinct turn positions of the visible messages (the units of a
    turn-budgeted read: the leading messages before the first user message are one).
    ``last_append`` is the append id of the last accepted append ("" before the first).
    ``last_ms`` is the time of its latest message, hidden ones included: a later message is never
    stored with an earlier time (``created_at`` never decreases within a conversation).
    """

    closed: bool = False
    next_seq: int = 1
    turn: int = 0  # the latest turn position of a row, hidden ones too (advances at every turn opened)
    turns: int = 0
    messages: int = 0
    content_bytes: int = 0
    last_append: str = ""
    last_ms: int = 0
    last_key: str = ""
    """The key id of the last accepted sealed record ("" none since the row was made): its ``K``
    row exists (written in the same step), so admission writes none for the next record sealed
    under it. Reset with the row at a clear; dropped with it with the partition."""
    allotted: int = 0
    """The latest turn position given to a turn slot (``allocate_turn``; 0: none). A turn opened
    without a slot takes the position after both this and ``turn``, so a slot's position is spent
    whether or not a turn ever uses it."""
    deleted: int = 0
    """How many of its messages were deleted (``delete_messages``; visible or hidden then). While it
    is 0 no batch has a ``D`` row, so a message's ordinal is its receipt's first ordinal plus its
    index, and a turn's seqs run with its ordinals (``projections.deletes``)."""

    def encode(self) -> bytes:
        key = self.last_key.encode("ascii")
        return _CONV.pack(1 if self.closed else 0, self.next_seq, self.turn, self.turns, self.messages,
                          self.content_bytes, self.last_ms, self.allotted, self.deleted,
                          len(key)) + key + self.last_append.encode("utf-8")

    @classmethod
    def decode(cls, b: bytes) -> ConversationRow:
        closed, next_seq, turn, turns, messages, content, last_ms, allotted, deleted, key_length = _CONV.unpack_from(b)
        key_end = _CONV.size + key_length
        return cls(bool(closed), next_seq, turn, turns, messages, content, b[key_end:].decode("utf-8"), last_ms,
                   b[_CONV.size:key_end].decode("ascii"), allotted, deleted)

    @property
    def named_turns(self) -> bool:
        """Whether a ``T`` row may hold its turn's id (a slot's, or a turn whose first message was
        deleted): only then do the reads of turn ids look at the ``T`` rows."""
        return self.allotted > 0 or self.deleted > 0


_RECEIPT = struct.Struct(">IQQIQ")


@dataclass(frozen=True, slots=True)
class ReceiptRow:
    """Evidence of an accepted append: its digest, log position, message seq range, and the
    ordinal its first message got (its rows are there unless its turn was replaced since)."""

    digest: str
    partition: int
    offset: int
    first_seq: int
    count: int
    first_ord: int

    def encode(self) -> bytes:
        return self.pack(self.digest, self.partition, self.offset, self.first_seq, self.count, self.first_ord)

    @staticmethod
    def pack(digest: str, partition: int, offset: int, first_seq: int, count: int, first_ord: int) -> bytes:
        """``encode`` without building the object (the projector's hot path)."""
        return _RECEIPT.pack(partition, offset, first_seq, count, first_ord) + digest.encode()

    @classmethod
    def decode(cls, b: bytes) -> ReceiptRow:
        partition, offset, first_seq, count, first_ord = _RECEIPT.unpack_from(b)
        return cls(b[_RECEIPT.size:].decode(), partition, offset, first_seq, count, first_ord)


_MSG = struct.Struct(">QQQIBBIH")
FLAG_INTERRUPTED = 1
FLAG_ASSETS = 2
"""A message row whose message has linked assets (``G`` rows): a read looks them up only then."""
_FLAGS_AT = 29  # the offset of ``flags`` in ``_MSG``


@dataclass(frozen=True, slots=True)
class MessageRow:
    """A stored message: where it sits, where it came from, and its canonical JSON."""

    turn: int
    seq: int
    created_at_ms: int
    index: int  # index in its batch
    role: int
    flags: int
    content_bytes: int
    append_id: str
    canonical: bytes

    def encode(self) -> bytes:
        return self.pack(self.turn, self.seq, self.created_at_ms, self.index, self.role, self.flags,
                         self.content_bytes, self.append_id.encode("utf-8"), self.canonical)

    @staticmethod
    def pack(turn: int, seq: int, created_at_ms: int, index: int, role: int, flags: int, content_bytes: int,
             append_id: bytes, canonical: bytes) -> bytes:
        """``encode`` without building the object (the projector's hot path)."""
        return b"".join((_MSG.pack(turn, seq, created_at_ms, index, role, flags, content_bytes, len(append_id)),
                         append_id, canonical))

    @classmethod
    def decode(cls, b: bytes) -> MessageRow:
        turn, seq, created, index, role, flags, content, alen = _MSG.unpack_from(b)
        start = _MSG.size
        return cls(turn, seq, created, index, role, flags, content,
                   b[start:start + alen].decode("utf-8"), b[start + alen:])

    @staticmethod
    def canonical_of(b: bytes) -> bytes:
        """The message's canonical JSON, without decoding the rest of the row."""
        return b[_MSG.size + _MSG.unpack_from(b)[7]:]

    @staticmethod
    def flagged(b: bytes, flag: int) -> bytes:
        """The encoded row ``b`` with ``flag`` set, nothing else changed."""
        return b[:_FLAGS_AT] + bytes((b[_FLAGS_AT] | flag,)) + b[_FLAGS_AT + 1:]

    @staticmethod
    def decode_head(b: bytes) -> tuple[int, int, int]:
        """``(turn, role, content_bytes)`` without copying the payload."""
        turn, _, _, _, role, _, content, _ = _MSG.unpack_from(b)
        return turn, role, content


_SOURCE = struct.Struct(">QQIBBH")


class SourceRow:
    """The turn-source row of a message: what turn-response composition reads, nothing else
    (``content`` is the canonical JSON without message metadata)."""

    @staticmethod
    def pack(turn: int, created_at_ms: int, index: int, role: int, flags: int, append_id: bytes,
             content: bytes) -> bytes:
        return b"".join((_SOURCE.pack(turn, created_at_ms, index, role, flags, len(append_id)), append_id, content))

    @staticmethod
    def decode(b: bytes) -> tuple[int, int, int, int, int, str, bytes]:
        """``(turn, created_at_ms, index, role, flags, append_id, content)``."""
        turn, created, index, role, flags, alen = _SOURCE.unpack_from(b)
        start = _SOURCE.size
        return turn, created, index, role, flags, b[start:start + alen].decode("utf-8"), b[start + alen:]

    @staticmethod
    def decode_head(b: bytes) -> tuple[int, int]:
        """``(turn, content_bytes)`` without copying the payload."""
        turn, _, _, _, _, alen = _SOURCE.unpack_from(b)
        return turn, len(b) - _SOURCE.size - alen


_AGGREGATE = struct.Struct(">QQ")


class AggregateRow:
    """Running sums of the visible messages before each message of one batch, keyed by the
    batch's first ordinal: per message, in batch order, ``(content_bytes, turns)`` before it,
    where ``turns`` counts the distinct turn positions before the message's own turn (the
    message count before it is its ordinal). ``measure(after)`` is the conversation's totals
    minus the sums of the first message after, found with one ``Snapshot.floor`` (a batch's
    ordinals are contiguous: message ``k`` of the batch at ordinal ``first`` has ``first + k``).

    One row per batch rather than per message: a 2-message batch writes one key instead of two,
    and a read still visits one key. No payload: ``measure`` loads none."""

    @staticmethod
    def pack(sums: list[int]) -> bytes:
        """The row of a batch from its messages' sums flattened: ``[bytes0, turns0, bytes1, ...]``."""
        return struct.pack(f">{len(sums)}Q", *sums)

    @staticmethod
    def at(b: bytes, k: int) -> tuple[int, int]:
        """``(content_bytes, turns)`` before the batch's message ``k``."""
        content, turns = _AGGREGATE.unpack_from(b, k * _AGGREGATE.size)
        return content, turns

    @staticmethod
    def count(b: bytes) -> int:
        """How many messages the row has sums for."""
        return len(b) // _AGGREGATE.size


_HIDDEN = struct.Struct(">QBH")
REASONS = REPLACE_REASONS


class HiddenRow:
    """A message of a replaced turn: when and why it was hidden, by which turn, then its
    ``MessageRow`` bytes unchanged."""

    @staticmethod
    def pack(hidden_at_ms: int, reason: str, superseded_by: str, message_row: bytes) -> bytes:
        by = superseded_by.encode("utf-8")
        return _HIDDEN.pack(hidden_at_ms, REASONS.index(reason), len(by)) + by + message_row

    @staticmethod
    def decode(b: bytes) -> tuple[int, str, str, bytes]:
        """``(hidden_at_ms, reason, superseded_by, message_row)``."""
        at, reason, blen = _HIDDEN.unpack_from(b)
        start = _HIDDEN.size
        return at, REASONS[reason], b[start:start + blen].decode("utf-8"), b[start + blen:]


_STATS = struct.Struct(">QQQQQQQQQQQ")
_STATS_BEFORE_DELETES = struct.Struct(">QQQQQQQQQQ")  # rows written before ``deleted`` was counted
_STATS_BEFORE_FENCES = struct.Struct(">QQQQQQQQQ")  # rows written before ``fenced`` was counted
_STATS_BEFORE_ERASURE = struct.Struct(">QQQQQQQ")  # rows written before ``cleared`` and ``erased`` were counted


@dataclass(slots=True)
class Stats:
    """Admission outcome counters since the state was built."""

    accepted: int = 0
    duplicates: int = 0
    conflicts: int = 0
    rejected_closed: int = 0
    corrupt: int = 0
    precondition_failed: int = 0
    not_replaceable: int = 0
    cleared: int = 0
    """Conversations cleared (each erased once: its keys destroyed, its rows deleted)."""
    erased: int = 0
    """Records met after their content was erased (their key destroyed): applied without effect."""
    fenced: int = 0
    """Writes refused because a later run began before them (``Fenced``)."""
    deleted: int = 0
    """Messages deleted (``delete_messages``: each one once, visible or hidden then)."""

    def encode(self) -> bytes:
        return _STATS.pack(self.accepted, self.duplicates, self.conflicts, self.rejected_closed, self.corrupt,
                           self.precondition_failed, self.not_replaceable, self.cleared, self.erased, self.fenced,
                           self.deleted)

    def copy(self) -> Stats:
        return Stats(*(getattr(self, f) for f in Stats.__slots__))

    @classmethod
    def total(cls, parts: list[Stats]) -> Stats:
        """The counters of several partitions added up."""
        return cls(*(sum(getattr(s, f) for s in parts) for f in Stats.__slots__))

    @classmethod
    def decode(cls, b: bytes | None) -> Stats:
        if not b:
            return cls()
        if len(b) == _STATS_BEFORE_ERASURE.size:
            return cls(*_STATS_BEFORE_ERASURE.unpack(b))
        if len(b) == _STATS_BEFORE_DELETES.size:
            return cls(*_STATS_BEFORE_DELETES.unpack(b))
        if len(b) == _STATS_BEFORE_FENCES.size:
            return cls(*_STATS_BEFORE_FENCES.unpack(b))
        return cls(*_STATS.unpack(b))

def checkpoint_value(offset: int, stats: Stats | None = None) -> bytes:
    """A checkpoint row's value: the next offset to apply, then, for admission's own (``core``),
    the partition's counters (``Stats``), which change in exactly the steps the checkpoint does
    and are read with it: one row per partition and step instead of two."""
    return _U64.pack(offset) if stats is None else _U64.pack(offset) + stats.encode()


def read_checkpoint_stats(raw: bytes | None) -> Stats:
    """The counters of a ``core`` checkpoint row (zero when there is none yet)."""
    return Stats.decode(raw[_U64.size:] if raw else None)
