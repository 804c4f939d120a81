"""The key store's record: one data key, or one erasure marker (the one home of this format,
shared by the file store and the Kafka keys topic; ``docs/erasure.md`` has the table).

Body (all integers big-endian)::

    "HLK1" | kind u8 (1 key, 2 erased) | conversation id length u16 | conversation id (UTF-8)
    kind 1: key id (32 ASCII hex) | wrap u8 (0 plain, 1 wrapped)
            wrap 0: secret (32)      wrap 1: master key id (8) | nonce + wrapped secret (60)
    kind 2: nothing more

An *erasure marker* says the conversation's keys were destroyed: it outlives them (a key record of
that conversation written after it is void, so a creator racing an erasure cannot bring a key
back). It holds only the conversation id, which is never erased (it keys the log too).

``frame``/``unframe``: the file store's framing, ``u32 body length | u32 CRC32C(body) | body``.
Kafka frames records itself (key ``conversation id 0x1F key id``, the marker's key id empty).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

import crc32c

from engine.keys.master import WRAPPED_BYTES, MasterKey
from schemas.errors import KeyStoreDamaged
from schemas.ids import MAX_ID_BYTES
from schemas.sealed import KEY_ID_LENGTH, SECRET_BYTES, DataKey, key_id_problem

__all__ = ["FRAME_HEADER", "MAX_FRAME", "KeyRecord", "decode_record", "encode_record", "frame", "record_key",
           "split_record_key", "unframe"]

_MAGIC: Final = b"HLK1"
_KEY: Final = 1
_ERASED: Final = 2
FRAME_HEADER: Final = 8
MAX_FRAME: Final = FRAME_HEADER + 4 + 1 + 2 + MAX_ID_BYTES + KEY_ID_LENGTH + 1 + 8 + WRAPPED_BYTES
"""The largest frame (a wrapped key of a conversation id of the longest length): a torn tail,
what one interrupted create leaves, is never longer."""
_SEP: Final = b"\x1f"


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """A decoded record: ``key`` is ``None`` for an erasure marker."""

    conversation_id: str
    key: DataKey | None


def encode_record(conversation_id: str, key: DataKey | None, master: MasterKey | None = None) -> bytes:
    """The body of a key record (``key`` given) or of an erasure marker (``key=None``)."""
    conv = conversation_id.encode("utf-8")
    head = _MAGIC + struct.pack(">BH", _KEY if key else _ERASED, len(conv)) + conv
    if key is None:
        return head
    head += key.key_id.encode("ascii")
    if master is None:
        return head + b"\x00" + key.secret
    return head + b"\x01" + master.key_id + master.wrap(key.secret, conversation_id=conversation_id,
                                                         key_id=key.key_id)


def decode_record(body: bytes, master: MasterKey | None, *, where: str) -> KeyRecord:
    """Parse a body; ``KeyStoreDamaged`` for anything that is not exactly one record, or a wrapped
    key whose master key is not ``master``."""
    def damaged(why: str) -> KeyStoreDamaged:
        return KeyStoreDamaged(f"key store record at {where} is damaged ({why}); keys cannot be rebuilt "
                               "from the log: restore the key store from a backup", where=where)
    if len(body) < 7 or body[:4] != _MAGIC:
        raise damaged("bad magic or too short")
    kind, n = struct.unpack_from(">BH", body, 4)
    end = 7 + n
    if len(body) < end:
        raise damaged("cut inside the conversation id")
    try:
        conversation_id = body[7:end].decode("utf-8")
    except UnicodeDecodeError:
        raise damaged("conversation id is not UTF-8") from None
    if kind == _ERASED:
        if len(body) != end:
            raise damaged("trailing bytes after an erasure marker")
        return KeyRecord(conversation_id, None)
    if kind != _KEY:
        raise damaged(f"unknown kind {kind}")
    key_id = body[end:end + KEY_ID_LENGTH].decode("ascii", "replace")
    if key_id_problem(key_id):
        raise damaged("bad key id")
    pos = end + KEY_ID_LENGTH
    wrap, rest = body[pos:pos + 1], body[pos + 1:]
    if wrap == b"\x00" and len(rest) == SECRET_BYTES:  # also under a master key: written before it was set
        return KeyRecord(conversation_id, DataKey(key_id, rest))
    if wrap == b"\x01" and len(rest) == 8 + WRAPPED_BYTES:
        if master is None:
            raise KeyStoreDamaged(f"the data key {key_id} at {where} is wrapped by master key {rest[:8].hex()}: open "
                                  f"with that master key (master_key_file= or HISTLOG_MASTER_KEY_FILE)", where=where)
        if rest[:8] != master.key_id:
            raise KeyStoreDamaged(f"the data key {key_id} at {where} is wrapped by master key {rest[:8].hex()}, not "
                                  f"by the given one ({master.key_id.hex()}): open with the right master key file",
                                  where=where)
        secret = master.unwrap(rest[8:], conversation_id=conversation_id, key_id=key_id, where=where)
        return KeyRecord(conversation_id, DataKey(key_id, secret))
    raise damaged("bad wrap flag or key length")


def frame(body: bytes) -> bytes:
    return struct.pack(">II", len(body), crc32c.crc32c(body)) + body


def unframe(buf: bytes, pos: int) -> tuple[bytes | None, int]:
    """The body of the frame at ``pos`` and the next position, or ``(None, pos)`` when the bytes
    from ``pos`` are not one whole frame with a matching CRC (a torn or damaged tail)."""
    if len(buf) - pos < FRAME_HEADER:
        return None, pos
    n, crc = struct.unpack_from(">II", buf, pos)
    end = pos + FRAME_HEADER + n
    if end > len(buf):
        return None, pos
    body = buf[pos + FRAME_HEADER:end]
    if crc32c.crc32c(body) != crc:
        return None, pos
    return body, end


def record_key(conversation_id: str, key_id: str) -> bytes:
    """Kafka record key: ``conversation id 0x1F key id`` (``key_id=""`` for the erasure marker)."""
    return conversation_id.encode("utf-8") + _SEP + key_id.encode("ascii")


def split_record_key(raw: bytes) -> tuple[str, str]:
    conv, sep, key_id = raw.rpartition(_SEP)
    if not sep:
        raise ValueError("no separator")
    return conv.decode("utf-8"), key_id.decode("ascii")
