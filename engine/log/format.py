"""The FileLog on-disk format: constants, the record frame, and every file name.

This module is the only place that knows the byte layout and the names of files; the spec
for readers in other languages is ``docs/log-format.md`` (keep both in step).

Record frame (all integers little-endian)::

    0   length        u32   number of bytes after the CRC field (magic .. end of headers)
    4   crc           u32   CRC32C (Castagnoli) of exactly those ``length`` bytes
    8   magic         u8    format version, currently 1
    9   offset        u64   the record's offset in its partition
    17  timestamp_ms  i64   milliseconds since the Unix epoch, set by the writer
    25  key_length    u32   then ``key_length`` bytes of key
        value_length  u32   then ``value_length`` bytes of value
        header_count  u16   then per header: name_length u16, name (UTF-8),
                                              value_length u32, value

Segments hold frames back to back and nothing else. No I/O happens here.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import crc32c

__all__ = [
    "FRAME_HEADER",
    "FRAME_HEADER_SIZE",
    "LOCK_FILE",
    "MAGIC",
    "MAX_BODY_SIZE",
    "META_FILE",
    "MIN_BODY_SIZE",
    "MIN_FRAME_SIZE",
    "SEGMENT_SUFFIX",
    "TAIL_INDEX_FILE",
    "DecodedBody",
    "decode_body",
    "encode_record",
    "list_segments",
    "lock_path",
    "meta_path",
    "parse_segment_name",
    "partition_dir",
    "segment_name",
    "segment_path",
    "tail_index_path",
]

MAGIC = 1
"""The only record format version this code writes and reads."""

FRAME_HEADER = struct.Struct("<II")  # length, crc
FRAME_HEADER_SIZE = FRAME_HEADER.size  # 8
_BODY_PREFIX = struct.Struct("<BQqI")  # magic, offset, timestamp_ms, key_length
_U32 = struct.Struct("<I")
_U16 = struct.Struct("<H")
MIN_BODY_SIZE = _BODY_PREFIX.size + _U32.size + _U16.size  # 27: empty key, value, no headers
MIN_FRAME_SIZE = FRAME_HEADER_SIZE + MIN_BODY_SIZE  # 35
MAX_BODY_SIZE = 1 << 30
"""Largest body a writer produces (1 GiB); a larger ``length`` field is damage."""

SEGMENT_SUFFIX = ".log"
SEGMENT_NAME_DIGITS = 20
META_FILE = "meta.json"
LOCK_FILE = "LOCK"
TAIL_INDEX_FILE = "tail.index"
"""In each partition directory: the newest segment's index, saved on close (``engine.log.index``)."""


# ---------------------------------------------------------------- file naming

def segment_name(base_offset: int) -> str:
    """``00000000000000000042.log``: the base offset (first record's offset), 20 digits."""
    return f"{base_offset:0{SEGMENT_NAME_DIGITS}d}{SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    """The base offset of a segment file name, or ``None`` when ``name`` is not a segment."""
    stem, suffix = name[:-len(SEGMENT_SUFFIX)], name[-len(SEGMENT_SUFFIX):]
    if suffix != SEGMENT_SUFFIX or len(stem) != SEGMENT_NAME_DIGITS or not stem.isascii():
        return None
    if not stem.isdigit():
        return None
    return int(stem)


def partition_dir(root: Path, partition: int) -> Path:
    return root / str(partition)


def segment_path(root: Path, partition: int, base_offset: int) -> Path:
    return partition_dir(root, partition) / segment_name(base_offset)


def meta_path(root: Path) -> Path:
    return root / META_FILE


def lock_path(root: Path) -> Path:
    return root / LOCK_FILE


def tail_index_path(root: Path, partition: int) -> Path:
    return partition_dir(root, partition) / TAIL_INDEX_FILE


def list_segments(directory: Path) -> list[tuple[int, Path]]:
    """``(base_offset, path)`` of every segment file in ``directory``, oldest first."""
    found = []
    for entry in directory.iterdir():
        base = parse_segment_name(entry.name)
        if base is not None and entry.is_file():
            found.append((base, entry))
    found.sort()
    return found


# ---------------------------------------------------------------- record frame

def encode_record(offset: int, timestamp_ms: int, key: bytes, value: bytes,
                  headers: Sequence[tuple[str, bytes]] = ()) -> bytes:
    """One complete frame (length + CRC + body). Raises ``ValueError`` for unframeable input."""
    parts = [_BODY_PREFIX.pack(MAGIC, offset, timestamp_ms, len(key)), key,
             _U32.pack(len(value)), value, _U16.pack(len(headers))]
    for name, hvalue in headers:
        encoded = name.encode("utf-8")
        if len(encoded) > 0xFFFF:
            raise ValueError(f"header name of {len(encoded)} bytes is longer than 65535")
        parts += [_U16.pack(len(encoded)), encoded, _U32.pack(len(hvalue)), hvalue]
    body = b"".join(parts)
    if len(body) > MAX_BODY_SIZE:
        raise ValueError(f"record of {len(body)} bytes is larger than the {MAX_BODY_SIZE}-byte frame limit")
    return FRAME_HEADER.pack(len(body), crc32c.crc32c(body)) + body


class DecodedBody(NamedTuple):
    offset: int
    timestamp_ms: int
    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...]


def decode_body(data: bytes, start: int, end: int) -> DecodedBody:
    """Decode a version-1 body occupying ``data[start:end]`` (its CRC already checked).

    Raises ``ValueError`` naming the inconsistency when the inner lengths do not add up to
    exactly ``end - start`` bytes (a writer bug or a collision, never a torn write).
    """
    if end - start < MIN_BODY_SIZE:
        raise ValueError(f"body of {end - start} bytes is shorter than {MIN_BODY_SIZE}")
    _magic, offset, timestamp_ms, klen = _BODY_PREFIX.unpack_from(data, start)
    p = start + _BODY_PREFIX.size
    key = data[p:p + klen]
    p += klen
    if p + 6 > end:
        raise ValueError("key length runs past the end of the body")
    (vlen,) = _U32.unpack_from(data, p)
    p += 4
    value = data[p:p + vlen]
    p += vlen
    if p + 2 > end:
        raise ValueError("value length runs past the end of the body")
    (hcount,) = _U16.unpack_from(data, p)
    p += 2
    headers: tuple[tuple[str, bytes], ...] = ()
    if hcount:
        items = []
        for _ in range(hcount):
            if p + 2 > end:
                raise ValueError("header name length runs past the end of the body")
            (nlen,) = _U16.unpack_from(data, p)
            p += 2
            name = data[p:p + nlen]
            p += nlen
            if p + 4 > end:
                raise ValueError("header value length runs past the end of the body")
            (hvlen,) = _U32.unpack_from(data, p)
            p += 4
            items.append((name.decode("utf-8"), data[p:p + hvlen]))
            p += hvlen
        headers = tuple(items)
    if p != end:
        raise ValueError(f"body fields end at byte {p - start} of a {end - start}-byte body")
    return DecodedBody(offset, timestamp_ms, key, value, headers)
