"""What clears cost the rest of the engine: appends to other conversations while clears run,
against the same appends with no clear, same state, same run (``projections/eraser.py``).

A clear compacts the RocksDB files its conversation's ranges overlap, which costs about the size
of those files, not the conversation's: in a state of many conversations one clear rewrites
megabytes. The compaction runs on the eraser's thread (RocksDB releases the interpreter lock
while it works), so appends to other conversations are decided meanwhile; clears that arrive
together share one compaction.

Cases, each on a copy of one state of ``conversations`` one-turn conversations (the copy is not
timed): 16 writer threads append ``appends`` durable 2-message turns (``fsync="always"``) to
conversations of their own while 0 (the baseline), 1 or 4 clearer threads clear old
conversations one after another until the writers are done. Reported per case: appends/s and
their p50 / p99 / max latency, the ratio of appends/s to the baseline's, clears/s and the clear
p50. Every clear must erase a conversation (``stats().cleared``), or the run fails.

Measured (this 2-core box, 2026-12-03, 20,000 conversations, 4,000 appends): 2,149 appends/s with
no clear; 1,989 / 1,920 (x0.93 / 0.89) while 1 / 4 threads clear, append p99 27 / 26 ms, 1.7 /
3.2 clears/s. The previous release, whose compaction ran inside the projector's step, back to
back: 2,309 with no clear, 34 / 11 (x0.015 / 0.005) while clearing, append p50 458 / 1,409 ms
(every append waited for the compaction in progress), 2.0 / 2.8 clears/s.

``python -m bench.bench_clears [--quick]`` prints the table and writes
``bench/results/clears.json``; ``histlog bench clears`` runs it with the others.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import batch, percentiles, run_measured, save
from engine import HistoryEngine

__all__ = ["Sizes", "report", "run"]

RESULTS = Path(__file__).resolve().parent / "results" / "clears.json"
WRITERS = 16


@dataclass(frozen=True, slots=True)
class Sizes:
    conversations: int
    appends: int
    clearers: tuple[int, ...] = (0, 1, 4)

    @classmethod
    def of(cls, quick: bool) -> Sizes:
        return cls(2_000, 800) if quick else cls(20_000, 4_000)


def _state(where: Path, conversations: int) -> None:
    """``conversations`` one-turn conversations ``c-N``, written without fsync (the setting)."""
    with HistoryEngine.open(where, fsync="never") as engine:
        per = max(conversations // WRITERS, 1)
        run_measured(WRITERS, per, lambda t, i: engine.append(batch(f"c-{t * per + i}", f"a-{i}")))


def _case(state: Path, work: Path, sizes: Sizes, clearers: int) -> dict[str, Any]:
    shutil.copytree(state, work)
    engine = HistoryEngine.open(work, fsync="always")
    done, lock, clear_ms, turn = threading.Event(), threading.Lock(), [], [0]
    errors: list[BaseException] = []

    def clear_loop() -> None:
        try:
            while not done.is_set():
                with lock:
                    n, turn[0] = turn[0], turn[0] + 1
                if n >= sizes.conversations:
                    return
                started = time.perf_counter_ns()
                engine.clear(f"c-{(n * 7919) % sizes.conversations}")  # spread over the state
                clear_ms.append((time.perf_counter_ns() - started) / 1e6)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=clear_loop) for _ in range(clearers)]
    try:
        per = sizes.appends // WRITERS
        started = time.perf_counter()
        for t in threads:
            t.start()
        appended = run_measured(WRITERS, per, lambda t, i: engine.append(batch(f"w-{t}", f"x-{i}")))
        done.set()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - started
        if errors:
            raise errors[0]
        assert engine.stats().cleared == len(clear_ms)  # Invariant: every clear erased a conversation.
    finally:
        done.set()
        engine.close()
        shutil.rmtree(work, ignore_errors=True)
    lat = sorted(x / 1000 for x in appended.latencies_us)
    p50, p99 = percentiles(lat)
    out: dict[str, Any] = {"clearers": clearers, "appends_per_s": round(appended.per_s), "append_p50_ms": round(p50, 2),
                           "append_p99_ms": round(p99, 2), "append_max_ms": round(lat[-1], 2),
                           "clears": len(clear_ms), "clears_per_s": round(len(clear_ms) / elapsed, 1)}
    if clear_ms:
        out["clear_p50_ms"] = round(percentiles(clear_ms)[0], 1)
    return out


def run(quick: bool = False, progress: bool = True, sizes: Sizes | None = None) -> dict[str, Any]:
    sizes = sizes or Sizes.of(quick)
    root = Path(tempfile.mkdtemp(prefix="histlog-bench-clears-"))
    try:
        _state(root / "state", sizes.conversations)
        cases = []
        for clearers in sizes.clearers:
            cases.append(_case(root / "state", root / f"run-{clearers}", sizes, clearers))
            if progress:
                print(f"  {cases[-1]}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = next((c["appends_per_s"] for c in cases if c["clearers"] == 0), None)
    for c in cases:
        c["rate_ratio"] = round(c["appends_per_s"] / base, 3) if base else None
    return {"bench": "clears", "conversations": sizes.conversations, "appends": sizes.appends, "writers": WRITERS,
            "cases": cases}


def report(result: dict[str, Any]) -> str:
    lines = [f"{result['writers']} writers append {result['appends']} turns to their own conversations while N "
             f"clearers clear others, in a state of {result['conversations']} conversations (same run; ratio: "
             "appends/s against N = 0)",
             f"  {'clearers':>8} {'appends/s':>10} {'ratio':>6} {'p50 / p99 / max ms':>22} {'clears/s':>9} "
             f"{'clear p50 ms':>13}"]
    for c in result["cases"]:
        lat = f"{c['append_p50_ms']} / {c['append_p99_ms']} / {c['append_max_ms']}"
        lines.append(f"  {c['clearers']:>8} {c['appends_per_s']:>10} {c['rate_ratio']:>6} {lat:>22} "
                     f"{c['clears_per_s']:>9} {c.get('clear_p50_ms', '-'):>13}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    result = run(quick="--quick" in args)
    print(report(result))
    save(result, RESULTS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
