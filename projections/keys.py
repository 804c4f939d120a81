"""The one place that knows the RocksDB key layout of histlog's state: every keyspace, the
navigation indexes included (the row values' formats, named in the table, are ``projections.rows``).
One home for every key byte: every prefix and the table of every keyspace are here, with the
history's key builders; the builders of the features' keyspaces (runs, slots, assets, deletes,
graph checkpoints) are ``projections.feature_keys``, over these prefixes. No other module spells one.
About 530 lines on purpose: the table below (about 90 lines) describes every keyspace in one place,
beside the builders of the history's keys it documents.

All integers are fixed-width big-endian so byte order is numeric order. IDs cannot contain
control characters, so ``0x1F`` after a conversation id ends it unambiguously and
``conv + 0x20`` is the exclusive upper bound of everything keyed under ``conv + 0x1F``.

The visible history is keyed by **ordinal** (``ord``: how many visible messages precede the
message, 0-based), not by seq: a turn replacement always hides the visible *tail*, so the
replacement turn takes over the hidden turn's ordinals and overwrites its rows in place. The
visible keyspaces therefore never have holes (deleted rows a scan would have to step over, however
many turns were replaced); the hidden messages move to ``H``. A message's seq is in its row.

=====================  ==============================================  =========================================
key                    meaning                                         value
=====================  ==============================================  =========================================
``C`` conv             conversation summary                            ``ConversationRow``
``R`` conv 1F append   receipt evidence of an accepted append          ``ReceiptRow``
``M`` conv 1F ord      a visible message                               ``MessageRow`` header + canonical JSON
``S`` conv 1F ord      index of visible system messages (window)       empty
``N`` conv 1F ord      turn source: the message narrowed (own space)   ``SourceRow`` header + content JSON
``A`` conv 1F ord      running sums before each message of the batch   ``AggregateRow`` (16 bytes a message)
                       whose first message has ordinal ``ord``
``T`` conv 1F turn     each visible turn's first message (cursors)     seq, ord (+ a slotted turn's id)
``H`` conv 1F turn seq a hidden message (its turn was replaced)       ``HiddenRow`` + ``MessageRow``
``W`` conv 1F ms ord   each visible batch by time (its first ordinal)  empty
``X`` conv 1F ext 1F   a visible message whose metadata ``external_id``  empty
      ord              is the JSON string ``ext`` (canonical spelling)
``O`` conv             an open conversation (listing pages)            empty
``L`` conv 1F slot     a turn slot (``TurnAllocated``)                 its position (u64), 1 byte: used
``G`` conv 1F seq      the assets linked to message ``seq``          their canonical JSON array, by
                       (``AssetsLinked``)                              ordinal
``D`` conv 1F append   the deleted messages of that append's batch     their indexes (u32 each, ascending)
                       (``MessagesDeleted``)
``Y`` conv 1F ns 1F    a graph checkpoint of the thread (``Checkpointed`` ``projections.checkpoints``' rows
      checkpoint         put; LangGraph persistence)
``Z`` conv 1F ns 1F    a channel's value at a version (a checkpoint's  its serde type and bytes
      channel 1F version blob)
``V`` conv 1F ns 1F    a task's pending write to a checkpoint          its task path, channel, type, bytes
      checkpoint 1F task
      1F index (u32, +2³¹)
``B`` part run 1F conv a checkpoint written by run ``run`` (its       empty
      1F ns 1F checkpoint metadata ``run_id``): ``delete_for_runs``
``E`` conv             a cleared conversation whose erasure has not    ``b""``: its files may hold content
                       completed (``projections.erasure``: keys to     (compact them); ``b"k"``: it had no
                       destroy, files to compact)                      rows, only keys to destroy
``K`` conv 1F key_id   a record of the conversation was sealed under   empty
                       data key ``key_id`` (what ``clear`` destroys)
``F`` conv 1F run      a run of the conversation (``RunBegun``); the  its epoch (u64); for the empty run:
                       empty run id: the conversation's latest run     the latest epoch
``F`` conv 1F 00 epoch the run that has epoch ``epoch`` (u64)          its run id (UTF-8)
``J`` conv 1F run 1F   the run wrote a message in turn ``turn``        empty
      ``t`` turn       (a turn id; hidden messages keep theirs)
``J`` conv 1F run 1F   the run wrote a user message, seq ``seq``       its message id (UTF-8)
      ``u`` seq
``P`` name 00 part     checkpoint: next offset to apply (``core``'s:   offset (``core``: + ``Stats``)
                       with the partition's admission counters)
``Q`` part offset      a quarantined poison record                     reason (UTF-8)
``U`` name 00 part key a custom projection's rows of one partition     the projection's bytes
``m`` name             metadata (layout version, backend identity)     ``STATE_FORMAT``, JSON
=====================  ==============================================  =========================================

``created_at`` never decreases within a conversation (admission stores the later of the
previous message's time and the record's, ``ConversationRow.last_ms``), and a batch's messages
share one time, so ``W`` is in ordinal order too: a time bound is one seek to the first batch at
or after it. ``X`` keeps every visible message with an external id; the newest is the greatest
key under ``X conv 1F ext 1F`` (one floor seek), and a hidden message's row leaves with it.
``O`` is the set of open conversations, so a listing page never steps over closed ones.

Everything a partition's records wrote can be dropped without touching another partition
(``engine.revoke(p, drop=True)``): checkpoints (with the counters), poison and custom rows carry the
partition in their key, and every conversation-scoped row belongs to the partition of its
conversation (``schemas.records.partition_for_key``, as the log), so no read key changes.

Every prefix is a constant below and every key is built, split and ranged by a function here
or in ``projections.feature_keys`` (``conv_range``, ``prefix_end``, ``custom_keyspace`` ...): no
other module spells a key byte.
``STATE_FORMAT`` versions this layout together with the admission rules that fill it.

Every fixed-width field holds whatever admission accepts, because ``schemas.events`` lets through
only valid events (the rules live there and in ``schemas.times``): times are ``0..MAX_TIME_MS`` (``Q``);
``message_count`` is an Avro int (so a batch index fits ``I``); ids are at most 1024 UTF-8 bytes
(their lengths, and ``append-id/0`` of ``superseded_by``, fit ``H``); one message's content is part
of one log record, at most 1 GiB on a FileLog and far less on Kafka (``I``); seqs, ordinals,
turns, offsets and byte sums only grow by what the log holds (``Q``); partitions fit ``I``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from schemas.canonical import dumps

__all__ = [
    "AGGREGATE",
    "ASSET",
    "CHECKPOINT",
    "CONVERSATION",
    "CUSTOM",
    "DELETED",
    "ERASE_COMPACT",
    "ERASE_KEYS_ONLY",
    "ERASING",
    "EVIDENCE_FORMATS",
    "EXTERNAL",
    "FORMAT_KEY",
    "GRAPH_BLOB",
    "GRAPH_CHECKPOINT",
    "GRAPH_RUN",
    "GRAPH_WRITE",
    "HIDDEN",
    "IDENTITY_KEY",
    "KEY_ID",
    "MESSAGE",
    "META",
    "OPEN",
    "POISON",
    "RECEIPT",
    "RECEIPT_END",
    "RECEIPT_PREFIX",
    "ROLE_CODES",
    "RUN",
    "RUN_WRITES",
    "SLOT",
    "SOURCE",
    "STATE_FORMAT",
    "SYSTEM",
    "TIME",
    "TURN",
    "aggregate_key",
    "checkpoint_key",
    "checkpoint_range",
    "content_ranges",
    "conv_key",
    "conv_range",
    "conversation_ranges",
    "conversations_range",
    "custom_keyspace",
    "custom_partition_keyspace",
    "erasing_key",
    "erasing_range",
    "erasure_ranges",
    "external_key",
    "external_range",
    "external_text",
    "hidden_key",
    "key_id_key",
    "key_id_range",
    "message_key",
    "message_keys",
    "meta_key",
    "open_key",
    "open_range",
    "poison_key",
    "poison_partition_range",
    "poison_range",
    "prefix_end",
    "read_checkpoint_key",
    "read_conv_key",
    "read_erasing_key",
    "read_hidden_seq",
    "read_key_id_key",
    "read_key_u64",
    "read_open_key",
    "read_poison_key",
    "read_receipt_key",
    "read_time_key",
    "read_turn_id",
    "read_turn_value",
    "receipt_key",
    "source_key",
    "system_key",
    "time_key",
    "turn_key",
    "turn_value",
]

EVIDENCE_FORMATS = frozenset({b"5", b"6", b"7", b"8", b"9", b"10", b"11", b"12", b"13", b"14"})
"""The layouts whose ``core`` checkpoint rows begin with the next offset to apply (a u64): their
checkpoints are evidence of acknowledged records (``engine/state.py``) even when the layout is
older than ``STATE_FORMAT`` and is about to be rebuilt. Add each new layout that keeps that."""

STATE_FORMAT = b"14"
"""Version of this layout and of the admission rules that filled it (``m format``); a state of another
version is rebuilt. 14: graph checkpoints (``Checkpointed``, the ``Y``, ``Z``, ``V`` and ``B`` rows).
13: message deletes (``MessagesDeleted``, the ``D`` rows, ``ConversationRow.deleted``
and the ``deleted`` counter; a turn whose first message was deleted keeps its id in its ``T`` row).
12: assets (``AssetsLinked``, the ``G`` rows, ``FLAG_ASSETS`` in a message row).
11: turn slots (``TurnAllocated``, the ``L`` rows, ``ConversationRow.allotted``,
a slotted turn's id in its ``T`` row), so a state of 10 may have quarantined as poison the records
that now allocate or use a slot. 10: runs and fences (``RunBegun``, the ``F`` and ``J`` rows, the ``fenced``
outcome and its counter), so a state of 9 may have quarantined as poison the records that now
begin a run or carry a fence. 9: ``ConversationRow.last_key``, the key id of the conversation's last
accepted sealed record, whose ``K`` row exists (admission notes the next record under that key
without reading its ``K`` row). 8: the ``K`` rows (the data keys each conversation's records were sealed
under), so a rebuilt state lists the same keys as the live one. 7: a user message flagged internal
feedback opens no turn (turn positions change), ``created_at`` never decreases within a
conversation, and the ``W``, ``X`` and ``O`` indexes of history navigation. 6: one ``A`` row per
batch instead of one per message, and the admission counters in ``core``'s checkpoint row instead
of an ``X`` row of their own (a 2-message batch writes 8 keys, not 9, and a step 1 key per
partition, not 2). 5: counters and custom projection rows per partition, so a partition's state is
dropped whole. 4: every field of a decoded event is validated before admission, so a state of 3 may
hold records (or counters) that a rebuild now decides as poison."""

SEP = b"\x1f"
END = b"\x20"

CONVERSATION = b"C"
RECEIPT = b"R"
MESSAGE = b"M"
SYSTEM = b"S"
SOURCE = b"N"
AGGREGATE = b"A"
TURN = b"T"
HIDDEN = b"H"
CHECKPOINT = b"P"
POISON = b"Q"
CUSTOM = b"U"
META = b"m"
_NAME_END = b"\x00"  # ends a name (checkpoints, custom projections): names hold no control character

TIME = b"W"
EXTERNAL = b"X"
OPEN = b"O"
ERASING = b"E"
KEY_ID = b"K"
RUN = b"F"
RUN_WRITES = b"J"
SLOT = b"L"
ASSET = b"G"
DELETED = b"D"
GRAPH_CHECKPOINT = b"Y"
GRAPH_BLOB = b"Z"
GRAPH_WRITE = b"V"
GRAPH_RUN = b"B"

CONVERSATION_SCOPED = (MESSAGE, SOURCE, AGGREGATE, SYSTEM, TURN, HIDDEN, RECEIPT, TIME, EXTERNAL, RUN, RUN_WRITES,
                       SLOT, ASSET, DELETED, GRAPH_CHECKPOINT, GRAPH_BLOB, GRAPH_WRITE)
"""Every keyspace under ``prefix conv 1F``: what a clear drops (the ``C`` row keeps the closure)."""

ROLE_CODES = {"system": 0, "user": 1, "assistant": 2, "tool": 3}

_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")


u64: Callable[[int], bytes] = _U64.pack
"""The 8 big-endian bytes of ``n`` (the struct's own bound method: no wrapper call on the hot path)."""


def read_u64(b: bytes, at: int = 0) -> int:
    return int(_U64.unpack_from(b, at)[0])


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with ``prefix`` (the exclusive upper
    bound of a prefix scan). ``ValueError`` for a prefix of only ``0xFF`` bytes (or none), which
    no key bounds: no prefix of this layout is one (every keyspace starts with a letter)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        raise ValueError(f"no key is greater than every key starting with {prefix!r}; scan without an upper bound")
    return stripped[:-1] + bytes([stripped[-1] + 1])


def conv_key(conv: bytes) -> bytes:
    return CONVERSATION + conv


def read_conv_key(key: bytes) -> bytes:
    """The conversation id bytes of a ``C`` key."""
    return key[len(CONVERSATION):]


def conversations_range() -> tuple[bytes, bytes]:
    """``[lower, upper)`` of every ``C`` row (one per conversation ever seen)."""
    return CONVERSATION, prefix_end(CONVERSATION)


def receipt_key(conv: bytes, append_id: bytes) -> bytes:
    return RECEIPT + conv + SEP + append_id


def read_receipt_key(key: bytes) -> tuple[bytes, bytes]:
    """``(conversation, append id)`` bytes of an ``R`` key."""
    conv, _, append_id = key[len(RECEIPT):].partition(SEP)
    return conv, append_id


RECEIPT_PREFIX, RECEIPT_END = RECEIPT, prefix_end(RECEIPT)
"""Every receipt key is in ``[RECEIPT_PREFIX, RECEIPT_END)``."""


def message_key(conv: bytes, ord_: int) -> bytes:
    return MESSAGE + conv + SEP + _U64.pack(ord_)


def system_key(conv: bytes, ord_: int) -> bytes:
    return SYSTEM + conv + SEP + _U64.pack(ord_)


def source_key(conv: bytes, ord_: int) -> bytes:
    return SOURCE + conv + SEP + _U64.pack(ord_)


def aggregate_key(conv: bytes, ord_: int) -> bytes:
    return AGGREGATE + conv + SEP + _U64.pack(ord_)


def message_keys(conv: bytes) -> tuple[bytes, bytes, bytes]:
    """The ``M``, ``N`` and ``S`` key prefixes of ``conv``: ``prefix + u64(ord)`` is
    ``message_key``, ``source_key`` and ``system_key`` (built once per batch on the hot path)."""
    tail = conv + SEP
    return MESSAGE + tail, SOURCE + tail, SYSTEM + tail


def read_key_u64(key: bytes) -> int:
    """The number that ends an ``M``, ``S``, ``N``, ``A`` or ``T`` key (its ordinal or turn)."""
    return int(_U64.unpack_from(key, len(key) - _U64.size)[0])


def hidden_key(conv: bytes, turn: int, seq: int) -> bytes:
    """Keyed by position ``(turn, seq)``, so a cursor is a key: hidden rows are read in O(result)."""
    return HIDDEN + conv + SEP + _U64.pack(turn) + _U64.pack(seq)


def read_hidden_seq(key: bytes) -> int:
    """The seq of an ``H`` key (its last 8 bytes)."""
    return int(_U64.unpack_from(key, len(key) - 8)[0])


_TURN = struct.Struct(">QQ")


def turn_value(first_seq: int, first_ord: int, turn_id: bytes = b"") -> bytes:
    """A ``T`` row: the turn's first seq and ordinal, and a slotted turn's id (``<slot>/0``; a
    turn of no slot has the id of its first message, which its ``M`` row names)."""
    return _TURN.pack(first_seq, first_ord) + turn_id


def read_turn_value(b: bytes) -> tuple[int, int]:
    """``(first_seq, first_ord)`` of a turn."""
    first_seq, first_ord = _TURN.unpack_from(b)
    return first_seq, first_ord


def read_turn_id(b: bytes) -> str | None:
    """A slotted turn's id from its ``T`` row; None for a turn of no slot."""
    return b[_TURN.size:].decode("utf-8") if len(b) > _TURN.size else None


def turn_key(conv: bytes, turn: int) -> bytes:
    return TURN + conv + SEP + _U64.pack(turn)


def time_key(conv: bytes, created_at_ms: int, first_ord: int) -> bytes:
    """A visible batch by time: ``(ms, first ordinal)``, so a seek to ``time_key(conv, t, 0)``
    finds the first batch stored at or after ``t``."""
    return TIME + conv + SEP + _U64.pack(created_at_ms) + _U64.pack(first_ord)


def read_time_key(key: bytes) -> tuple[int, int]:
    """``(created_at_ms, first_ord)`` of a ``W`` key."""
    ms, ord_ = _TURN.unpack_from(key, len(key) - _TURN.size)
    return ms, ord_


def external_text(external_id: str) -> bytes:
    """The canonical JSON spelling of an external id (a JSON string): how ``X`` keys hold it, the
    same whatever escapes the metadata used. It holds no control character (those are escaped),
    so the ``1F`` after it ends it."""
    return dumps(external_id)


def external_key(conv: bytes, external: bytes, ord_: int) -> bytes:
    """A visible message with external id ``external`` (``external_text``) at ordinal ``ord_``."""
    return EXTERNAL + conv + SEP + external + SEP + _U64.pack(ord_)


def external_range(conv: bytes, external: bytes) -> tuple[bytes, bytes]:
    """``[lower, upper)`` of the ``X`` rows of one external id, oldest ordinal first."""
    lower = EXTERNAL + conv + SEP + external + SEP
    return lower, prefix_end(lower)


def open_key(conv: bytes) -> bytes:
    return OPEN + conv


def open_range(prefix: bytes = b"") -> tuple[bytes, bytes]:
    """``[lower, upper)`` of the ``O`` rows of the open conversations whose id starts with ``prefix``."""
    return OPEN + prefix, prefix_end(OPEN + prefix)


def read_open_key(key: bytes) -> bytes:
    """The conversation id bytes of an ``O`` key."""
    return key[len(OPEN):]


def erasing_key(conv: bytes) -> bytes:
    """A cleared conversation whose state files may still hold its content (``projections.erasure``)."""
    return ERASING + conv


def erasing_range() -> tuple[bytes, bytes]:
    return ERASING, prefix_end(ERASING)


def read_erasing_key(key: bytes) -> bytes:
    return key[len(ERASING):]


ERASE_COMPACT = b""
"""An ``E`` row's value when the conversation had rows: the state files must be compacted."""
ERASE_KEYS_ONLY = b"k"
"""An ``E`` row's value when it had none (only ``K`` rows, or nothing): its keys to destroy, no compaction."""


def key_id_key(conv: bytes, key_id: str) -> bytes:
    """A record of ``conv`` was sealed under data key ``key_id`` (32 lowercase hex digits,
    ``schemas.sealed``; random, so the row holds no content). Written by admission whenever it
    opened such a record, whatever it decided: the durable list of the keys ``clear`` destroys
    (a key store may bind a key to its conversation in memory only)."""
    return KEY_ID + conv + SEP + key_id.encode("ascii")


def key_id_range(conv: bytes) -> tuple[bytes, bytes]:
    """``[lower, upper)`` of the ``K`` rows of ``conv``."""
    return conv_range(KEY_ID, conv)


def read_key_id_key(key: bytes) -> tuple[bytes, str]:
    """``(conversation, key id)`` of a ``K`` key."""
    conv, _, key_id = key[len(KEY_ID):].partition(SEP)
    return conv, key_id.decode("ascii")


def erasure_ranges(conv: bytes) -> list[tuple[bytes, bytes]]:
    """``[lower, upper)`` of every key a conversation's rows may have had: what a clear compacts."""
    single = [(prefix + conv, prefix + conv + b"\x00") for prefix in (CONVERSATION, OPEN)]
    return [*conversation_ranges(conv), *single]


def conv_range(prefix: bytes, conv: bytes) -> tuple[bytes, bytes]:
    """``[lower, upper)`` covering every ``prefix conv 1F ...`` key."""
    return prefix + conv + SEP, prefix + conv + END


def content_ranges(conv: bytes) -> list[tuple[bytes, bytes]]:
    """``conv_range`` of the keyspaces whose rows hold content (``M``, ``N``, ``H``, ``G``) or spell
    it in their keys (``X``): what the compaction after a message delete rewrites."""
    return [conv_range(prefix, conv) for prefix in (MESSAGE, SOURCE, HIDDEN, ASSET, EXTERNAL)]


def conversation_ranges(conv: bytes) -> list[tuple[bytes, bytes]]:
    """``conv_range`` of every keyspace in ``CONVERSATION_SCOPED``."""
    return [conv_range(prefix, conv) for prefix in CONVERSATION_SCOPED]


def _named(prefix: bytes, name: str) -> bytes:
    return prefix + name.encode("utf-8") + _NAME_END


def checkpoint_key(name: str, partition: int) -> bytes:
    return _named(CHECKPOINT, name) + _U32.pack(partition)


def checkpoint_range(name: str) -> tuple[bytes, bytes]:
    """``[lower, upper)`` of every checkpoint of the projection ``name``."""
    lower = _named(CHECKPOINT, name)
    return lower, prefix_end(lower)


def read_checkpoint_key(key: bytes) -> tuple[str, int]:
    """``(name, partition)`` of a ``P`` key."""
    name = key[len(CHECKPOINT):-_U32.size - len(_NAME_END)]  # the partition is fixed-width, last
    return name.decode("utf-8"), int(_U32.unpack_from(key, len(key) - _U32.size)[0])


def custom_keyspace(name: str) -> tuple[bytes, bytes]:
    """``[lower, upper)`` of every state key of the custom projection ``name`` (all partitions)."""
    lower = _named(CUSTOM, name)
    return lower, prefix_end(lower)


def custom_partition_keyspace(name: str, partition: int) -> tuple[bytes, bytes]:
    """``[lower, upper)`` of the rows of projection ``name`` written by the events of one
    partition; its keys are ``lower + the projection's own key``."""
    lower = _named(CUSTOM, name) + _U32.pack(partition)
    return lower, prefix_end(lower)


def poison_key(partition: int, offset: int) -> bytes:
    return POISON + _U32.pack(partition) + _U64.pack(offset)


def read_poison_key(key: bytes) -> tuple[int, int]:
    """``(partition, offset)`` of a ``Q`` key."""
    at = len(POISON)
    return int(_U32.unpack_from(key, at)[0]), int(_U64.unpack_from(key, at + _U32.size)[0])


def poison_partition_range(partition: int) -> tuple[bytes, bytes]:
    """``[lower, upper)`` of the quarantined poison records of one partition."""
    lower = POISON + _U32.pack(partition)
    return lower, prefix_end(lower)


def poison_range() -> tuple[bytes, bytes]:
    """``[lower, upper)`` of every quarantined poison record, in position order."""
    return POISON, prefix_end(POISON)


def meta_key(name: str) -> bytes:
    return META + name.encode("utf-8")


FORMAT_KEY = meta_key("format")
"""Holds ``STATE_FORMAT``, the layout version the state was built with."""
IDENTITY_KEY = meta_key("identity")
"""Holds the identity (JSON) of the log the state was built from."""


