"""LangGraph checkpointers side by side: graph steps per second of a one-node ``StateGraph`` that
appends a 200-byte message to a ``messages`` channel (one ``invoke`` makes 3 ``put``, 2
``put_writes`` and 1 ``get_tuple``), over 16 thread ids, with 1 and with 16 threads invoking at
once, on ``HistlogSaver`` (the embedded file log, sealed, fsync on every decision) and, in the same
run, ``InMemorySaver`` (no durability at all) and ``SqliteSaver`` (a file, WAL), interleaved rounds.

Reported per saver and concurrency: steps/s (median of the rounds), p99 step latency, and the
bytes each checkpoint adds to what the saver keeps on disk (histlog: the log, its sealed records
of all three writes; SQLite: the database and its WAL); and histlog's ratios to the others.

``python -m bench.bench_langgraph [--quick]`` prints the table and writes
``bench/results/langgraph.json``; ``histlog bench langgraph`` runs it with the others.
"""

from __future__ import annotations

import operator
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph

from bench.common import save
from engine.integrations.langgraph import HistlogSaver

__all__ = ["report", "run"]

RESULTS = Path(__file__).resolve().parent / "results" / "langgraph.json"
THREAD_IDS = 16
MESSAGE = "x" * 200


class Chat(TypedDict):
    messages: Annotated[list[str], operator.add]


def _graph(saver: BaseCheckpointSaver[Any]) -> Any:
    builder = StateGraph(Chat)
    builder.add_node("bot", lambda state: {"messages": [MESSAGE]})
    builder.add_edge(START, "bot")
    builder.add_edge("bot", END)
    return builder.compile(checkpointer=saver)


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else (
        path.stat().st_size if path.exists() else 0)


def _savers(root: Path) -> dict[str, Callable[[], tuple[BaseCheckpointSaver[Any], Callable[[], int],
                                                        Callable[[], None]]]]:
    def histlog() -> tuple[BaseCheckpointSaver[Any], Callable[[], int], Callable[[], None]]:
        path = Path(tempfile.mkdtemp(dir=root))
        saver = HistlogSaver.open(path)
        return saver, lambda: _size(path / "log"), saver.close

    def memory() -> tuple[BaseCheckpointSaver[Any], Callable[[], int], Callable[[], None]]:
        return InMemorySaver(), lambda: 0, lambda: None

    def sqlite() -> tuple[BaseCheckpointSaver[Any], Callable[[], int], Callable[[], None]]:
        path = Path(tempfile.mkdtemp(dir=root)) / "cp.sqlite"
        conn = sqlite3.connect(path, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        return (SqliteSaver(conn), lambda: _size(path) + _size(path.with_name("cp.sqlite-wal")), conn.close)

    return {"histlog": histlog, "in_memory": memory, "sqlite": sqlite}


def _steps(saver: BaseCheckpointSaver[Any], steps: int, workers: int) -> tuple[float, float]:
    """Run ``steps`` invokes over ``THREAD_IDS`` threads with ``workers`` at once: (steps/s, p99 ms)."""
    graph = _graph(saver)
    latencies: list[float] = []

    def step(k: int) -> None:
        started = time.perf_counter()
        graph.invoke({"messages": [MESSAGE]}, {"configurable": {"thread_id": f"thread-{k % THREAD_IDS}"}})
        latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    if workers == 1:
        for k in range(steps):
            step(k)
    else:
        # One thread id per worker at a time: LangGraph runs one step of a thread at once.
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(lambda w: [step(w + THREAD_IDS * i) for i in range(steps // workers)], range(workers)))
    elapsed = time.perf_counter() - started
    latencies.sort()
    return len(latencies) / elapsed, latencies[int(len(latencies) * 0.99) - 1] * 1000


def run(quick: bool = False, progress: bool = True, sizes: tuple[int, int] | None = None) -> dict[str, Any]:
    """``sizes``: (steps per run, rounds), for a tiny run in the tests."""
    steps, rounds = sizes or ((320, 2) if quick else (2000, 3))
    root = Path(tempfile.mkdtemp(prefix="histlog-bench-langgraph-"))
    result: dict[str, Any] = {"bench": "langgraph", "steps": steps, "rounds": rounds, "thread_ids": THREAD_IDS}
    try:
        makers = _savers(root)
        seen: dict[tuple[str, int], list[float]] = {}
        p99: dict[tuple[str, int], list[float]] = {}
        per_checkpoint: dict[str, float] = {}
        for r in range(rounds):
            for workers in (1, 16):
                for name, make in makers.items():
                    saver, disk, close = make()
                    try:
                        rate, tail = _steps(saver, steps, workers)
                        if r == 0 and workers == 1:
                            per_checkpoint[name] = round(disk() / (3 * steps), 1)
                    finally:
                        close()
                    seen.setdefault((name, workers), []).append(rate)
                    p99.setdefault((name, workers), []).append(tail)
                    if progress:
                        print(f"  round {r + 1}/{rounds} {name} x{workers}: {rate:.0f} steps/s", file=sys.stderr,
                              flush=True)
        for (name, workers), rates in seen.items():
            row = result.setdefault(name, {"bytes_per_checkpoint": per_checkpoint.get(name, 0.0)})
            row[f"steps_per_s_{workers}"] = round(statistics.median(rates), 1)
            row[f"p99_ms_{workers}"] = round(statistics.median(p99[(name, workers)]), 1)
        for other in ("in_memory", "sqlite"):
            result[f"ratio_to_{other}"] = {
                str(w): round(result["histlog"][f"steps_per_s_{w}"] / result[other][f"steps_per_s_{w}"], 3)
                for w in (1, 16)}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return result


def report(result: dict[str, Any]) -> str:
    lines = [f"LangGraph checkpointers: {result['steps']} graph steps over {result['thread_ids']} thread ids, "
             f"{result['rounds']} interleaved rounds, medians"]
    for name in ("histlog", "in_memory", "sqlite"):
        row = result[name]
        lines.append(f"  {name:<10} 1 thread {row['steps_per_s_1']:>8} steps/s (p99 {row['p99_ms_1']} ms)   "
                     f"16 threads {row['steps_per_s_16']:>8} steps/s (p99 {row['p99_ms_16']} ms)   "
                     f"{row['bytes_per_checkpoint']} B/checkpoint on disk")
    for other in ("in_memory", "sqlite"):
        ratio = result[f"ratio_to_{other}"]
        lines.append(f"  histlog ÷ {other}: {ratio['1']} (1 thread), {ratio['16']} (16 threads)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    result = run(quick="--quick" in args)
    print(report(result))
    save(result, RESULTS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
