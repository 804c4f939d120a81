"""Calls that name many things at once, against doing the same one at a time, same state, same
run: ``clear_prefix`` of a bot's conversations against ``clear`` of each, and ``entries_by_ids``
(``turn_sources_by_ids``) of a few ids against reading the whole conversation and picking them.

* **clear_prefix**: a state of ``conversations`` one-turn conversations ``bot-1/u-N`` and as many
  ``bot-2/u-N`` (the copy per case is not timed). ``clear`` of every ``bot-1/`` one, one after
  another, against one ``clear_prefix("bot-1/")``, which writes a thousand clears before it waits,
  so a projector step applies many and one erasure (a flush and a compaction) forgets them
  together. Reported: seconds, clears/s, ratio (higher is better), and that exactly the
  ``bot-1/`` conversations were erased (``stats().cleared``, the open ``bot-2/`` ones untouched).
* **by ids**: 20 ids spread over a ``messages``-message conversation; p50 µs of
  ``entries_by_ids`` and ``turn_sources_by_ids`` against ``entries`` + a filter (what a caller
  does without them), samples interleaved. Ratio by ids ÷ whole read (lower is better).

``python -m bench.bench_bulk [--quick]`` prints the table and writes ``bench/results/bulk.json``;
``histlog bench bulk`` runs it with the others.
"""

from __future__ import annotations

import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import batch, percentiles, run_measured, save
from engine import HistoryEngine

__all__ = ["Sizes", "report", "run"]

RESULTS = Path(__file__).resolve().parent / "results" / "bulk.json"
WRITERS = 8
IDS = 20


@dataclass(frozen=True, slots=True)
class Sizes:
    conversations: int
    messages: int
    samples: int

    @classmethod
    def of(cls, quick: bool) -> Sizes:
        return cls(200, 400, 50) if quick else cls(1_000, 2_000, 300)


def _state(where: Path, sizes: Sizes) -> None:
    with HistoryEngine.open(where, fsync="never") as engine:
        per = max(sizes.conversations // WRITERS, 1)
        run_measured(WRITERS, 2 * per, lambda t, i: engine.append(batch(f"bot-{1 + i % 2}/u-{t * per + i // 2}", "a")))
        for i in range(sizes.messages // 2):
            engine.append(batch("long", f"a-{i}"))


def _clears(state: Path, work: Path, prefix: bool) -> dict[str, Any]:
    shutil.copytree(state, work)
    try:
        with HistoryEngine.open(work, fsync="always") as engine:
            convs = engine.conversations(prefix="bot-1/")
            others = engine.conversations(prefix="bot-2/")
            started = time.perf_counter()
            if prefix:
                count = engine.clear_prefix("bot-1/")
            else:
                for c in convs:
                    engine.clear(c)
                count = len(convs)
            seconds = time.perf_counter() - started
            assert count == len(convs) and engine.stats().cleared == len(convs)  # Invariant: each erased once.
            assert engine.conversations(prefix="bot-") == others  # Invariant: nothing else was cleared.
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"conversations": count, "seconds": round(seconds, 2), "per_s": round(count / seconds, 1)}


def _by_ids(state: Path, sizes: Sizes) -> dict[str, Any]:
    rng = random.Random(7)
    with HistoryEngine.open(state, fsync="never") as engine:
        ids = [e.id for e in rng.sample(engine.entries("long"), IDS)]
        wanted = set(ids)
        calls = {"entries_by_ids": lambda: engine.entries_by_ids("long", ids),
                 "turn_sources_by_ids": lambda: engine.turn_sources_by_ids("long", ids),
                 "entries + filter": lambda: [e for e in engine.entries("long") if e.id in wanted]}
        assert len(calls["entries_by_ids"]()) == IDS == len(calls["entries + filter"]())  # Invariant: same rows.
        took: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(sizes.samples):  # interleaved: the same load on each
            for name, call in calls.items():
                started = time.perf_counter_ns()
                call()
                took[name].append((time.perf_counter_ns() - started) / 1000)
    p50 = {name: round(percentiles(sorted(v))[0], 1) for name, v in took.items()}
    whole = p50["entries + filter"]
    return {"ids": IDS, "messages": sizes.messages, "p50_us": p50,
            "ratio_entries": round(p50["entries_by_ids"] / whole, 4),
            "ratio_sources": round(p50["turn_sources_by_ids"] / whole, 4)}


def run(quick: bool = False, progress: bool = True, sizes: Sizes | None = None) -> dict[str, Any]:
    sizes = sizes or Sizes.of(quick)
    root = Path(tempfile.mkdtemp(prefix="histlog-bench-bulk-"))
    try:
        _state(root / "state", sizes)
        one_by_one = _clears(root / "state", root / "one", prefix=False)
        by_prefix = _clears(root / "state", root / "prefix", prefix=True)
        if progress:
            print(f"  clear: {one_by_one}, clear_prefix: {by_prefix}", file=sys.stderr, flush=True)
        reads = _by_ids(root / "state", sizes)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"bench": "bulk", "clear": one_by_one, "clear_prefix": by_prefix,
            "clear_ratio": round(by_prefix["per_s"] / one_by_one["per_s"], 2), "by_ids": reads}


def report(result: dict[str, Any]) -> str:
    one, bulk, reads = result["clear"], result["clear_prefix"], result["by_ids"]
    p50 = reads["p50_us"]
    return "\n".join([
        f"clear_prefix of {bulk['conversations']} conversations vs clear of each (same state, same run; ratio "
        "clears/s, higher is better)",
        f"  clear one by one   {one['seconds']:>8} s {one['per_s']:>9} clears/s",
        f"  clear_prefix       {bulk['seconds']:>8} s {bulk['per_s']:>9} clears/s   ratio {result['clear_ratio']}",
        f"{reads['ids']} ids of a {reads['messages']}-message conversation, p50 µs (ratio vs entries + filter, "
        "lower is better)",
        f"  entries + filter     {p50['entries + filter']:>9}",
        f"  entries_by_ids       {p50['entries_by_ids']:>9}   ratio {reads['ratio_entries']}",
        f"  turn_sources_by_ids  {p50['turn_sources_by_ids']:>9}   ratio {reads['ratio_sources']}",
    ])


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    result = run(quick="--quick" in args)
    print(report(result))
    save(result, RESULTS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
