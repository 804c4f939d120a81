"""Helpers shared by the benchmarks: the workload, a threaded driver and an asyncio one."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import resource
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schemas import Batch, Message
from schemas.events import BatchAppended, encode_event

__all__ = ["Cost", "Run", "batch", "conversation", "cost_now", "event_bytes", "percentiles", "progress_printer",
           "run_measured", "run_measured_async", "run_threads", "save"]

TURNS_PER_CONVERSATION = 10


def conversation(thread: int, i: int) -> str:
    """Writer ``thread``'s conversation for its ``i``-th append: 10 turns each, like a real chat."""
    return f"conv-{thread}-{i // TURNS_PER_CONVERSATION}"


def batch(conv: str, aid: str) -> Batch:
    """One 2-message turn (user question + assistant answer)."""
    return Batch(conv, aid, [Message.user(f"what is the status of order {aid}?"),
                             Message.assistant(f"Order {aid} shipped yesterday; it arrives Friday.")])


def event_bytes(b: Batch, created_at_ms: int = 0) -> bytes:
    """The encoded event the engine would write for ``b`` (what raw baselines send)."""
    return encode_event(BatchAppended.of(b, created_at_ms))


def progress_printer(enabled: bool, label: str = "replay") -> Callable[[int, int], None]:
    """A ``progress(done, total)`` callback that redraws one stderr line (or does nothing)."""

    def show(done: int, total: int) -> None:
        if enabled:
            print(f"\r  {label} {done}/{total}", end="", file=sys.stderr, flush=True)

    return show


@dataclass(frozen=True, slots=True)
class Cost:
    """This process's CPU seconds (user + system, every thread) and context switches (voluntary +
    involuntary, every thread, from ``getrusage(RUSAGE_SELF)``) at one moment; subtract two."""

    cpu_s: float
    switches: int

    def __sub__(self, other: Cost) -> Cost:
        return Cost(self.cpu_s - other.cpu_s, self.switches - other.switches)


def cost_now() -> Cost:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return Cost(usage.ru_utime + usage.ru_stime, usage.ru_nvcsw + usage.ru_nivcsw)


@dataclass(frozen=True, slots=True)
class Run:
    """What ``run_measured`` saw: calls per second, every call's latency (µs), and the process's
    CPU µs and context switches per call over the same window (the projector's and the log
    client's threads included: the cost of a call that wall-clock rates hide on a busy machine)."""

    per_s: float
    latencies_us: list[float]
    cpu_us_per_op: float
    switches_per_op: float

    def shape(self, prefix: str) -> dict[str, float]:
        """The cost columns of a report row, named ``{prefix}_cpu_us`` and ``{prefix}_ctx``."""
        return {f"{prefix}_cpu_us": round(self.cpu_us_per_op, 1), f"{prefix}_ctx": round(self.switches_per_op, 2)}


def run_measured(n: int, per_thread: int, fn: Callable[[int, int], object]) -> Run:
    """Call ``fn(thread, i)`` ``per_thread`` times from each of ``n`` threads started together,
    measuring rate, latencies and the process's cost per call (``Run``); re-raises the first error."""
    barrier = threading.Barrier(n + 1)
    latencies: list[list[float]] = [[] for _ in range(n)]
    errors: list[BaseException] = []

    def work(t: int) -> None:
        barrier.wait()
        mine = latencies[t]
        try:
            for i in range(per_thread):
                started = time.perf_counter_ns()
                fn(t, i)
                mine.append((time.perf_counter_ns() - started) / 1000)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n)]
    for th in threads:
        th.start()
    before = cost_now()
    barrier.wait()
    start = time.perf_counter()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - start
    spent = cost_now() - before
    if errors:
        raise errors[0]
    calls = n * per_thread
    return Run(calls / elapsed, [x for lst in latencies for x in lst], spent.cpu_s * 1e6 / calls,
               spent.switches / calls)


def run_measured_async(n: int, per_task: int, fn: Callable[[int, int], Awaitable[object]]) -> Run:
    """``run_measured`` for coroutines: ``await fn(task, i)`` ``per_task`` times from each of ``n``
    tasks on one new event loop, started together; the same rate, latencies and process costs."""
    latencies: list[list[float]] = [[] for _ in range(n)]

    async def work(t: int) -> None:
        mine = latencies[t]
        for i in range(per_task):
            started = time.perf_counter_ns()
            await fn(t, i)
            mine.append((time.perf_counter_ns() - started) / 1000)

    async def main() -> tuple[float, Cost]:
        before = cost_now()
        start = time.perf_counter()
        await asyncio.gather(*(work(t) for t in range(n)))
        return time.perf_counter() - start, cost_now() - before

    elapsed, spent = asyncio.run(main())
    calls = n * per_task
    return Run(calls / elapsed, [x for lst in latencies for x in lst], spent.cpu_s * 1e6 / calls,
               spent.switches / calls)


def run_threads(n: int, per_thread: int, fn: Callable[[int, int], object]) -> tuple[float, list[float]]:
    """``run_measured`` without the costs: calls per second and every call's latency in µs."""
    run = run_measured(n, per_thread, fn)
    return run.per_s, run.latencies_us


def percentiles(samples: list[float]) -> tuple[float, float]:
    """(p50, p99) of ``samples``."""
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(int(len(ordered) * 0.99), len(ordered) - 1)]


def latency(fn: Callable[[], object], n: int) -> tuple[float, float]:
    """p50 and p99 in µs of ``n`` sequential calls of ``fn`` (after a garbage collection)."""
    gc.collect()
    samples = []
    for _ in range(n):
        started = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - started) / 1000)
    return percentiles(samples)


def cpu_seconds(pid: int | None = None) -> float:
    """CPU time (user + system, every thread) used so far by process ``pid`` (this one when None),
    from ``/proc``: the cost of work that wall-clock latency hides on a busy machine."""
    if pid is None:
        return time.process_time()
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def best_us(fn: Callable[[], object], iterations: int) -> float:
    """Best of 5 rounds of ``iterations`` calls, microseconds per call."""
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter_ns()
        for _ in range(iterations):
            fn()
        best = min(best, (time.perf_counter_ns() - start) / iterations / 1000)
    return best


def save(result: Any, path: Path) -> None:
    """Write a bench's result as JSON to ``path`` (its directory made) and say where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(f"\nresults: {path}")
