"""Standby replicas of a histlog cluster (issue 48, docs/cluster.md "Standby replicas"), on a real
Kafka broker: ``histlog serve --group G --standbys 1`` members as subprocesses on 127.0.0.1.

* Every partition has one standby on a member other than its owner, in every member's
  ``/v1/cluster``; a standby's state follows the log (its applied offsets reach the log end)
  while its calls are forwarded to the owner.
* kill -9 an owner: its partitions go to the members that held their standbys, which take them
  on where they stand: nothing is replayed (their records applied since open do not grow), and
  the history checker finds nothing lost, duplicated or reordered, under a recorded load.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from engine import AsyncHistoryClient, HistoryEngine
from tests.history_checker import AsyncRecorded, History
from tests.integration.cluster_support import (
    PARTITIONS,
    SESSION_TIMEOUT,
    Load,
    MemberProcess,
    batch_of,
    checked,
    conversations_on_every_partition,
    fill_partitions,
    finals_of,
    get_json,
    metric,
    resend_everything,
    start_all,
    wait_until,
    whole_map,
)
from tests.kafka_broker import unique_topic

pytestmark = pytest.mark.kafka

JOIN_S = 60.0
CATCH_UP_S = 30.0
KILL_AFTER = 40


@pytest.fixture
def members(tmp_path: Path, kafka_bootstrap: str) -> Iterator[list[MemberProcess]]:
    """Three members of one group with ``--standbys 1`` on a new six-partition topic; killed at the end."""
    topic, group = unique_topic("standby"), unique_topic("group")
    HistoryEngine.open(kafka=kafka_bootstrap, topic=topic, state_dir=tmp_path / "creator",
                       partitions=PARTITIONS).close()
    started = [MemberProcess(f"m{i}", kafka_bootstrap, topic, group, tmp_path / f"m{i}", tmp_path / f"m{i}.log",
                             "--standbys", "1") for i in range(3)]
    try:
        start_all(started, JOIN_S)
        wait_until(lambda: whole_map(started) and all(_standbys(m) for m in started), JOIN_S,
                   "three members agree on one map, with standbys")
        yield started
    finally:
        for m in started:
            m.stop()


def _standbys(m: MemberProcess) -> dict[int, list[str]]:
    return {int(p): us for p, us in get_json(m.url, "/v1/cluster").get("standbys", {}).items()}


def _stats(m: MemberProcess) -> dict[str, list[int]]:
    s: dict[str, list[int]] = get_json(m.url, "/v1/stats")
    return s


def _standbys_current(members: list[MemberProcess]) -> bool:
    """Every member has applied the log end of every partition it owns or keeps as a standby."""
    cluster = get_json(members[0].url, "/v1/cluster")
    for m in members:
        s = _stats(m)
        mine = {int(p) for p, u in cluster["owners"].items() if u == m.url}
        mine |= {int(p) for p, us in cluster["standbys"].items() if m.url in us}
        if any(s["applied_offsets"][p] < s["end_offsets"][p] for p in mine):
            return False
    return True


@pytest.mark.slow
def test_standbys_are_placed_kept_current_and_take_over_a_killed_owner_without_a_replay(
        members: list[MemberProcess]) -> None:
    urls = [m.url for m in members]
    cluster = get_json(urls[0], "/v1/cluster")
    standbys = _standbys(members[0])
    assert sorted(standbys) == list(range(PARTITIONS))
    for p, us in standbys.items():
        assert len(us) == 1 and us[0] != cluster["owners"][str(p)] and us[0] in urls
    assert all(_standbys(m) == standbys for m in members[1:])  # one placement per generation

    # Written through routed clients: every standby reaches the log end of its partitions.
    history = History()
    conversations = conversations_on_every_partition(2)

    async def write() -> None:
        async with AsyncHistoryClient(urls) as client:
            for i in range(8):
                await asyncio.gather(*(AsyncRecorded(client, history, k).append(batch_of(k, i, c))
                                       for k, c in enumerate(conversations)))

    asyncio.run(write())
    wait_until(lambda: _standbys_current(members), CATCH_UP_S, "every standby has applied its partitions' log end")
    for m in members:
        kept = sum(m.url in us for us in standbys.values())
        wait_until(lambda m=m, kept=kept: metric(m, "histlog_cluster_standby_partitions") == kept
                   and metric(m, "histlog_cluster_standby_lag_records") == 0, CATCH_UP_S,
                   f"{m.name}'s /metrics shows its {kept} standbys caught up")

    # kill -9 the owner of partitions, under load: the standbys take them over.
    victim = members[2]
    survivors = members[:2]
    lost = {int(p) for p, u in cluster["owners"].items() if u == victim.url}
    assert lost, "a member of three on six partitions owns some"
    before = {m.url: _stats(m)["applied_since_open"] for m in survivors}
    load = Load(history, urls, conversations)
    killed_at: list[float] = []
    owned_at: list[float] = []

    def watch() -> None:
        wait_until(lambda: whole_map(survivors) and all(m.ready() for m in survivors), SESSION_TIMEOUT + CATCH_UP_S,
                   "the survivors own every partition and are ready")
        owned_at.append(time.monotonic())

    watcher = threading.Thread(target=watch)

    def on_ack(n: int) -> None:
        if n == KILL_AFTER:
            victim.signal(signal.SIGKILL)
            killed_at.append(time.monotonic())
            load.live.remove(victim.url)
            watcher.start()

    asyncio.run(load.run(on_ack))
    assert killed_at, f"the load ended after {load.acks} acknowledgements, before the kill"
    watcher.join(SESSION_TIMEOUT + CATCH_UP_S + 5)
    assert owned_at, "the survivors did not take every partition over in time"
    assert victim.wait() == -signal.SIGKILL

    after = get_json(survivors[0].url, "/v1/cluster")
    for p in lost:
        new_owner = after["owners"][str(p)]
        assert new_owner in standbys[p], f"partition {p} went to {new_owner}, not to its standby {standbys[p]}"
        # Taken on where the standby stood: what it applied since open grew by the load's
        # records only (at most all of them), never by a replay of the partition from 0.
        s = _stats(next(m for m in survivors if m.url == new_owner))
        grown = s["applied_since_open"][p] - before[new_owner][p]
        assert grown < s["end_offsets"][p] - before[new_owner][p] + 1, (p, grown, s)
        assert before[new_owner][p] > 0, f"the standby of {p} had applied nothing before the kill"

    survivor_urls = [m.url for m in survivors]
    asyncio.run(resend_everything(history, survivor_urls))
    report = checked(history, asyncio.run(finals_of(history, survivor_urls)))
    assert not report.never_ok, f"resent appends still unacknowledged: {sorted(report.never_ok)[:5]}"
    # The new map keeps one standby per partition on the survivors.
    wait_until(lambda: all(len(us) == 1 for us in _standbys(survivors[0]).values())
               and sorted(_standbys(survivors[0])) == list(range(PARTITIONS)), JOIN_S,
               "the survivors' map has a standby for every partition")


@pytest.mark.slow
def test_a_standby_paused_during_a_failover_serves_nothing_stale_and_nothing_is_lost(
        members: list[MemberProcess]) -> None:
    """kill -9 an owner and SIGSTOP the standby of its partitions at once: the one member left
    takes every partition (replaying what it held no standby of), the paused standby wakes with
    a lapsed lease (503/421 or complete answers only), rejoins, and the checker finds nothing lost."""
    urls = [m.url for m in members]
    cluster = get_json(urls[0], "/v1/cluster")
    standbys = _standbys(members[0])
    owner = members[0]
    lost = {int(p) for p, u in cluster["owners"].items() if u == owner.url}
    paused = next(m for m in members[1:] if any(m.url in standbys[p] for p in lost))
    (last,) = [m for m in members if m not in (owner, paused)]
    history = History()
    conversations = conversations_on_every_partition(1)

    async def append_all(via: list[str], i: int) -> None:
        async with AsyncHistoryClient(via, timeout=40.0) as client:
            for k, c in enumerate(conversations):
                await AsyncRecorded(client, history, k).append(batch_of(k, i, c))

    asyncio.run(append_all(urls, 0))
    owner.signal(signal.SIGKILL)
    paused.signal(signal.SIGSTOP)
    wait_until(lambda: whole_map([last]) and last.ready(), SESSION_TIMEOUT + CATCH_UP_S + JOIN_S,
               "the one member left owns every partition and is ready")
    asyncio.run(append_all([last.url], 1))  # acknowledged while the standby sleeps
    paused.signal(signal.SIGCONT)
    mine = [c for c in conversations]

    async def probe() -> list[int]:
        statuses: list[int] = []
        async with httpx.AsyncClient(base_url=paused.url, timeout=30.0) as http:
            for c in mine:
                r = await http.get(f"/v1/conversations/{c.replace('/', '%2F')}/messages")
                statuses.append(r.status_code)
                if r.status_code == 200:
                    ids = {row["append_id"] for row in r.json()["messages"]}
                    assert f"a-{conversations.index(c)}-1" in ids, f"{c}: a stale answer: {sorted(ids)}"
                else:
                    assert r.status_code in (421, 503), r.text[:300]
        return statuses

    assert asyncio.run(probe())
    wait_until(lambda: whole_map([last, paused]), JOIN_S, "the woken standby rejoins and both agree")
    assert asyncio.run(probe()) == [200] * len(mine)
    checked(history, asyncio.run(finals_of(history, [last.url, paused.url])))


@pytest.mark.slow
def test_the_whole_cluster_restarted_resumes_every_partition_from_its_state(members: list[MemberProcess]) -> None:
    """kill -9 every member, start them all again on their state: they agree on a map with
    standbys, every partition is resumed from a checkpoint (nothing replayed from 0), and every
    acknowledged append is there once."""
    urls = [m.url for m in members]
    history = History()
    conversations = conversations_on_every_partition(2)
    asyncio.run(Load(history, urls, conversations, clients=6, per_client=6).run())
    wait_until(lambda: _standbys_current(members), CATCH_UP_S, "every standby has applied its partitions' log end")
    held = {m.name: {p for p, o in enumerate(_stats(m)["applied_offsets"]) if o > 0} for m in members}
    written = {p for p, o in enumerate(_stats(members[0])["end_offsets"]) if o > 0}
    assert all(sum(p in h for h in held.values()) >= 2 for p in written), (written, held)  # an owner and a standby
    for m in members:
        m.signal(signal.SIGKILL)
    for m in members:
        assert m.wait() == -signal.SIGKILL
    start_all(members, JOIN_S)
    wait_until(lambda: whole_map(members) and all(_standbys(m) for m in members) and all(m.ready() for m in members),
               JOIN_S, "the restarted members agree on a map with standbys and are ready")
    wait_until(lambda: _standbys_current(members), CATCH_UP_S, "every standby has caught up again")
    # What a member held before the kill it resumes from its checkpoint. A partition it did not
    # hold may be replayed from 0: while the members rejoin one by one, an early map can give it
    # one (placement among members whose state is equal is free to differ from the last run).
    for m in members:
        s = _stats(m)
        for p in held[m.name]:
            assert s["applied_since_open"][p] < s["end_offsets"][p], (m.name, p, s)
    checked(history, asyncio.run(finals_of(history, urls)))


def _skip_if_the_first_member_dropped_out(first: MemberProcess) -> None:
    """A warm-up waits on a live owner. If the first member's lease lapsed meanwhile (CPU
    starvation on a loaded 2-core machine, or kafka-python's stuck join, docs/cluster.md "Known
    issue"), its partitions were a dead owner's for a while and moved at once, as they must: the
    scenario this test is about did not happen, so it says so instead of passing or failing."""
    log = first.stderr()
    if "lease expired" in log or "starting it again as a new member" in log:
        pytest.skip("the first member dropped out of the group mid-test (lease expired or a stuck join; see its "
                    "log): the warm-up was not exercised this run")


@pytest.mark.slow
@pytest.mark.parametrize("snapshots", [True, False], ids=["from-snapshots", "by-replay"])
def test_a_new_member_takes_partitions_over_only_once_it_has_warmed_them_up(tmp_path: Path, kafka_bootstrap: str,
                                                                            snapshots: bool) -> None:
    """KIP-441's warm-up: a member joining a group whose partitions hold far more records than
    ``--warmup-lag`` is given none of them at first; it warms the ones balance would move to it as
    standbys (the map names them in ``warmups``), joins again once within the lag, and only then
    takes them over: it never owns a partition it is far behind on. It warms them from the
    owner's snapshots (nothing replayed), or with ``--no-snapshots`` by replaying every record."""
    partitions, per, lag = 4, 4000, 500
    topic, group = unique_topic("warmup"), unique_topic("group")
    HistoryEngine.open(kafka=kafka_bootstrap, topic=topic, state_dir=tmp_path / "creator",
                       partitions=partitions).close()
    conversations = conversations_on_every_partition(1, partitions)
    fill_partitions(kafka_bootstrap, topic, conversations, per, partitions)
    flags = ("--standbys", "1", "--warmup-lag", str(lag), *(() if snapshots else ("--no-snapshots",)))
    first = MemberProcess("m0", kafka_bootstrap, topic, group, tmp_path / "m0", tmp_path / "m0.log", *flags)
    new = MemberProcess("m1", kafka_bootstrap, topic, group, tmp_path / "m1", tmp_path / "m1.log", *flags)
    try:
        first.start()
        wait_until(lambda: whole_map([first], partitions) and first.ready(), JOIN_S, "the first member owns all")
        new.start()
        seen_warmups: set[int] = set()
        worst = 0

        def settled() -> bool:
            nonlocal worst
            cluster = get_json(first.url, "/v1/cluster")
            seen_warmups.update(int(p) for p in cluster.get("warmups", {}))
            s = _stats(new)
            mine = [int(p) for p, u in get_json(new.url, "/v1/cluster")["owners"].items() if u == new.url]
            worst = max([worst, *(s["end_offsets"][p] - s["applied_offsets"][p] for p in mine)])
            return bool(mine) and not cluster.get("warmups") and bool(whole_map([first, new], partitions)) \
                and first.ready() and new.ready()

        try:
            wait_until(settled, JOIN_S + CATCH_UP_S, "the new member warms up, joins again and owns its share",
                       every=0.05)
        finally:
            _skip_if_the_first_member_dropped_out(first)
        _skip_if_the_first_member_dropped_out(first)
        assert seen_warmups, "the new member was given partitions without a warm-up"
        assert worst <= lag, f"the new member owned a partition {worst} records behind (warm-up lag {lag})"
        owned_new = {int(p) for p, u in get_json(new.url, "/v1/cluster")["owners"].items() if u == new.url}
        assert len(owned_new) == partitions // 2
        s = _stats(new)
        for p in owned_new:  # warmed as a standby before it was owned: restored, or every record once
            assert s["end_offsets"][p] == per and s["applied_since_open"][p] == (0 if snapshots else per), (p, s)
        restores = metric(new, "histlog_cluster_snapshot_restores_total") or 0
        assert (restores >= len(owned_new)) if snapshots else restores == 0, restores
        assert (metric(new, "histlog_cluster_snapshot_fallbacks_total") or 0) == 0
        assert (metric(new, "histlog_cluster_warmup_rejoins_total") or 0) >= 1
        assert metric(first, "histlog_cluster_warmup_rejoins_total") == 0
    finally:
        first.stop()
        new.stop()
