"""Cluster membership on a Kafka consumer group (issue 14): members are real processes
(``tests/integration/member_runner.py``) on a real broker, so kill -9 and SIGSTOP are real.

Every wait is bounded and waits on a condition (a line from a member); the measured timings are
printed (``pytest -s`` shows them). Session timeout: 6 s, the broker's minimum.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaProducer

from engine.cluster import Membership, OwnershipMap
from engine.log.kafka_topic import CLIENT_TUNING
from schemas.errors import InvalidConfiguration
from tests.kafka_broker import KafkaCluster, unique_topic

pytestmark = pytest.mark.kafka

REPO = Path(__file__).resolve().parents[2]
PARTITIONS = 6
SESSION_S = 6.0
HEARTBEAT_S = SESSION_S / 6  # Membership's default heartbeat interval
JOIN_BOUND_S = 30.0  # first start of a process (imports, bootstrap, first rebalance)
REBALANCE_BOUND_S = 15.0
UNSTICK_S = 2 * SESSION_S
"""After a membership change a survivor's join can hang in kafka-python 3.0.12 (its SyncGroup
answered, the join task never completing: about one run in three of these tests on a busy
machine). ``Membership._unstick`` starts it again as a new member after ``rebalance_timeout +
session_timeout`` (two sessions, as ``member_runner`` and ``ClusterMember`` set it), and the lease
keeps it from serving meanwhile; waits for the group to agree after a change allow for that."""

Event = dict[str, Any]


class Member:
    """A ``member_runner`` process and the events it printed (read by a thread as they come)."""

    def __init__(self, bootstrap: str, topic: str, group: str, url: str, cond: threading.Condition,
                 instance_id: str | None = None) -> None:
        self.url = url
        self.events: list[Event] = []
        self.cond = cond
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        static = [instance_id] if instance_id else []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.member_runner", bootstrap, topic, group, url, str(SESSION_S),
             *static],
            cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, bufsize=1)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None  # Invariant: Popen was given stdout=PIPE
        for line in self.proc.stdout:
            with self.cond:
                self.events.append(json.loads(line))
                self.cond.notify_all()
        with self.cond:
            self.events.append({"event": "eof", "t": time.time()})
            self.cond.notify_all()

    def wait_for(self, predicate: Callable[[list[Event]], Any], timeout: float, what: str) -> Any:
        """The first truthy ``predicate(events)`` within ``timeout`` seconds, else fail."""
        with self.cond:
            found = self.cond.wait_for(lambda: predicate(self.events), timeout)
            if not found:
                pytest.fail(f"{self.url}: no {what} within {timeout:.0f} s; events: {self.events[-8:]}")
            return found

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None  # Invariant: Popen was given stdin=PIPE
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def stats(self, timeout: float = 10.0) -> Event:
        with self.cond:
            seen = len(self.events)
        self.send("stats")
        found: Event = self.wait_for(lambda ev: next((e for e in ev[seen:] if e["event"] == "stats"), None),
                                     timeout, "stats")
        return found

    def latest_map(self) -> Event | None:
        with self.cond:
            return next((e for e in reversed(self.events) if e["event"] == "map"), None)

    def owned(self) -> set[int]:
        """What the member serves according to its assigned/revoked events."""
        owned: set[int] = set()
        with self.cond:
            for e in self.events:
                if e["event"] == "assigned":
                    assert not owned & set(e["parts"]), f"{self.url} assigned twice: {e}"
                    owned |= set(e["parts"])
                elif e["event"] == "revoked":
                    assert set(e["parts"]) <= owned, f"{self.url} revoked what it did not own: {e}"
                    owned -= set(e["parts"])
        return owned

    def mark(self) -> int:
        with self.cond:
            return len(self.events)

    def since(self, mark: int) -> list[Event]:
        with self.cond:
            return list(self.events[mark:])

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGCONT)
        self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


@pytest.fixture
def topic(kafka_bootstrap: str) -> str:
    name = unique_topic("membership")
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, **CLIENT_TUNING)
    try:
        admin.create_topics({name: {"num_partitions": PARTITIONS, "replication_factor": 1}},
                            timeout_ms=15_000, wait_for_metadata=True)
    finally:
        admin.close()
    return name


@pytest.fixture
def spawn(kafka_bootstrap: str, topic: str) -> Iterator[Callable[..., Member]]:
    """``spawn(n, instance_id=None)`` starts member ``n`` (URL http://127.0.0.1:90NN) of one group;
    all are killed at the end."""
    group = f"g-{topic}"
    members: list[Member] = []
    cond = threading.Condition()  # shared: any member's line wakes a wait on several members

    def start(n: int, instance_id: str | None = None) -> Member:
        member = Member(kafka_bootstrap, topic, group, f"http://127.0.0.1:{9000 + n}", cond, instance_id)
        members.append(member)
        return member

    yield start
    for member in members:
        member.stop()


def converged(members: list[Member], absent: tuple[str, ...] = ()) -> int | None:
    """The generation on which every member's latest map agrees, covers every partition exactly
    once with owners among ``members``, and matches what each member serves; else None."""
    maps = [m.latest_map() for m in members]
    if any(mp is None for mp in maps):
        return None
    first = maps[0]
    assert first is not None  # Invariant: checked just above
    if first["generation"] < 0 or any(mp != {**first, "t": mp["t"]} for mp in maps if mp is not None):
        return None
    owners = {int(p): u for p, u in first["owners"].items()}
    urls = {m.url for m in members}
    if set(owners) != set(range(PARTITIONS)) or not set(owners.values()) <= urls or set(owners.values()) & set(absent):
        return None
    for m in members:
        if m.owned() != {p for p, u in owners.items() if u == m.url}:
            return None
    generation: int = first["generation"]
    return generation


def wait_converged(members: list[Member], timeout: float, absent: tuple[str, ...] = ()) -> int:
    """Wait (bounded) until ``converged``; woken by every line any member prints."""
    cond = members[0].cond  # Invariant: every member of one test shares one condition (``spawn``)
    with cond:
        if not cond.wait_for(lambda: converged(members, absent) is not None, timeout):
            pytest.fail(f"members did not agree within {timeout:.0f} s: "
                        + "; ".join(f"{m.url}: {m.latest_map()} owned={sorted(m.owned())}" for m in members))
        generation = converged(members, absent)
    assert generation is not None  # Invariant: the wait just returned True on this condition
    return generation


def owners_of(member: Member) -> dict[int, str]:
    mp = member.latest_map()
    assert mp is not None
    return {int(p): u for p, u in mp["owners"].items()}


def start_group(spawn: Callable[..., Member], n: int, *, static: bool = False) -> list[Member]:
    members = [spawn(i + 1, f"member-{i + 1}" if static else None) for i in range(n)]
    for m in members:
        m.wait_for(lambda ev: any(e["event"] == "started" for e in ev), JOIN_BOUND_S, "start")
    wait_converged(members, JOIN_BOUND_S)
    return members


# ---------------------------------------------------------------------------------------------


def test_three_members_own_each_partition_once_and_agree(spawn: Callable[..., Member], kafka_bootstrap: str,
                                                        topic: str) -> None:
    members = start_group(spawn, 3)
    generation = converged(members)
    assert generation is not None and generation >= 0
    owned = [m.owned() for m in members]
    assert sorted(p for o in owned for p in o) == list(range(PARTITIONS)), owned
    assert [len(o) for o in owned] == [2, 2, 2], owned  # balanced

    # Membership only: records on the topic are never delivered and no offset is committed.
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, **CLIENT_TUNING)
    try:
        for i in range(60):
            producer.send(topic, value=b"x", partition=i % PARTITIONS)
        producer.flush(15)
    finally:
        producer.close()
    for m in members:
        stats = m.stats()
        assert stats["stray"] == 0 and stats["lease"] is True and set(stats["owned"]) == m.owned(), stats
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, **CLIENT_TUNING)
    try:
        assert admin.list_group_offsets({f"g-{topic}": None}) == {f"g-{topic}": {}}
    finally:
        admin.close()


def test_a_join_moves_only_what_balance_needs(spawn: Callable[..., Member]) -> None:
    members = start_group(spawn, 2)
    before = owners_of(members[0])
    marks = [m.mark() for m in members]
    t0 = time.time()
    members.append(spawn(3))
    wait_converged(members, JOIN_BOUND_S)
    after = owners_of(members[0])
    moved = {p for p in range(PARTITIONS) if before[p] != after[p]}
    new_share = PARTITIONS // 3
    assert len(moved) == new_share, (before, after)  # sticky: exactly the new member's fair share moves
    assert {after[p] for p in moved} == {members[2].url}
    for m, k in zip(members[:2], marks, strict=True):
        revoked = [p for e in m.since(k) if e["event"] == "revoked" for p in e["parts"]]
        assert len(revoked) == 1, (m.url, m.since(k))  # each old member gives up one partition, keeps the rest
    started_at = next(e["t"] for e in members[2].events if e["event"] == "started")
    assigned_at = next(e["t"] for e in members[2].events if e["event"] == "assigned")
    print(f"\njoin: the 3rd member had its partitions {assigned_at - started_at:.2f} s after it joined "
          f"({assigned_at - t0:.2f} s after its process started)")


def test_close_hands_partitions_over_at_once(spawn: Callable[..., Member]) -> None:
    members = start_group(spawn, 3)
    leaving = members[2]
    had = leaving.owned()
    t0 = time.time()
    leaving.send("close")
    leaving.wait_for(lambda ev: any(e["event"] == "closed" for e in ev), 10, "closed")
    assert leaving.owned() == set()  # revoked everything before leaving
    rest = members[:2]
    wait_converged(rest, REBALANCE_BOUND_S + UNSTICK_S, absent=(leaving.url,))
    first = {p: min(e["t"] for m in rest for e in m.events if e["event"] == "assigned" and p in e["parts"]
                 and e["t"] >= t0)
             for p in had}
    elapsed = max(first.values()) - t0
    print(f"\nclose: partitions of the leaving member reassigned {elapsed:.2f} s after close")
    assert elapsed < SESSION_S - HEARTBEAT_S, elapsed  # LeaveGroup, not the session timeout
    assert leaving.proc.wait(10) == 0


def test_kill9_is_detected_within_the_session_timeout(spawn: Callable[..., Member]) -> None:
    members = start_group(spawn, 3)
    victim = members[0]
    had = victim.owned()
    t0 = time.time()
    victim.proc.send_signal(signal.SIGKILL)
    rest = members[1:]
    wait_converged(rest, SESSION_S + REBALANCE_BOUND_S + UNSTICK_S, absent=(victim.url,))
    # When each of the victim's partitions was first owned again (a survivor whose join hung may
    # take some of them over later still, once it is let back in).
    first = {p: min(e["t"] for m in rest for e in m.events if e["event"] == "assigned" and p in e["parts"]
                 and e["t"] >= t0)
             for p in had}
    elapsed = max(first.values()) - t0
    print(f"\nkill -9: partitions reassigned {elapsed:.2f} s after the kill (session timeout {SESSION_S:g} s)")
    assert SESSION_S - 2 * HEARTBEAT_S <= elapsed <= SESSION_S + 5.0, elapsed


def test_a_paused_member_revokes_before_it_rejoins(spawn: Callable[..., Member]) -> None:
    members = start_group(spawn, 3)
    paused, rest = members[0], members[1:]
    had = paused.owned()
    assert had
    paused.proc.send_signal(signal.SIGSTOP)
    t_stop = time.time()
    generation = wait_converged(rest, SESSION_S + REBALANCE_BOUND_S + UNSTICK_S, absent=(paused.url,))
    print(f"\nSIGSTOP: the others took over {time.time() - t_stop:.2f} s after the pause (generation {generation})")
    mark = paused.mark()
    t_cont = time.time()
    paused.proc.send_signal(signal.SIGCONT)

    # Its first word after waking: it revokes everything it had, before any assignment.
    first = paused.wait_for(lambda ev: ev[mark] if len(ev) > mark else None, 10, "event after SIGCONT")
    assert first["event"] == "revoked" and set(first["parts"]) == had, paused.since(mark)
    print(f"SIGCONT: revoked {sorted(had)} {first['t'] - t_cont:.2f} s after waking")
    # The lease, not kafka-python's next heartbeat (a heartbeat interval and a round trip later),
    # tells it: one poll of the membership thread after waking.
    assert first["t"] - t_cont < HEARTBEAT_S, first["t"] - t_cont
    after = paused.since(mark)
    # No map it published after waking claims a partition for itself at the stale generation.
    for e in after:
        if e["event"] == "map" and e["generation"] <= generation:
            assert paused.url not in e["owners"].values(), e
    wait_converged(members, REBALANCE_BOUND_S + SESSION_S + UNSTICK_S)  # then it rejoins and gets a share again
    assert paused.owned(), "the woken member rejoined and was given partitions"


def test_a_static_member_restarted_within_the_session_timeout_gets_its_partitions_back(
        spawn: Callable[..., Member]) -> None:
    members = start_group(spawn, 3, static=True)
    victim, rest = members[0], members[1:]
    had = victim.owned()
    marks = [m.mark() for m in rest]
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait(10)
    t0 = time.time()
    again = spawn(1, "member-1")
    wait_converged([again, *rest], REBALANCE_BOUND_S)
    got = next(e for e in again.events if e["event"] == "assigned")
    print(f"\nstatic restart: the same partitions back {got['t'] - t0:.2f} s after the new process started")
    assert again.owned() == had and got["t"] - t0 < SESSION_S + 3.0
    for m, k in zip(rest, marks, strict=True):  # nobody else moved
        assert not [e for e in m.since(k) if e["event"] in ("assigned", "revoked")], m.since(k)


# --------------------------------------------------------------------------- in this process


def test_an_unknown_topic_is_refused(kafka_bootstrap: str) -> None:
    with pytest.raises(InvalidConfiguration, match="does not exist"):
        Membership(kafka_bootstrap, unique_topic("absent"), "g-absent", "http://127.0.0.1:9001",
                   session_timeout=SESSION_S)


def test_callbacks_come_in_order_and_a_raising_one_does_not_stop_the_member(kafka_bootstrap: str,
                                                                            topic: str) -> None:
    calls: list[tuple[str, Any]] = []

    def on_assigned(parts: frozenset[int]) -> None:
        calls.append(("assigned", parts))
        raise RuntimeError("a faulty host callback")

    def on_change(m: OwnershipMap) -> None:
        calls.append(("map", m))

    member = Membership(kafka_bootstrap, topic, f"g-{topic}", "http://127.0.0.1:9001", session_timeout=SESSION_S,
                        on_assigned=on_assigned, on_revoked=lambda ps: calls.append(("revoked", ps)),
                        on_change=on_change)
    try:
        assert member.wait_joined(JOIN_BOUND_S)
        assert member.owned == frozenset(range(PARTITIONS)) and member.lease_valid()
        mp = member.map
        assert mp.generation >= 0 and mp.partitions == PARTITIONS
        assert all(mp.owns(p) for p in range(PARTITIONS))
        assert calls[0] == ("assigned", frozenset(range(PARTITIONS)))  # the map follows the assignment
        assert any(kind == "map" and value == mp for kind, value in calls[1:])
    finally:
        started = time.monotonic()
        member.close()
        closing = time.monotonic() - started
    assert closing < 5.0 + 1.0, closing  # bounded by close_timeout
    assert ("revoked", frozenset(range(PARTITIONS))) in calls and member.owned == frozenset()
    last_map = next(value for kind, value in reversed(calls) if kind == "map")
    assert last_map.generation == -1 and not any(last_map.owns(p) for p in range(PARTITIONS))
    member.close()  # idempotent


def test_a_member_cut_off_from_kafka_stops_serving_and_serves_again_when_it_returns(
        kafka_broker1: KafkaCluster) -> None:
    """The lease without a frozen process: the broker goes away for longer than the session
    timeout; the member revokes on its own (nobody can tell it), and takes partitions again once
    Kafka answers."""
    bootstrap = kafka_broker1.bootstrap
    name = unique_topic("membership-cut")
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, **CLIENT_TUNING)
    try:
        admin.create_topics({name: {"num_partitions": 2, "replication_factor": 1}},
                            timeout_ms=15_000, wait_for_metadata=True)
    finally:
        admin.close()
    events: list[tuple[str, float, frozenset[int]]] = []
    cond = threading.Condition()

    def record(kind: str) -> Callable[[frozenset[int]], None]:
        def callback(parts: frozenset[int]) -> None:
            with cond:
                events.append((kind, time.monotonic(), parts))
                cond.notify_all()
        return callback

    member = Membership(bootstrap, name, f"g-{name}", "http://127.0.0.1:9001", session_timeout=SESSION_S,
                        on_assigned=record("assigned"), on_revoked=record("revoked"))
    try:
        assert member.wait_joined(JOIN_BOUND_S) and member.owned == {0, 1}
        kafka_broker1.stop()
        t_down = time.monotonic()
        with cond:
            assert cond.wait_for(lambda: any(k == "revoked" for k, _, _ in events), SESSION_S + 5)
        revoked_at = next(t for k, t, _ in events if k == "revoked")
        assert member.owned == frozenset() and not member.lease_valid() and member.map.generation == -1
        assert revoked_at - t_down <= SESSION_S, revoked_at - t_down  # before Kafka could have expired it
        print(f"\nbroker down: the member stopped serving {revoked_at - t_down:.2f} s after the broker stopped")
        kafka_broker1.start()
        with cond:
            assert cond.wait_for(lambda: events[-1][0] == "assigned", JOIN_BOUND_S + SESSION_S), events
        assert member.owned == {0, 1} and member.lease_valid()
    finally:
        member.close()


def test_a_join_that_never_completes_is_started_again_as_a_new_member(kafka_bootstrap: str, topic: str) -> None:
    """The stuck join of kafka-python 3.0.12 (docs/cluster.md), forced: the member's next join
    task never completes (kafka-python's coordinator runs our stand-in: the real JoinGroup and
    SyncGroup, then an hour's sleep on kafka-python's own event loop instead of returning the
    assignment, as the stuck member did with a SyncGroup the broker had answered). The lease
    revokes everything; after ``rebalance_timeout + session_timeout`` ``Membership._unstick``
    drops that task and joins as a new member, which gets the partitions back."""
    events: list[tuple[str, frozenset[int]]] = []
    cond = threading.Condition()

    def record(kind: str) -> Callable[[frozenset[int]], None]:
        def callback(parts: frozenset[int]) -> None:
            with cond:
                events.append((kind, parts))
                cond.notify_all()
        return callback

    member = Membership(kafka_bootstrap, topic, f"g-{topic}", "http://127.0.0.1:9001", session_timeout=SESSION_S,
                        rebalance_timeout=SESSION_S,  # as ClusterMember: stuck for good after 12 s
                        on_assigned=record("assigned"), on_revoked=record("revoked"))
    try:
        assert member.wait_joined(JOIN_BOUND_S) and member.owned == frozenset(range(PARTITIONS))
        coordinator = member._consumer._coordinator
        first_member_id = coordinator._generation.member_id
        real_join = coordinator._do_join_and_sync_async
        hung: list[float] = []

        async def never_completes() -> bytes:  # the seam: the next join task, and only it, hangs
            coordinator._do_join_and_sync_async = real_join
            await real_join()  # JoinGroup and SyncGroup answered, as seen for real ...
            hung.append(time.monotonic())
            await coordinator._manager._net.sleep(3600)  # ... and the task never completes
            raise AssertionError("unreachable within the test")

        coordinator._do_join_and_sync_async = never_completes
        coordinator.request_rejoin()
        with cond:
            assert cond.wait_for(lambda: events[-1][0] == "revoked", SESSION_S + REBALANCE_BOUND_S), events
        assert hung, "the rejoin did not run the hanging join task"
        assert member.restarted_joins == 0 and not member.lease_valid()
        with cond:  # 12 s stuck, then a join as a new member
            assert cond.wait_for(lambda: events[-1][0] == "assigned", 2 * SESSION_S + JOIN_BOUND_S), events
        unstuck_after = time.monotonic() - hung[0]
        assert member.restarted_joins == 1
        assert member.owned == frozenset(range(PARTITIONS)) and member.lease_valid()
        # A new member: a new member id. Not necessarily a higher generation: the group empties
        # when the broker drops the stuck member, and an empty group that committed no offsets
        # may be deleted, so the new one can start again at generation 1 (seen in one CI run).
        assert member._consumer._coordinator._generation.member_id not in ("", first_member_id)
        assert member.map.generation >= 1
        assert unstuck_after >= 2 * SESSION_S - HEARTBEAT_S  # not before the broker could have dropped it
        print(f"\nstuck join: owned again {unstuck_after:.1f} s after the join hung")
    finally:
        member.close()
