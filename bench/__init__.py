"""histlog's benchmarks. Each module has ``run(quick=False) -> dict`` and ``report(dict) -> str``
and measures against a baseline in the same run (ratios, never absolute pass/fail gates).

``python -m bench [NAME ...] [--quick] [--only NAME[,NAME]] [--json PATH]`` or ``histlog bench
[NAME ...]`` runs them (all when none is named):
schemas, codec, log, engine (appends with CPU µs and context switches per append, vs raw FileLog and
eventsourcing), reads (the read projections vs ``read()`` + Python), middleware, turns, kafka (a real broker:
``HISTLOG_KAFKA`` or one started from the Maven Central jars with ``scripts/kafka``; appends with their cost,
where the decision wait goes at 64 writers), postgres (a private PostgreSQL 15 vs histlog: durable idempotent
appends at 1/16/64 writers, the newest-20 read, bytes on disk per message), and
service (``histlog serve`` vs the same engine in process), frameworks (the service's two hot shapes on
each HTTP framework and server present, against raw ASGI on uvicorn), forward (one hop between cluster
members), cluster (a member of a 3-member group vs a full replica: start-up catch-up, appends/s, the hop),
langchain (``HistlogMiddleware``'s overhead per agent step vs the same ``create_agent`` agent without it),
sealed (erasure's AES-256-GCM sealing and key store vs today's encode and a raw append + fsync), and
erasure (the sealed engine vs ``seal=False``, interleaved rounds: appends/s and CPU per append at 1/16/64
writers, replay, clear latency), clears (appends to other conversations while clears run, against the
same appends with none), bulk (``clear_prefix`` against a clear of each, reads by ids against a whole
read and a filter), runs (``append(fence=...)`` against a plain append, interleaved rounds), assets
(reads of messages with linked assets against the same reads without), deletes (``delete_messages`` of
10 messages against a ``clear`` of the same size), langgraph (graph steps/s on ``HistlogSaver`` against
``InMemorySaver`` and ``SqliteSaver``), console (the web console in headless Chromium: first-load bytes
and requests, the render time of a 1,000-message conversation's first page against a fetch() of its
JSON), and instructions (callgrind's instructions per append and per replayed record).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["NAMES", "run_all"]

NAMES = ("schemas", "codec", "log", "engine", "reads", "middleware", "turns", "kafka", "service", "frameworks",
         "forward", "cluster", "langchain", "sealed", "erasure", "clears", "instructions",
         "postgres", "bulk", "runs", "assets", "deletes", "langgraph", "console")


def run_all(argv: list[str] | None = None) -> int:
    """Run the selected benchmarks, print each table, write all results as JSON; exit status."""
    parser = argparse.ArgumentParser(prog="histlog bench", description=__doc__)
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"which benchmarks: {', '.join(NAMES)} (default all)")
    parser.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    parser.add_argument("--only", default="", help="the same as NAME ..., comma-separated")
    parser.add_argument("--json", default="bench/results/latest.json", help="where to write the results")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    names = [*args.names, *(n.strip() for n in args.only.split(",") if n.strip())] or list(NAMES)
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        print(f"histlog bench: unknown benchmark {unknown[0]!r}; choose from {', '.join(NAMES)}", file=sys.stderr)
        return 2
    results: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "quick": args.quick}
    for i, name in enumerate(names, 1):
        print(f"\n== [{i}/{len(names)}] bench {name}", file=sys.stderr, flush=True)
        module = importlib.import_module(f"bench.bench_{name}")
        started = time.perf_counter()
        result = module.run(quick=args.quick)
        print(f"\n# {name} ({time.perf_counter() - started:.0f} s)")
        print(module.report(result), flush=True)
        results[name] = result
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(f"\nresults: {out}")
    return 0
