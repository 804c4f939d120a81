"""Where the leader puts standbys (``engine.cluster.standbys.place_standbys``) and how they
travel in the assignment (``OwnershipAssignor`` with ``standbys=K``), with no broker: the
leader's code run on decoded subscriptions, as ``test_state_affinity`` does. The real failover
is ``tests/integration/test_cluster_standbys.py``."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from engine.cluster.assignor import OwnershipAssignor, decode_owners, decode_standbys, decode_warmups, encode_owners
from engine.cluster.ownership import OwnershipMap
from engine.cluster.standbys import defer_cold_moves, place_standbys
from tests.unit.test_state_affinity import TOPIC, Cluster, member


def _owners(partitions: int, members: list[str]) -> dict[int, str]:
    return {p: members[p % len(members)] for p in range(partitions)}


@pytest.mark.parametrize(("partitions", "n", "k"), [(8, 2, 1), (6, 3, 1), (12, 4, 2), (7, 3, 2), (4, 5, 1)])
def test_standbys_are_k_other_members_spread_evenly(partitions: int, n: int, k: int) -> None:
    members = [f"m{i}" for i in range(n)]
    final = _owners(partitions, members)
    got = place_standbys(final, members, {}, k)
    assert sorted(got) == list(range(partitions))
    load: Counter[str] = Counter()
    for p, standbys in got.items():
        assert len(standbys) == min(k, n - 1) == len(set(standbys))
        assert final[p] not in standbys
        load.update(standbys)
    cap = -(-partitions * min(k, n - 1) // n)
    assert max(load.values()) <= cap
    assert got == place_standbys(final, list(reversed(members)), {}, k)  # deterministic


def test_no_standbys_without_k_or_without_another_member() -> None:
    assert place_standbys({0: "a", 1: "a"}, ["a"], {}, 1) == {}
    assert place_standbys({0: "a", 1: "b"}, ["a", "b"], {}, 0) == {}


def test_a_standby_stays_where_its_state_is_and_the_most_caught_up_is_kept() -> None:
    members = ["a", "b", "c"]
    final = {0: "a", 1: "a", 2: "b", 3: "b", 4: "c", 5: "c"}
    first = place_standbys(final, members, {}, 1)
    held = {m: {p: 100 for p, ss in first.items() if m in ss} for m in members}
    assert place_standbys(final, members, held, 1) == first  # sticky
    # c holds partition 0 further along than b: c keeps it (spread allowing).
    warm = {"b": {0: 10}, "c": {0: 90}}
    assert place_standbys(final, members, warm, 1)[0] == ("c",)


def test_random_placements_keep_every_rule() -> None:
    rnd = random.Random(48)
    for _ in range(300):
        n, partitions, k = rnd.randint(2, 6), rnd.randint(1, 24), rnd.randint(1, 3)
        members = [f"m{i}" for i in range(n)]
        final = {p: rnd.choice(members) for p in range(partitions)}
        held = {m: {p: rnd.randint(0, 50) for p in range(partitions) if rnd.random() < 0.3} for m in members}
        got = place_standbys(final, members, held, k)
        load: Counter[str] = Counter()
        for p, standbys in got.items():
            assert final[p] not in standbys and len(standbys) == min(k, n - 1)
            load.update(standbys)
        cap = -(-partitions * min(k, n - 1) // n)
        # Over the cap only where no member under it could take one of those standbys (its owner, or one already).
        for m in (m for m in members if load[m] > cap):
            for u in (u for u in members if load[u] < cap):
                assert all(u == final[p] or u in ss for p, ss in got.items() if m in ss), (m, u, got)


def test_the_assignment_carries_the_standbys_and_every_member_learns_its_own() -> None:
    members = [member("x", {0, 1}), member("y", {2, 3})]
    out = OwnershipAssignor("http://x:1", TOPIC, standbys=1).assign(Cluster(4), members)
    blobs = {m: a.user_data for m, a in out.items()}
    assert len(set(blobs.values())) == 1  # the same map for every member of the generation
    data = blobs["x"]
    assert decode_owners(data) == (4, {0: "http://x:1", 1: "http://x:1", 2: "http://y:1", 3: "http://y:1"})
    standbys = decode_standbys(data)
    assert standbys == {0: ("http://y:1",), 1: ("http://y:1",), 2: ("http://x:1",), 3: ("http://x:1",)}
    owners = decode_owners(data)
    assert owners is not None
    for url, mine in (("http://x:1", {2, 3}), ("http://y:1", {0, 1})):
        assert OwnershipMap("g", 1, 4, url, owners[1], standbys).standby_here() == frozenset(mine)


def test_old_readers_ignore_standbys_and_bad_data_means_none() -> None:
    data = encode_owners(2, {0: "http://a:1"}, {0: ("http://b:1",)})
    assert decode_owners(data) == (2, {0: "http://a:1"})
    assert decode_standbys(encode_owners(2, {0: "http://a:1"})) == {}
    for bad in (b"", b"\xff", b"[]", b'{"v":1,"standbys":3}', b'{"v":2,"standbys":{"0":["u"]}}'):
        assert decode_standbys(bad) == {}
    assert decode_standbys(b'{"v":1,"standbys":{"0":["u",3]}}') == {0: ("u",)}
    out = OwnershipAssignor("http://x:1", TOPIC).assign(Cluster(2), [member("x", set()), member("y", set())])
    assert all(decode_standbys(a.user_data) == {} for a in out.values())  # K=0: nothing placed


def test_a_move_to_a_member_far_behind_waits_for_its_warm_up() -> None:
    chosen = {0: "y", 1: "y", 2: "x", 3: "z"}
    current = {0: "x", 1: "x", 2: "x"}  # 3: its owner died
    held = {"x": {0: 5000, 1: 900, 2: 10}, "y": {0: 4500}}
    out, warming = defer_cold_moves(chosen, current, held, 1000)
    # 0: y is 500 behind: moves; 1: y has nothing but 900 is within the lag: moves; 3: no live owner: moves.
    assert out == chosen and warming == {}
    held["y"][0] = 3999  # 1001 behind: stays with x, warmed by y
    out, warming = defer_cold_moves(chosen, current, held, 1000)
    assert out == {0: "x", 1: "y", 2: "x", 3: "z"} and warming == {0: "y"}


def test_the_assignment_keeps_a_cold_move_with_its_owner_and_names_the_member_warming_it() -> None:
    # x owns everything with state far ahead; y joins with none: balance would move two to y.
    members = [member("x", {0, 1, 2, 3}, {p: 50_000 for p in range(4)}), member("y", set())]
    out = OwnershipAssignor("http://x:1", TOPIC, standbys=1, warmup_lag=1000).assign(Cluster(4), members)
    assert {tp.partition for tp in out["x"].partitions()} == {0, 1, 2, 3} and not out["y"].partitions()
    data = out["x"].user_data
    warmups = decode_warmups(data)
    assert len(warmups) == 2 and set(warmups.values()) == {"http://y:1"}
    assert all(decode_standbys(data)[p] == ("http://y:1",) for p in range(4))
    # Warmed up (within the lag): the same round moves them (two-phase: revoked from x first).
    warm = [member("x", {0, 1, 2, 3}, {p: 50_000 for p in range(4)}),
            member("y", set(), {p: 49_500 for p in range(4)})]
    out = OwnershipAssignor("http://x:1", TOPIC, standbys=1, warmup_lag=1000).assign(Cluster(4), warm)
    assert decode_warmups(out["x"].user_data) == {} and len(out["x"].partitions()) == 2
    # K = 0: no warm-up, the old behaviour.
    out = OwnershipAssignor("http://x:1", TOPIC).assign(Cluster(4), members)
    assert decode_warmups(out["x"].user_data) == {} and len(out["x"].partitions()) == 2


def test_the_partitions_of_one_owner_get_different_standbys_while_there_are_enough_members() -> None:
    for n in (3, 4, 5):
        members = [f"m{i}" for i in range(n)]
        final = {p: members[p % n] for p in range(2 * n)}  # two partitions each
        got = place_standbys(final, members, {}, 1)
        for owner in members:
            mine = [got[p][0] for p, o in final.items() if o == owner]
            assert len(set(mine)) == len(mine), (owner, got)
