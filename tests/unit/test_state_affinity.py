"""The assignor's preference for members that hold a partition's state (``prefer_state``,
engine/cluster/assignor.py), on kafka-python's own sticky placement and two-phase split, with no
broker: ``OwnershipAssignor.assign`` is the leader's code, run here on decoded subscriptions.
The real restart is ``tests/integration/test_cluster_faults.py``'s kill -9 test."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment, ConsumerProtocolSubscription

from engine.cluster.assignor import OwnershipAssignor, decode_owners, decode_state, encode_url, prefer_state

TOPIC = "t"


class Cluster:
    def __init__(self, partitions: int) -> None:
        self.partitions = partitions

    def topics(self) -> set[str]:
        return {TOPIC}

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return set(range(self.partitions)) if topic == TOPIC else None


@dataclass
class Member:
    member_id: str
    metadata: ConsumerProtocolSubscription


def member(name: str, owned: set[int], held: dict[int, int] | None = None) -> Member:
    sub = ConsumerProtocolSubscription(
        version=1, topics=[TOPIC], user_data=encode_url(f"http://{name}:1", held),
        owned_partitions=[ConsumerProtocolSubscription.TopicPartition(topic=TOPIC, partitions=sorted(owned))]
        if owned else [])
    return Member(name, ConsumerProtocolSubscription.decode(sub.encode()))


def assign(partitions: int, *members: Member) -> dict[str, set[int]]:
    out = OwnershipAssignor("http://leader:1", TOPIC).assign(Cluster(partitions), list(members))
    return {m: {tp.partition for tp in a.partitions()} for m, a in out.items()}


def rounds(partitions: int, owned: dict[str, set[int]], held: dict[str, dict[int, int]]) -> list[dict[str, set[int]]]:
    """Rebalance rounds until the assignment stops changing (each member's owned = what it was given)."""
    seen = []
    for _ in range(6):
        got = assign(partitions, *(member(m, owned[m], held.get(m)) for m in owned))
        seen.append(got)
        claimed = [p for ps in got.values() for p in ps]
        assert len(claimed) == len(set(claimed)), f"a partition given twice in one round: {got}"
        for m, ps in got.items():
            revoked_elsewhere = {p for other, mine in owned.items() if other != m for p in mine}
            assert not ps & revoked_elsewhere, f"{m} given {ps & revoked_elsewhere} still owned by another: {got}"
        if got == owned:
            return seen
        owned = got
    raise AssertionError(f"no stable assignment: {seen}")


def test_a_member_rejoining_with_kept_state_gets_those_partitions_back() -> None:
    # m2 was killed: m0 and m1 took its partitions 0 and 3; it restarts as a new member that owns
    # nothing, holding the state of 0 and 3.
    owned = {"m0": {0, 1, 2}, "m1": {3, 4, 5}, "m2": set()}
    seen = rounds(6, owned, {"m2": {0: 500, 3: 480}})
    first, final = seen[0], seen[-1]
    assert first["m0"] == {1, 2} and first["m1"] == {4, 5} and first["m2"] == set()  # 0 and 3 revoked first
    assert final == {"m0": {1, 2}, "m1": {4, 5}, "m2": {0, 3}}
    assert rounds(6, owned, {})[-1]["m2"] == {2, 5}  # what kafka-python's placement alone gives it


def test_without_state_placement_is_kafka_pythons() -> None:
    owned = {"m0": {0, 1, 2}, "m1": {3, 4, 5}, "m2": set()}
    plain = rounds(6, owned, {})
    assert [sorted(len(ps) for ps in r.values()) for r in plain][-1] == [2, 2, 2]


def test_balance_wins_over_state() -> None:
    # m2 holds the state of four partitions, balance gives it two: the two with the higher checkpoints.
    owned = {"m0": {0, 1, 2}, "m1": {3, 4, 5}, "m2": set()}
    final = rounds(6, owned, {"m2": {0: 5, 1: 7, 3: 9, 4: 1}})[-1]
    assert sorted(len(ps) for ps in final.values()) == [2, 2, 2]
    assert final["m2"] == {1, 3}


@pytest.mark.parametrize("seed", range(40))
def test_random_groups_keep_balance_moves_and_two_phases(seed: int) -> None:
    rng = random.Random(seed)
    partitions, names = rng.randint(1, 12), [f"m{i}" for i in range(rng.randint(1, 5))]
    owned: dict[str, set[int]] = {m: set() for m in names}
    for p in range(partitions):
        if rng.random() < 0.7:
            owned[rng.choice(names)].add(p)
    held = {m: {p: rng.randint(0, 100) for p in range(partitions) if rng.random() < 0.3} for m in names}
    # rounds() checks each round: no partition given twice, none given while another member owns it
    final = rounds(partitions, owned, held)[-1]
    counts = [len(final[m]) for m in names]
    assert max(counts) - min(counts) <= 1 and sum(counts) == partitions
    plain = rounds(partitions, owned, {})[-1]
    assert sorted(counts) == sorted(len(plain[m]) for m in names)


def _count(a: dict[int, str]) -> list[tuple[str, int]]:
    return [(m, sum(1 for v in a.values() if v == m)) for m in sorted(set(a.values()))]


def _moves(a: dict[int, str], current: dict[int, str]) -> int:
    return sum(current.get(p) != m for p, m in a.items())


def _landed(a: dict[int, str], current: dict[int, str], held: dict[str, dict[int, int]]) -> int:
    return sum(current.get(p) != m and p in held[m] for p, m in a.items())


def test_prefer_state_never_adds_moves_nor_changes_counts() -> None:
    rng = random.Random(7)
    improved = 0
    for _ in range(300):
        parts, names = rng.randint(1, 8), ["a", "b", "c"]
        final = {p: rng.choice(names) for p in range(parts)}
        current = {p: rng.choice(names) for p in range(parts) if rng.random() < 0.6}
        held = {m: {p: rng.randint(0, 9) for p in range(parts) if rng.random() < 0.4} for m in names}
        out = prefer_state(final, current, held)
        assert _count(out) == _count(final)
        assert _moves(out, current) <= _moves(final, current)
        assert _landed(out, current, held) >= _landed(final, current, held)
        improved += _landed(out, current, held) > _landed(final, current, held)
    assert improved > 30  # it does something on random inputs


def test_user_data_carries_the_state_and_old_readers_ignore_it() -> None:
    data = encode_url("http://a:1", {5: 10, 0: 3})
    assert decode_state(data) == {0: 3, 5: 10}
    assert decode_state(encode_url("http://a:1")) == {} and decode_state(b"\xff") == {}
    sub = OwnershipAssignor("http://a:1", TOPIC, held=lambda: {2: 40}).metadata({TOPIC})
    assert decode_state(sub.user_data) == {2: 40}
    out = OwnershipAssignor("http://leader:1", TOPIC).assign(Cluster(2), [member("x", set(), {1: 1})])
    blob = next(iter(out.values()))
    assert isinstance(blob, ConsumerProtocolAssignment) and decode_owners(blob.user_data) == (2, {0: "http://x:1",
                                                                                                  1: "http://x:1"})
