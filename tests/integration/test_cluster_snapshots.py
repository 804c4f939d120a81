"""State snapshots between cluster members (issue 48, docs/cluster.md "State snapshots"), on a
real Kafka broker with ``histlog serve --group`` members as subprocesses on 127.0.0.1.

* A member joining a group whose partitions hold thousands of records takes its share from the
  other member's snapshots (``GET /v1/partitions/{p}/snapshot``) instead of replaying them: it
  applies nothing of them but their tail, serves what the log holds, and the conversations
  cleared before are in none of its files (the erasure proof on the restored member).
* A member taking partitions on with no peer to ask (the only other member was killed) falls
  back to the replay, and serves the same history.
* The member serving a snapshot killed mid-transfer (SIGSTOP while it sends, then SIGKILL) while
  clients write: the joining member installs nothing of it, replays, takes every partition over,
  and the history checker finds nothing lost, duplicated or reordered in the recorded load.
* The route itself: 404 for a partition the member holds nothing of, 400 naming ``p`` for one
  that is not a partition (the token: ``tests/service/test_http_snapshots.py``).
"""

from __future__ import annotations

import asyncio
import signal
import threading
from pathlib import Path

import httpx
import pytest

from engine import HistoryClient, HistoryEngine
from schemas.records import partition_for_key, record_key
from tests.history_checker import History
from tests.integration.cluster_support import (
    SESSION_TIMEOUT,
    Load,
    MemberProcess,
    checked,
    conversations_on_every_partition,
    fill_partitions,
    finals_of,
    get_json,
    metric,
    start_all,
    wait_until,
    whole_map,
)
from tests.integration.erasure_support import files_holding, token, token_batch
from tests.kafka_broker import unique_topic

pytestmark = pytest.mark.kafka

PARTITIONS, PER = 4, 1500
JOIN_S, CATCH_UP_S = 60.0, 60.0
WRITER_S = 300.0  # 10 appends per writer, each call bounded by 25 s


def _owned(m: MemberProcess) -> set[int]:
    return {int(p) for p, u in get_json(m.url, "/v1/cluster")["owners"].items() if u == m.url}


@pytest.fixture
def topic(tmp_path: Path, kafka_bootstrap: str) -> tuple[str, list[str], list[str]]:
    """A 4-partition topic: ``PER`` appends on one conversation of each partition, and on a
    second conversation of each partition a batch holding a token, then cleared."""
    name = unique_topic("snapshot")
    by: dict[int, list[str]] = {}
    for c in conversations_on_every_partition(2, PARTITIONS):
        by.setdefault(partition_for_key(record_key(c), PARTITIONS), []).append(c)
    kept, doomed = [cs[0] for _, cs in sorted(by.items())], [cs[1] for _, cs in sorted(by.items())]
    with HistoryEngine.open(kafka=kafka_bootstrap, topic=name, state_dir=tmp_path / "creator",
                            partitions=PARTITIONS) as creator:
        tokens = []
        for c in doomed:
            tokens.append(token())
            creator.append(token_batch(c, "secret", tokens[-1]))
            creator.clear(c)
    fill_partitions(kafka_bootstrap, name, kept, PER, PARTITIONS)
    return name, kept, tokens


@pytest.mark.slow
def test_a_joining_member_takes_its_partitions_from_snapshots_erased_conversations_and_all(
        tmp_path: Path, kafka_bootstrap: str, topic: tuple[str, list[str], list[str]]) -> None:
    name, kept, tokens = topic
    group = unique_topic("group")
    first = MemberProcess("m0", kafka_bootstrap, name, group, tmp_path / "m0", tmp_path / "m0.log")
    new = MemberProcess("m1", kafka_bootstrap, name, group, tmp_path / "m1", tmp_path / "m1.log")
    try:
        start_all([first], JOIN_S)
        wait_until(lambda: whole_map([first], PARTITIONS) and first.ready(), JOIN_S + CATCH_UP_S,
                   "the first member owns every partition and is ready")
        # The route: a partition it holds, one it does not, and bad input.
        with httpx.stream("GET", first.url + "/v1/partitions/0/snapshot", timeout=30) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("application/vnd.histlog")
            assert r.read().startswith(b"histlog-partition-snapshot\n")
        for bad in ("4", "x", "-1", "01"):
            r = httpx.get(first.url + f"/v1/partitions/{bad}/snapshot", timeout=5)
            assert r.status_code == 400 and "path segment p" in r.json()["detail"], r.text

        start_all([new], JOIN_S)
        wait_until(lambda: whole_map([first, new], PARTITIONS) and _owned(new) and first.ready() and new.ready(),
                   JOIN_S + CATCH_UP_S, "the new member owns its share and is ready")
        mine = _owned(new)
        assert len(mine) == PARTITIONS // 2
        # (>=: on a loaded machine the first member's lease may lapse mid-join; the new one then
        # takes every partition on for a moment, from the first's snapshots too, and gives half back.)
        wait_until(lambda: (metric(new, "histlog_cluster_snapshot_restores_total") or 0) >= len(mine), CATCH_UP_S,
                   "the new member restored each of its partitions from a snapshot")
        assert metric(new, "histlog_cluster_snapshot_fallbacks_total") == 0
        stats = get_json(new.url, "/v1/stats")
        for p in mine:
            assert stats["applied_offsets"][p] == stats["end_offsets"][p]
            assert stats["applied_since_open"][p] == 0, f"partition {p}: replayed {stats['applied_since_open'][p]}"
        with HistoryClient(new.url) as client:
            for c in kept:
                messages = client.read(c)
                assert len(messages) == 2 * PER and messages[-1].text() == f"answer a-{kept.index(c)}-{PER - 1}"
        assert files_holding(tmp_path / "m1", [t.encode() for t in tokens]) == []  # erased there too
        with httpx.stream("GET", new.url + f"/v1/partitions/{min(set(range(PARTITIONS)) - mine)}/snapshot",
                          timeout=5) as r:
            assert r.status_code == 404  # it holds nothing of a partition it never had
    finally:
        first.stop()
        new.stop()


@pytest.mark.slow
def test_with_no_peer_to_ask_a_member_replays(tmp_path: Path, kafka_bootstrap: str,
                                             topic: tuple[str, list[str], list[str]]) -> None:
    name, kept, _ = topic
    group = unique_topic("group")
    first = MemberProcess("m0", kafka_bootstrap, name, group, tmp_path / "m0", tmp_path / "m0.log")
    new = MemberProcess("m1", kafka_bootstrap, name, group, tmp_path / "m1", tmp_path / "m1.log")
    try:
        start_all([first], JOIN_S)
        wait_until(lambda: whole_map([first], PARTITIONS) and first.ready(), JOIN_S + CATCH_UP_S,
                   "the first member owns every partition and is ready")
        first.signal(signal.SIGKILL)  # the only member with state is gone
        assert first.wait() == -signal.SIGKILL
        start_all([new], JOIN_S)
        wait_until(lambda: whole_map([new], PARTITIONS) and new.ready(), JOIN_S + CATCH_UP_S,
                   "the new member owns every partition and is ready")
        assert metric(new, "histlog_cluster_snapshot_restores_total") == 0
        assert metric(new, "histlog_cluster_snapshot_fallbacks_total") == PARTITIONS
        stats = get_json(new.url, "/v1/stats")
        assert stats["applied_since_open"] == stats["end_offsets"]  # replayed, every partition
        with HistoryClient(new.url) as client:
            for c in kept:
                assert len(client.read(c)) == 2 * PER
    finally:
        first.stop()
        new.stop()


@pytest.mark.slow
def test_the_member_serving_a_snapshot_killed_mid_transfer(tmp_path: Path, kafka_bootstrap: str) -> None:
    partitions, per = 2, 40_000  # big enough that a transfer outlasts what the socket buffers hold
    name, group = unique_topic("snapshot-kill"), unique_topic("group")
    by: dict[int, list[str]] = {}
    for c in conversations_on_every_partition(3, partitions):
        by.setdefault(partition_for_key(record_key(c), partitions), []).append(c)
    filled, before, after = ([cs[i] for _, cs in sorted(by.items())] for i in range(3))
    HistoryEngine.open(kafka=kafka_bootstrap, topic=name, state_dir=tmp_path / "creator",
                       partitions=partitions).close()
    fill_partitions(kafka_bootstrap, name, filled, per, partitions)
    first = MemberProcess("m0", kafka_bootstrap, name, group, tmp_path / "m0", tmp_path / "m0.log")
    new = MemberProcess("m1", kafka_bootstrap, name, group, tmp_path / "m1", tmp_path / "m1.log")
    history = History()
    try:
        start_all([first], JOIN_S)
        wait_until(lambda: whole_map([first], partitions) and first.ready(), JOIN_S + CATCH_UP_S,
                   "the first member owns every partition and is ready")
        asyncio.run(Load(history, [first.url], before, clients=4, per_client=5).run())
        start_all([new], JOIN_S)
        writing = Load(history, [first.url, new.url], after, clients=4, per_client=10, seed=15)
        writer = threading.Thread(target=lambda: asyncio.run(writing.run()), daemon=True)
        writer.start()  # clients write through the kill
        # (or the new one has restored already: a transfer quicker than a scrape; skipped below)
        wait_until(lambda: (metric(first, "histlog_cluster_snapshot_streams") or 0) >= 1
                   or (metric(new, "histlog_cluster_snapshot_restores_total") or 0) >= 1, JOIN_S,
                   "the first member sends the new one a snapshot", every=0.01)
        first.signal(signal.SIGSTOP)  # mid-transfer: it sends no more
        first.signal(signal.SIGKILL)
        assert first.wait() == -signal.SIGKILL
        writing.live = [new.url]
        wait_until(lambda: whole_map([new], partitions) and new.ready(), SESSION_TIMEOUT + JOIN_S + CATCH_UP_S,
                   "the new member owns every partition and is ready")
        writer.join(WRITER_S)
        assert not writer.is_alive(), f"the writers did not finish within {WRITER_S:g} s"
        restored = metric(new, "histlog_cluster_snapshot_restores_total") or 0
        stats = get_json(new.url, "/v1/stats")
        checked(history, asyncio.run(finals_of(history, [new.url])))
        with HistoryClient(new.url) as client:
            for c in filled:
                assert len(client.read(c)) == 2 * per
        if restored:
            pytest.skip("the snapshot arrived whole before its sender was stopped, or from what the socket buffers "
                        "held: the history held, but the kill mid-transfer did not happen this run")
        assert (metric(new, "histlog_cluster_snapshot_fallbacks_total") or 0) >= 1
        assert stats["applied_since_open"] == stats["end_offsets"]  # nothing of the cut one kept: replayed
    finally:
        first.stop()
        new.stop()
