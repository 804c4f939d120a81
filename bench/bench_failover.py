"""Failover benchmark (issue 48, ``serve --group G --standbys K``): what a standby replica buys when
an owner dies and what it costs to keep, measured in one run on one broker. Part of ``histlog bench
cluster`` (``bench_cluster.run`` calls it on its broker); alone: ``python -m bench.bench_failover
[--quick]``.

* **unavailability after kill -9 of an owner**, ``--standbys 0`` vs ``--standbys 1``: a 2-partition
  topic whose partition 0 holds N records (a raw producer, as ``bench_cluster._fill``, every record
  on conversations the log's partitioner puts on partition 0; a few on partition 1), 2 ``histlog serve
  --group`` members (session timeout 6 s, the broker's minimum, fresh state) started together. Once
  both agree on one whole map, are ready and (K=1) the standby of partition 0 has applied its log
  end, one writer appends to a conversation on partition 0 through the **survivor** (the member
  that does not own it: it forwards), each append with a 2 s timeout, retried at once on a timeout
  and after 20 ms on an error answer (so the retries do not take the survivor's CPU from its
  catch-up). After 50 acknowledged appends the owner of partition 0 is killed (SIGKILL); the writer
  goes on until 50 more are acknowledged (or 120 s). Unavailability = the longest gap between two
  consecutive acknowledgements. Also: kill -> the survivor's ``/readyz`` 200 owning partition 0, and
  the records it applied on partition 0 after the kill (``applied_since_open``: the replay cost).
  The members run with ``--no-snapshots``: a standby started beside a fresh owner could otherwise
  take a partial snapshot of it, and its apply cost (below) would not be measured.
* **the cost of a standby**: CPU (utime + stime of the process, ``/proc/<pid>/stat``) per record of
  the initial catch-up of the N records, on the owner and on the standby of partition 0 (each member
  from the moment it listens until its applied offset of partition 0 reaches the log end). Under
  load (appends/s, CPU per append with K=1 vs K=0) and the efficiency of 2 members vs 1:
  ``bench_load``, on the same broker.
* **a new member's time to ready** (snapshots vs replay): ``bench_join``, on the same broker.

On this 2-core machine the members, the broker and the load generator share the cores: CPU per
record is the robust number, rates swing between runs.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import httpx
import orjson
from kafka import KafkaProducer

from bench.bench_kafka import _broker
from bench.common import batch, event_bytes
from bench.members import START_S, Serve
from engine.cluster.membership import MIN_SESSION_TIMEOUT
from engine.log.kafka import KafkaLog
from schemas.records import partition_for_key, record_key

__all__ = ["report", "run"]

FAILOVER_PARTITIONS = 2
SESSION_S = MIN_SESSION_TIMEOUT
WRITER_TIMEOUT_S = 2.0
ERROR_PAUSE_S = 0.02
BEFORE_KILL = 50
AFTER_KILL = 50
RECOVERY_BOUND_S = 120.0
JOIN_S = 120.0
CATCH_UP_S = 300.0
_TICK = os.sysconf("SC_CLK_TCK")


def _say(text: str) -> None:
    print(f"  failover: {text}", file=sys.stderr, flush=True)


def _cpu_s(pid: int) -> float:
    """utime + stime of process ``pid`` (every thread), seconds."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # fields 14 and 15 of proc(5), after "pid (comm)"


def _on_partition(partition: int, partitions: int, count: int, prefix: str) -> list[str]:
    """``count`` conversation ids the log's partitioner puts on ``partition``."""
    out: list[str] = []
    i = 0
    while len(out) < count:
        c = f"{prefix}-{i}"
        if partition_for_key(record_key(c), partitions) == partition:
            out.append(c)
        i += 1
    return out


def _fill(bootstrap: str, records: int, on_1: int = 100) -> str:
    """A 2-partition topic: ``records`` on partition 0 (over 3000 conversations), ``on_1`` on
    partition 1 (over 10 conversations, 3000 when ``on_1`` > 1000) (bench_cluster's encoding)."""
    topic = f"histlog-bench-failover-{uuid.uuid4().hex[:8]}"
    KafkaLog(bootstrap, topic, partitions=FAILOVER_PARTITIONS).close()
    on0 = _on_partition(0, FAILOVER_PARTITIONS, 3000, "conv")
    on1 = _on_partition(1, FAILOVER_PARTITIONS, 3000 if on_1 > 1000 else 10, "conv")
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=20,
                             batch_size=256 * 1024)
    try:
        for partition, convs, n in ((0, on0, records), (1, on1, on_1)):
            for i in range(n):
                b = batch(convs[i % len(convs)], f"a-{i}")
                producer.send(topic, key=record_key(b.conversation_id, b.append_id),
                              value=event_bytes(b, int(time.time() * 1000)), partition=partition)
                if i and i % 50_000 == 0:
                    _say(f"filled {i}/{n} on partition {partition}")
        producer.flush()
    finally:
        producer.close()
    return topic


def _get(url: str, path: str) -> Any:
    return httpx.get(url + path, timeout=5.0).json()


def _ready(url: str) -> bool:
    return httpx.get(url + "/readyz", timeout=5.0).status_code == 200


def _whole_map(urls: list[str], partitions: int, standbys: int) -> dict[str, Any] | None:
    """The map every member agrees on (same generation, every partition owned by one of them, each
    of them owning some, K standbys of every partition when K > 0, all ready), else None."""
    try:
        maps = [_get(u, "/v1/cluster") for u in urls]
        first = maps[0]
        owners = first.get("owners", {})
        if first.get("generation", -1) < 0 or any(m.get("generation") != first["generation"] for m in maps) or \
                any(m.get("owners") != owners for m in maps):
            return None
        if len(owners) != partitions or set(owners.values()) != set(urls):
            return None
        if standbys and any(len(first.get("standbys", {}).get(str(p), [])) != standbys for p in range(partitions)):
            return None
        if not all(_ready(u) for u in urls):
            return None
        return dict(first)
    except (httpx.HTTPError, OSError, ValueError):
        return None


def _wait(condition: Any, timeout: float, what: str, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"bench failover: {what}: not within {timeout:g} s")
        time.sleep(every)


@contextmanager
def _members(bootstrap: str, topic: str, root: Path, count: int, standbys: int) -> Iterator[
        list[tuple[Serve, float]]]:
    """``count`` members of a new group on ``topic``, started together (fresh state); yields each
    with its CPU seconds when it printed its URL. Every one is killed on exit (Ctrl-C included)."""
    group = f"bench-failover-{uuid.uuid4().hex[:8]}"
    started: list[tuple[Serve, float] | None] = [None] * count
    errors: list[BaseException] = []

    def start(i: int) -> None:
        try:
            m = Serve(bootstrap, topic, root / f"{group}-m{i}", "--group", group, "--advertise",
                                     "http://127.0.0.1:0", "--session-timeout", str(SESSION_S),
                                     "--standbys", str(standbys), "--no-snapshots")
            started[i] = (m, _cpu_s(m.proc.pid))
        except BaseException as exc:  # reported by the caller
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(i,), daemon=True) for i in range(count)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        yield [s for s in started if s is not None]
    finally:
        for t in threads:
            t.join(START_S)
        for s in started:
            if s is not None:
                s[0].close()


# ----- part 1: a kill -9 of partition 0's owner

def _stats(url: str) -> dict[str, Any]:
    s: dict[str, Any] = _get(url, "/v1/stats")
    return s


def _catch_up(pairs: list[tuple[Serve, float]], standbys: int) -> dict[str, Any]:
    """Wait for the whole map and partition 0's owner (and standby) at the log end of partition 0;
    the CPU each of them spent until then, per record of partition 0."""
    urls = [m.url for m, _ in pairs]
    cpu0 = {m.url: c for m, c in pairs}
    pid = {m.url: m.proc.pid for m, _ in pairs}
    done: dict[str, tuple[float, int]] = {}  # url -> (cpu s when at the end, records applied since open)
    started = time.monotonic()
    deadline = started + CATCH_UP_S
    cluster: dict[str, Any] | None = None
    last_say = started
    while True:
        cluster = _whole_map(urls, FAILOVER_PARTITIONS, standbys)
        if cluster is not None:
            owner = cluster["owners"]["0"]
            watched = [owner, *cluster.get("standbys", {}).get("0", [])]
            for u in watched:
                if u in done:
                    continue
                s = _stats(u)
                if s["applied_offsets"][0] >= s["end_offsets"][0] > 0:
                    done[u] = (_cpu_s(pid[u]), s["applied_since_open"][0])
            if all(u in done for u in watched):
                break
        now = time.monotonic()
        if now > deadline:
            raise RuntimeError(f"bench failover: partition 0 not caught up within {CATCH_UP_S:g} s ({cluster})")
        if now - last_say > 5:
            last_say = now
            try:
                progress = {u.rsplit(":", 1)[1]: _stats(u)["applied_offsets"][0] for u in urls}
            except (httpx.HTTPError, OSError, ValueError):
                progress = {}
            _say(f"catching up partition 0 (applied per member port: {progress})")
        time.sleep(0.2)
    assert cluster is not None
    owner = cluster["owners"]["0"]
    out: dict[str, Any] = {"caught_up_s": round(time.monotonic() - started, 2), "owner": owner}

    def per_record(u: str) -> dict[str, Any]:
        cpu, applied = done[u]
        return {"cpu_s": round(cpu - cpu0[u], 2), "applied": applied,
                "cpu_us_per_record": round((cpu - cpu0[u]) / max(applied, 1) * 1e6, 1)}

    out["owner_cost"] = per_record(owner)
    if standbys:
        out["standby"] = cluster["standbys"]["0"][0]
        out["standby_cost"] = per_record(out["standby"])
    out["cluster"] = cluster
    return out


async def _writer(survivor: str, owner: Serve, conversation: str) -> dict[str, Any]:
    """Appends to ``conversation`` (on partition 0) through ``survivor``; kills ``owner`` after
    BEFORE_KILL acknowledgements; stops AFTER_KILL acknowledgements after the kill or at the bound."""
    acks: list[float] = []
    killed_at: float | None = None
    taken_over: dict[str, Any] = {}
    errors = timeouts = 0

    async def watch(http: httpx.AsyncClient, killed: float, before: int) -> None:
        while time.monotonic() - killed < RECOVERY_BOUND_S:
            try:
                ready = (await http.get(survivor + "/readyz")).status_code == 200
                if ready and (await http.get(survivor + "/v1/cluster")).json().get("owners", {}).get("0") == survivor:
                    at = time.monotonic()
                    stats = (await http.get(survivor + "/v1/stats")).json()
                    taken_over.update(ready_s=round(at - killed, 2),
                                      replayed=stats["applied_since_open"][0] - before)
                    return
            except (httpx.HTTPError, ValueError):
                pass
            await asyncio.sleep(0.05)

    async with httpx.AsyncClient(timeout=WRITER_TIMEOUT_S) as http, \
            httpx.AsyncClient(timeout=WRITER_TIMEOUT_S) as watcher_http:
        watcher: asyncio.Task[None] | None = None
        i = 0
        while True:
            b = batch(conversation, f"w-{i}")
            body = orjson.dumps({"messages": orjson.Fragment(b.canonical_json())})
            try:
                r = await http.put(f"{survivor}/v1/conversations/{conversation}/appends/{b.append_id}",
                                   content=body, headers={"content-type": "application/json"})
                ok = r.is_success
            except httpx.TimeoutException:
                ok = False
                timeouts += 1
            except httpx.HTTPError:
                ok = False
                errors += 1
                await asyncio.sleep(ERROR_PAUSE_S)
            else:
                if not ok:
                    errors += 1
                    await asyncio.sleep(ERROR_PAUSE_S)
            now = time.monotonic()
            if ok:
                acks.append(now)
                i += 1  # a failed append is resent under the same append id (idempotent)
            if killed_at is None and len(acks) >= BEFORE_KILL:
                # what the survivor has applied of partition 0 at the kill: the rest is the tail
                # (a standby's) or the replay (no standby) it applies to take the partition over
                before = (await watcher_http.get(survivor + "/v1/stats")).json()["applied_since_open"][0]
                owner.proc.kill()  # SIGKILL
                killed_at = time.monotonic()
                _say(f"killed the owner of partition 0 (pid {owner.proc.pid}) after {len(acks)} appends")
                watcher = asyncio.create_task(watch(watcher_http, killed_at, before))
            if killed_at is not None and (sum(a > killed_at for a in acks) >= AFTER_KILL
                                          or now - killed_at > RECOVERY_BOUND_S):
                break
        if watcher is not None:
            try:
                await asyncio.wait_for(watcher, RECOVERY_BOUND_S)
            except TimeoutError:
                watcher.cancel()
    assert killed_at is not None
    after = [a for a in acks if a > killed_at]
    gaps = [b - a for a, b in itertools.pairwise(acks)]
    out: dict[str, Any] = {"acks_before_kill": len(acks) - len(after), "acks_after_kill": len(after),
                           "errors": errors, "timeouts": timeouts, "recovered": bool(after)}
    if after:
        out["unavailable_s"] = round(max(gaps), 2)
        out["first_ack_after_kill_s"] = round(after[0] - killed_at, 2)
    out["ready_after_kill_s"] = taken_over.get("ready_s")
    out["replayed_after_kill"] = taken_over.get("replayed")
    return out


def _failover(bootstrap: str, topic: str, root: Path, standbys: int) -> dict[str, Any]:
    _say(f"--standbys {standbys}: starting 2 members")
    with _members(bootstrap, topic, root, 2, standbys) as pairs:
        caught = _catch_up(pairs, standbys)
        cluster = caught.pop("cluster")
        owner = next(m for m, _ in pairs if m.url == cluster["owners"]["0"])
        survivor = next(m for m, _ in pairs if m is not owner)
        if standbys and survivor.url not in cluster["standbys"]["0"]:
            raise RuntimeError(f"bench failover: the survivor is not partition 0's standby: {cluster}")
        _say(f"--standbys {standbys}: caught up in {caught['caught_up_s']} s; writing through the survivor")
        conversation = _on_partition(0, FAILOVER_PARTITIONS, 1, f"writer-{standbys}")[0]
        out = asyncio.run(_writer(survivor.url, owner, conversation))
        out.update(standbys=standbys, **{k: v for k, v in caught.items() if k not in ("owner", "standby")})
        _say(f"--standbys {standbys}: unavailable {out.get('unavailable_s')} s, ready after "
             f"{out['ready_after_kill_s']} s, replayed {out['replayed_after_kill']}")
        return out


def run(quick: bool = False, bootstrap: str | None = None) -> dict[str, Any]:
    records = 50_000 if quick else 200_000
    root = Path(tempfile.mkdtemp(prefix="histlog-bench-failover-"))
    try:
        with (nullcontext(bootstrap) if bootstrap else _broker()) as kafka:
            _say(f"filling partition 0 with {records} records")
            started = time.perf_counter()
            topic = _fill(kafka, records)
            _say(f"filled in {time.perf_counter() - started:.1f} s")
            failover = [_failover(kafka, topic, root, k) for k in (0, 1)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    owner, standby = failover[1]["owner_cost"], failover[1]["standby_cost"]
    return {"bench": "failover", "records": records, "partitions": FAILOVER_PARTITIONS, "session_timeout_s": SESSION_S,
            "goal_s": SESSION_S + 2, "failover": {f"standbys_{f['standbys']}": f for f in failover},
            "standby_cost": {"owner_cpu_us_per_record": owner["cpu_us_per_record"],
                             "standby_cpu_us_per_record": standby["cpu_us_per_record"],
                             "ratio": round(standby["cpu_us_per_record"] / max(owner["cpu_us_per_record"], 1e-9), 2)}}


def _failover_line(f: dict[str, Any], goal: float) -> list[str]:
    label = f"--standbys {f['standbys']}"
    if not f["recovered"]:
        head = f"  {label}  no recovery within {RECOVERY_BOUND_S:g} s"
    else:
        head = (f"  {label}  unavailable {f['unavailable_s']:>6} s"
                + (f"  (goal <= {goal:g} s: {'met' if f['unavailable_s'] <= goal else 'missed'})"
                   if f["standbys"] else ""))
    ready = f["ready_after_kill_s"]
    return [head, f"      survivor ready owning it {ready if ready is not None else '-'} s after the kill, "
                  f"applied {f['replayed_after_kill'] if f['replayed_after_kill'] is not None else '-'} records "
                  f"of it after the kill (when it was ready); {f['errors']} errors, {f['timeouts']} timeouts retried"]


def report(result: dict[str, Any]) -> str:
    r, c = result, result["standby_cost"]
    f0, f1 = r["failover"]["standbys_0"], r["failover"]["standbys_1"]
    return "\n".join([
        f"failover: kill -9 of the owner of a partition of {r['records']} records, 2 members, "
        f"session timeout {r['session_timeout_s']:g} s",
        *_failover_line(f0, r["goal_s"]),
        *_failover_line(f1, r["goal_s"]),
        f"the cost of a standby: CPU per record of the initial catch-up of {r['records']} records",
        f"  owner  (--standbys 0)  {f0['owner_cost']['cpu_us_per_record']:>6} µs",
        f"  owner  (--standbys 1)  {c['owner_cpu_us_per_record']:>6} µs",
        f"  standby               {c['standby_cpu_us_per_record']:>6} µs  -> {c['ratio']}x the owner's",
    ])


if __name__ == "__main__":
    res = run(quick="--quick" in sys.argv)
    print(report(res))
    print(json.dumps(res))
