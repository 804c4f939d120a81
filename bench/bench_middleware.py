"""Middleware benchmark (issue 6): what ``HistoryMiddleware.call`` adds per call over calling the
model directly with a hand-assembled request, measured in the same run.

Run ``python -m bench --only middleware [--quick]`` (or ``python -m bench.bench_middleware``).

Setup: the embedded default (``HistoryEngine.open(tmpdir)``), a conversation holding a system
message and 20 or 2,000 messages (2-message turns), and a model that returns a fixed answer at
once (so every microsecond measured is the middleware's or the store's). Each sample is a pair,
run back to back: the **direct** call (build the ``ChatRequest`` the model would see from
messages already in memory, call the model) and the **middleware** call; the reported numbers
are percentiles of the per-pair difference ("added ms").

* **read side**: the middleware with a writer that confirms at once (no I/O): reading the
  history, checking every stored message, validating the open turn, assembling the request,
  building and digesting the Batch. This is the middleware's own cost plus the read; the reader's
  ``read`` alone is reported next to it, so the middleware's own share is the difference.
* **total**: the middleware with the engine as writer, so each call also makes one durable
  append (fsync ``always``, the default) or a buffered one (fsync ``never``): the difference
  between the two is the fsync.

Readers: the engine itself (``read``: the whole history), ``WindowReader`` over a plain reader
(reads the whole history, then keeps a window of whole turns), and the engine's
``window(cid, 20)`` projection (O(limit)), which is what ``WindowReader(engine, 20)`` asks when
its reader is the engine itself. The history each call sees
stays fixed: the reader reads the prefilled conversation, the writer appends to another one.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import percentiles
from engine import HistoryEngine, HistoryMiddleware, MiddlewareConfig, WindowReader
from schemas import Batch, ChatRequest, ChatResponse, LogPosition, Message, Receipt, Role, Usage

__all__ = ["report", "run"]

SYSTEM = Message.system("You are Nova, Parcelly's support assistant. Be brief; use the tools.")
REPLY = Message.assistant("Order A1042 arrives tomorrow between 10:00 and 14:00.")
ANSWER = ChatResponse(REPLY, "stop", Usage(500, 14))
TARGET_MS = 1.0


def _model(request: ChatRequest) -> ChatResponse:
    return ANSWER


class _Fixed:
    """Reads one prefilled conversation whatever it is asked (the history stays the same size)."""

    def __init__(self, read: Callable[[str], list[Message]], conversation: str) -> None:
        self._read = read
        self._conversation = conversation

    def read(self, conversation_id: str) -> list[Message]:
        return self._read(self._conversation)


class _Confirming:
    """A writer that confirms at once without I/O (isolates the read side)."""

    def append(self, batch: Batch) -> Receipt:
        return Receipt(batch.conversation_id, batch.append_id, batch.digest, LogPosition(0, 0))


def _prefill(engine: HistoryEngine, conversation: str, messages: int) -> None:
    engine.append(Batch(conversation, "system", [SYSTEM]))
    for t in range(messages // 2):
        engine.append(Batch(conversation, f"t{t}", [
            Message.user(f"Where is my order A{1000 + t}? It was due on the {t % 28 + 1}th."),
            Message.assistant(f"Order A{1000 + t} left the Leipzig hub this morning; it arrives tomorrow."),
        ]))


def _readers(engine: HistoryEngine, conversation: str) -> dict[str, Any]:
    full = _Fixed(engine.read, conversation)
    return {
        "engine": full,
        "WindowReader(reader, 20)": WindowReader(full, 20),
        "engine.window(20)": _Fixed(lambda c: engine.window(c, 20), conversation),
    }


def _pairs(direct: Callable[[], object], wrapped: Callable[[], object], n: int) -> dict[str, float]:
    for _ in range(min(n // 10, 20)):  # warm-up
        direct()
        wrapped()
    base, added = [], []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        direct()
        t1 = time.perf_counter_ns()
        wrapped()
        t2 = time.perf_counter_ns()
        base.append((t1 - t0) / 1e6)
        added.append(((t2 - t1) - (t1 - t0)) / 1e6)
    b50, _ = percentiles(base)
    a50, a99 = percentiles(added)
    return {"direct_p50_ms": round(b50, 4), "added_p50_ms": round(a50, 4), "added_p99_ms": round(a99, 4)}


def _case(reader: Any, writer: Any, n: int) -> dict[str, float]:
    mw = HistoryMiddleware(MiddlewareConfig(reader, writer, "bench-sink"))
    call = mw.call(_model)
    question = Message.user("Can you send it to my office instead?")
    request = ChatRequest([SYSTEM, question])
    seen = [m for m in reader.read("bench-sink") if m.role is not Role.SYSTEM]  # what the model sees, in memory

    def direct() -> object:
        return _model(ChatRequest([SYSTEM, *seen, question]))

    return _pairs(direct, lambda: call(request), n)


def _read_alone(reader: Any, n: int) -> float:
    """p50 ms of the reader's ``read`` by itself: the part of the read side that is the store's."""
    samples = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        reader.read("bench-sink")
        samples.append((time.perf_counter_ns() - t0) / 1e6)
    return percentiles(samples)[0]


def _say(enabled: bool, text: str) -> None:
    if enabled:
        print(f"  {text}", file=sys.stderr, flush=True)


def run(quick: bool = False, progress: bool = True) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="histlog-bench-mw-"))
    sizes = {20: 200 if quick else 2000, 2000: 30 if quick else 300}  # history size -> samples
    rows: dict[tuple[int, str], dict[str, Any]] = {}
    try:
        for fsync in ("always", "never"):
            with HistoryEngine.open(root / fsync, fsync=fsync) as engine:
                for size, n in sizes.items():
                    conversation = f"history-{size}"
                    _say(progress, f"fsync={fsync}: prefilling {size} messages")
                    _prefill(engine, conversation, size)
                    for name, reader in _readers(engine, conversation).items():
                        row = rows.setdefault((size, name), {"messages": size, "reader": name, "samples": n})
                        if fsync == "always":
                            _say(progress, f"{size} messages, {name}: read side ({n} pairs)")
                            row["read_side"] = _case(reader, _Confirming(), n)
                            row["reader_read_p50_ms"] = round(_read_alone(reader, n), 4)
                        _say(progress, f"{size} messages, {name}: total, fsync={fsync} ({n} pairs)")
                        row[f"total_fsync_{fsync}"] = _case(reader, engine, n)
            with HistoryEngine.open(root / f"append-{fsync}", fsync=fsync) as engine:
                samples = []
                for i in range(sizes[20]):
                    b = Batch("c", f"a{i}", [Message.user("q"), REPLY])
                    t0 = time.perf_counter_ns()
                    engine.append(b)
                    samples.append((time.perf_counter_ns() - t0) / 1e6)
                p50, p99 = percentiles(samples)
                rows[(0, f"append-{fsync}")] = {"append_fsync": fsync, "p50_ms": round(p50, 4), "p99_ms": round(p99, 4)}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    cases = [r for k, r in rows.items() if k[0]]
    appends = [r for k, r in rows.items() if not k[0]]
    at20 = [r for r in cases if r["messages"] == 20]
    return {
        "bench": "middleware", "quick": quick, "cases": cases, "engine_append_alone": appends,
        "target_ms": TARGET_MS,
        "target_met_read_side_at_20": all(r["read_side"]["added_p50_ms"] < TARGET_MS for r in at20),
        "target_met_total_fsync_never_at_20": all(r["total_fsync_never"]["added_p50_ms"] < TARGET_MS for r in at20),
        "target_met_total_fsync_always_at_20": all(r["total_fsync_always"]["added_p50_ms"] < TARGET_MS for r in at20),
    }


def report(result: dict[str, Any]) -> str:
    lines = ["middleware overhead per call: added ms over the direct call, p50 / p99 (direct = build the request "
             "in memory + call the model)",
             f"  {'history':>7}  {'reader':<25} {'direct p50':>10}  {'read side':>15}  {'(read alone p50)':>16}  "
             f"{'total fsync=never':>17}  {'total fsync=always':>18}"]

    def pair(x: dict[str, float]) -> str:
        return f"{x['added_p50_ms']:.3f} / {x['added_p99_ms']:.3f}"

    for r in result["cases"]:
        lines.append(f"  {r['messages']:>7}  {r['reader']:<25} {r['read_side']['direct_p50_ms']:>10.4f}  "
                     f"{pair(r['read_side']):>15}  {r['reader_read_p50_ms']:>16.3f}  "
                     f"{pair(r['total_fsync_never']):>17}  {pair(r['total_fsync_always']):>18}")
    for a in result["engine_append_alone"]:
        lines.append(f"  engine.append alone (2 messages), fsync={a['append_fsync']}: "
                     f"p50 {a['p50_ms']:.3f} ms, p99 {a['p99_ms']:.3f} ms")

    def met(key: str) -> str:
        return "met" if result[key] else "NOT met"

    lines.append(f"target < {result['target_ms']} ms added at 20 messages (p50, every reader): read side "
                 f"{met('target_met_read_side_at_20')}; total fsync=never {met('target_met_total_fsync_never_at_20')}; "
                 f"total fsync=always {met('target_met_total_fsync_always_at_20')} (the durable append's fsync)")
    return "\n".join(lines)


if __name__ == "__main__":
    res = run(quick="--quick" in sys.argv)
    print(report(res))
    print(json.dumps(res))
