"""Service benchmark (issue 13): the engine through ``histlog serve`` vs the same engine in
process, measured in the same run on the same data shape.

Run ``python -m bench --only service [--quick]`` (or ``histlog bench --only service``). Cases:

* **appends/s** with fsync ``always`` at 1, 16 and 64 concurrent clients, 2-message batches:
  in process, ``HistoryEngine.append`` from that many threads (as ``bench_engine``); through the
  server (a ``histlog serve`` subprocess on its own data dir, loopback), that many concurrent
  appenders on one event loop, three ways: ``raw`` (one keep-alive HTTP/1.1 connection each,
  written by hand: the server's own capacity, what bots in any language see), ``client_each`` (an
  ``AsyncHistoryClient`` each: one per bot process) and ``client_shared`` (one
  ``AsyncHistoryClient``, so one httpx pool, for all of them).
* **latency** p50/p99 of one client's sequential ``append`` and of ``window(20)`` on a
  100-message conversation: in process vs a raw keep-alive connection vs ``HistoryClient``.

Also the CPU time per ``window(20)``: in process, and the server process's per raw HTTP request
(from ``/proc``), whose difference is HTTP's share of the server's work: unlike wall-clock
latency, it does not grow when other processes compete for the cores.

The issue's goals are printed as met or not for each way, never asserted: HTTP overhead of
``window(20)`` at p50 (through the server minus in process) under 300 µs, and appends/s at 64
clients at least 0.6x in process. Both processes share the machine's cores, so the server's figures include the
client's CPU time: a lower bound on what a fleet of separate bot processes would see.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import orjson

from bench.common import batch, conversation, cpu_seconds, latency, percentiles, run_threads
from engine import AsyncHistoryClient, HistoryClient, HistoryEngine
from schemas import Batch

__all__ = ["report", "run"]

CONCURRENCY = (1, 16, 64)
WAYS = ("raw", "client_each", "client_shared")
WINDOW_CONV = "window-100"  # 100 messages, as bench_engine's smaller read case
OVERHEAD_GOAL_US = 300
RATE_GOAL = 0.6
START_S = 60.0


class _Server:
    """A ``histlog serve`` subprocess on ``data`` (fsync "always"), stopped by SIGTERM on exit."""

    def __init__(self, data: Path) -> None:
        repo = Path(__file__).resolve().parents[1]
        env = dict(os.environ, PYTHONPATH=str(repo) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine", "--data", str(data), "serve", "--listen", "127.0.0.1:0"],
            cwd=repo, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], START_S)
        line = self.proc.stdout.readline().decode() if ready else ""
        if not line.startswith("listening="):
            self.proc.kill()
            raise RuntimeError(f"histlog serve did not start (printed {line!r})")
        self.url = line.strip().removeprefix("listening=")

    def __enter__(self) -> _Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=START_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        assert self.proc.stdout is not None
        self.proc.stdout.close()


def _batch(tag: str, t: int, i: int) -> Batch:
    """Appender ``t``'s ``i``-th batch of run ``tag``: its own ids, so no run resends another's."""
    return batch(f"{tag}-{conversation(t, i)}", f"a-{tag}-{t}-{i}")


def _inprocess(root: Path, total: int, samples: int) -> dict[str, Any]:
    out: dict[str, Any] = {"appends_per_s": {}}
    with HistoryEngine.open(root / "inproc") as engine:
        for w in CONCURRENCY:
            def one(t: int, i: int, w: int = w) -> None:
                engine.append(_batch(f"w{w}", t, i))

            rate, lat = run_threads(w, max(total // w, 1), one)
            out["appends_per_s"][w] = rate
            if w == 1:
                out["append_us"] = percentiles(lat)
        for i in range(50):
            engine.append(batch(WINDOW_CONV, f"win-{i}"))
        out["window20_us"] = latency(lambda: engine.window(WINDOW_CONV, 20), samples)
        cpu = cpu_seconds()  # apart from latency(), whose garbage collection would count
        for _ in range(samples):
            engine.window(WINDOW_CONV, 20)
        out["window20_cpu_us"] = (cpu_seconds() - cpu) * 1e6 / samples
    return out


async def _timed(tag: str, writers: int, per_client: int,
                 append: Callable[[int, Batch], Awaitable[object]]) -> tuple[float, list[float]]:
    """``writers`` concurrent appenders on one event loop, started together: rate, latencies (µs)."""
    lat: list[float] = []

    async def one(t: int) -> None:
        for i in range(per_client):
            started = time.perf_counter_ns()
            await append(t, _batch(tag, t, i))
            lat.append((time.perf_counter_ns() - started) / 1000)

    start = time.perf_counter()
    await asyncio.gather(*(one(t) for t in range(writers)))
    return writers * per_client / (time.perf_counter() - start), lat


class _RawHTTP:
    """One keep-alive HTTP/1.1 connection on asyncio streams, speaking SERVICE.md by hand: what
    a bot in any language sends, with no Python client's cost on top."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, url: str) -> _RawHTTP:
        parts = urlsplit(url)
        return cls(*await asyncio.open_connection(parts.hostname, parts.port))

    async def append(self, b: Batch) -> None:
        body = orjson.dumps({"messages": [orjson.Fragment(m.model_dump_json()) for m in b.messages]})
        path = f"/v1/conversations/{quote(str(b.conversation_id), safe='')}/appends/{quote(str(b.append_id), safe='')}"
        self.writer.write(f"PUT {path} HTTP/1.1\r\nHost: histlog\r\nContent-Type: application/json\r\n"
                          f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        head = await self.reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":", 1)[1]) for line in head.lower().split(b"\r\n")
                      if line.startswith(b"content-length:"))
        answer = await self.reader.readexactly(length)
        if not head.startswith(b"HTTP/1.1 200 "):
            raise RuntimeError(f"append answered {head.splitlines()[0]!r}: {answer[:200]!r}")

    def close(self) -> None:
        self.writer.close()


async def _served_way(url: str, way: str, writers: int, per_client: int) -> tuple[float, list[float]]:
    """The load one way: ``raw`` connections (the server's own capacity, as bots in any language
    see it), an ``AsyncHistoryClient`` per appender (``client_each``: one per bot process), or one
    ``AsyncHistoryClient`` shared by every appender (``client_shared``: one pool)."""
    tag = f"{way}-w{writers}"
    if way == "raw":
        raw = [await _RawHTTP.open(url) for _ in range(writers)]
        try:
            return await _timed(tag, writers, per_client, lambda t, b: raw[t].append(b))
        finally:
            for r in raw:
                r.close()
    clients = [AsyncHistoryClient(url) for _ in range(writers if way == "client_each" else 1)]
    try:  # one connection per appender open before the clock starts
        await asyncio.gather(*(clients[t % len(clients)].stats() for t in range(writers)))
        return await _timed(tag, writers, per_client, lambda t, b: clients[t % len(clients)].append(b))
    finally:
        for c in clients:
            await c.close()


def _raw_window(url: str, samples: int, pid: int) -> tuple[tuple[float, float], float]:
    """window(20) on one raw keep-alive ``http.client`` connection (no Python client on top):
    p50/p99 µs, and the server process's CPU µs per request."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=START_S)
    path = f"/v1/conversations/{quote(WINDOW_CONV, safe='')}/window?limit=20"

    def get() -> None:
        conn.request("GET", path)
        r = conn.getresponse()
        body = r.read()
        if r.status != 200:
            raise RuntimeError(f"window(20) answered {r.status}: {body[:200]!r}")

    get()
    try:
        cpu = cpu_seconds(pid)
        lat = latency(get, samples)
        return lat, (cpu_seconds(pid) - cpu) * 1e6 / samples
    finally:
        conn.close()


def _served(root: Path, total: int, samples: int) -> dict[str, Any]:
    out: dict[str, Any] = {"appends_per_s": {}}
    with _Server(root / "served") as server, HistoryClient(server.url) as client:
        client.stats()
        for w in CONCURRENCY:
            # Each way on its own append ids: a resend would measure deduplication instead.
            rates = {way: asyncio.run(_served_way(server.url, way, w, max(total // w, 1))) for way in WAYS}
            out["appends_per_s"][w] = {way: r for way, (r, _) in rates.items()}
            if w == 1:
                out["append_us"] = {way: percentiles(lat) for way, (_, lat) in rates.items()}
        for i in range(50):
            client.append(batch(WINDOW_CONV, f"win-{i}"))
        client.window(WINDOW_CONV, 20)
        out["window20_us"] = latency(lambda: client.window(WINDOW_CONV, 20), samples)
        out["window20_raw_http_us"], out["window20_server_cpu_us"] = _raw_window(server.url, samples, server.proc.pid)
    return out


def run(quick: bool = False, progress: bool = True) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="histlog-bench-service-"))
    total, samples = (256, 200) if quick else (3200, 2000)
    try:
        local = _inprocess(root, total, samples)
        remote = _served(root, total, samples)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    appends = []
    for w in CONCURRENCY:
        base = local["appends_per_s"][w]
        row: dict[str, Any] = {"clients": w, "inprocess_per_s": round(base)}
        for way in WAYS:
            row[f"{way}_per_s"] = round(remote["appends_per_s"][w][way])
            row[f"{way}_vs_inprocess"] = round(remote["appends_per_s"][w][way] / base, 3)
        appends.append(row)

    def lat(pair: tuple[float, float]) -> dict[str, int]:
        return {"p50_us": round(pair[0]), "p99_us": round(pair[1])}

    window = {"inprocess": lat(local["window20_us"]), "raw_http": lat(remote["window20_raw_http_us"]),
              "client": lat(remote["window20_us"])}
    overhead = {way: window[way]["p50_us"] - window["inprocess"]["p50_us"] for way in ("raw_http", "client")}
    cpu = {"inprocess_us": round(local["window20_cpu_us"]), "server_us": round(remote["window20_server_cpu_us"])}
    cpu["overhead_us"] = cpu["server_us"] - cpu["inprocess_us"]
    return {"bench": "service", "appends": appends, "window20_cpu_per_call": cpu,
            "append_latency": {"inprocess": lat(local["append_us"]), "raw_http": lat(remote["append_us"]["raw"]),
                               "client": lat(remote["append_us"]["client_each"])},
            "window20_latency": window, "window20_overhead_p50_us": overhead,
            "goals": {"window20_overhead_p50_under_300us": {w: o < OVERHEAD_GOAL_US for w, o in overhead.items()},
                      "appends_64_at_least_0.6x": {way: appends[-1][f"{way}_vs_inprocess"] >= RATE_GOAL
                                                   for way in WAYS}}}


def report(result: dict[str, Any]) -> str:
    lines = ["appends/s (fsync=always, 2-message batches): in process vs through histlog serve",
             "  (raw: keep-alive HTTP/1.1 by hand; client_each: an AsyncHistoryClient per appender; "
             "client_shared: one for all)",
             f"  {'clients':>7} {'in-process':>11}" + "".join(f" {way:>13} {'ratio':>6}" for way in WAYS)]
    for a in result["appends"]:
        lines.append(f"  {a['clients']:>7} {a['inprocess_per_s']:>11}" + "".join(
            f" {a[f'{way}_per_s']:>13} {a[f'{way}_vs_inprocess']:>6}" for way in WAYS))
    lines.append("latency (µs, one client, sequential)")
    for name, key in (("append", "append_latency"), ("window(20)", "window20_latency")):
        cells = [f"{who} p50 {v['p50_us']} p99 {v['p99_us']}" for who, v in result[key].items()]
        lines.append(f"  {name}: " + "; ".join(cells))
    cpu = result["window20_cpu_per_call"]
    lines.append(f"  window(20) CPU per call: in process {cpu['inprocess_us']} µs; the server's per raw HTTP request "
                 f"{cpu['server_us']} µs (HTTP's share {cpu['overhead_us']} µs; the client's CPU not counted)")
    goals = result["goals"]

    def met(ok: bool) -> str:
        return "met" if ok else "NOT met"

    for way, us in result["window20_overhead_p50_us"].items():
        lines.append(f"goal: window(20) HTTP overhead p50 < {OVERHEAD_GOAL_US} µs via {way}: {us} µs, "
                     f"{met(goals['window20_overhead_p50_under_300us'][way])}")
    last = result["appends"][-1]
    for way in WAYS:
        lines.append(f"goal: appends/s at {last['clients']} clients >= {RATE_GOAL}x in process via {way}: "
                     f"{last[f'{way}_vs_inprocess']}x, {met(goals['appends_64_at_least_0.6x'][way])}")
    return "\n".join(lines)


if __name__ == "__main__":
    res = run(quick="--quick" in sys.argv)
    print(report(res))
    print(json.dumps(res))
