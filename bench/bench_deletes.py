"""The cost of ``delete_messages``: a delete of 10 messages against a ``clear`` of a conversation
of the same size, same engine, same run, interleaved rounds (so a drifting clock or a busy
neighbour weighs on both), in a state that also holds ``others`` conversations (a delete, like a
clear, compacts the key ranges its rows had before it returns: its cost is that compaction's).

Timed per operation (median of the rounds, milliseconds): ``delete_newest_10`` (the newest 10
messages: the tail to rewrite is empty), ``delete_oldest_10`` (the oldest 10: every later row of
the conversation moves down, O(messages after them)) and ``clear`` of a conversation of the same
size. Reported with the ratios delete ÷ clear (1.0: as costly as a clear).

``python -m bench.bench_deletes [--quick]`` prints the table and writes
``bench/results/deletes.json``; ``histlog bench deletes`` runs it with the others.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import save
from engine import HistoryEngine
from schemas import Batch, Message

__all__ = ["report", "run"]

RESULTS = Path(__file__).resolve().parent / "results" / "deletes.json"


def _fill(engine: HistoryEngine, conv: str, turns: int) -> None:
    for k in range(turns):
        engine.append(Batch(conv, f"a{k}", [Message.user(f"question {k} " * 8),
                                            Message.assistant(f"answer {k} " * 20)]))


def _ms(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def run(quick: bool = False, progress: bool = True, sizes: tuple[int, int, int] | None = None) -> dict[str, Any]:
    """``sizes``: (turns per conversation, rounds, other conversations), for a tiny run in the tests."""
    turns, rounds, others = sizes or ((50, 5, 200) if quick else (100, 15, 2000))
    root = Path(tempfile.mkdtemp(prefix="histlog-bench-deletes-"))
    result: dict[str, Any] = {"bench": "deletes", "messages_per_conversation": 2 * turns, "rounds": rounds,
                              "other_conversations": others}
    try:
        with HistoryEngine.open(root / "d") as engine:
            for k in range(others):
                engine.append(Batch(f"other-{k}", "a", [Message.user(f"hi {k}"), Message.assistant("hello")]))
            seen: dict[str, list[float]] = {"delete_newest_10": [], "delete_oldest_10": [], "clear": []}
            for r in range(rounds):
                for name in seen:
                    conv = f"{name}-{r}"
                    _fill(engine, conv, turns)
                    if name == "clear":
                        seen[name].append(_ms(lambda c=conv: engine.clear(c)))
                        continue
                    first = turns - 5 if name == "delete_newest_10" else 0
                    ids = [f"a{k}/{i}" for k in range(first, first + 5) for i in (0, 1)]
                    seen[name].append(_ms(lambda c=conv, i=ids: engine.delete_messages(c, i)))
                if progress:
                    print(f"  round {r + 1}/{rounds}", file=sys.stderr, flush=True)
            for name, values in seen.items():
                result[name] = {"ms": round(statistics.median(values), 2)}
            for name in ("delete_newest_10", "delete_oldest_10"):
                result[name]["ratio_to_clear"] = round(result[name]["ms"] / result["clear"]["ms"], 3)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return result


def report(result: dict[str, Any]) -> str:
    lines = [f"delete_messages of 10 vs clear, conversations of {result['messages_per_conversation']} messages "
             f"beside {result['other_conversations']} others, {result['rounds']} interleaved rounds, medians"]
    for name in ("delete_newest_10", "delete_oldest_10"):
        row = result[name]
        lines.append(f"  {name:<17} {row['ms']:>8} ms   ratio to clear {row['ratio_to_clear']}")
    lines.append(f"  {'clear':<17} {result['clear']['ms']:>8} ms")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    result = run(quick="--quick" in args)
    print(report(result))
    save(result, RESULTS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
