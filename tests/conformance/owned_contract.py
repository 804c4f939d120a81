"""The owned-partitions contract (issue 14, docs/design.md §9), run on the file log and on Kafka.

An engine opened with ``owned=`` applies and serves only those partitions; ``assign`` takes one
on (resumed from its own checkpoint, ``catching_up`` until it has applied the log end seen then),
``revoke`` gives one up (``NotOwner`` at once; ``drop=True`` deletes its state, so the next
``assign`` rebuilds it from offset 0). A backend (``backend`` fixture) gives: ``open(owned)`` on
one state, ``drop_state()``, ``reference(owned)``: an engine with a fresh state over the same log,
and ``raw_log()``: the log itself, to write records as another member would. On the file log one
process holds the log at a time, so the suite closes an engine before it uses the others.

A custom projection with a gate holds the projector inside a step on purpose (the public
projection API, no mock): that makes "still catching up" and "revoked while a step runs"
observable deterministically.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar, Protocol

import pytest

from engine import HistoryEngine
from engine.log.base import Log
from engine.log.file import FileLog
from projections import ClearEvent, ProjectedEvent, Projection, ProjectionTx, keys
from schemas import (
    Batch,
    CommitUnconfirmed,
    InvalidConfiguration,
    LogPosition,
    NotOwner,
    NotReady,
    ProjectionError,
)
from schemas.events import BatchAppended, encode_event
from schemas.records import partition_for_key, record_key
from schemas.times import now_ms
from tests.conformance.facade_contract import turn

PARTITIONS = 4
BOUND_S = 30.0  # the longest any wait here may take on a loaded machine


class OwnedBackend(Protocol):
    def open(self, owned: Iterable[int] | None = None) -> HistoryEngine: ...
    def drop_state(self) -> None: ...
    def reference(self, owned: Iterable[int] | None = None) -> HistoryEngine: ...
    def raw_log(self) -> Log: ...


class FileOwned:
    """The embedded file log under ``root``; ``reference`` replays a copy of the log."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._copies = 0

    def open(self, owned: Iterable[int] | None = None) -> HistoryEngine:
        return HistoryEngine.open(self.root, partitions=PARTITIONS, owned=owned)

    def drop_state(self) -> None:
        shutil.rmtree(self.root / "state")

    def reference(self, owned: Iterable[int] | None = None) -> HistoryEngine:
        self._copies += 1
        copy = self.root.parent / f"reference-{self._copies}"
        shutil.copytree(self.root / "log", copy / "log")
        shutil.copytree(self.root / "keys", copy / "keys")  # the log's content is sealed under these
        return HistoryEngine.open(copy, owned=owned)

    def raw_log(self) -> Log:
        return FileLog(self.root / "log", PARTITIONS)


class KafkaOwned:
    """One topic of a real broker; ``reference`` opens another state directory on it."""

    def __init__(self, bootstrap: str, topic: str, tmp: Path) -> None:
        self.bootstrap, self.topic, self.tmp = bootstrap, topic, tmp
        self._copies = 0

    def open(self, owned: Iterable[int] | None = None) -> HistoryEngine:
        return HistoryEngine.open(kafka=self.bootstrap, topic=self.topic, state_dir=self.tmp / "state",
                                  partitions=PARTITIONS, owned=owned)

    def drop_state(self) -> None:
        shutil.rmtree(self.tmp / "state")

    def reference(self, owned: Iterable[int] | None = None) -> HistoryEngine:
        self._copies += 1
        return HistoryEngine.open(kafka=self.bootstrap, topic=self.topic, state_dir=self.tmp / f"ref-{self._copies}",
                                  owned=owned)

    def raw_log(self) -> Log:
        from engine.log.kafka import KafkaLog

        return KafkaLog(self.bootstrap, self.topic, partitions=None)


def part(conv: str) -> int:
    return partition_for_key(conv.encode(), PARTITIONS)


def conversations_by_partition(per: int = 3) -> dict[int, list[str]]:
    """``per`` conversation ids for each partition (found by the log's own partitioner)."""
    out: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    i = 0
    while any(len(v) < per for v in out.values()):
        c = f"conv-{i}"
        if len(out[part(c)]) < per:
            out[part(c)].append(c)
        i += 1
    return out


def view_of(engine: HistoryEngine, convs: Iterable[str]) -> dict[str, Any]:
    """What a reader of these conversations observes (entries with positions and ids)."""
    return {c: [(e.id, e.position, e.append_id, e.message.canonical_json()) for e in engine.entries(c)]
            for c in sorted(convs)}


def append_raw(log_: Log, batch: Batch) -> LogPosition:
    """Write an append as another member would: to the log, with no engine of this test."""
    return log_.append(record_key(batch.conversation_id, batch.append_id),
                       encode_event(BatchAppended.of(batch, now_ms())))


class Gate(Projection):
    """Counts messages per conversation; holds the projector inside ``apply`` of an event of a
    partition in ``hold`` until ``release`` (``entered`` is set once it holds)."""

    name = "gate-count"

    def __init__(self) -> None:
        self.hold: set[int] = set()
        self.entered = threading.Event()
        self._open = threading.Event()

    def release(self) -> None:
        self.hold = set()
        self._open.set()

    def close_on(self, *parts: int) -> None:
        self._open.clear()
        self.entered.clear()
        self.hold = set(parts)

    def apply(self, event: ProjectedEvent, tx: ProjectionTx) -> None:
        if event.position.partition in self.hold:
            self.entered.set()
            assert self._open.wait(BOUND_S), "the test never released the gate"
        key = event.conversation_id.encode()
        if isinstance(event, ClearEvent):
            tx.delete(key)
            return
        tx.put(key, str(int(tx.get(key) or b"0") + len(event.messages)).encode())


class Total(Projection):
    """Counts every accepted event under one key: a row written by events of every partition."""

    name = "total"

    def apply(self, event: ProjectedEvent, tx: ProjectionTx) -> None:
        tx.put(b"events", str(int(tx.get(b"events") or b"0") + 1).encode())


class OwnedContract:
    @pytest.fixture
    def backend(self) -> OwnedBackend:
        raise NotImplementedError

    convs: ClassVar[dict[int, list[str]]] = conversations_by_partition()

    def write_full(self, backend: OwnedBackend) -> dict[str, Any]:
        """A 4-partition log written by a full engine; what a full reader sees of it."""
        with backend.open() as full:
            for convs in self.convs.values():
                for i, c in enumerate(convs):
                    for t in range(2 + i):
                        full.append(turn(c, f"{c}-a{t}", f"{c} says {t}", tool=t == 1))
            full.clear(self.convs[3][0])
            assert full.stats().owned_partitions == [0, 1, 2, 3]
            return view_of(full, [c for cs in self.convs.values() for c in cs])

    def test_owned_partitions_are_served_taken_on_resumed_and_dropped(self, backend: OwnedBackend) -> None:
        ref = self.write_full(backend)
        backend.drop_state()
        mine = lambda *ps: sorted(c for p in ps for c in self.convs[p])  # noqa: E731

        # An engine owning {0, 1} applies exactly those partitions, from offset 0.
        eng = backend.open(owned=[0, 1])
        try:
            s = eng.stats()
            assert s.owned_partitions == [0, 1] and eng.owned == frozenset({0, 1})
            assert s.applied_since_open == [s.end_offsets[0], s.end_offsets[1], 0, 0]
            assert s.applied_offsets[2:] == [0, 0] and s.lag[2:] == [0, 0]
            assert eng.conversations() == mine(0, 1)
            assert view_of(eng, mine(0, 1)) == {c: ref[c] for c in mine(0, 1)}
            ends = eng.log.end_offsets()
            for c in mine(2, 3):
                with pytest.raises(NotOwner):
                    eng.entries(c)
                with pytest.raises(NotOwner):
                    eng.append(turn(c, "never", "x"))
                with pytest.raises(NotOwner):
                    eng.clear(c)
            assert eng.log.end_offsets() == ends  # refused before anything was written
            assert [eng.partition_state(p) for p in range(4)] == ["ready", "ready", "not_owned", "not_owned"]

            # assign(2): catching up (held inside its first step), then ready; reads equal the full engine's.
            gate = Gate()
            eng.register(gate)
            gate.close_on(2)
            eng.assign([2])
            assert gate.entered.wait(BOUND_S)
            assert eng.partition_state(2) == "catching_up"
            with pytest.raises(NotReady):
                eng.entries(self.convs[2][0])
            with pytest.raises(NotReady):
                eng.append(turn(self.convs[2][0], "early", "x"))
            gate.release()
            assert eng.catch_up(timeout=BOUND_S)
            assert eng.partition_state(2) == "ready"
            assert view_of(eng, mine(2)) == {c: ref[c] for c in mine(2)}
            assert eng.view("gate-count").get(self.convs[2][1].encode()) == str(len(ref[self.convs[2][1]])).encode()

            # Appends on an owned partition work and their receipts read back.
            c1 = self.convs[1][0]
            r = eng.append(turn(c1, "late-1", "after assign"))
            assert r.position.partition == 1
            assert [m.text() for m in eng.read(c1, at_least=r)][-2:] == ["after assign", "answer to after assign"]

            # A write waiting for its decision when its partition is revoked: CommitUnconfirmed at
            # once; revoke returns only after the step in progress (held by the gate) ends.
            gate.close_on(1)
            outcome: list[BaseException | None] = []

            def write() -> None:
                try:
                    eng.append(turn(c1, "late-2", "while revoked"), timeout=BOUND_S)
                    outcome.append(None)
                except BaseException as e:
                    outcome.append(e)

            writer = threading.Thread(target=write)
            writer.start()
            assert gate.entered.wait(BOUND_S)
            revoker = threading.Thread(target=eng.revoke, args=([1],))
            revoker.start()
            writer.join(BOUND_S)
            assert not writer.is_alive() and isinstance(outcome[0], CommitUnconfirmed)
            assert revoker.is_alive()  # the step that holds partition 1 has not ended
            with pytest.raises(NotOwner):
                eng.entries(c1)
            gate.release()
            revoker.join(BOUND_S)
            assert not revoker.is_alive()
            assert eng.partition_state(1) == "not_owned"
            applied_1 = eng.stats().applied_offsets[1]

            # revoke(0): NotOwner at once, for reads, waits and listings.
            eng.revoke([0])
            assert eng.partition_state(0) == "not_owned"
            with pytest.raises(NotOwner):
                eng.read(self.convs[0][0])
            with pytest.raises(NotOwner):
                eng.wait_applied(LogPosition(0, 0), timeout=1)
            assert eng.conversations() == mine(2)
            # Steps go on for partition 2; partition 1 is no longer applied.
            append_raw(eng.log, turn(c1, "late-3", "not mine now"))  # as another member would
            r2 = eng.append(turn(self.convs[2][0], "p2-more", "still mine"))
            eng.wait_applied(r2.position, timeout=BOUND_S)
            assert eng.stats().applied_offsets[1] == applied_1
        finally:
            eng.close()

        # Another member writes partitions 1 and 2 meanwhile.
        log_ = backend.raw_log()
        try:
            for k in range(3):
                append_raw(log_, turn(self.convs[1][1], f"away-{k}", f"away {k}"))
            for k in range(2):
                append_raw(log_, turn(self.convs[2][1], f"away-{k}", f"away {k}"))
        finally:
            log_.close()

        # Restart owning {1, 2}: each resumes from its own checkpoint (nothing replayed from 0).
        eng = backend.open(owned={1, 2})
        try:
            s = eng.stats()
            behind_1 = s.end_offsets[1] - applied_1  # late-2 was applied in the held step; late-3 and away-*
            assert s.applied_since_open == [0, behind_1, 2, 0]
            assert behind_1 == 4
            # revoke(2, drop=True), then assign(2): rebuilt from offset 0.
            eng.revoke([2], drop=True)
            assert eng.stats().applied_offsets[2] == 0
            eng.assign([2])
            assert eng.catch_up(timeout=BOUND_S) and eng.partition_state(2) == "ready"
            s = eng.stats()
            assert s.applied_since_open[2] == 2 + s.end_offsets[2]
            eng.register(Gate())
            mine_now = view_of(eng, mine(1, 2))
            listed = eng.conversations()
            counts = {c: eng.view("gate-count").get(c.encode()) for c in mine(1, 2)}
            stats_now = eng.stats()
        finally:
            eng.close()

        # Equal to a rebuild from the log, of the same partitions and of every partition.
        with backend.reference(owned=[1, 2]) as rebuilt:
            assert view_of(rebuilt, mine(1, 2)) == mine_now
            assert rebuilt.conversations() == listed
            rebuilt.register(Gate())
            assert {c: rebuilt.view("gate-count").get(c.encode()) for c in mine(1, 2)} == counts
            r = rebuilt.stats()
            assert (r.accepted, r.duplicates, r.conflicts, r.rejected_closed, r.corrupt) == (
                stats_now.accepted, stats_now.duplicates, stats_now.conflicts, stats_now.rejected_closed,
                stats_now.corrupt)
        with backend.reference() as full:
            assert view_of(full, mine(1, 2)) == mine_now

    def test_a_key_written_by_several_partitions_is_one_row_per_partition(self, backend: OwnedBackend) -> None:
        self.write_full(backend)
        with backend.open() as eng:
            eng.register(Total())
            view = eng.view("total")
            rows = view.rows(b"events")
            events = sum(2 + i for convs in self.convs.values() for i in range(len(convs))) + 1  # the appends, a clear
            if eng.sealing:  # the catch-up replays only the clear of the cleared conversation (its 2 appends erased)
                events -= 2
            assert sorted(rows) == [0, 1, 2, 3] and sum(int(v) for v in rows.values()) == events
            with pytest.raises(ProjectionError, match="rows"):
                view.get(b"events")
            eng.revoke([2], drop=True)
            assert sorted(view.rows(b"events")) == [0, 1, 3]
            eng.revoke([0, 3])
            assert view.get(b"events") == rows[1]  # one partition owned: one value

    def test_catch_up_stops_waiting_for_a_partition_revoked_meanwhile(self, backend: OwnedBackend) -> None:
        self.write_full(backend)
        backend.drop_state()
        with backend.open(owned=[0]) as eng:
            gate = Gate()
            eng.register(gate)
            gate.close_on(3)
            eng.assign([3])
            assert gate.entered.wait(BOUND_S)  # partition 3 is held inside its first step
            caught: list[bool] = []
            waiter = threading.Thread(target=lambda: caught.append(eng.catch_up(timeout=BOUND_S)))
            waiter.start()
            revoker = threading.Thread(target=eng.revoke, args=([3],), kwargs={"drop": True})
            revoker.start()
            waiter.join(BOUND_S)
            assert caught == [True] and revoker.is_alive()  # answered before the held step ended
            gate.release()
            revoker.join(BOUND_S)
            assert not revoker.is_alive()
            assert eng.partition_state(3) == "not_owned" and eng.stats().applied_offsets[3] == 0

    def test_dropped_partition_leaves_no_row_and_others_untouched(self, backend: OwnedBackend) -> None:
        self.write_full(backend)
        with backend.open() as eng:
            eng.register(Gate())
            keep = view_of(eng, self.convs[0] + self.convs[1] + self.convs[3])
            before = dict(eng._store.db.items())  # every row, as bytes
            eng.revoke([2], drop=True)
            after = dict(eng._store.db.items())
            assert eng.view("gate-count").get(self.convs[2][0].encode()) is None
            eng.assign([2])
            assert eng.catch_up(timeout=BOUND_S)
            assert dict(eng._store.db.items()) == before  # rebuilt to the same bytes
            assert view_of(eng, self.convs[0] + self.convs[1] + self.convs[3]) == keep
        gone = {k for k in before if k not in after}
        assert after == {k: v for k, v in before.items() if k not in gone}  # nothing else changed
        assert {keys.conv_key(c.encode()) for c in self.convs[2]} | {
            keys.checkpoint_key("core", 2), keys.checkpoint_key("gate-count", 2)} <= gone
        assert not any(keys.conv_key(c.encode()) in after for c in self.convs[2])
        assert not any(k[1:].startswith(c.encode() + b"\x1f") for k in after for c in self.convs[2])

    def test_owned_is_checked_before_any_io(self, backend: OwnedBackend, tmp_path: Path) -> None:
        for bad in ([-1], ["0"], [True], 3, "01"):
            with pytest.raises(InvalidConfiguration):
                HistoryEngine.open(tmp_path / "never", owned=bad)  # type: ignore[arg-type]
        assert not (tmp_path / "never").exists()
        self.write_full(backend)
        with pytest.raises(InvalidConfiguration, match="has 4"):
            backend.open(owned=[4])
        with backend.open(owned=[0]) as eng:
            with pytest.raises(InvalidConfiguration):
                eng.assign([9])
            with pytest.raises(InvalidConfiguration):
                eng.revoke([0], drop="yes")  # type: ignore[arg-type]
            assert eng.owned == frozenset({0})

