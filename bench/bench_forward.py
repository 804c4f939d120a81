"""The cost of one forward hop between cluster members (issue 14), measured in one run.

Two full-replica members on one Kafka topic (2 partitions), each an in-process uvicorn server
over its own engine, with a static ownership map: A owns partition 0, B owns 1. ``window(20)`` of a
100-message conversation on partition 0 is read over one keep-alive HTTP/1.1 connection
**direct** (to A, the owner) and **via B** (B forwards it to A over its pooled connection and
relays the answer), in alternating blocks so drift hits both alike. The hop's cost is the
difference of the p50s. Run ``python -m bench --only forward [--quick]``.
"""

from __future__ import annotations

import contextlib
import http.client
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import uvicorn

from bench.bench_kafka import _broker
from bench.common import batch, percentiles
from engine import HistoryEngine
from engine.cluster import OwnershipMap
from engine.service.app import build_app
from engine.service.routing import Router

__all__ = ["report", "run"]

PARTITIONS = 2


@contextlib.contextmanager
def _serving(app: Any) -> Iterator[str]:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the bench server did not start")
        time.sleep(0.005)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)


def _samples(url: str, path: str, n: int) -> list[float]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    out = []
    try:
        for _ in range(n):
            started = time.perf_counter_ns()
            conn.request("GET", path)
            response = conn.getresponse()
            body = response.read()
            out.append((time.perf_counter_ns() - started) / 1000)
            if response.status != 200 or b'"messages"' not in body:
                raise RuntimeError(f"window answered {response.status}: {body[:200]!r}")
    finally:
        conn.close()
    return out


def run(quick: bool = False) -> dict[str, Any]:
    n, blocks = (100, 4) if quick else (500, 6)
    root = Path(tempfile.mkdtemp(prefix="histlog-bench-forward-"))
    topic = f"histlog-bench-forward-{uuid.uuid4().hex[:8]}"
    owners: dict[int, str] = {}
    with _broker() as bootstrap, contextlib.ExitStack() as stack:
        urls: list[str] = []
        engines = []
        for name in ("a", "b"):
            engine = stack.enter_context(HistoryEngine.open(kafka=bootstrap, topic=topic, state_dir=root / name,
                                                            partitions=PARTITIONS))
            cell: list[str] = []

            def source(cell: list[str] = cell) -> OwnershipMap:
                return OwnershipMap("bench", 1, PARTITIONS, cell[0], owners)

            url = stack.enter_context(_serving(build_app(engine, ownership=source)))
            cell.append(url)
            urls.append(url)
            engines.append(engine)
        a, b = urls
        owners.update({0: a, 1: b})
        c = next(f"window-{i}" for i in range(1000) if Router.partition_of(f"window-{i}", PARTITIONS) == 0)
        for i in range(50):  # 100 messages
            engines[0].append(batch(c, f"a-{i}"))
        path = f"/v1/conversations/{quote(c, safe='')}/window?limit=20"
        _samples(a, path, 50), _samples(b, path, 50)  # warm both connections and B's pool
        direct: list[float] = []
        forwarded: list[float] = []
        for _ in range(blocks):
            direct += _samples(a, path, n)
            forwarded += _samples(b, path, n)
    d50, d99 = percentiles(direct)
    f50, f99 = percentiles(forwarded)
    return {"requests_each": len(direct), "direct_p50_us": round(d50), "direct_p99_us": round(d99),
            "forwarded_p50_us": round(f50), "forwarded_p99_us": round(f99), "hop_p50_us": round(f50 - d50)}


def report(result: dict[str, Any]) -> str:
    r = result
    return "\n".join([
        f"window(20) of 100 messages, {r['requests_each']} requests each, one keep-alive connection",
        f"  direct to the owner   p50 {r['direct_p50_us']:>6} µs   p99 {r['direct_p99_us']:>6} µs",
        f"  via a non-owner       p50 {r['forwarded_p50_us']:>6} µs   p99 {r['forwarded_p99_us']:>6} µs",
        f"  one forward hop costs p50 {r['hop_p50_us']:>6} µs",
    ])
