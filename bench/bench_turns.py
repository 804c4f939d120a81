"""Turns benchmark (issue 7): replacement latency, and reads of a conversation with 1,000
replaced turns — each against a baseline measured in the same run.

Run ``python -m bench.bench_turns [--quick]`` (or ``histlog bench --only turns``). Prints a table
and one JSON line. Cases, on the embedded default (``HistoryEngine.open(tmp)``):

* **writes**, with fsync ``always`` and ``never``: p50/p99 latency of ``replace_turn`` (the
  latest turn of a conversation, retry and edit alternately) vs a plain ``append`` of a batch of
  the same size (a 2-message turn) to another conversation, interleaved call by call.
* **reads**: ``window(20)``, ``read_within_bytes(8 KiB)``, ``turn_sources(8 KiB)``, ``measure()``
  and ``latest_turn()`` on a conversation of 50 visible turns and 1,000 replaced ones vs a
  conversation with the same visible history and no replacement, interleaved call by call;
  plus the RocksDB keys each read visits (``StateStore.keys_read``). Two layouts of the
  replaced turns: **spread** (20 replacements of each visible turn) and **tail** (all 1,000
  replacements of the newest turn: every hidden row lies between the two newest visible turns).
  The target is a ratio of about 1: hidden rows must not slow windows (O(window)). Measured
  twice: with the state fresh in the memtable, then flushed and compacted into SST files.
  ``keys`` counts the keys a read was given; tombstones RocksDB skips inside one ``prev()`` or
  ``next()`` are not in it (time shows them).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench.common import percentiles
from engine import HistoryEngine
from engine.log.file import FsyncPolicy
from schemas import Batch, HistoryLoad, HistoryTurn, Message

__all__ = ["report", "run"]

VISIBLE_TURNS = 50
REPLACED_TURNS = 1000
BUDGET = 8 * 1024


def _turn(conv: str, aid: str, question: str, answer: str) -> Batch:
    return Batch(conv, aid, [Message.user(question),
                             Message.assistant(f"{answer}: " + "the order shipped yesterday and arrives Friday. " * 3)])


def _progress(label: str, done: int, total: int) -> None:
    print(f"\r  {label} {done}/{total}", end="" if done < total else "\n", file=sys.stderr, flush=True)


# -- writes -------------------------------------------------------------------------------------
def _timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - started) / 1000


def _writes(root: Path, fsync: FsyncPolicy, n: int) -> dict[str, Any]:
    appends: list[float] = []
    replaces: list[float] = []
    with HistoryEngine.open(root / f"writes-{fsync}", fsync=fsync) as engine:
        engine.append(_turn("replaced", "r-0", "question", "first answer"))
        latest, question = "r-0/0", "question"
        warmup = max(n // 20, 10)
        for i in range(n + warmup):
            plain = _turn("plain", f"p-{i}", f"question {i}", f"answer {i}")
            if i % 2:
                reason, question = "edit", f"question, edited {i}"
            else:
                reason = "retry"
            replacement = _turn("replaced", f"r-{i + 1}", question, f"answer {i}")
            a = _timed(partial(engine.append, plain))
            r = _timed(partial(engine.replace_turn, replacement, latest, reason))
            latest = f"r-{i + 1}/0"
            if i >= warmup:
                appends.append(a)
                replaces.append(r)
            if i % 100 == 0 or i == n + warmup - 1:
                _progress(f"writes, fsync={fsync}", i + 1, n + warmup)
        hidden = sum(1 for e in engine.entries("replaced", include_hidden=True) if e.hidden)
        assert hidden == 2 * (n + warmup)  # Invariant: every replacement hid the previous turn.
    a50, a99 = percentiles(appends)
    r50, r99 = percentiles(replaces)
    return {"fsync": fsync, "calls": n, "append_p50_us": round(a50), "append_p99_us": round(a99),
            "replace_p50_us": round(r50), "replace_p99_us": round(r99),
            "ratio_p50": round(r50 / a50, 2), "ratio_p99": round(r99 / a99, 2)}


# -- reads --------------------------------------------------------------------------------------
def _build(engine: HistoryEngine, conv: str, layout: str | None) -> None:
    """50 visible turns (and a system message); with a layout, 1,000 replaced turns too. The
    visible history is the same whatever the layout."""
    engine.append(Batch(conv, "system", [Message.system("You are the order-status assistant. Be brief.")]))
    per_turn = REPLACED_TURNS // VISIBLE_TURNS
    done = 0
    for t in range(VISIBLE_TURNS):
        final = (f"question {t}", f"answer {t}")
        if layout == "spread" or (layout == "tail" and t == VISIBLE_TURNS - 1):
            count = per_turn if layout == "spread" else REPLACED_TURNS
            engine.append(_turn(conv, f"t{t}-0", f"question {t}", f"draft 0 of {t}"))
            latest, question = f"t{t}-0/0", f"question {t}"
            for k in range(1, count + 1):
                if k == count:
                    (question, answer), reason = final, "edit"
                elif k % 2:
                    question, answer, reason = f"question {t}, edited {k}", f"draft {k} of {t}", "edit"
                else:
                    answer, reason = f"draft {k} of {t}", "retry"
                engine.replace_turn(_turn(conv, f"t{t}-{k}", question, answer), latest, reason)
                latest = f"t{t}-{k}/0"
                done += 1
                if done % 50 == 0:
                    _progress(f"building {conv}", done, REPLACED_TURNS)
        else:
            engine.append(_turn(conv, f"t{t}", *final))


def _keys(engine: HistoryEngine, fn: Callable[[], object]) -> int:
    store = engine._store
    before = store.keys_read
    fn()
    return store.keys_read - before


def _compare(engine: HistoryEngine, read: Callable[[str], object], plain: str, replaced: str,
             n: int) -> dict[str, Any]:
    base: list[float] = []
    other: list[float] = []
    for _ in range(n):  # interleaved, so drift hits both alike
        base.append(_timed(lambda: read(plain)))
        other.append(_timed(lambda: read(replaced)))
    b50, b99 = percentiles(base)
    r50, r99 = percentiles(other)
    return {"plain_p50_us": round(b50, 1), "plain_p99_us": round(b99, 1),
            "replaced_p50_us": round(r50, 1), "replaced_p99_us": round(r99, 1),
            "ratio_p50": round(r50 / b50, 2), "ratio_p99": round(r99 / b99, 2),
            "plain_keys": _keys(engine, lambda: read(plain)), "replaced_keys": _keys(engine, lambda: read(replaced))}


def _reads(root: Path, n: int) -> list[dict[str, Any]]:
    out = []
    with HistoryEngine.open(root / "reads", fsync="never") as engine:
        _build(engine, "plain", None)
        for layout in ("spread", "tail"):
            _build(engine, layout, layout)
            plain = [(e.position.turn > 0, e.message.canonical_json()) for e in engine.entries("plain")]
            same = [(e.position.turn > 0, e.message.canonical_json()) for e in engine.entries(layout)]
            assert plain == same  # Invariant: the same visible history.
            hidden = sum(1 for e in engine.entries(layout, include_hidden=True) if e.hidden)
            assert hidden == 2 * REPLACED_TURNS  # Invariant: 1,000 replaced 2-message turns.
        reads: dict[str, Callable[[str], object]] = {
            "window(20)": lambda c: engine.window(c, 20),
            "read_within_bytes(8 KiB)": lambda c: engine.read_within_bytes(c, BUDGET),
            "turn_sources(8 KiB)": lambda c: engine.turn_sources(c, BUDGET),
            "measure()": lambda c: engine.measure(c),
            "latest_turn()": lambda c: engine.latest_turn(c),
        }
        for state in ("memtable", "sst"):
            if state == "sst":  # what a long-running engine reads: flushed and compacted
                engine._store.db.flush()
                engine._store.db.compact_range(None, None)
            for layout in ("spread", "tail"):
                for name, read in reads.items():
                    assert _answer(read("plain")) == _answer(read(layout))  # Invariant: the same answer.
                    out.append({"state": state, "layout": layout, "read": name,
                                **_compare(engine, read, "plain", layout, n)})
                _progress("reads", len(out), 4 * len(reads))
    return out


def _answer(result: object) -> object:
    """A read's result without ids and positions (the two conversations' append ids differ)."""
    if isinstance(result, list):
        return [m.canonical_json() for m in result]
    if isinstance(result, HistoryLoad):
        return [getattr(m, "content", None) or m.message.canonical_json() for m in result.messages], result.truncated
    if isinstance(result, HistoryTurn):
        return [m.message.canonical_json() for m in result.messages]
    return result


def run(quick: bool = False) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="histlog-bench-turns-"))
    try:
        writes = [_writes(root, fsync, 300 if quick else 2000) for fsync in ("always", "never")]
        reads = _reads(root, 200 if quick else 2000)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"bench": "turns", "visible_turns": VISIBLE_TURNS, "replaced_turns": REPLACED_TURNS,
            "writes": writes, "reads": reads}


def report(result: dict[str, Any]) -> str:
    lines = ["replace_turn vs append of a 2-message batch, latency (µs), interleaved in one run",
             f"  {'fsync':>6} {'calls':>6} {'append p50':>11} {'p99':>7} {'replace p50':>12} {'p99':>7} "
             f"{'ratio p50':>10} {'p99':>6}"]
    for w in result["writes"]:
        lines.append(f"  {w['fsync']:>6} {w['calls']:>6} {w['append_p50_us']:>11} {w['append_p99_us']:>7} "
                     f"{w['replace_p50_us']:>12} {w['replace_p99_us']:>7} {w['ratio_p50']:>10} {w['ratio_p99']:>6}")
    lines.append(f"reads (µs): {result['visible_turns']} visible turns with {result['replaced_turns']} replaced "
                 "turns vs the same visible history without replacements")
    lines.append(f"  {'state':>8} {'layout':>6} {'read':<25} {'plain p50':>9} {'p99':>7} {'replaced p50':>12} "
                 f"{'p99':>7} {'ratio p50':>9} {'p99':>5} {'keys plain':>10} {'replaced':>8}")
    for r in result["reads"]:
        lines.append(f"  {r['state']:>8} {r['layout']:>6} {r['read']:<25} {r['plain_p50_us']:>9} "
                     f"{r['plain_p99_us']:>7} {r['replaced_p50_us']:>12} {r['replaced_p99_us']:>7} {r['ratio_p50']:>9} "
                     f"{r['ratio_p99']:>5} {r['plain_keys']:>10} {r['replaced_keys']:>8}")
    return "\n".join(lines)


if __name__ == "__main__":
    res = run(quick="--quick" in sys.argv)
    print(report(res))
    print(json.dumps(res))

