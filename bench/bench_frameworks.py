"""Framework and server benchmark (issue 13): which HTTP stack ``histlog serve`` should run on.

Run ``python -m bench --only frameworks [--quick]``. Each framework present (``raw`` ASGI as the
floor, Starlette, FastAPI, Litestar, all on the same pydantic models and handler work, each in its
idiomatic way; and Litestar on msgspec Structs, what it costs once the models are rewritten for it:
``bench/fw_apps.py``) is served by each server present (uvicorn with httptools + uvloop,
granian with uvloop; one worker each, as ``histlog serve``) in a subprocess on 127.0.0.1, and
measured with the client in this process on the service's two hot shapes, ``window(20)`` (a ~3 KB
JSON body of 20 models built per request) and ``PUT .../appends/{a}`` (a 2-message body validated
into a model, a small receipt back):

* **latency** p50/p99 of sequential requests on one keep-alive ``http.client`` connection;
* **req/s** of 64 concurrent keep-alive raw asyncio connections (HTTP/1.1 by hand, as
  ``bench_service``'s ``_RawHTTP``: no client library's cost on top), and the server's **CPU µs
  per request** under that load (user + system of its processes from ``/proc``): the figure that
  stays put when other processes load the machine, where wall-clock rates swing by tens of percent;
* the server's **RSS** after the load, and what the framework costs to import and build
  (milliseconds, modules) on top of pydantic and the models.

Every stack is measured 3 times (once with ``--quick``), interleaved (round 1 of every stack, then round 2, ...)
so a burst of load from another process hits them all alike; the table gives the median and the
spread ((max - min) / median) and the ratio to raw ASGI on uvicorn. A stack is called clearly
better than the current one (Starlette on uvicorn) only at >= 1.15x its req/s and <= 1/1.15 of
its CPU per request, on both shapes.
Client and server share the machine's cores, so the figures include the client's CPU time.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import importlib.metadata
import importlib.util
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from bench.common import latency

__all__ = ["report", "run"]

FRAMEWORKS = {"raw": (), "starlette": ("starlette",), "fastapi": ("fastapi",), "litestar": ("litestar",),
              "litestar_msgspec": ("litestar", "msgspec")}
SERVERS = {"uvicorn": ("uvicorn", "httptools", "uvloop"), "granian": ("granian", "uvloop")}
FLOOR, CURRENT = ("raw", "uvicorn"), ("starlette", "uvicorn")
CLEARLY_BETTER = 1.15
CONNECTIONS = 64
START_S, STOP_S = 30.0, 10.0
WINDOW_PATH = "/v1/conversations/c-1/window?limit=20"
PUT_BODY = json.dumps({"messages": [
    {"role": "user", "parts": [{"kind": "text", "text": "what is the status of order 1234?"}]},
    {"role": "assistant", "parts": [{"kind": "text", "text": "Order 1234 shipped yesterday; it arrives Friday."}]},
]}).encode()
REPO = Path(__file__).resolve().parents[1]


def _missing(modules: tuple[str, ...]) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]


def _versions(modules: tuple[str, ...]) -> str:
    return " ".join(f"{m} {importlib.metadata.version(m)}" for m in modules)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _command(framework: str, server: str, port: int) -> list[str]:
    if server == "uvicorn":
        return [sys.executable, "-m", "bench.fw_apps", framework, str(port)]
    return [sys.executable, "-m", "granian", "--interface", "asgi", "--host", "127.0.0.1", "--port", str(port),
            "--workers", "1", "--loop", "uvloop", "--http", "1", "--no-ws", "--log-level", "warning",
            "--factory", f"bench.fw_apps:{framework}_app"]


class _Served:
    """One stack in its own process group; ready once it accepts a connection. On exit SIGTERM,
    then SIGKILL to the whole group (granian's worker too) after a bounded wait."""

    def __init__(self, framework: str, server: str) -> None:
        self.port = _free_port()
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 -- closed in __exit__; read if it fails to start
        self.proc = subprocess.Popen(_command(framework, server, self.port), cwd=REPO, env=env,
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
                                     start_new_session=True)
        deadline = time.monotonic() + START_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1.0).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.log.seek(0)
                    said = self.log.read()[-2000:].decode(errors="replace")
                    self.__exit__(None, None, None)
                    raise RuntimeError(f"{framework} on {server} did not start: {said}") from None
                time.sleep(0.02)

    def _tree(self) -> list[int]:
        """The server process and its descendants (granian's worker)."""
        found, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            try:
                todo += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
            except OSError:
                continue
            found.append(pid)
        return found

    def rss_mb(self) -> float:
        """Resident memory of the server's processes."""
        total = 0
        for pid in self._tree():
            with contextlib.suppress(OSError):
                status = Path(f"/proc/{pid}/status").read_text()
                total += next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
        return total / 1024

    def cpu_s(self) -> float:
        """CPU seconds (user + system, every thread) the server's processes have used so far: unlike
        wall-clock rates, CPU per request hardly moves when other processes load the machine."""
        ticks = 0
        for pid in self._tree():
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of stat)
        return ticks / os.sysconf("SC_CLK_TCK")

    def __enter__(self) -> _Served:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the group is ours: anything left of this stack
        except ProcessLookupError:
            pass
        self.log.close()


def _sequential(port: int, samples: int) -> dict[str, tuple[float, float]]:
    """p50/p99 (µs) of each shape on one keep-alive ``http.client`` connection, after a warm-up."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=START_S)
    count = iter(range(10**9))

    def call(method: str, path: str, body: bytes | None) -> None:
        conn.request(method, path, body, {"Content-Type": "application/json"} if body else {})
        r = conn.getresponse()
        answer = r.read()
        if r.status != 200:
            raise RuntimeError(f"{method} {path} answered {r.status}: {answer[:200]!r}")

    def window() -> None:
        call("GET", WINDOW_PATH, None)

    def put() -> None:
        call("PUT", f"/v1/conversations/c-1/appends/s-{next(count)}", PUT_BODY)

    try:
        for _ in range(100):
            window()
            put()
        return {"window": latency(window, samples), "put": latency(put, samples)}
    finally:
        conn.close()


async def _concurrent(port: int, shape: str, per_conn: int) -> float:
    """req/s of ``CONNECTIONS`` keep-alive connections, each sending ``per_conn`` requests."""
    streams = [await asyncio.open_connection("127.0.0.1", port) for _ in range(CONNECTIONS)]

    def request(t: int, i: int) -> bytes:
        if shape == "window":
            return f"GET {WINDOW_PATH} HTTP/1.1\r\nHost: bench\r\n\r\n".encode()
        return (f"PUT /v1/conversations/c-{t}/appends/a-{t}-{i} HTTP/1.1\r\nHost: bench\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(PUT_BODY)}\r\n\r\n").encode() + PUT_BODY

    async def one(t: int, first: int, n: int) -> None:
        reader, writer = streams[t]
        for i in range(first, first + n):
            writer.write(request(t, i))
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line.split(b":", 1)[1]) for line in head.lower().split(b"\r\n")
                          if line.startswith(b"content-length:"))
            body = await reader.readexactly(length)
            if not head.startswith(b"HTTP/1.1 200 "):
                raise RuntimeError(f"{shape} answered {head.splitlines()[0]!r}: {body[:200]!r}")

    try:
        await asyncio.gather(*(one(t, 0, 2) for t in range(CONNECTIONS)))  # warm, every connection open
        start = time.perf_counter()
        await asyncio.gather(*(one(t, 2, per_conn) for t in range(CONNECTIONS)))
        return CONNECTIONS * per_conn / (time.perf_counter() - start)
    finally:
        for _, writer in streams:
            writer.close()


def _import_cost(framework: str) -> tuple[float, int]:
    """Milliseconds and modules a fresh interpreter spends importing and building ``framework``'s
    app, beyond pydantic and the models (``bench.fw_apps`` imported first)."""
    code = ("import sys, time; import bench.fw_apps as f; n = len(sys.modules); t = time.perf_counter(); "
            f"f.FACTORIES[{framework!r}](); print((time.perf_counter() - t) * 1000, len(sys.modules) - n)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=START_S,
                         env=dict(os.environ, PYTHONPATH=str(REPO)), check=True).stdout.split()
    return float(out[0]), int(out[1])


def _measure(framework: str, server: str, samples: int, per_conn: int) -> dict[str, float]:
    with _Served(framework, server) as served:
        seq = _sequential(served.port, samples)
        out = {f"{shape}_{q}_us": v for shape, pair in seq.items() for q, v in zip(("p50", "p99"), pair, strict=True)}
        for shape in ("window", "put"):
            cpu = served.cpu_s()
            out[f"{shape}_per_s"] = asyncio.run(_concurrent(served.port, shape, per_conn))
            out[f"{shape}_cpu_us"] = (served.cpu_s() - cpu) * 1e6 / (CONNECTIONS * (per_conn + 2))
        out["rss_mb"] = served.rss_mb()
    out["import_ms"], out["import_modules"] = _import_cost(framework)
    return out


def run(quick: bool = False, progress: bool = True) -> dict[str, Any]:
    rounds, samples, per_conn = (1, 200, 10) if quick else (3, 2000, 100)
    skipped: dict[str, str] = {}
    for name, modules in (*FRAMEWORKS.items(), *SERVERS.items()):
        if missing := _missing(modules):
            skipped[name] = f"not installed ({', '.join(missing)})"
    load_before = os.getloadavg()[0]
    stacks = [(f, s) for s in SERVERS for f in FRAMEWORKS if f not in skipped and s not in skipped]
    samples_of: dict[tuple[str, str], list[dict[str, float]]] = {stack: [] for stack in stacks}
    for r in range(rounds):
        for f, s in stacks:
            if progress:
                print(f"\r  round {r + 1}/{rounds}: {f} on {s}      ", end="", file=sys.stderr, flush=True)
            samples_of[(f, s)].append(_measure(f, s, samples, per_conn))
    if progress:
        print(file=sys.stderr)
    rows = []
    for (f, s), got in samples_of.items():
        row: dict[str, Any] = {"framework": f, "server": s, "rounds": len(got)}
        for key in got[0]:
            values = [g[key] for g in got]
            med = statistics.median(values)
            row[key] = round(med, 1)
            row[f"{key}_spread"] = round((max(values) - min(values)) / med, 3) if med else 0.0
        rows.append(row)
    by = {(row["framework"], row["server"]): row for row in rows}
    for row in rows:
        for base_name, base in (("raw", FLOOR), ("current", CURRENT)):
            if base in by:
                for key in ("window_per_s", "put_per_s", "window_p50_us", "put_p50_us", "window_cpu_us", "put_cpu_us"):
                    row[f"{key}_vs_{base_name}"] = round(row[key] / by[base][key], 3)
    better = [f"{r['framework']}+{r['server']}" for r in rows  # the floor is no candidate, the current no rival
              if CURRENT in by and r["framework"] != FLOOR[0] and (r["framework"], r["server"]) != CURRENT
              and min(r["window_per_s_vs_current"], r["put_per_s_vs_current"]) >= CLEARLY_BETTER
              and max(r["window_cpu_us_vs_current"], r["put_cpu_us_vs_current"]) <= 1 / CLEARLY_BETTER]
    present = tuple(m for mods in (*FRAMEWORKS.values(), *SERVERS.values()) for m in mods if m not in _missing((m,)))
    return {"bench": "frameworks", "rounds": rounds, "samples": samples, "connections": CONNECTIONS,
            "requests_per_shape": CONNECTIONS * per_conn, "python": sys.version.split()[0],
            "load_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "versions": _versions(("pydantic", *dict.fromkeys(present))), "skipped": skipped, "stacks": rows,
            "clearly_better_than_current": better}


def report(result: dict[str, Any]) -> str:
    def cell(row: dict[str, Any], key: str) -> str:
        return f"{row[key]:.0f} ±{row[f'{key}_spread'] * 50:.0f}%"

    def ratio(row: dict[str, Any], key: str) -> str:
        return f"{row[key]:.2f}" if key in row else "-"

    lines = [f"frameworks x servers, one worker, python {result['python']}: median of {result['rounds']} "
             f"interleaved rounds (± half the spread); {result['samples']} sequential samples, "
             f"{result['requests_per_shape']} requests on {result['connections']} connections per shape",
             f"  {result['versions']}; 1-min load average before/after {result['load_1min']}",
             "  x raw: req/s over raw ASGI on uvicorn's; cpu: the server's CPU µs per request under the load",
             f"  {'framework':<16} {'server':<8} {'window p50 µs':>14} {'p99':>5} {'req/s':>10} {'x raw':>5}"
             f" {'cpu':>9} {'put p50 µs':>12} {'p99':>5} {'req/s':>10} {'x raw':>5} {'cpu':>9}"
             f" {'RSS MB':>6} {'import ms':>9} {'+mods':>5}"]
    for r in result["stacks"]:
        lines.append(
            f"  {r['framework']:<16} {r['server']:<8} {cell(r, 'window_p50_us'):>14} {r['window_p99_us']:>5.0f}"
            f" {cell(r, 'window_per_s'):>10} {ratio(r, 'window_per_s_vs_raw'):>5} {cell(r, 'window_cpu_us'):>9}"
            f" {cell(r, 'put_p50_us'):>12} {r['put_p99_us']:>5.0f} {cell(r, 'put_per_s'):>10}"
            f" {ratio(r, 'put_per_s_vs_raw'):>5} {cell(r, 'put_cpu_us'):>9}"
            f" {r['rss_mb']:>6.1f} {r['import_ms']:>9.0f} {r['import_modules']:>5.0f}")
    lines += [f"  {name}: skipped, {why}" for name, why in result["skipped"].items()]
    lines.append("vs Starlette on uvicorn: req/s window, put | server CPU/request window, put | p50 window, put")
    lines += [f"  {r['framework'] + '+' + r['server']:<25} " + " | ".join(
        " ".join(f"{r[f'{shape}_{what}_vs_current']:.2f}x" for shape in ("window", "put"))
        for what in ("per_s", "cpu_us", "p50_us")) for r in result["stacks"] if "window_per_s_vs_current" in r]
    better = result["clearly_better_than_current"]
    lines.append(f"clearly better than Starlette on uvicorn (>= {CLEARLY_BETTER}x req/s and <= 1/{CLEARLY_BETTER} "
                 "of its CPU per request, both shapes): " + (", ".join(better) if better else "none"))
    return "\n".join(lines)


if __name__ == "__main__":
    res = run(quick="--quick" in sys.argv)
    print(report(res))
    print(json.dumps(res))
