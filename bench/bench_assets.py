"""The cost of assets on reads: the same reads of two conversations of the same messages, one
with an asset linked to every user message and one without, same engine, same run, interleaved
rounds (so a drifting clock or a busy neighbour weighs on both).

Reads timed: the newest 50 entries (``entries(order="desc", limit=50)``), the 50-message window
with where it is stored (``window_entries``) and every turn (``turns``). Reported: reads/s of
each, with and without assets (median of the rounds), and the ratio with ÷ without (1.0 = free),
and the keys each read visits (``StateStore.keys_read``: a message with assets costs one point
read more, one without none). Also ``link_assets``/s of one ref to messages that have none.

``python -m bench.bench_assets [--quick]`` prints the table and writes
``bench/results/assets.json``; ``histlog bench assets`` runs it with the others.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import save
from engine import HistoryEngine
from schemas import AssetRef, Batch, Message

__all__ = ["report", "run"]

RESULTS = Path(__file__).resolve().parent / "results" / "assets.json"


def _ref(k: int) -> AssetRef:
    return AssetRef("sha256:" + f"{k:064x}", "image", 0, mime="image/jpeg", size_bytes=48_213 + k,
                    storage_key=f"media/{k:08d}.jpg", name=f"photo-{k}.jpg")


def _fill(engine: HistoryEngine, conv: str, turns: int) -> None:
    for k in range(turns):
        engine.append(Batch(conv, f"a{k}", [Message.user(f"what is in photo {k}? " * 4),
                                            Message.assistant(f"photo {k} shows a cat on a mat. " * 6)]))


def _rate(fn: Callable[[], object], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - start)


def run(quick: bool = False, progress: bool = True, sizes: tuple[int, int, int] | None = None) -> dict[str, Any]:
    """``sizes``: (turns per conversation, rounds, reads per round), for a tiny run in the tests."""
    turns, rounds, per_round = sizes or ((200, 3, 200) if quick else (1000, 7, 500))
    root = Path(tempfile.mkdtemp(prefix="histlog-bench-assets-"))
    result: dict[str, Any] = {"bench": "assets", "turns": turns, "rounds": rounds, "reads_per_round": per_round}
    try:
        with HistoryEngine.open(root / "d") as engine:
            _fill(engine, "plain", turns)
            _fill(engine, "media", turns)
            start = time.perf_counter()
            for k in range(turns):
                engine.link_assets("media", f"a{k}/0", [_ref(k)])
            result["link_assets_per_s"] = round(turns / (time.perf_counter() - start), 1)
            reads: dict[str, Callable[[str], object]] = {
                "newest_50": lambda c: engine.entries(c, order="desc", limit=50),
                "window_entries_50": lambda c: engine.window_entries(c, 50),
                "turns": lambda c: engine.turns(c),
            }
            for name, read in reads.items():
                seen: dict[str, list[float]] = {"without": [], "with": []}
                for _ in range(rounds):
                    for label, conv in (("without", "plain"), ("with", "media")):
                        n = per_round if name != "turns" else max(per_round // 20, 2)
                        seen[label].append(_rate(lambda c=conv, r=read: r(c), n))
                keys: dict[str, int] = {}
                for label, conv in (("without", "plain"), ("with", "media")):
                    before = engine._store.keys_read
                    read(conv)
                    keys[label] = engine._store.keys_read - before
                row = {label: round(statistics.median(v), 1) for label, v in seen.items()}
                result[name] = {"per_s": row, "ratio": round(row["with"] / row["without"], 3), "keys": keys}
                if progress:
                    print(f"  {name}: {result[name]}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return result


def report(result: dict[str, Any]) -> str:
    lines = [f"reads with assets (every user message: one ref) vs without, {result['turns']} turns each, "
             f"{result['rounds']} interleaved rounds, medians; ratio reads/s with ÷ without, 1.0 = free"]
    for name in ("newest_50", "window_entries_50", "turns"):
        row = result[name]
        lines.append(f"  {name:<18} without {row['per_s']['without']:>9} /s ({row['keys']['without']} keys)"
                     f"   with {row['per_s']['with']:>9} /s ({row['keys']['with']} keys)   ratio {row['ratio']}")
    lines.append(f"  link_assets of one ref: {result['link_assets_per_s']} /s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    result = run(quick="--quick" in args)
    print(report(result))
    save(result, RESULTS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
