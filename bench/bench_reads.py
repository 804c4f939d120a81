"""Read-projection benchmark (issue 5): latency of the reads bots call on every turn, against
the naive baseline measured in the same run.

Run ``python -m bench.bench_reads [--quick]`` (or ``histlog bench --only reads``). Prints a
table and one JSON line. On conversations of 100, 10,000 and 100,000 messages (quick: 100 and
10,000), p50/p99 of:

* ``window(20)``, the navigation reads of a chat UI or a platform bot (``entries(order="desc",
  limit=50)``: the latest page; ``entries(since=<a time in the middle>, limit=50)``: a time range;
  ``locate(<an external id in the middle>, 5, 5)``), ``read_within_bytes(8 KiB)``,
  ``turn_sources(8 KiB)``, ``measure(after=START)`` and ``measure(after=middle)`` served by the
  projections, and
* the naive baseline: load the conversation (``read()`` for the window, ``entries()`` for the
  others) and compute the same result in Python.

``ratio`` is naive p50 / projection p50. The target is a projection latency flat in history
length. Turns vary in size (a user message, 0-3 tool rounds, an answer); messages carry about
200 bytes of content, so about 30 fit in 8 KiB.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import latency, progress_printer
from engine import HistoryEngine
from projections.window import select_window
from schemas import (
    Batch,
    HistoryLoad,
    HistoryPosition,
    Located,
    Measure,
    Message,
    StoredMessage,
    ToolCallPart,
    ToolOutput,
    ToolResultPart,
    TurnSource,
)

__all__ = ["report", "run"]

SIZES = (100, 10_000, 100_000)
QUICK_SIZES = (100, 10_000)
BUDGET = 8 * 1024
WINDOW = 20
QUERIES = ("window(20)", "entries(desc, 50)", "entries(since, 50)", "locate(middle, 5)", "read_within_bytes(8 KiB)",
           "turn_sources(8 KiB)", "measure(START)", "measure(middle)")
PAGE = 50
NAIVE_MESSAGES = 400_000  # naive samples per query: about this many messages loaded in all (quick: a quarter)


def _turn(rng: random.Random, k: int) -> list[Message]:
    words = " ".join(rng.choice(["order", "status", "shipping", "refund", "invoice", "delay"]) for _ in range(28))
    out = [Message.user(f"question {k}: {words}", metadata={"external_id": f"ext-{k}"})]
    for r in range(rng.choice([0, 0, 1, 1, 2, 3])):
        call = f"call-{k}-{r}"
        out.append(Message.assistant(ToolCallPart(call, "lookup", f'{{"order": {k}, "words": "{words[:120]}"}}')))
        out.append(Message.tool(ToolResultPart(call, "lookup", ToolOutput.text(f"result {k}/{r}: {words[:150]}"))))
    out.append(Message.assistant(f"answer {k}: {words}", metadata={"interrupted": k % 7 == 0, "model": "m1"}))
    return out


def _build(engine: HistoryEngine, conv: str, size: int, progress: bool) -> tuple[HistoryPosition, str]:
    """Append about ``size`` messages (a system message, then whole turns) in batches of about
    100; returns a position in the middle of the conversation and the external id of its turn's
    user message."""
    rng = random.Random(size)
    show = progress_printer(progress, f"building {conv}")
    pending: list[Message] = [Message.system("You are a careful order-support assistant.")]
    done = turn = k = 0
    middle = HistoryPosition.START
    external = ""
    while done + len(pending) < size:
        messages = _turn(rng, k)
        k += 1
        turn += 1
        if middle == HistoryPosition.START and done + len(pending) >= size // 2:
            middle = HistoryPosition(turn, done + len(pending) + 2)  # the turn's second message
            external = f"ext-{k - 1}"
        pending.extend(messages)
        if len(pending) >= 100:
            engine.append(Batch(conv, f"a{k}", pending))
            done += len(pending)
            pending = []
            show(done, size)
    if pending:
        engine.append(Batch(conv, "last", pending))
        done += len(pending)
    show(done, size)
    if progress:
        print(file=sys.stderr)
    return middle, external


# -- the naive baseline: load everything, compute in Python ------------------------------------------
def _within_bytes(entries: list[StoredMessage], max_bytes: int) -> HistoryLoad[StoredMessage]:
    kept: list[StoredMessage] = []
    spent = unit_bytes = 0
    turn: int | None = None
    for e in reversed(entries):
        if e.position.turn != turn:
            spent += unit_bytes
            if spent >= max_bytes:
                kept.reverse()
                return HistoryLoad(kept, True)
            turn, unit_bytes = e.position.turn, 0
        unit_bytes += e.message.content_bytes()
        kept.append(e)
    kept.reverse()
    return HistoryLoad(kept, False)


def _turn_sources(entries: list[StoredMessage], max_bytes: int) -> HistoryLoad[TurnSource]:
    load = _within_bytes(entries, max_bytes)
    return HistoryLoad([TurnSource(e.id, e.message.role, e.message.content_json(), e.created_at,
                                   e.message.metadata.get("interrupted") == "true") for e in load.messages],
                       load.truncated)


def _measure(entries: list[StoredMessage]) -> Measure:
    return Measure(len(entries), sum(e.message.content_bytes() for e in entries),
                   len({e.position.turn for e in entries}))


def _locate(entries: list[StoredMessage], external: str, around: int) -> Located:
    at = max(i for i, e in enumerate(entries) if e.message.metadata.get("external_id") == f'"{external}"')
    return Located(entries[at], entries[max(at - around, 0):at], entries[at + 1:at + 1 + around])


def _queries(engine: HistoryEngine, conv: str, middle: HistoryPosition, external: str
             ) -> dict[str, tuple[Callable[[], object], Callable[[], object]]]:
    """``name -> (projection query, naive baseline)``."""
    since = engine.entries(conv, after=HistoryPosition(middle.turn, middle.seq - 1), limit=1)[0].created_at
    return {
        "entries(desc, 50)": (lambda: engine.entries(conv, order="desc", limit=PAGE),
                              lambda: engine.entries(conv)[::-1][:PAGE]),
        "entries(since, 50)": (lambda: engine.entries(conv, since=since, limit=PAGE),
                               lambda: [e for e in engine.entries(conv) if e.created_at >= since][:PAGE]),
        "locate(middle, 5)": (lambda: engine.locate(conv, external, 5, 5),
                              lambda: _locate(engine.entries(conv), external, 5)),
        "window(20)": (lambda: engine.window(conv, WINDOW), lambda: select_window(engine.read(conv), WINDOW)),
        "read_within_bytes(8 KiB)": (lambda: engine.read_within_bytes(conv, BUDGET),
                                     lambda: _within_bytes(engine.entries(conv), BUDGET)),
        "turn_sources(8 KiB)": (lambda: engine.turn_sources(conv, BUDGET),
                                lambda: _turn_sources(engine.entries(conv), BUDGET)),
        "measure(START)": (lambda: engine.measure(conv), lambda: _measure(engine.entries(conv))),
        "measure(middle)": (lambda: engine.measure(conv, after=middle),
                            lambda: _measure(engine.entries(conv, after=middle))),
    }



def run(quick: bool = False, progress: bool = True) -> dict[str, Any]:
    sizes = QUICK_SIZES if quick else SIZES
    n = 200 if quick else 1000
    root = Path(tempfile.mkdtemp(prefix="histlog-bench-reads-"))
    rows: list[dict[str, Any]] = []
    try:
        with HistoryEngine.open(root, fsync="never") as engine:
            for size in sizes:
                conv = f"conv-{size}"
                middle, external = _build(engine, conv, size, progress)
                naive_n = max(5, min(n, NAIVE_MESSAGES // (4 if quick else 1) // size))
                for name, (fast, naive) in _queries(engine, conv, middle, external).items():
                    assert fast() == naive(), name  # Invariant: the baseline computes the same result.
                    p50, p99 = latency(fast, n)
                    n50, n99 = latency(naive, naive_n)
                    rows.append({"messages": size, "query": name, "p50_us": round(p50, 1), "p99_us": round(p99, 1),
                                 "naive_p50_us": round(n50, 1), "naive_p99_us": round(n99, 1),
                                 "samples": n, "naive_samples": naive_n, "ratio": round(n50 / p50, 1)})
                    if progress:
                        print(f"  {size} messages, {name}: p50 {p50:.0f} µs (naive {n50:.0f} µs)",
                              file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"bench": "reads", "sizes": list(sizes), "budget_bytes": BUDGET, "rows": rows}


def report(result: dict[str, Any]) -> str:
    lines = [f"read projections vs naive read()/entries() + Python, latency in ms (budget {result['budget_bytes']} B)",
             f"  {'query':<25} {'messages':>8} {'p50':>8} {'p99':>8} {'naive p50':>10} {'naive p99':>10} "
             f"{'ratio':>8}"]
    for q in QUERIES:
        for r in (r for r in result["rows"] if r["query"] == q):
            lines.append(f"  {q:<25} {r['messages']:>8} {r['p50_us'] / 1000:>8.3f} {r['p99_us'] / 1000:>8.3f} "
                         f"{r['naive_p50_us'] / 1000:>10.3f} {r['naive_p99_us'] / 1000:>10.3f} {r['ratio']:>7}x")
    sizes = result["sizes"]
    flat = []
    for q in QUERIES:
        by_size = {r["messages"]: r["p50_us"] for r in result["rows"] if r["query"] == q}
        flat.append(f"{q} {by_size[sizes[-1]] / by_size[sizes[0]]:.2f}")
    lines.append(f"  projection p50 at {sizes[-1]} / at {sizes[0]} messages (1.0 = flat): " + ", ".join(flat))
    return "\n".join(lines)


if __name__ == "__main__":
    res = run(quick="--quick" in sys.argv)
    print(report(res))
    print(json.dumps(res))
