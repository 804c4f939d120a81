"""Graph checkpoints (LangGraph persistence; ``schemas.checkpoints``): admission's rule for a
``Checkpointed`` record and the rows it keeps, and the reads of them.

Rows (``projections.keys``), all under the thread's conversation, so ``clear`` drops them with
its messages and a partition's drop takes them:

* ``Y conv 1F ns 1F checkpoint``: the checkpoint without its channel values (parent, run, the
  serde's checkpoint and metadata, the channel versions). Checkpoint ids sort by time (LangGraph's
  are UUIDv6), so a namespace's newest is one floor seek and a list newest first one reverse scan.
* ``Z conv 1F ns 1F channel 1F version``: a channel's value at a version, written once by the put
  that brought it and shared by every later checkpoint that keeps that version, so a checkpoint
  costs the channels it changed, not the whole state (``b""``: the channel has no value there).
* ``V conv 1F ns 1F checkpoint 1F task 1F index``: a task's pending write.
* ``B part run 1F conv 1F ns 1F checkpoint``: the checkpoints of a run (``delete_for_runs``).

Admission, in log order: a closed conversation → **rejected_closed**; else **checkpointed**:

* ``put``: the checkpoint row (the same put again writes the same bytes), its blobs, its run row;
* ``writes``: each write, except one at an index >= 0 the task wrote already (LangGraph's rule:
  the special channels, with negative indexes, are overwritten);
* ``prune``: ``delete`` drops every checkpoint row, blob and write of the thread; ``keep_latest``
  keeps each namespace's newest checkpoint with its writes; ``runs`` drops the checkpoints of the
  named runs with their writes. Blobs no remaining checkpoint of their namespace names go too.

A thread's first put makes its summary row (without listing it, as a turn slot does), so its
clear compacts its rows and a partition's drop finds them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from projections import feature_keys, keys
from projections.store import Snapshot, Tx
from schemas.checkpoints import (
    CheckpointWrite,
    PruneContent,
    PutContent,
    StoredCheckpoint,
    Typed,
    WritesContent,
    frames,
    unframe,
)

__all__ = ["PAGE", "apply", "clear_runs", "get", "listed", "run_checkpoints"]

PAGE = 64
"""How many checkpoint rows a list reads at once (then their blobs and writes, point reads)."""

_Y, _Z, _V = keys.GRAPH_CHECKPOINT, keys.GRAPH_BLOB, keys.GRAPH_WRITE


class _Row(NamedTuple):
    parent: bytes
    run: bytes
    checkpoint: Typed
    metadata: Typed
    versions: list[tuple[bytes, bytes]]


def _pack(put: PutContent) -> bytes:
    versions = frames([frames([c.encode(), v.encode()]) for c, v in put.versions])
    return frames([(put.parent_id or "").encode(), (put.run_id or "").encode(), put.checkpoint[0].encode(),
                   put.checkpoint[1], put.metadata[0].encode(), put.metadata[1], versions])


def _unpack(value: bytes) -> _Row:
    parent, run, ctype, cbytes, mtype, mbytes, versions = unframe(value, 7)
    pairs = [(c, v) for c, v in (unframe(raw, 2) for raw in unframe(versions))]
    return _Row(parent, run, (ctype.decode(), cbytes), (mtype.decode(), mbytes), pairs)


# -- admission ---------------------------------------------------------------------------------
def apply(tx: Tx, conv: bytes, partition: int, content: PutContent | WritesContent | PruneContent) -> None:
    """Apply one ``Checkpointed`` record's content in ``tx`` (the caller checked the conversation is open)."""
    if isinstance(content, PutContent):
        ns, cid = content.checkpoint_ns.encode(), content.checkpoint_id.encode()
        key = feature_keys.graph_key(_Y, conv, ns, cid)
        old = tx.get(key)
        if old is not None:
            run = _unpack(old).run
            if run and run != (content.run_id or "").encode():
                tx.delete(feature_keys.graph_run_key(partition, run, conv, ns, cid))
        tx.put(key, _pack(content))
        for channel, version, typed in content.blobs:
            tx.put(feature_keys.graph_key(_Z, conv, ns, channel.encode(), version.encode()),
                   b"" if typed is None else frames([typed[0].encode(), typed[1]]))
        if content.run_id:
            tx.put(feature_keys.graph_run_key(partition, content.run_id.encode(), conv, ns, cid), b"")
        return
    if isinstance(content, WritesContent):
        ns, cid, task = content.checkpoint_ns.encode(), content.checkpoint_id.encode(), content.task_id.encode()
        path = content.task_path.encode()
        for index, channel, (type_, data) in content.writes:
            key = feature_keys.graph_key(_V, conv, ns, cid, task, feature_keys.graph_write_index(index))
            if index >= 0 and tx.get(key) is not None:
                continue
            tx.put(key, frames([path, channel.encode(), type_.encode(), data]))
        return
    _prune(tx, conv, partition, content)


def _prune(tx: Tx, conv: bytes, partition: int, content: PruneContent) -> None:
    by_ns: dict[bytes, list[tuple[bytes, _Row]]] = {}
    lower, upper = keys.conv_range(_Y, conv)
    for key, value in tx.scan(lower, upper):
        ns, cid = key[len(lower):].split(keys.SEP, 1)
        by_ns.setdefault(ns, []).append((cid, _unpack(value)))
    runs = {r.encode() for r in content.run_ids}
    for ns, rows in by_ns.items():
        if content.strategy == "delete":
            gone = rows
        elif content.strategy == "keep_latest":
            gone = rows[:-1]  # in key order: the newest is last
        else:
            gone = [(cid, row) for cid, row in rows if row.run in runs]
        if not gone:
            continue
        for cid, row in gone:
            tx.delete(feature_keys.graph_key(_Y, conv, ns, cid))
            tx.delete_range(*feature_keys.graph_range(_V, conv, ns, cid))
            if row.run:
                tx.delete(feature_keys.graph_run_key(partition, row.run, conv, ns, cid))
        dropped = {cid for cid, _ in gone}
        kept = {(c, v) for cid, row in rows if cid not in dropped for c, v in row.versions}
        blobs_lower, blobs_upper = feature_keys.graph_range(_Z, conv, ns)
        for key, _ in tx.scan(blobs_lower, blobs_upper):
            channel, version = key[len(blobs_lower):].split(keys.SEP, 1)
            if (channel, version) not in kept:
                tx.delete(key)


def clear_runs(tx: Tx, conv: bytes, partition: int) -> None:
    """Delete the ``B`` rows of the thread's checkpoints (a clear: its other rows go with its
    conversation's ranges). One scan of its checkpoint rows."""
    lower, upper = keys.conv_range(_Y, conv)
    for key, value in tx.scan(lower, upper):
        run = _unpack(value).run
        if run:
            ns, cid = key[len(lower):].split(keys.SEP, 1)
            tx.delete(feature_keys.graph_run_key(partition, run, conv, ns, cid))


# -- reads -------------------------------------------------------------------------------------
def _stored(snap: Snapshot, conv: bytes, ns: bytes, cid: bytes, value: bytes) -> StoredCheckpoint:
    """A checkpoint row with its channel values (a point read per channel) and its pending
    writes (one scan), in LangGraph's ``writes_sort_key`` order."""
    row = _unpack(value)
    values: dict[str, Typed] = {}
    for channel, version in row.versions:
        raw = snap.get(feature_keys.graph_key(_Z, conv, ns, channel, version))
        if raw:
            type_, data = unframe(raw, 2)
            values[channel.decode()] = (type_.decode(), data)
    writes = []
    lower, upper = feature_keys.graph_range(_V, conv, ns, cid)
    for key, raw in snap.scan(lower, upper):
        task = key[len(lower):-5]
        path, channel, type_, data = unframe(raw, 4)
        writes.append(CheckpointWrite(task.decode(), channel.decode(), (type_.decode(), data), path.decode(),
                                      feature_keys.read_graph_write_index(key)))
    writes.sort(key=lambda w: (w.task_path, w.task_id, w.idx))
    versions = {c.decode(): v.decode() for c, v in row.versions}
    return StoredCheckpoint(conv.decode(), ns.decode(), cid.decode(), row.parent.decode() or None,
                            row.run.decode() or None, row.checkpoint, row.metadata, versions, values, tuple(writes))


def get(snap: Snapshot, conv: bytes, ns: bytes, cid: bytes | None) -> StoredCheckpoint | None:
    """The checkpoint ``cid`` of the namespace, or its newest (``cid`` None): one point read or
    one floor seek, then its channels and writes."""
    if cid is not None:
        value = snap.get(feature_keys.graph_key(_Y, conv, ns, cid))
        return _stored(snap, conv, ns, cid, value) if value is not None else None
    lower, upper = feature_keys.graph_range(_Y, conv, ns)
    found = snap.floor(lower, upper)
    if found is None or not found[0].startswith(lower):
        return None
    return _stored(snap, conv, ns, found[0][len(lower):], found[1])


def listed(snap: Snapshot, conv: bytes | None, ns: bytes | None, before: bytes | None,
           limit: int | None = None) -> Iterator[StoredCheckpoint]:
    """The checkpoints of a namespace (``conv`` and ``ns``), of every namespace of a thread (``ns``
    None) or of every thread (``conv`` None), newest first within each namespace, those before
    checkpoint id ``before`` only; read lazily, ``PAGE`` rows at a time, so a caller that stops
    early reads no further: a namespace costs O(returned). Without a namespace the namespaces are
    found first, one seek each. At most
    ``limit`` (None: all), and no row past them is read."""
    left = limit
    for c, n in _groups(snap, conv, ns):
        lower, upper = feature_keys.graph_range(_Y, c, n)
        if before is not None:
            upper = min(upper, lower + before)
        while left is None or left > 0:
            size = PAGE if left is None else min(PAGE, left)
            page: list[tuple[bytes, bytes]] = []
            scan = snap.scan_reverse(lower, upper)
            try:
                for found in scan:
                    page.append(found)
                    if len(page) == size:
                        break
            finally:
                scan.close()  # before the blobs' point reads: a snapshot has one iterator
            for key, value in page:
                yield _stored(snap, c, n, key[len(lower):], value)
            if left is not None:
                left -= len(page)
            if len(page) < size:
                break
            upper = page[-1][0]
        if left is not None and left <= 0:
            return


def _groups(snap: Snapshot, conv: bytes | None, ns: bytes | None) -> list[tuple[bytes, bytes]]:
    """The ``(conversation, namespace)`` pairs to list, in key order: one seek per pair (each
    seek skips the rest of the namespace it found)."""
    if conv is not None and ns is not None:
        return [(conv, ns)]
    lower, upper = keys.conv_range(_Y, conv) if conv is not None else (_Y, keys.prefix_end(_Y))
    seen: list[tuple[bytes, bytes]] = []
    while True:
        found = _first(snap, lower, upper)
        if found is None:
            return seen
        c, n, _cid = found.split(keys.SEP)
        seen.append((c, n))
        lower = feature_keys.graph_range(_Y, c, n)[1]


def _first(snap: Snapshot, lower: bytes, upper: bytes) -> bytes | None:
    """The first ``Y`` key in ``[lower, upper)`` without its prefix, or None (one seek)."""
    for key, _ in snap.scan(lower, upper):
        return key[len(_Y):]
    return None


def run_checkpoints(snap: Snapshot, partitions: int, run: bytes) -> list[bytes]:
    """The conversations holding checkpoints of run ``run`` (one seek per partition)."""
    found: list[bytes] = []
    for p in range(partitions):
        for key, _ in snap.scan(*feature_keys.graph_run_range(p, run)):
            conv = feature_keys.read_graph_run_key(key)[0]
            if conv not in found:
                found.append(conv)
    return found
