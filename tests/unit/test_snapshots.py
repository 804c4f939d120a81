"""State snapshots of a partition (``projections.snapshots``, issue 48), on the embedded file log
with real RocksDB: a snapshot restored on an engine that held nothing of the partition, plus the
tail from the log, equals a rebuild of that partition row for row; every corruption is refused
before anything is installed; a restore cut short by a kill is dropped at the next open; a
cleared conversation is in neither the snapshot nor the restored files."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from engine import HistoryEngine
from projections import keys, snapshots
from projections.snapshots import SnapshotRejected
from projections.store import StateStore
from schemas import NotFound, NotOwner
from schemas.records import partition_for_key, record_key
from tests.conformance.facade_contract import turn
from tests.conformance.owned_contract import PARTITIONS, FileOwned, conversations_by_partition, view_of
from tests.erased_counts import assert_rebuilt_counts
from tests.integration.erasure_support import files_holding, token, token_batch

CONVS = conversations_by_partition(3)
P = 1


def _rows_of(engine: HistoryEngine, partition: int) -> dict[bytes, bytes]:
    """Every row of ``partition`` in the engine's state (``partition_state.partition_rows``)."""
    snap = engine._store.iterator()
    points, ranges = snapshots.partition_rows(snap, partition, PARTITIONS)
    out = {k: v for k in points if (v := snap.get(k)) is not None}
    for lower, upper in ranges:
        out.update(snap.scan(lower, upper))
    return out


def _comparable(rows: dict[bytes, bytes]) -> dict[bytes, bytes]:
    """``rows`` with admission's checkpoint cut to its offset: its counters are compared on their own."""
    core = keys.checkpoint_key("core", P)
    return {k: v[:8] if k == core else v for k, v in rows.items()}


@pytest.fixture
def backend(tmp_path: Path) -> FileOwned:
    return FileOwned(tmp_path / "data")


def _history(backend: FileOwned, secret: str) -> tuple[list[bytes], int]:
    """A history on every partition (tool calls, a clear of a conversation holding ``secret``),
    the snapshot of partition ``P`` taken, then more appends on it (the tail)."""
    with backend.open() as full:
        for convs in CONVS.values():
            for i, c in enumerate(convs):
                for t in range(2 + i):
                    full.append(turn(c, f"{c}-a{t}", f"{c} says {t}", tool=t == 1))
        doomed = CONVS[P][2]
        full.append(token_batch(doomed, "secret", secret))
        full.clear(doomed)
        chunks = list(full.partition_snapshot(P))
        at = full.stats().applied_offsets[P]
        for t in range(3):
            full.append(turn(CONVS[P][0], f"tail-{t}", f"after the snapshot {t}"))
    return chunks, at


def test_a_restored_partition_plus_its_tail_equals_a_rebuild(backend: FileOwned, tmp_path: Path) -> None:
    secret = token()
    chunks, at = _history(backend, secret)
    assert not any(secret.encode() in c for c in chunks)  # cleared before the snapshot: not in it
    backend.drop_state()
    with backend.open(owned=[]) as eng:
        with pytest.raises(NotFound):
            eng.partition_snapshot(P)  # nothing of it here
        with pytest.raises(NotOwner):
            eng.restore_partition(P, chunks)  # not held for a restore
        eng.assign([P], hold=True)
        assert eng.partition_state(P) == "catching_up"
        assert eng.restore_partition(P, chunks) == at
        assert eng.stats().applied_since_open[P] == 0  # nothing replayed to get there
        eng.release([P])
        assert eng.catch_up(timeout=30)
        assert eng.partition_state(P) == "ready"
        assert eng.stats().applied_since_open[P] == 3 * 1  # only the tail: three appends
        restored, seen = _rows_of(eng, P), view_of(eng, CONVS[P])
        stats = eng.stats()
    assert files_holding(tmp_path / "data" / "state", [secret.encode()]) == []
    with backend.reference(owned=[P]) as rebuilt:
        assert _comparable(_rows_of(rebuilt, P)) == _comparable(restored)
        assert view_of(rebuilt, CONVS[P]) == seen
        # The counters are the source's (its live decisions); a rebuild counts the cleared
        # conversation's records as erased instead (tests/erased_counts.py says how they compare).
        assert_rebuilt_counts(stats, rebuilt.stats())


def _frames(chunks: list[bytes]) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    data = b"".join(chunks)
    body = data[len(snapshots.MAGIC):]
    header, body = body.split(b"\n", 1)
    frames, i = [], 0
    while True:
        klen, vlen = struct.unpack_from(">II", body, i)
        i += 8
        if klen == 0xFFFFFFFF:
            break
        frames.append((body[i:i + klen], body[i + klen:i + klen + vlen]))
        i += klen + vlen
    return header, frames


def _encode(header: bytes, frames: list[tuple[bytes, bytes]]) -> list[bytes]:
    """A snapshot with these frames and a correct trailer (what a peer with bad state could send)."""
    import hashlib
    import json

    out = bytearray(snapshots.MAGIC + header + b"\n")
    for k, v in frames:
        out += struct.pack(">II", len(k), len(v)) + k + v
    out += struct.pack(">II", 0xFFFFFFFF, 0)
    trailer = json.dumps({"rows": len(frames), "sha256": hashlib.sha256(out).hexdigest()}).encode() + b"\n"
    return [bytes(out) + trailer]


def test_every_bad_snapshot_is_refused_and_nothing_is_installed(backend: FileOwned) -> None:
    chunks, _ = _history(backend, token())
    data = b"".join(chunks)
    header, frames = _frames(chunks)
    other = next(c for c in CONVS[2])
    foreign = (keys.conv_key(other.encode()), frames[0][1])
    bad = {
        "bad magic": [b"x" + data[1:]],
        "checksum": [data[:200] + bytes([data[200] ^ 1]) + data[201:]],
        "ended early": [data[: len(data) // 2]],
        "after its trailer": [data + b"more"],
        "not partition 1's": _encode(header, [*frames, foreign]),
        "partition is 2": _encode(header.replace(b'"partition":1', b'"partition":2'), frames),
        "state_format": _encode(header.replace(keys.STATE_FORMAT, b"999"), frames),
        "checkpoint row": _encode(header.replace(b'"offset":', b'"offset":1'), frames),
    }
    backend.drop_state()
    with backend.open(owned=[]) as eng:
        eng.assign([P], hold=True)
        for why, stream in bad.items():
            with pytest.raises(SnapshotRejected, match=why):
                eng.restore_partition(P, stream)
            assert eng.applied_offsets()[P] == 0 and _rows_of(eng, P) == {}
            assert eng._store.get(keys.conv_key(other.encode())) is None  # no foreign row written
        eng.release([P])  # falls back to a replay from offset 0
        assert eng.catch_up(timeout=30) and eng.partition_state(P) == "ready"
        replayed = _rows_of(eng, P)
    with backend.reference(owned=[P]) as rebuilt:
        assert _comparable(_rows_of(rebuilt, P)) == _comparable(replayed)


def test_a_restore_cut_short_by_a_kill_is_dropped_at_the_next_open(backend: FileOwned) -> None:
    chunks, _ = _history(backend, token())
    backend.drop_state()
    with backend.open(owned=[0]) as eng:
        keep = _rows_of(eng, 0)
    # What install leaves after its first batches when the process dies: the marker and some rows.
    _, frames = _frames(chunks)
    store = StateStore(backend.root / "state")
    try:
        tx = store.tx()
        tx.put(snapshots.restoring_key(P), b"1")
        for k, v in frames[:5]:
            if not k.startswith(keys.CHECKPOINT):
                tx.put(k, v)
        tx.commit()
    finally:
        store.close()
    with backend.open(owned=[0]) as eng:
        assert _rows_of(eng, P) == {} and eng._store.get(snapshots.restoring_key(P)) is None
        assert _rows_of(eng, 0) == keep  # another partition untouched
        eng.assign([P], hold=True)
        eng.restore_partition(P, chunks)  # restored anew
        eng.release([P])
        assert eng.catch_up(timeout=30)
        restored = _rows_of(eng, P)
    with backend.reference(owned=[P]) as rebuilt:
        assert _comparable(_rows_of(rebuilt, P)) == _comparable(restored)


def test_a_partition_revoked_while_its_snapshot_arrives_installs_nothing(backend: FileOwned) -> None:
    chunks, _ = _history(backend, token())
    backend.drop_state()
    with backend.open(owned=[]) as eng:
        eng.assign([P], hold=True)

        def arriving() -> object:
            yield chunks[0][:10]
            eng.revoke([P])  # the member lost the partition mid-transfer
            yield from [chunks[0][10:], *chunks[1:]]

        with pytest.raises(NotOwner):
            eng.restore_partition(P, arriving())  # type: ignore[arg-type]
        assert eng.applied_offsets()[P] == 0 and _rows_of(eng, P) == {}


def test_conversations_of_the_partition_are_those_of_the_log_partitioner() -> None:
    for p, convs in CONVS.items():
        assert all(partition_for_key(record_key(c), PARTITIONS) == p for c in convs)


def test_a_standby_restored_from_a_snapshot_plus_its_tail_equals_a_rebuild(backend: FileOwned) -> None:
    """A new standby (or one warming up before a move) held by ``add_standbys(hold=True)`` is not
    applied until its snapshot is installed and released; it then applies only the tail, serves
    nothing, and once promoted its state and reads equal a rebuild's."""
    chunks, at = _history(backend, token())
    backend.drop_state()
    with backend.open(owned=[]) as eng:
        eng.add_standbys([0])
        eng.add_standbys([P], hold=True)
        assert eng.standbys == {0, P}
        assert eng.catch_up(timeout=30, standbys=True)  # the projector ran: partition 0 applied...
        ends = eng.stats().end_offsets
        assert eng.applied_offsets()[0] == ends[0] > 0
        assert eng.applied_offsets()[P] == 0  # ...P held: nothing applied
        with pytest.raises(NotFound):
            eng.partition_snapshot(P)  # a held standby is served to no peer either
        assert eng.restore_partition(P, chunks) == at
        eng.release([P])
        assert eng.catch_up(timeout=30, standbys=True)
        assert eng.applied_offsets()[P] == ends[P] and eng.stats().applied_since_open[P] == 3  # the tail
        assert eng.partition_state(P) == "not_owned"
        with pytest.raises(NotOwner):
            eng.entries(CONVS[P][0])  # a standby serves nothing
        restored = _rows_of(eng, P)
        eng.assign([P])  # promoted where it stands
        assert eng.catch_up(timeout=30) and eng.stats().applied_since_open[P] == 3
        seen = view_of(eng, CONVS[P])
    with backend.reference(owned=[P]) as rebuilt:
        assert _comparable(_rows_of(rebuilt, P)) == _comparable(restored)
        assert view_of(rebuilt, CONVS[P]) == seen


def test_a_standby_removed_while_its_snapshot_arrives_installs_nothing(backend: FileOwned) -> None:
    chunks, _ = _history(backend, token())
    backend.drop_state()
    with backend.open(owned=[]) as eng:
        eng.add_standbys([P], hold=True)

        def arriving() -> object:
            yield chunks[0][:10]
            eng.remove_standbys([P])  # the map moved the standby elsewhere mid-transfer
            yield from [chunks[0][10:], *chunks[1:]]

        with pytest.raises(NotOwner):
            eng.restore_partition(P, arriving())  # type: ignore[arg-type]
        assert eng.applied_offsets()[P] == 0 and _rows_of(eng, P) == {} and eng.standbys == frozenset()
        eng.release([P])  # what the restorer does next: nothing to release
        assert eng.standbys == frozenset() and eng.applied_offsets()[P] == 0


def test_a_partition_held_for_a_restore_and_revoked_to_a_standby_is_applied(backend: FileOwned) -> None:
    """``revoke(standby=True)`` of a partition held for a restore: it goes on as a standby, and
    since no restore will install anything into it now, it is applied from its checkpoint."""
    _history(backend, token())
    backend.drop_state()
    with backend.open(owned=[]) as eng:
        eng.assign([P], hold=True)
        eng.revoke([P], standby=True)
        assert eng.standbys == {P}
        assert eng.catch_up(timeout=30, standbys=True)
        assert eng.applied_offsets()[P] == eng.stats().end_offsets[P] > 0
        replayed = _rows_of(eng, P)
    with backend.reference(owned=[P]) as rebuilt:
        assert _comparable(_rows_of(rebuilt, P)) == _comparable(replayed)


def test_snapshots_being_sent_are_counted_until_read_or_closed(backend: FileOwned) -> None:
    """``snapshots_sending`` (a member's ``histlog_cluster_snapshot_streams``): from a stream's
    first chunk until its last, or until it is closed (a peer gone mid-transfer)."""
    _history(backend, token())
    with backend.open() as eng:
        assert eng.snapshots_sending == 0
        whole, cut = eng.partition_snapshot(P), eng.partition_snapshot(P)
        next(whole), next(cut)
        assert eng.snapshots_sending == 2
        list(whole)  # read to its end
        assert eng.snapshots_sending == 1
        cut.close()  # type: ignore[attr-defined]
        assert eng.snapshots_sending == 0
