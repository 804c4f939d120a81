"""The cost of a fence: ``append(batch, fence=f)`` against a plain ``append`` of the same batches,
same engine, same run, interleaved rounds (so a drifting clock or a busy neighbour weighs on both).

Each round appends ``per_round`` 2-message turns to fresh conversations twice: once plain, once
with the fence of a run begun on each conversation first (the ``begin_run`` is not timed) and the
batch's ``run_id`` (so the ``J`` rows of what the run wrote are written too). Reported: appends/s
and CPU µs per append of each at 1 and ``WRITERS`` writers (median of the rounds), and the ratio
fenced ÷ plain (appends/s: higher is better, 1.0 = free). A fence costs admission one point read
(the conversation's latest epoch) and the record 2-3 bytes; a run adds two keys per user-led turn.

``python -m bench.bench_runs [--quick]`` prints the table and writes ``bench/results/runs.json``;
``histlog bench runs`` runs it with the others.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import batch, run_measured, save
from engine import HistoryEngine
from schemas import Batch, Fence

__all__ = ["report", "run"]

RESULTS = Path(__file__).resolve().parent / "results" / "runs.json"
WRITERS = 8


def _round(engine: HistoryEngine, writers: int, per_writer: int, tag: str) -> dict[str, dict[str, float]]:
    fences: dict[str, Fence] = {}
    for t in range(writers):
        for i in range(per_writer):
            c = f"{tag}-f-{t}-{i}"
            fences[c] = engine.begin_run(c, "run-1")

    def plain(t: int, i: int) -> object:
        return engine.append(batch(f"{tag}-p-{t}-{i}", "a"))

    def fenced(t: int, i: int) -> object:
        c = f"{tag}-f-{t}-{i}"
        b = batch(c, "a")
        return engine.append(Batch(c, "a", b.messages, run_id="run-1"), fence=fences[c])

    out = {}
    for name, fn in (("plain", plain), ("fenced", fenced)):
        measured = run_measured(writers, per_writer, fn)
        out[name] = {"per_s": measured.per_s, "cpu_us": measured.cpu_us_per_op}
    last = f"{tag}-f-{writers - 1}-{per_writer - 1}"
    assert engine.run_wrote_history(last, "run-1", "a/0")  # Invariant: the fenced appends were the run's.
    return out


def run(quick: bool = False, progress: bool = True, sizes: tuple[int, int] | None = None) -> dict[str, Any]:
    """``sizes``: (rounds, appends per round), for a tiny run in the tests."""
    rounds, per_round = sizes or ((3, 100) if quick else (7, 400))
    root = Path(tempfile.mkdtemp(prefix="histlog-bench-runs-"))
    result: dict[str, Any] = {"bench": "runs", "rounds": rounds, "appends_per_round": per_round}
    try:
        with HistoryEngine.open(root / "d", fsync="always") as engine:
            for writers in (1, WRITERS):
                seen: dict[str, list[dict[str, float]]] = {"plain": [], "fenced": []}
                for r in range(rounds):
                    got = _round(engine, writers, max(per_round // writers, 1), f"w{writers}-r{r}")
                    for name in seen:
                        seen[name].append(got[name])
                row = {name: {k: round(statistics.median(x[k] for x in v), 1) for k in ("per_s", "cpu_us")}
                       for name, v in seen.items()}
                row["ratio"] = round(row["fenced"]["per_s"] / row["plain"]["per_s"], 3)
                result[f"writers_{writers}"] = row
                if progress:
                    print(f"  {writers} writers: {row}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return result


def report(result: dict[str, Any]) -> str:
    lines = [f"append(fence=...) vs plain append ({result['rounds']} interleaved rounds of "
             f"{result['appends_per_round']} appends, medians; ratio appends/s fenced ÷ plain, 1.0 = free)"]
    for key in sorted(k for k in result if k.startswith("writers_")):
        row = result[key]
        writers = key.removeprefix("writers_")
        lines.append(f"  {writers:>2} writers  plain {row['plain']['per_s']:>8} /s {row['plain']['cpu_us']:>7} µs CPU"
                     f"   fenced {row['fenced']['per_s']:>8} /s {row['fenced']['cpu_us']:>7} µs CPU"
                     f"   ratio {row['ratio']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    result = run(quick="--quick" in args)
    print(report(result))
    save(result, RESULTS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
