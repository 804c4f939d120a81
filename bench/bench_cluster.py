"""Cluster benchmark (issue 14): what owning 1/``MEMBERS`` of the partitions buys (2 members on 8
partitions, the issue's shape), measured in one run on one broker.
Run ``python -m bench --only cluster [--quick]`` (or ``histlog bench cluster``).

* **start-up**: N events on a ``PARTITIONS``-partition topic (written by a raw producer, spread by the log's
  partitioner), then, with fresh state directories, (1) a **full replica**
  (``HistoryEngine.open``: it replays every partition before it answers) and (2) a **member of a
  ``MEMBERS``-member group** (the engine opened owning nothing, joined to the group with the other
  members already in it: it takes its share of the partitions the group gives it and is ready, as its
  ``/readyz`` says, once those are caught up). Records replayed (``applied_since_open``) and
  seconds until ready; the member's time includes joining the group (the rebalance rounds).
* **appends/s** through ``MEMBERS`` ``histlog serve --group`` members (their own topic, same
  partitions, an ``AsyncHistoryClient`` given their URLs: each append goes straight to its owner) vs 1
  ``histlog serve`` full replica on a topic of the same shape, 64 concurrent appenders, same run.
  On this 2-core machine the members, the broker and the load generator share two cores, so
  the ratio shows what the machine allows, not what separate machines would give (docs/cluster.md
  projects that from the per-partition rates).
* **forward hop**: ``bench_forward`` (``window(20)`` direct vs through a non-owner), reused.
* **failover**: ``bench_failover`` (kill -9 of an owner with ``--standbys 0`` vs ``1``, a standby's cost), on
  the same broker.
* **a new member's time to ready**: ``bench_join`` (from a peer's snapshot vs by replay), on the same broker.
* **appends under load with standbys, and 2 members vs 1 split**: ``bench_load``, on the same broker.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from kafka import KafkaProducer

from bench import bench_failover, bench_forward, bench_join, bench_load
from bench.bench_kafka import _broker
from bench.common import batch, event_bytes
from bench.members import START_S, Serve
from engine import AsyncHistoryClient, HistoryEngine
from engine.cluster.member import ClusterMember, ClusterReadiness
from engine.cluster.membership import MIN_SESSION_TIMEOUT, Membership
from engine.log.kafka import KafkaLog
from schemas.records import partition_for_key, record_key

__all__ = ["report", "run"]

PARTITIONS = 8
MEMBERS = 2
APPENDERS = 64


def _fill(bootstrap: str, events: int) -> str:
    topic = f"histlog-bench-cluster-{uuid.uuid4().hex[:8]}"
    KafkaLog(bootstrap, topic, partitions=PARTITIONS).close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=20,
                             batch_size=256 * 1024)
    for i in range(events):
        b = batch(f"conv-{i % 3000}", f"a-{i}")
        key = record_key(b.conversation_id, b.append_id)
        producer.send(topic, key=key, value=event_bytes(b, int(time.time() * 1000)),
                      partition=partition_for_key(record_key(b.conversation_id), PARTITIONS))
    producer.flush()
    producer.close()
    return topic


def _full_replica(bootstrap: str, topic: str, root: Path) -> dict[str, Any]:
    started = time.perf_counter()
    with HistoryEngine.open(kafka=bootstrap, topic=topic, state_dir=root / "replica") as engine:
        seconds = time.perf_counter() - started
        replayed = sum(engine.stats().applied_since_open)
    return {"owned": PARTITIONS, "replayed": replayed, "ready_s": round(seconds, 2)}


def _member(bootstrap: str, topic: str, root: Path) -> dict[str, Any]:
    group = f"bench-{uuid.uuid4().hex[:8]}"
    others = [Membership(bootstrap, topic, group, f"http://127.0.0.1:{9 + i}", session_timeout=MIN_SESSION_TIMEOUT)
              for i in range(MEMBERS - 1)]
    try:
        for o in others:
            o.wait_joined(START_S)
        started = time.perf_counter()
        with HistoryEngine.open(kafka=bootstrap, topic=topic, state_dir=root / "member", owned=()) as engine, \
                ClusterMember(engine, bootstrap, topic, group, "http://127.0.0.1:8",
                              session_timeout=MIN_SESSION_TIMEOUT) as member:
            ready = ClusterReadiness(member)
            joined_s = None
            deadline = time.monotonic() + START_S
            while len(engine.owned) != PARTITIONS // MEMBERS or \
                    any(engine.partition_state(p) != "ready" for p in engine.owned):
                if joined_s is None and engine.owned:
                    joined_s = time.perf_counter() - started
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the member was not ready within {START_S} s: {ready.check()}")
                time.sleep(0.005)  # no stats() here: it asks the broker, and would slow the catch-up it times
            seconds = time.perf_counter() - started
            if ready.check() is not None:  # what /readyz would answer now
                raise RuntimeError(f"the member's readiness disagrees: {ready.check()}")
            replayed = sum(engine.stats().applied_since_open)
            owned = len(engine.owned)
    finally:
        for o in others:
            o.close()
    joined = joined_s if joined_s is not None else seconds
    return {"owned": owned, "replayed": replayed, "ready_s": round(seconds, 2), "joined_s": round(joined, 2),
            "catch_up_s": round(seconds - joined, 2)}


async def _wait_ready(urls: list[str]) -> None:
    import httpx

    deadline = time.monotonic() + START_S
    async with httpx.AsyncClient(timeout=10) as http:
        for url in urls:
            while (await http.get(url + "/readyz")).status_code != 200:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{url} not ready within {START_S} s")
                await asyncio.sleep(0.05)


async def _append_rate(urls: list[str], total: int, tag: str) -> float:
    await _wait_ready(urls)
    per = max(total // APPENDERS, 1)
    async with AsyncHistoryClient(urls if len(urls) > 1 else urls[0], timeout=60) as client:
        await client.append(batch(f"warm-{tag}", "w"))  # reads the map, opens the pools

        async def appender(k: int) -> None:
            for i in range(per):
                await client.append(batch(f"conv-{tag}-{k}-{i // 10}", f"a-{k}-{i}"))

        started = time.perf_counter()
        await asyncio.gather(*(appender(k) for k in range(APPENDERS)))
        return per * APPENDERS / (time.perf_counter() - started)


def _throughput(bootstrap: str, root: Path, total: int) -> dict[str, Any]:
    out: dict[str, Any] = {"appenders": APPENDERS, "appends": total}
    one_topic = f"histlog-bench-one-{uuid.uuid4().hex[:8]}"
    one = Serve(bootstrap, one_topic, root / "one", "--partitions", str(PARTITIONS))
    try:
        out["one_server_per_s"] = round(asyncio.run(_append_rate([one.url], total, "one")))
    finally:
        one.close()
    topic = f"histlog-bench-members-{uuid.uuid4().hex[:8]}"
    KafkaLog(bootstrap, topic, partitions=PARTITIONS).close()
    group = f"bench-{uuid.uuid4().hex[:8]}"
    members: list[Serve] = []
    try:
        for i in range(MEMBERS):
            members.append(Serve(bootstrap, topic, root / f"m{i}", "--group", group, "--advertise",
                                  "http://127.0.0.1:0", "--session-timeout", str(MIN_SESSION_TIMEOUT)))
        out["members_per_s"] = round(asyncio.run(_append_rate([m.url for m in members], total, "members")))
    finally:
        for m in members:
            m.close()
    out["members"] = MEMBERS
    out["ratio"] = round(out["members_per_s"] / out["one_server_per_s"], 2)
    return out


def run(quick: bool = False) -> dict[str, Any]:
    events = 6_000 if quick else 60_000
    root = Path(tempfile.mkdtemp(prefix="histlog-bench-cluster-"))
    try:
        with _broker() as bootstrap:
            topic = _fill(bootstrap, events)
            replica = _full_replica(bootstrap, topic, root)
            member = _member(bootstrap, topic, root)
            throughput = _throughput(bootstrap, root, 1_000 if quick else 4_000)
            failover = bench_failover.run(quick=quick, bootstrap=bootstrap)
            join = bench_join.run(quick=quick, bootstrap=bootstrap)
            load = bench_load.run(quick=quick, bootstrap=bootstrap)
        forward = bench_forward.run(quick=quick)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"bench": "cluster", "events": events, "partitions": PARTITIONS, "full_replica": replica,
            "member": member, "members": MEMBERS, "startup_speedup": round(replica["ready_s"] / member["ready_s"], 2),
            "catch_up_speedup": round(replica["ready_s"] / max(member["catch_up_s"], 0.01), 2),
            "appends": throughput, "forward": forward, "failover": failover,
            "join": join, "load": load}


def report(result: dict[str, Any]) -> str:
    r, f, m, a = result, result["full_replica"], result["member"], result["appends"]
    return "\n".join([
        f"start-up on {r['events']} events, {r['partitions']} partitions, fresh state",
        f"  full replica      owns {f['owned']}  replayed {f['replayed']:>7}  ready in {f['ready_s']:>6} s",
        f"  member of {r['members']}       owns {m['owned']}  replayed {m['replayed']:>7}  "
        f"ready in {m['ready_s']:>6} s -> {r['startup_speedup']}x sooner",
        f"    of which joining the group {m['joined_s']} s, catching up {m['catch_up_s']} s "
        f"({r['catch_up_speedup']}x less than the replica's whole replay)",
        f"appends/s, {a['appenders']} concurrent appenders, {a['appends']} appends",
        f"  1 server (full replica)  {a['one_server_per_s']:>6}/s",
        f"  {a['members']} members (routed)       {a['members_per_s']:>6}/s  -> {a['ratio']}x (all on this machine's "
        "cores; goal 1.6x needs cores of their own)",
        bench_forward.report(r["forward"]),
        bench_failover.report(r["failover"]),
        *([bench_join.report(r["join"])] if "join" in r else []),
        *([bench_load.report(r["load"])] if "load" in r else []),
    ])


if __name__ == "__main__":
    res = run(quick="--quick" in sys.argv)
    print(report(res))
    print(json.dumps(res))
