"""The standby-replica contract (issue 48, docs/cluster.md "Standby replicas"), on the file log
and on Kafka (the backends of ``owned_contract``).

An engine's standbys are partitions it applies without serving: their calls raise ``NotOwner``
and their events reach no subscription, but the state follows the log, so ``assign`` of a
standby costs only the tail it had not applied (nothing is replayed from offset 0), and the
state it serves then is byte for byte the state of an engine that owned the partition all along.
"""

from __future__ import annotations

import pytest

from projections import keys
from schemas import InvalidConfiguration, NotOwner
from tests.conformance.facade_contract import turn
from tests.conformance.owned_contract import BOUND_S, OwnedBackend, append_raw, conversations_by_partition, view_of


class StandbyContract:
    @pytest.fixture
    def backend(self) -> OwnedBackend:
        raise NotImplementedError

    convs = conversations_by_partition()

    def _write(self, backend: OwnedBackend) -> None:
        with backend.open() as full:
            for convs in self.convs.values():
                for i, c in enumerate(convs):
                    for t in range(2 + i):
                        full.append(turn(c, f"{c}-a{t}", f"{c} says {t}", tool=t == 1))
            full.clear(self.convs[1][2])
        backend.drop_state()

    def test_a_standby_follows_the_log_unserved_and_is_promoted_where_it_stands(self, backend: OwnedBackend) -> None:
        self._write(backend)
        c0, c1 = self.convs[0][0], self.convs[1][0]
        with backend.open(owned=[0]) as eng:
            events = eng.subscribe()
            eng.add_standbys([1])
            assert eng.standbys == frozenset({1}) and eng.owned == frozenset({0})
            assert eng.catch_up(timeout=BOUND_S, standbys=True)
            ends = eng.log.end_offsets()
            assert eng.applied_offsets()[1] == ends[1] > 0
            # Applied, not served: reads, writes and waits on it are NotOwner; its stats are not this engine's.
            assert eng.partition_state(1) == "not_owned"
            for call in (lambda: eng.entries(c1), lambda: eng.append(turn(c1, "never", "x")), lambda: eng.clear(c1)):
                with pytest.raises(NotOwner):
                    call()
            assert eng.log.end_offsets() == ends
            assert eng.stats().owned_partitions == [0]
            assert eng.conversations() == sorted(self.convs[0])

            # It keeps following what another member appends.
            later = append_raw(eng.log, turn(c1, "away-1", "written by its owner"))
            assert later.partition == 1
            assert eng.catch_up(timeout=BOUND_S, standbys=True)
            assert eng.applied_offsets()[1] == later.offset + 1

            # Promoted: ready at once, nothing replayed, served.
            applied_before = eng.stats().applied_since_open[1]
            eng.assign([1])
            assert eng.standbys == frozenset() and eng.owned == frozenset({0, 1})
            assert eng.catch_up(timeout=BOUND_S)
            assert eng.partition_state(1) == "ready"
            assert eng.stats().applied_since_open[1] == applied_before
            assert [m.text() for m in eng.read(c1)][-1] == "answer to written by its owner"
            own = eng.append(turn(c0, "own-0", "on my own partition"))
            eng.wait_applied(own.position, timeout=BOUND_S)
            mine = view_of(eng, self.convs[0] + self.convs[1])

            # Events: the owned partition's, never the standby's (its owner's subscribers have them).
            seen = []
            for event in events:
                seen.append(event)
                if event.position == own.position:
                    break
            assert {e.position.partition for e in seen} == {0}
            events.close()
            rows = dict(eng._store.db.items())

        # Equal to a rebuild of the same partitions from the log, row for row.
        with backend.reference(owned=[0, 1]) as rebuilt:
            assert view_of(rebuilt, self.convs[0] + self.convs[1]) == mine
            assert dict(rebuilt._store.db.items()) == rows

    def test_revoked_to_standby_keeps_applying_and_removed_stops(self, backend: OwnedBackend) -> None:
        self._write(backend)
        c2 = self.convs[2][0]
        with backend.open(owned=[2, 3]) as eng:
            assert eng.catch_up(timeout=BOUND_S)
            eng.revoke([2], standby=True)
            assert eng.standbys == frozenset({2}) and eng.partition_state(2) == "not_owned"
            with pytest.raises(NotOwner):
                eng.entries(c2)
            r = append_raw(eng.log, turn(c2, "while-standby", "x"))
            assert eng.catch_up(timeout=BOUND_S, standbys=True)
            assert eng.applied_offsets()[2] == r.offset + 1

            eng.remove_standbys([2])
            assert eng.standbys == frozenset()
            stopped = eng.applied_offsets()[2]
            append_raw(eng.log, turn(c2, "after-removal", "x"))
            mark = eng.append(turn(self.convs[3][0], "p3", "still mine"))
            eng.wait_applied(mark.position, timeout=BOUND_S)
            assert eng.applied_offsets()[2] == stopped  # no longer applied; its state is kept
            assert eng.catch_up(timeout=BOUND_S, standbys=True)  # nothing of 2 is waited for

            eng.add_standbys([2])  # resumed from its checkpoint, then dropped with its rows
            assert eng.catch_up(timeout=BOUND_S, standbys=True)
            assert eng.applied_offsets()[2] == stopped + 1
            eng.remove_standbys([2], drop=True)
            assert eng.applied_offsets()[2] == 0
            assert eng._store.get(keys.conv_key(c2.encode())) is None

    def test_standby_arguments_are_checked_before_anything_changes(self, backend: OwnedBackend) -> None:
        self._write(backend)
        with backend.open(owned=[0]) as eng:
            for bad in ([4], [-1], ["1"], [True]):
                with pytest.raises(InvalidConfiguration):
                    eng.add_standbys(bad)  # type: ignore[arg-type]
            with pytest.raises(InvalidConfiguration):
                eng.remove_standbys([1], drop="yes")  # type: ignore[arg-type]
            with pytest.raises(InvalidConfiguration, match="choose one"):
                eng.revoke([0], drop=True, standby=True)
            with pytest.raises(InvalidConfiguration):
                eng.catch_up(standbys="yes")  # type: ignore[arg-type]
            assert eng.owned == frozenset({0}) and eng.standbys == frozenset()
            eng.add_standbys([0])  # owned already: left alone
            assert eng.standbys == frozenset() and eng.partition_state(0) == "ready"
