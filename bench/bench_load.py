"""Appends/s and CPU per append under load (issue 48): what a standby costs a cluster, and the
efficiency of 2 members vs 1, split into its parts. Part of ``histlog bench cluster``
(``bench_cluster.run`` calls it on its broker); alone: ``python -m bench.bench_load [--quick]``.

The variants, ``(members, standbys, appenders)``, each on its own fresh ``LOAD_PARTITIONS``-partition
topic, every one up at once (``histlog serve --group``, ``bench_failover._members``: fresh state,
session timeout 6 s) and loaded in turn, in ``ROUNDS`` interleaved rounds (the order rotating, so
drift hits each alike) after an uncounted warm-up; each appender appends one batch at a time
through an ``AsyncHistoryClient`` given the variant's URLs (each append goes straight to its owner):

* ``(2, 0, 64)``: 2 members; ``(2, 1, 64)``: 2 members with a standby of every partition;
  ``(1, 0, 64)``: 1 member;
* ``(1, 0, 32)``: 1 member at half the concurrency, which is what each of the 2 members sees of
  the 64 appenders.

CPU is utime + stime (``/proc/<pid>/stat``) of the loaded variant's members over its rounds. Then
**idle**: every member's CPU over ``IDLE_S`` seconds with no load at all (heartbeats, the
projector's poll loop, the server), its background burn per second.

**The efficiency** is the CPU per append of 2 members vs 1 on the same load (goal <= 1.2x). Its
extra, split (all in µs per append, same run):

* **concurrency**: ``(1, 0, 32)`` - ``(1, 0, 64)``: one member with half the appenders in flight
  (each group commit, produce and projector step carries about half the appends);
* **background**: the second member's idle burn over the 2-member rounds' seconds, per append;
* **the rest**: ``(2, 0, 64)`` - ``(1, 0, 32)`` - background: what a second busy process on the
  same two cores adds (contention, cache), not attributable from outside the processes.

A paced control (that one member at 32 appenders held to half the 2-member rate) was tried and
left out: pacing empties the member's queue (1-2 appends in flight instead of 32), so its group
commits carry one append each and its CPU per append doubled (1,849 vs 804 µs): it measures the
loss of batching, not what a member of two sees.

On this 2-core machine the members, the broker and the load generator share the cores: CPU per
append is the robust number, rates swing between runs.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack, nullcontext
from pathlib import Path
from typing import Any

from bench.bench_failover import JOIN_S, _cpu_s, _members, _wait, _whole_map
from bench.bench_kafka import _broker
from bench.common import batch
from engine import AsyncHistoryClient
from engine.log.kafka import KafkaLog

__all__ = ["report", "run"]

LOAD_PARTITIONS = 8
APPENDERS = 64
VARIANTS = ((2, 0, APPENDERS), (2, 1, APPENDERS), (1, 0, APPENDERS), (1, 0, APPENDERS // 2))
ROUNDS = 4
IDLE_S = 10.0
EFFICIENCY_GOAL = 1.2

Variant = tuple[int, int, int]


def _say(text: str) -> None:
    print(f"  load: {text}", file=sys.stderr, flush=True)


def _name(v: Variant) -> str:
    return f"{v[0]} member{'s' if v[0] > 1 else ''}, --standbys {v[1]}, {v[2]} appenders"


async def _round(client: AsyncHistoryClient, pids: list[int], appenders: int, appends: int,
                 tag: str) -> tuple[float, float]:
    """``appenders`` concurrent appenders, ``appends`` in all: (seconds, the members' CPU seconds)."""
    per = appends // appenders

    async def appender(k: int) -> None:
        for i in range(per):
            await client.append(batch(f"conv-{tag}-{k}-{i // 10}", f"a-{k}-{i}"))

    cpu0 = [_cpu_s(p) for p in pids]
    started = time.perf_counter()
    await asyncio.gather(*(appender(k) for k in range(appenders)))
    seconds = time.perf_counter() - started
    return seconds, sum(_cpu_s(p) - c for p, c in zip(pids, cpu0, strict=True))


async def _loads(clusters: dict[Variant, list[str]], pids: dict[Variant, list[int]],
                 appends: int) -> dict[Variant, dict[str, Any]]:
    """The same ``appends`` per round on every variant, in ``ROUNDS`` interleaved rounds after an
    uncounted warm-up round; totals over the rounds."""
    clients = {v: AsyncHistoryClient(urls if len(urls) > 1 else urls[0], timeout=60) for v, urls in clusters.items()}
    done: dict[Variant, list[tuple[float, float]]] = {v: [] for v in clusters}
    try:
        for v, client in clients.items():  # reads the map, opens the pools
            tag = "warm-" + "-".join(map(str, v))
            await client.append(batch(tag, "w"))
            await _round(client, pids[v], v[2], 2 * v[2], tag)
        order = list(clusters)
        for r in range(ROUNDS):
            for v in order[r % len(order):] + order[:r % len(order)]:
                done[v].append(await _round(clients[v], pids[v], v[2], appends, f"r{r}-" + "-".join(map(str, v))))
            _say(f"round {r + 1}/{ROUNDS} done")
    finally:
        for client in clients.values():
            await client.close()
    out = {}
    for v, rounds in done.items():
        n = (appends // v[2]) * v[2] * len(rounds)
        seconds, cpu = sum(s for s, _ in rounds), sum(c for _, c in rounds)
        out[v] = {"members": v[0], "standbys": v[1], "appenders": v[2], "appends": n, "seconds": round(seconds, 2),
                  "per_s": round(n / seconds), "cpu_s": round(cpu, 2), "cpu_us_per_append": round(cpu / n * 1e6),
                  "rounds_cpu_us_per_append": [round(c / (n / len(rounds)) * 1e6) for _, c in rounds],
                  "rounds_per_s": [round(n / len(rounds) / s) for s, _ in rounds]}
    return out


def _idle(pids: list[int]) -> float:
    """The members' mean CPU seconds per second over ``IDLE_S`` seconds with no load."""
    cpu0 = [_cpu_s(p) for p in pids]
    started = time.perf_counter()
    time.sleep(IDLE_S)  # measuring an idle window, not waiting for anything
    seconds = time.perf_counter() - started
    return sum(_cpu_s(p) - c for p, c in zip(pids, cpu0, strict=True)) / len(pids) / seconds


def _split(out: dict[Variant, dict[str, Any]], idle: float) -> dict[str, Any]:
    two, one, half = out[(2, 0, APPENDERS)], out[(1, 0, APPENDERS)], out[(1, 0, APPENDERS // 2)]
    extra = two["cpu_us_per_append"] - one["cpu_us_per_append"]
    concurrency = half["cpu_us_per_append"] - one["cpu_us_per_append"]
    background = idle * two["seconds"] / two["appends"] * 1e6  # the second member's burn, per append
    return {"ratio": round(two["cpu_us_per_append"] / one["cpu_us_per_append"], 2), "goal": EFFICIENCY_GOAL,
            "extra_us": extra, "concurrency_us": concurrency, "background_us": round(background),
            "rest_us": round(extra - concurrency - background),
            "idle_cpu_per_member": round(idle, 4)}


def run(quick: bool = False, bootstrap: str | None = None) -> dict[str, Any]:
    appends = (2_048 if quick else 4_096)  # per variant per round (a multiple of every variant's appenders)
    root = Path(tempfile.mkdtemp(prefix="histlog-bench-load-"))
    try:
        with (nullcontext(bootstrap) if bootstrap else _broker()) as kafka, ExitStack() as stack:
            clusters: dict[Variant, list[str]] = {}
            pids: dict[Variant, list[int]] = {}
            for v in VARIANTS:
                topic = f"histlog-bench-load-{uuid.uuid4().hex[:8]}"
                KafkaLog(kafka, topic, partitions=LOAD_PARTITIONS).close()
                _say(f"starting {_name(v)}")
                pairs = stack.enter_context(_members(kafka, topic, root, v[0], v[1]))
                clusters[v], pids[v] = [m.url for m, _ in pairs], [m.proc.pid for m, _ in pairs]
            for v, urls in clusters.items():
                _wait(lambda urls=urls, k=v[1]: _whole_map(urls, LOAD_PARTITIONS, k), JOIN_S,
                      f"{_name(v)}: one whole map, every member ready")
            out = asyncio.run(_loads(clusters, pids, appends))
            every = sorted({p for ps in pids.values() for p in ps})
            _say(f"idle: every member's CPU over {IDLE_S:g} s with no load")
            idle = _idle(every)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for v, o in out.items():
        _say(f"{_name(v)}: {o['per_s']}/s, {o['cpu_us_per_append']} µs CPU per append "
             f"(rounds: {o['rounds_cpu_us_per_append']})")
    two, two_standby = out[(2, 0, APPENDERS)], out[(2, 1, APPENDERS)]
    return {"bench": "load", "partitions": LOAD_PARTITIONS, "rounds": ROUNDS, "appends_per_round": appends,
            "variants": [out[v] for v in VARIANTS],
            "standby": {"per_s_ratio": round(two_standby["per_s"] / two["per_s"], 2),
                        "cpu_ratio": round(two_standby["cpu_us_per_append"] / two["cpu_us_per_append"], 2)},
            "efficiency": _split(out, idle)}


def report(result: dict[str, Any]) -> str:
    r, e, s = result, result["efficiency"], result["standby"]
    lines = [f"appends/s and CPU per append: {r['appends_per_round']} appends per variant in each of {r['rounds']} "
             f"interleaved rounds, {r['partitions']} partitions, each variant on its own topic"]
    for o in r["variants"]:
        v = (o["members"], o["standbys"], o["appenders"])
        lines.append(f"  {_name(v):<38} {o['per_s']:>6}/s  CPU {o['cpu_us_per_append']:>5} µs/append  "
                     f"(rounds: {o['rounds_cpu_us_per_append']})")
    lines += [
        f"  a standby of every partition: {s['per_s_ratio']}x the appends/s, {s['cpu_ratio']}x the CPU per append",
        f"  CPU per append, 2 members vs 1: {e['ratio']}x (goal <= {e['goal']}x); the extra {e['extra_us']} µs:",
        f"    concurrency (1 member at half the appenders)  {e['concurrency_us']:>5} µs",
        f"    background (the second member idle: {e['idle_cpu_per_member'] * 100:.1f} % of a core)"
        f"  {e['background_us']:>5} µs",
        f"    the rest (a second busy process on the same cores)  {e['rest_us']:>5} µs",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    res = run(quick="--quick" in sys.argv)
    print(report(res))
    print(json.dumps(res))
