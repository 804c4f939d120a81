"""The Avro binary *bodies* of the events ``schemas.events.encode_event`` writes, by hand.

A part of the events' wire format (``schemas.events`` frames these bodies and is its home; the
schemas themselves are the ``.avsc`` files): for exactly the writer schemas ``encode_event`` uses
(``batch_appended.avsc`` v2, ``.v3``, ``.v4`` and ``.v5``, ``turn_replaced.avsc`` v1, ``.v2`` and
``.v3``, ``conversation_cleared.avsc``, ``run_begun.avsc``, ``turn_allocated.avsc``,
``assets_linked.avsc``, ``messages_deleted.avsc``, ``checkpointed.avsc``), the body as the Avro
specification's binary encoding gives it:

* ``int`` / ``long``: zig-zag, then a base-128 varint, least significant group first;
* ``string`` / ``bytes``: the byte length as a ``long``, then the (UTF-8) bytes;
* a union: the branch index as a ``long``, then the value (``["null", X]``: ``00`` or ``02`` + X);
* a ``fixed``: its bytes as they are; a record: its fields in schema order.

Promise: byte-identical to ``fastavro.schemaless_writer`` over the same schema and record
(pinned by the golden files and a differential test, tests/unit/test_event_body.py), for the
values ``encode_event`` lets through (it checks every field's type and range first: this module
checks nothing, except that a ``str`` encodes as UTF-8, ``UnicodeEncodeError`` otherwise, as
fastavro raises). ``schemas.events`` asserts at import that each schema's field names and types
are the layout written here, so a schema change cannot silently diverge from it.

Why: fastavro writes a union holding a record by first *validating* the datum against each
branch, which made a sealed event's encode ~3x a plain one's (measured 12.6 vs 6.1 us for a
2-message batch); these functions take ~2-3 us for either (bench/bench_erasure.py components).
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "ALLOCATED_FIELDS",
    "ASSETS_FIELDS",
    "BATCH_FIELDS",
    "CHECKPOINTED_FIELDS",
    "CLEARED_FIELDS",
    "DELETED_FIELDS",
    "REPLACED_FIELDS",
    "RUN_FIELDS",
    "SEALED_FIELDS",
    "SLOT_FIELDS",
    "TAIL_FIELDS",
    "allocated_body",
    "assets_body",
    "batch_body",
    "checkpointed_body",
    "cleared_body",
    "deleted_body",
    "replaced_body",
    "run_body",
]

BATCH_FIELDS: Final = (("conversation_id", "string"), ("append_id", "string"), ("digest", "string"),
                       ("messages", "bytes"), ("message_count", "int"), ("content_bytes", "long"),
                       ("created_at_ms", "long"), ("expected_last", ["null", "string"]))
"""``BatchAppended`` v2's fields as written here (v3 adds ``sealed``: ``["null", SealedContent]``)."""
REPLACED_FIELDS: Final = (("conversation_id", "string"), ("append_id", "string"), ("digest", "string"),
                          ("messages", "bytes"), ("message_count", "int"), ("content_bytes", "long"),
                          ("created_at_ms", "long"), ("old_turn_id", "string"), ("reason", "string"))
"""``TurnReplaced`` v1's fields as written here (v2 adds ``sealed``)."""
SEALED_FIELDS: Final = (("key_id", "string"), ("nonce", 12), ("ciphertext", "bytes"), ("mac", 32))
"""``SealedContent``'s fields as written here (an int: a ``fixed`` of that size)."""
CLEARED_FIELDS: Final = (("conversation_id", "string"), ("created_at_ms", "long"))
"""``ConversationCleared``'s fields as written here."""
TAIL_FIELDS: Final = (("fence", ["null", "long"]), ("run_id", ["null", "string"]))
"""The fields ``BatchAppended`` v4 and ``TurnReplaced`` v3 add after ``sealed``."""
SLOT_FIELDS: Final = (("turn_id", ["null", "string"]), ("turn_position", ["null", "long"]))
"""The fields ``BatchAppended`` v5 adds after those."""
ALLOCATED_FIELDS: Final = (("conversation_id", "string"), ("slot_id", "string"), ("created_at_ms", "long"))
"""``TurnAllocated``'s fields as written here."""
ASSETS_FIELDS: Final = (("conversation_id", "string"), ("message_id", "string"), ("assets", "bytes"),
                        ("created_at_ms", "long"))
"""``AssetsLinked``'s fields as written here, before its ``sealed``."""
RUN_FIELDS: Final = (("conversation_id", "string"), ("run_id", "string"), ("created_at_ms", "long"))
"""``RunBegun``'s fields as written here."""
CHECKPOINTED_FIELDS: Final = (("conversation_id", "string"), ("record_id", "string"), ("kind", "string"),
                              ("content", "bytes"), ("created_at_ms", "long"))
"""``Checkpointed``'s fields as written here, before its ``sealed``."""
DELETED_FIELDS: Final = (("conversation_id", "string"), ("delete_id", "string"), ("message_ids", ["array", "string"]),
                         ("fence", ["null", "long"]), ("created_at_ms", "long"))
"""``MessagesDeleted``'s fields as written here (an array: its items in one block, then ``00``)."""

_ONE_BYTE: Final = tuple(bytes((n,)) for n in range(128))


def _long(n: int) -> bytes:
    """A zig-zag varint (``int`` and ``long`` alike: for an ``int`` in its range the zig-zag of
    32 and 64 bits is the same number)."""
    z = (n << 1) ^ (n >> 63)
    if z < 0x80:
        return _ONE_BYTE[z]
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def _content(parts: list[bytes], conversation_id: str, append_id: str, digest: str, messages: bytes,
             message_count: int, content_bytes: int, created_at_ms: int) -> None:
    """The seven fields every batch and replacement body opens with."""
    c = conversation_id.encode("utf-8")
    a = append_id.encode("utf-8")
    d = digest.encode("utf-8")
    parts += (_long(len(c)), c, _long(len(a)), a, _long(len(d)), d, _long(len(messages)), messages,
              _long(message_count), _long(content_bytes), _long(created_at_ms))


def _sealed(parts: list[bytes], key_id: str, nonce: bytes, ciphertext: bytes, mac: bytes) -> None:
    """The ``sealed`` union's record branch (index 1)."""
    k = key_id.encode("utf-8")
    parts += (b"\x02", _long(len(k)), k, nonce, _long(len(ciphertext)), ciphertext, mac)


def _optional(parts: list[bytes], value: str | None) -> None:
    """A ``["null", "string"]`` union."""
    if value is None:
        parts.append(b"\x00")
    else:
        v = value.encode("utf-8")
        parts += (b"\x02", _long(len(v)), v)


Tail = tuple[int | None, str | None] | tuple[int | None, str | None, str | None, int | None]
"""(fence, run_id): the fields of ``BatchAppended`` v4 / ``TurnReplaced`` v3; with (turn_id,
turn_position) after them, ``BatchAppended`` v5's."""


def _end(parts: list[bytes], sealed: tuple[str, bytes, bytes, bytes] | None, tail: Tail | None) -> bytes:
    """The ``sealed`` union and, with ``tail``, the fields of the later versions."""
    if tail is not None:
        if sealed is None:
            parts.append(b"\x00")
        else:
            _sealed(parts, *sealed)
        fence, run_id = tail[0], tail[1]
        parts.append(b"\x00" if fence is None else b"\x02" + _long(fence))
        _optional(parts, run_id)
        if len(tail) == 4:
            _optional(parts, tail[2])
            position = tail[3]
            parts.append(b"\x00" if position is None else b"\x02" + _long(position))
    elif sealed is not None:
        _sealed(parts, *sealed)
    return b"".join(parts)


def batch_body(conversation_id: str, append_id: str, digest: str, messages: bytes, message_count: int,
               content_bytes: int, created_at_ms: int, expected_last: str | None,
               sealed: tuple[str, bytes, bytes, bytes] | None, tail: Tail | None = None) -> bytes:
    """A ``BatchAppended`` body: with ``tail`` = (fence, run_id), v4, with (fence, run_id, turn_id,
    turn_position) v5; else v2 when ``sealed`` is None, v3 with ``sealed`` = (key_id, nonce,
    ciphertext, mac)."""
    parts: list[bytes] = []
    _content(parts, conversation_id, append_id, digest, messages, message_count, content_bytes, created_at_ms)
    _optional(parts, expected_last)
    return _end(parts, sealed, tail)


def replaced_body(conversation_id: str, append_id: str, digest: str, messages: bytes, message_count: int,
                  content_bytes: int, created_at_ms: int, old_turn_id: str, reason: str,
                  sealed: tuple[str, bytes, bytes, bytes] | None, tail: Tail | None = None) -> bytes:
    """A ``TurnReplaced`` body: with ``tail``, v3; else v1 when ``sealed`` is None, v2 sealed."""
    parts: list[bytes] = []
    _content(parts, conversation_id, append_id, digest, messages, message_count, content_bytes, created_at_ms)
    o = old_turn_id.encode("utf-8")
    r = reason.encode("utf-8")
    parts += (_long(len(o)), o, _long(len(r)), r)
    return _end(parts, sealed, tail)


def run_body(conversation_id: str, run_id: str, created_at_ms: int) -> bytes:
    """A ``RunBegun`` body."""
    c = conversation_id.encode("utf-8")
    r = run_id.encode("utf-8")
    return _long(len(c)) + c + _long(len(r)) + r + _long(created_at_ms)


def allocated_body(conversation_id: str, slot_id: str, created_at_ms: int) -> bytes:
    """A ``TurnAllocated`` body (the same layout as ``RunBegun``'s)."""
    return run_body(conversation_id, slot_id, created_at_ms)


def assets_body(conversation_id: str, message_id: str, assets: bytes, created_at_ms: int,
                sealed: tuple[str, bytes, bytes, bytes] | None) -> bytes:
    """An ``AssetsLinked`` body."""
    c = conversation_id.encode("utf-8")
    m = message_id.encode("utf-8")
    parts = [_long(len(c)), c, _long(len(m)), m, _long(len(assets)), assets, _long(created_at_ms)]
    if sealed is None:
        parts.append(b"\x00")
    else:
        _sealed(parts, *sealed)
    return b"".join(parts)


def deleted_body(conversation_id: str, delete_id: str, message_ids: tuple[str, ...], fence: int | None,
                 created_at_ms: int) -> bytes:
    """A ``MessagesDeleted`` body (its ids as one array block: the count, the items, ``00``)."""
    c = conversation_id.encode("utf-8")
    d = delete_id.encode("utf-8")
    parts = [_long(len(c)), c, _long(len(d)), d]
    if message_ids:
        parts.append(_long(len(message_ids)))
        for m in message_ids:
            b = m.encode("utf-8")
            parts += (_long(len(b)), b)
    parts.append(b"\x00")
    parts.append(b"\x00" if fence is None else b"\x02" + _long(fence))
    parts.append(_long(created_at_ms))
    return b"".join(parts)


def checkpointed_body(conversation_id: str, record_id: str, kind: str, content: bytes, created_at_ms: int,
                      sealed: tuple[str, bytes, bytes, bytes] | None) -> bytes:
    """A ``Checkpointed`` body."""
    c = conversation_id.encode("utf-8")
    r = record_id.encode("utf-8")
    k = kind.encode("utf-8")
    parts = [_long(len(c)), c, _long(len(r)), r, _long(len(k)), k, _long(len(content)), content,
             _long(created_at_ms)]
    if sealed is None:
        parts.append(b"\x00")
    else:
        _sealed(parts, *sealed)
    return b"".join(parts)


def cleared_body(conversation_id: str, created_at_ms: int) -> bytes:
    """A ``ConversationCleared`` body."""
    c = conversation_id.encode("utf-8")
    return _long(len(c)) + c + _long(created_at_ms)
