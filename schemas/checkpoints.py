"""Graph checkpoints on the log (LangGraph persistence: ``engine.integrations.langgraph`` is the
saver): the values the engine's checkpoint calls take and return, their checks, and the content
of a ``Checkpointed`` event (``schemas/checkpointed.avsc``), the one home of its bytes.

A thread is a conversation: its checkpoints are records of that conversation, sealed under its
data keys like messages, so ``clear`` (LangGraph's ``delete_thread``) erases them with it.

The content of each kind is a sequence of *frames* (``frames``: each part's length as a base-128
varint, then its bytes), so no part needs escaping:

* ``put``: namespace, checkpoint id, parent id (``""``: none), run id (``""``: none), the
  checkpoint's serde type and bytes (without its channel values), the metadata's type and
  bytes, its channel versions (frames of channel, version pairs) and the blobs it adds (frames of
  channel, version, type, bytes; type ``""`` marks a channel the checkpoint has no value for);
* ``writes``: namespace, checkpoint id, task id, task path, and the writes (frames of index,
  channel, type, bytes; the index as decimal text, negative for LangGraph's special channels);
* ``prune``: the strategy (``keep_latest``, ``delete``, or ``runs``) and, for ``runs``, the run ids.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from schemas.errors import InvalidRequest

__all__ = [
    "KINDS",
    "MAX_NAME_BYTES",
    "PRUNE_STRATEGIES",
    "CheckpointWrite",
    "PruneContent",
    "PutContent",
    "StoredCheckpoint",
    "Typed",
    "WritesContent",
    "check_name",
    "frames",
    "unframe",
]

Typed = tuple[str, bytes]
"""A value as a serde's ``dumps_typed`` gives it: its type name and its bytes."""

KINDS: Final = ("put", "writes", "prune")
PRUNE_STRATEGIES: Final = ("keep_latest", "delete", "runs")
MAX_NAME_BYTES: Final = 1024
_CONTROL = re.compile("[\x00-\x1f\x7f]")


def check_name(value: object, field: str, *, empty: bool = False) -> str:
    """A namespace, checkpoint id, channel, task or version: a str of at most ``MAX_NAME_BYTES``
    UTF-8 bytes without control characters (``""`` only when ``empty``); ``InvalidRequest``
    naming ``field`` otherwise."""
    if not isinstance(value, str):
        raise InvalidRequest(f"invalid {field}: expected a str, got {type(value).__name__}")
    if not value and not empty:
        raise InvalidRequest(f"invalid {field}: empty")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidRequest(f"invalid {field}: invalid UTF-8 (lone surrogate)") from None
    if size > MAX_NAME_BYTES:
        raise InvalidRequest(f"invalid {field}: longer than {MAX_NAME_BYTES} bytes ({size} bytes)")
    bad = _CONTROL.search(value)
    if bad is not None:
        raise InvalidRequest(f"invalid {field}: contains control character U+{ord(bad.group()):04X}")
    return value


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def frames(parts: Sequence[bytes]) -> bytes:
    """``parts`` as frames: each one's length (a base-128 varint), then its bytes."""
    return b"".join(_varint(len(p)) + p for p in parts)


def unframe(data: bytes, count: int | None = None) -> list[bytes]:
    """The parts ``frames`` wrote; ``ValueError`` for bytes it did not write (or not ``count`` parts)."""
    out: list[bytes] = []
    i, end = 0, len(data)
    while i < end:
        n = shift = 0
        while True:
            if i >= end or shift > 63:
                raise ValueError("a frame's length is cut short")
            b = data[i]
            i += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                break
        if i + n > end:
            raise ValueError("a frame is longer than the bytes left")
        out.append(data[i:i + n])
        i += n
    if count is not None and len(out) != count:
        raise ValueError(f"{len(out)} frames where {count} belong")
    return out


def _text(b: bytes, field: str, *, empty: bool = False) -> str:
    try:
        text = b.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{field} is not UTF-8") from None
    try:
        return check_name(text, field, empty=empty)
    except InvalidRequest as e:
        raise ValueError(str(e)) from None


def _typed(type_: bytes, data: bytes) -> Typed:
    return _text(type_, "type"), data


@dataclass(frozen=True, slots=True)
class PutContent:
    """A checkpoint put: its place (namespace, id, parent), its run, the checkpoint and metadata
    as the serde typed them, the checkpoint's channel versions and the blobs it adds (``None``:
    a channel with a new version but no value)."""

    checkpoint_ns: str
    checkpoint_id: str
    parent_id: str | None
    run_id: str | None
    checkpoint: Typed
    metadata: Typed
    versions: tuple[tuple[str, str], ...]
    blobs: tuple[tuple[str, str, Typed | None], ...]

    def encode(self) -> bytes:
        versions = frames([frames([c.encode(), v.encode()]) for c, v in self.versions])
        added = []
        for c, v, typed in self.blobs:
            t, b = typed if typed is not None else ("", b"")
            added.append(frames([c.encode(), v.encode(), t.encode(), b]))
        blobs = frames(added)
        return frames([self.checkpoint_ns.encode(), self.checkpoint_id.encode(), (self.parent_id or "").encode(),
                       (self.run_id or "").encode(), self.checkpoint[0].encode(), self.checkpoint[1],
                       self.metadata[0].encode(), self.metadata[1], versions, blobs])

    @classmethod
    def decode(cls, data: bytes) -> PutContent:
        ns, cid, parent, run, ctype, cbytes, mtype, mbytes, versions, blobs = unframe(data, 10)
        pairs = []
        for raw in unframe(versions):
            c, v = unframe(raw, 2)
            pairs.append((_text(c, "channel"), _text(v, "version")))
        added: list[tuple[str, str, Typed | None]] = []
        for raw in unframe(blobs):
            c, v, t, b = unframe(raw, 4)
            added.append((_text(c, "channel"), _text(v, "version"), _typed(t, b) if t else None))
        return cls(_text(ns, "checkpoint_ns", empty=True), _text(cid, "checkpoint_id"),
                   _text(parent, "parent_id", empty=True) or None, _text(run, "run_id", empty=True) or None,
                   _typed(ctype, cbytes), _typed(mtype, mbytes), tuple(pairs), tuple(added))


@dataclass(frozen=True, slots=True)
class WritesContent:
    """A task's writes to a checkpoint: ``(index, channel, value)`` each."""

    checkpoint_ns: str
    checkpoint_id: str
    task_id: str
    task_path: str
    writes: tuple[tuple[int, str, Typed], ...]

    def encode(self) -> bytes:
        writes = frames([frames([str(i).encode(), c.encode(), t.encode(), b]) for i, c, (t, b) in self.writes])
        return frames([self.checkpoint_ns.encode(), self.checkpoint_id.encode(), self.task_id.encode(),
                       self.task_path.encode(), writes])

    @classmethod
    def decode(cls, data: bytes) -> WritesContent:
        ns, cid, task, path, raw_writes = unframe(data, 5)
        writes = []
        for raw in unframe(raw_writes):
            i, c, t, b = unframe(raw, 4)
            if re.fullmatch(rb"-?(0|[1-9][0-9]{0,9})", i) is None or not -(1 << 31) <= int(i) < (1 << 31):
                raise ValueError("a write's index is not a decimal int of 32 bits")
            writes.append((int(i), _text(c, "channel"), _typed(t, b)))
        if not writes:
            raise ValueError("writes with no write")
        return cls(_text(ns, "checkpoint_ns", empty=True), _text(cid, "checkpoint_id"), _text(task, "task_id"),
                   _text(path, "task_path", empty=True), tuple(writes))


@dataclass(frozen=True, slots=True)
class PruneContent:
    """A prune of the thread's checkpoints: ``keep_latest`` (each namespace's newest stays),
    ``delete`` (all go) or ``runs`` (those whose run is in ``run_ids``)."""

    strategy: str
    run_ids: tuple[str, ...] = ()

    def encode(self) -> bytes:
        return frames([self.strategy.encode(), frames([r.encode() for r in self.run_ids])])

    @classmethod
    def decode(cls, data: bytes) -> PruneContent:
        strategy, runs = unframe(data, 2)
        text = strategy.decode("utf-8", "replace")
        if text not in PRUNE_STRATEGIES:
            raise ValueError(f"prune strategy {text[:40]!r} is not one of {', '.join(PRUNE_STRATEGIES)}")
        run_ids = tuple(_text(r, "run_id") for r in unframe(runs))
        if (text == "runs") != bool(run_ids):
            raise ValueError("a prune of runs names its runs, and only it does")
        return cls(text, run_ids)


@dataclass(frozen=True, slots=True)
class CheckpointWrite:
    """A pending write of a checkpoint, as ``put_checkpoint_writes`` stored it."""

    task_id: str
    channel: str
    value: Typed
    task_path: str
    idx: int


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    """A checkpoint as the engine stores it: the serde's bytes, its channel values assembled
    from the blobs of its versions, and its pending writes (in ``(task_path, task_id, idx)`` order)."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    run_id: str | None
    checkpoint: Typed
    metadata: Typed
    channel_versions: dict[str, str]
    channel_values: dict[str, Typed]
    pending_writes: tuple[CheckpointWrite, ...]
