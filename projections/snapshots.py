"""A partition's state as a stream of bytes, and its restore on another member (issue 48,
docs/cluster.md "State snapshots").

A member that takes a partition on with no state of it would replay the partition from offset 0;
instead it can copy the state from a peer that has it (``GET /v1/partitions/{p}/snapshot``) and
replay only the tail after the snapshot's checkpoint. What this module promises:

* **A snapshot is one point in time** (``stream``): one RocksDB iterator pins the state, and a
  projector step is one WriteBatch, so the rows and the checkpoint a snapshot holds are those of
  the same step. It holds exactly the partition's rows (``partition_state.partition_rows``): a
  cleared conversation's rows were deleted by its clear's step, so a snapshot taken after the
  clear holds nothing of it.
* **The wire format**: ``MAGIC``, one JSON line ``{"v", "state_format", "partition",
  "partitions", "offset"}`` (``offset``: the partition's checkpoint, the next record to apply),
  then one frame per row (``>II`` key and value lengths, the key, the value), then an end frame
  (key length ``0xFFFFFFFF``) and one JSON line ``{"rows", "sha256"}``: the count of rows and the
  SHA-256 of every byte before that line.
* **Nothing unverified is installed** (``receive`` then ``install``). The rows go to a scratch
  store first; the restore is refused (``SnapshotRejected``, the partition's state untouched)
  unless the magic, the format, the state layout, the partition and the partition count are this
  member's, the count and the checksum match what arrived, the scratch holds exactly the rows of
  that partition and nothing else (a peer cannot write another partition's rows), and the
  checkpoint row says the header's offset. A stream cut short is refused the same way.
* **Installed atomically enough to survive kill -9** (``install``): one WriteBatch drops what
  the member held of the partition and writes a marker; the rows follow in batches; the last
  batch writes the checkpoints and deletes the marker. A member killed in between finds the
  marker when it opens (``recover``) and drops the partition again, so it is either restored
  whole or absent (then replayed or restored anew), never half of one.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from projections import keys
from projections.partition_state import drop_partition, partition_rows
from projections.rows import Stats, read_checkpoint_stats
from projections.store import StateStore
from schemas.errors import HistoryError

__all__ = ["FORMAT", "MAGIC", "Received", "SnapshotRejected", "install", "partition_rows", "receive", "recover",
           "restoring_key", "stream"]

MAGIC = b"histlog-partition-snapshot\n"
FORMAT = 1
_FRAME = struct.Struct(">II")
_END = 0xFFFFFFFF
_CHUNK = 256 * 1024  # bytes a stream yields at a time
_TX_ROWS = 4096  # rows per WriteBatch while receiving or installing
_LINE_MAX = 4096


class SnapshotRejected(HistoryError):
    """A snapshot failed verification (the reason says which check); nothing of it was installed."""


@dataclass(frozen=True, slots=True)
class Received:
    """A verified snapshot in a scratch store: its partition, checkpoint offset, row count and checksum."""

    partition: int
    offset: int
    rows: int
    sha256: str


def restoring_key(partition: int) -> bytes:
    """The marker of a restore in progress (``install``)."""
    return keys.meta_key(f"restoring/{partition}")


def stream(store: StateStore, partition: int, partitions: int, core: str) -> Iterator[bytes]:
    """The snapshot of ``partition`` (see the module), in chunks. ``core``: the name of
    admission's checkpoint (``projections.runtime.CORE``)."""
    snap = store.iterator()
    points, ranges = partition_rows(snap, partition, partitions)
    raw = snap.get(keys.checkpoint_key(core, partition))
    offset = keys.read_u64(raw) if raw else 0
    found = [(k, snap.get(k)) for k in points]  # point reads first: a get moves the one iterator
    digest = hashlib.sha256()
    out = bytearray(MAGIC + _line({"v": FORMAT, "state_format": keys.STATE_FORMAT.decode(), "partition": partition,
                                   "partitions": partitions, "offset": offset}))
    rows = 0

    def rows_of() -> Iterator[tuple[bytes, bytes]]:
        for k, v in found:
            if v is not None:
                yield k, v
        for lower, upper in ranges:
            yield from snap.scan(lower, upper)

    for k, v in rows_of():
        out += _FRAME.pack(len(k), len(v))
        out += k
        out += v
        rows += 1
        if len(out) >= _CHUNK:
            digest.update(out)
            yield bytes(out)
            out.clear()
    out += _FRAME.pack(_END, 0)
    digest.update(out)
    yield bytes(out) + _line({"rows": rows, "sha256": digest.hexdigest()})


def receive(scratch: StateStore, chunks: Iterable[bytes], *, partition: int, partitions: int,
            core: str) -> Received:
    """Read a snapshot of ``partition`` from ``chunks`` into the empty store ``scratch`` and
    verify it (the module's checks); ``SnapshotRejected`` naming the first check that failed."""
    reader = _Reader(iter(chunks))
    if reader.exact(len(MAGIC)) != MAGIC:
        raise SnapshotRejected("not a histlog partition snapshot (bad magic)")
    header = reader.json_line()
    expected = {"v": FORMAT, "state_format": keys.STATE_FORMAT.decode(), "partition": partition,
                "partitions": partitions}
    for name, value in expected.items():
        if header.get(name) != value:
            raise SnapshotRejected(f"snapshot {name} is {header.get(name)!r}, this member needs {value!r}")
    offset = header.get("offset")
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise SnapshotRejected(f"snapshot offset {offset!r} is not a log offset")
    rows, tx = 0, scratch.tx()
    while True:
        klen, vlen = _FRAME.unpack(reader.exact(_FRAME.size))
        if klen == _END:
            break
        k, v = reader.exact(klen), reader.exact(vlen)
        tx.put(k, v)
        rows += 1
        if rows % _TX_ROWS == 0:
            tx.commit()
            tx = scratch.tx()
    tx.commit()
    digest = reader.digest()  # of everything before the trailer line
    trailer = reader.json_line()
    if trailer.get("sha256") != digest or trailer.get("rows") != rows:
        raise SnapshotRejected(f"snapshot checksum or row count differs from what arrived ({rows} rows, sha256 "
                               f"{digest[:16]}...; the sender said {trailer.get('rows')!r}, "
                               f"{str(trailer.get('sha256'))[:16]}...)")
    if reader.rest():
        raise SnapshotRejected("snapshot has bytes after its trailer")
    _check_scratch(scratch, partition, partitions, core, offset, rows)
    return Received(partition, offset, rows, digest)


def _check_scratch(scratch: StateStore, partition: int, partitions: int, core: str, offset: int, rows: int) -> None:
    snap = scratch.iterator()
    everything = sum(1 for _ in snap.scan(b"", b"\xff" * 8))
    points, ranges = partition_rows(snap, partition, partitions)
    found = sum(snap.get(k) is not None for k in points)
    for lower, upper in ranges:
        found += sum(1 for _ in snap.scan(lower, upper))
    if everything != rows or found != rows:
        raise SnapshotRejected(f"snapshot holds {everything - found} rows that are not partition {partition}'s")
    raw = snap.get(keys.checkpoint_key(core, partition))
    if (keys.read_u64(raw) if raw else 0) != offset:
        raise SnapshotRejected(f"snapshot checkpoint row differs from its header's offset {offset}")


def install(store: StateStore, scratch: StateStore, received: Received, partitions: int,
            core: str) -> Stats:
    """Replace this member's state of the partition with the verified snapshot in ``scratch``
    (kill-safe, see the module); returned: the partition's admission counters as restored."""
    p = received.partition
    tx = store.tx()
    drop_partition(store, tx, p, partitions)
    tx.put(restoring_key(p), b"1")
    tx.commit()
    snap = scratch.iterator()
    checkpoints = [(k, v) for k, v in snap.scan(keys.CHECKPOINT, keys.prefix_end(keys.CHECKPOINT))]
    tx, n = store.tx(), 0
    for k, v in snap.scan(b"", b"\xff" * 8):
        if k.startswith(keys.CHECKPOINT):
            continue
        tx.put(k, v)
        n += 1
        if n % _TX_ROWS == 0:
            tx.commit()
            tx = store.tx()
    for k, v in checkpoints:
        tx.put(k, v)
    tx.delete(restoring_key(p))
    tx.commit()
    return read_checkpoint_stats(store.get(keys.checkpoint_key(core, p)))


def recover(store: StateStore, partitions: int) -> list[int]:
    """At open: drop every partition whose restore did not finish (its marker is there); returned:
    those partitions (replayed, or restored anew, when taken on)."""
    torn = [p for p in range(partitions) if store.get(restoring_key(p)) is not None]
    if torn:
        tx = store.tx()
        for p in torn:
            drop_partition(store, tx, p, partitions)
            tx.delete(restoring_key(p))
        tx.commit()
    return torn


def _line(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode() + b"\n"


class _Reader:
    """Exact reads over an iterator of byte chunks, hashing what it consumed (``digest``)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = bytearray()
        self._hash = hashlib.sha256()

    def _fill(self, n: int) -> None:
        while len(self._buf) < n:
            chunk = next(self._chunks, None)
            if chunk is None:
                raise SnapshotRejected("snapshot ended early (the transfer was cut short)")
            self._buf += chunk

    def exact(self, n: int) -> bytes:
        self._fill(n)
        out = bytes(self._buf[:n])
        del self._buf[:n]
        self._hash.update(out)
        return out

    def json_line(self) -> dict[str, object]:
        while b"\n" not in self._buf:
            if len(self._buf) > _LINE_MAX:
                raise SnapshotRejected("snapshot header or trailer line is too long")
            self._fill(len(self._buf) + 1)
        end = self._buf.index(b"\n") + 1
        line = bytes(self._buf[:end])
        del self._buf[:end]
        self._hash.update(line)
        try:
            obj = json.loads(line)
        except ValueError:
            raise SnapshotRejected("snapshot header or trailer is not JSON") from None
        if not isinstance(obj, dict):
            raise SnapshotRejected("snapshot header or trailer is not a JSON object")
        return obj

    def digest(self) -> str:
        """SHA-256 of every byte read so far."""
        return self._hash.hexdigest()

    def rest(self) -> bool:
        """Whether anything follows (read to the end)."""
        if self._buf:
            return True
        return any(chunk for chunk in self._chunks)
