"""A new member's time to ready, from snapshots vs by replay (issue 48, docs/cluster.md "State
snapshots"), measured in one run on one broker. Part of ``histlog bench cluster`` (``bench_cluster.run``
calls it on its broker); alone: ``python -m bench.bench_join [--quick]``.

A 2-partition topic with N records on each partition (``bench_failover``'s raw-producer fill), one
member A (``--standbys 0``) started and waited for until it owns both and is ready; then a member B
(fresh state) is started, timed from B's process start until B's ``/readyz`` is 200 and the map (B and
A agreeing on one generation) is whole with B owning one partition. Twice on the same topic, each
with a fresh group and fresh state for A and B: with snapshots (the default: B restores its
partition from A's snapshot and applies the tail) and with ``--no-snapshots`` on both (B replays it
from offset 0). Reported: seconds to ready (and how much of it was joining the group), the records B
applied of its partition (``applied_since_open``), B's CPU seconds and its
``histlog_cluster_snapshot_restores_total`` and ``_fallbacks_total``.

A failover restored from a snapshot is not measured: after a kill -9 only a standby (promoted where
it stands, ``bench_failover``) or a former owner holds the partition's state, and a dead owner cannot
serve its snapshot.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
import uuid
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import httpx

from bench.bench_failover import (
    CATCH_UP_S,
    FAILOVER_PARTITIONS,
    SESSION_S,
    _cpu_s,
    _fill,
    _get,
    _stats,
    _wait,
    _whole_map,
)
from bench.bench_kafka import _broker
from bench.members import Serve

__all__ = ["report", "run"]

VARIANTS = (("snapshots", ()), ("replay", ("--no-snapshots",)))  # (name, flags of both members)
NO_SNAPSHOT_FAILOVER = ("failover restored from a snapshot: not measured — after a kill -9 only a standby (promoted "
                        "where it stands, bench_failover) or a former owner holds the partition's state; a dead "
                        "owner cannot serve its snapshot")


def _say(text: str) -> None:
    print(f"  join: {text}", file=sys.stderr, flush=True)


def _serve(bootstrap: str, topic: str, state: Path, group: str, *extra: str) -> Serve:
    """One ``histlog serve --group group --standbys 0`` member (fresh state at ``state``)."""
    return Serve(bootstrap, topic, state, "--group", group, "--advertise", "http://127.0.0.1:0",
                                "--session-timeout", str(SESSION_S), "--standbys", "0", *extra)


def _counter(url: str, name: str) -> int | None:
    """The value of the unlabelled counter ``name`` on ``url``'s ``/metrics`` (None: not there)."""
    for line in httpx.get(url + "/metrics", timeout=5.0).text.splitlines():
        if line.startswith(name + " "):
            return int(float(line.rsplit(" ", 1)[1]))
    return None


def _owns(url: str) -> bool:
    """``url``'s own map names it the owner of some partition."""
    try:
        return url in _get(url, "/v1/cluster").get("owners", {}).values()
    except (httpx.HTTPError, OSError, ValueError):
        return False


def _new_member(bootstrap: str, topic: str, root: Path, name: str, extra: tuple[str, ...]) -> dict[str, Any]:
    """A (alone, owning both partitions, ready), then B started: B's process start -> B ready owning
    one partition in a whole map both agree on; what B applied of it and its snapshot counters."""
    group = f"bench-join-{uuid.uuid4().hex[:8]}"
    a: Serve | None = None
    b: Serve | None = None
    try:
        started = time.monotonic()
        a = _serve(bootstrap, topic, root / f"{group}-a", group, *extra)
        _wait(lambda: _whole_map([a.url], FAILOVER_PARTITIONS, 0), CATCH_UP_S,
              f"{name}: member A owning both partitions, ready", every=0.2)
        a_ready = time.monotonic() - started
        _say(f"new member ({name}): A owns both partitions, ready {a_ready:.1f} s after its start; starting B")
        started = time.monotonic()
        b = _serve(bootstrap, topic, root / f"{group}-b", group, *extra)
        joined: float | None = None
        cluster: dict[str, Any] | None = None
        deadline = started + CATCH_UP_S
        while cluster is None:
            if joined is None and _owns(b.url):
                joined = time.monotonic() - started
            if joined is not None:
                cluster = _whole_map([b.url, a.url], FAILOVER_PARTITIONS, 0)
            if cluster is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"bench join: {name}: B not ready owning a partition within {CATCH_UP_S:g} s; "
                                       "see the members' logs above")
                time.sleep(0.1)
        ready = time.monotonic() - started
        assert joined is not None
        cpu = _cpu_s(b.proc.pid)
        part = int(next(p for p, u in cluster["owners"].items() if u == b.url))
        stats = _stats(b.url)
        out: dict[str, Any] = {
            "snapshots": not extra, "ready_s": round(ready, 2), "joined_s": round(joined, 2),
            "catch_up_s": round(ready - joined, 2), "partition": part, "log_end": stats["end_offsets"][part],
            "applied": stats["applied_since_open"][part], "cpu_s": round(cpu, 2),
            "restores": _counter(b.url, "histlog_cluster_snapshot_restores_total"),
            "fallbacks": _counter(b.url, "histlog_cluster_snapshot_fallbacks_total"),
            "a_ready_s": round(a_ready, 2)}
        _say(f"new member ({name}): B ready in {out['ready_s']} s (joined {out['joined_s']} s), applied "
             f"{out['applied']} of partition {part}, restores {out['restores']}, fallbacks {out['fallbacks']}")
        return out
    finally:
        for m in (b, a):
            if m is not None:
                m.close()


def run(quick: bool = False, bootstrap: str | None = None) -> dict[str, Any]:
    records = 25_000 if quick else 100_000
    root = Path(tempfile.mkdtemp(prefix="histlog-bench-join-"))
    try:
        with (nullcontext(bootstrap) if bootstrap else _broker()) as kafka:
            _say(f"new member: filling both partitions with {records} records each")
            started = time.perf_counter()
            topic = _fill(kafka, records, on_1=records)
            _say(f"new member: filled in {time.perf_counter() - started:.1f} s")
            out: dict[str, Any] = {"bench": "join", "records_per_partition": records,
                                   "partitions": FAILOVER_PARTITIONS}
            for name, extra in VARIANTS:
                out[name] = _new_member(kafka, topic, root, name, extra)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out["ratio"] = round(out["replay"]["ready_s"] / max(out["snapshots"]["ready_s"], 1e-9), 2)
    out["catch_up_ratio"] = round(out["replay"]["catch_up_s"] / max(out["snapshots"]["catch_up_s"], 1e-9), 2)
    out["failover_from_snapshot"] = "not measured"
    return out


def _line(label: str, v: dict[str, Any]) -> str:
    restores = "-" if v["restores"] is None else v["restores"]
    fallbacks = "-" if v["fallbacks"] is None else v["fallbacks"]
    return (f"  {label}  ready in {v['ready_s']:>6} s  (joined {v['joined_s']} s, then {v['catch_up_s']} s)  "
            f"applied {v['applied']:>6} records of its partition, CPU {v['cpu_s']} s  "
            f"restores {restores}, fallbacks {fallbacks}")


def report(result: dict[str, Any]) -> str:
    n = result
    return "\n".join([
        f"a new member's time to ready: from snapshots vs by replay, {n['partitions']} partitions of "
        f"{n['records_per_partition']} records each, member A owning both, then B started (fresh state; "
        "B's start -> B ready owning one, the map whole)",
        _line("from snapshots            ", n["snapshots"]),
        _line("by replay (--no-snapshots)", n["replay"]),
        f"  replay / snapshot: {n['ratio']}x the time to ready, {n['catch_up_ratio']}x the time after joining",
        f"  {NO_SNAPSHOT_FAILOVER}"])


if __name__ == "__main__":
    res = run(quick="--quick" in sys.argv)
    print(report(res))
    print(json.dumps(res))
