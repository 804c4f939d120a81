"""Engine benchmark (issue 3): durable appends, replay, read latency — each against a baseline
measured in the same run.

Run ``python -m bench.bench_engine [--quick]`` (or ``histlog bench``). Prints a table and one
JSON line. Cases:

* **appends/s** with fsync ``always`` at 1, 16 and 64 concurrent writer threads, 2-message
  batches, through ``HistoryEngine.append`` (validate, encode, group-committed log append,
  wait for the projector's decision), and through ``AsyncHistoryEngine.append`` from as many
  coroutines on one event loop (the service's path, where no writer thread waits), vs raw
  ``FileLog.append`` of pre-encoded events (the events are encoded before the clock starts:
  the raw rate is the log's own) at the same concurrency, and vs the ``eventsourcing`` library
  on SQLite doing the equivalent work (load the conversation aggregate, dedup by append id,
  record the event, save). Each of the four also reports its **cost per append**: the
  process's CPU µs (every thread: writers, group commit, projector) and context switches
  (voluntary + involuntary, ``getrusage``) over the same window, ``bench.common.run_measured``.
  On 2 shared cores the rate moves with the neighbours' load; the cost per append moves much
  less, and it is what a thread hand-off or a second wake-up shows up in.
* **replay**: rebuild the state from N batches on the log vs a raw scan + decode of the log.
* **read latency** p50/p99 of ``read`` and ``window(limit=20)`` on conversations of 100 and
  10,000 messages.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from uuid import NAMESPACE_URL, UUID, uuid5

from bench.common import (
    Run,
    batch,
    conversation,
    event_bytes,
    latency,
    progress_printer,
    run_measured,
    run_measured_async,
)
from engine import HistoryEngine
from engine.aio import AsyncHistoryEngine
from engine.log.base import record_key
from engine.log.file import FileLog
from schemas.events import decode_event

__all__ = ["run"]


try:  # the peer library, defined once at import (it registers aggregate topics globally)
    from eventsourcing.application import Application
    from eventsourcing.domain import Aggregate, event

    class _Conversation(Aggregate):
        """A conversation aggregate that dedups appends by id, as histlog's admission does."""

        def __init__(self, name: str) -> None:
            self.name = name
            self.appends: dict[str, str] = {}

        @staticmethod
        def create_id(name: str) -> UUID:
            return uuid5(NAMESPACE_URL, name)

        @event("Appended")
        def append(self, append_id: str, digest: str, messages: str) -> None:
            self.appends[append_id] = digest

    class _Histories(Application):  # type: ignore[type-arg]
        pass

    HAVE_EVENTSOURCING = True
except ImportError:  # pragma: no cover - the bench extra is not installed
    HAVE_EVENTSOURCING = False


def _eventsourcing_run(root: Path, writers: int, per_thread: int) -> Run | None:
    """eventsourcing 9 on SQLite: get the aggregate, dedup by append id, record, save."""
    if not HAVE_EVENTSOURCING:
        return None
    from eventsourcing.application import AggregateNotFoundError

    app = _Histories(env={"PERSISTENCE_MODULE": "eventsourcing.sqlite",
                          "SQLITE_DBNAME": str(root / "es.sqlite")})
    lock = threading.Lock()  # its SQLite recorder takes one writer at a time

    def one(t: int, i: int) -> None:
        b = batch(conversation(t, i), f"a-{t}-{i}")
        with lock:
            try:
                conv = app.repository.get(_Conversation.create_id(b.conversation_id))
            except AggregateNotFoundError:
                conv = _Conversation(b.conversation_id)
            if str(b.append_id) not in conv.appends:
                conv.append(str(b.append_id), b.digest, b.canonical_json().decode())
                app.save(conv)

    run = run_measured(writers, per_thread, one)
    app.close()
    return run


def _appends(root: Path, writers: int, total: int) -> dict[str, Any]:
    per_thread = max(total // writers, 1)
    eng_dir = root / f"eng-{writers}"
    # The batches are built before the clock starts, as the raw case's records are encoded: making
    # a Batch (pydantic validation of its messages) is the caller's work, about a fifth of the
    # interpreter's time at 16 writers when it ran inside the timed loop.
    batches = [[batch(conversation(t, i), f"a-{t}-{i}") for i in range(per_thread)] for t in range(writers)]
    with HistoryEngine.open(eng_dir) as engine:
        eng = run_measured(writers, per_thread, lambda t, i: engine.append(batches[t][i]))
    # The asyncio face (what ``histlog serve`` runs): as many coroutines on one loop, the same
    # batches again on a fresh engine. No writer thread waits: a group's decisions reach the
    # loop in one hand-off (engine/aio.py).
    with HistoryEngine.open(root / f"aio-{writers}") as engine:
        aengine = AsyncHistoryEngine(engine)
        aio = run_measured_async(writers, per_thread, lambda t, i: aengine.append(batches[t][i]))
    raw = FileLog(root / f"raw-{writers}", 1)
    records = [[(record_key(b.conversation_id, b.append_id), event_bytes(b))
                for b in (batch(conversation(t, i), f"a-{t}-{i}") for i in range(per_thread))]
               for t in range(writers)]

    def raw_one(t: int, i: int) -> None:  # pre-encoded records: the log's own rate and cost
        raw.append(*records[t][i])

    raw_run = run_measured(writers, per_thread, raw_one)
    raw.close()
    (root / f"es-{writers}").mkdir()
    es = _eventsourcing_run(root / f"es-{writers}", writers, max(per_thread // 2, 1))
    return {"writers": writers, "engine_per_s": round(eng.per_s), "async_per_s": round(aio.per_s),
            "raw_filelog_per_s": round(raw_run.per_s),
            "vs_raw": round(eng.per_s / raw_run.per_s, 3), "async_vs_raw": round(aio.per_s / raw_run.per_s, 3),
            "eventsourcing_sqlite_per_s": round(es.per_s) if es else None,
            "vs_eventsourcing": round(eng.per_s / es.per_s, 1) if es else None,
            **eng.shape("engine"), **aio.shape("async"), **raw_run.shape("raw"),
            **(es.shape("eventsourcing") if es else {})}


def _replay(root: Path, batches: int, progress: bool) -> dict[str, Any]:
    data = root / "replay"
    log = FileLog(data / "log", 1, fsync="never")
    for i in range(batches):
        b = batch(f"conv-{i % 1000}", f"a-{i}")
        log.append(record_key(b.conversation_id, b.append_id), event_bytes(b, 1_767_225_600_000 + i))
    # Ceiling: raw scan + decode of every record.
    start = time.perf_counter()
    offset = n = 0
    while True:
        records = log.read(0, offset, 5000)
        if not records:
            break
        for r in records:
            decode_event(r.value)
        n += len(records)
        offset = records[-1].offset + 1
    scan_rate = n / (time.perf_counter() - start)
    log.close()

    start = time.perf_counter()
    with HistoryEngine.open(data, progress=progress_printer(progress)) as engine:
        replay_rate = batches / (time.perf_counter() - start)
        assert engine.stats().accepted == batches  # Invariant: the replay applied every batch.
    if progress:
        print(file=sys.stderr)
    return {"batches": batches, "replay_batches_per_s": round(replay_rate),
            "raw_scan_decode_per_s": round(scan_rate), "vs_raw_scan": round(replay_rate / scan_rate, 3)}



def _reads(root: Path, sizes: list[int], n: int) -> list[dict[str, Any]]:
    out = []
    with HistoryEngine.open(root / "reads", fsync="never") as engine:
        for size in sizes:
            conv = f"conv-{size}"
            for i in range(size // 2):
                engine.append(batch(conv, f"a-{i}"))
            r50, r99 = latency(lambda c=conv: engine.read(c), max(n // max(size // 100, 1), 20))
            w50, w99 = latency(lambda c=conv: engine.window(c, 20), n)
            out.append({"messages": size, "read_p50_us": round(r50), "read_p99_us": round(r99),
                        "window20_p50_us": round(w50), "window20_p99_us": round(w99)})
    return out


def run(quick: bool = False, progress: bool = True) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="histlog-bench-"))
    try:
        total = 2000 if quick else 8000
        appends = [_appends(root, w, total) for w in (1, 16, 64)]
        replay = _replay(root, 20_000 if quick else 200_000, progress)
        reads = _reads(root, [100, 10_000] if not quick else [100, 2_000], 200 if quick else 1000)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"bench": "engine", "appends": appends, "replay": replay, "reads": reads}


def report(result: dict[str, Any]) -> str:
    lines = ["durable appends/s (fsync=always, 2-message batches; raw FileLog = pre-encoded records;",
             "  engine: writer threads; asyncio: as many coroutines on one loop, AsyncHistoryEngine)",
             f"  {'writers':>7} {'engine':>9} {'ratio':>6} {'asyncio':>9} {'ratio':>6} {'raw FileLog':>12} "
             f"{'eventsourcing':>14} {'ratio':>6}",
             "  cost per append: CPU µs / context switches (whole process)",
             f"  {'writers':>7} {'engine':>14} {'asyncio':>14} {'raw FileLog':>14} {'eventsourcing':>16}"]
    rates, costs = lines[:3], lines[3:]
    for a in result["appends"]:
        rates.append(f"  {a['writers']:>7} {a['engine_per_s']:>9} {a['vs_raw']:>6} {a['async_per_s']:>9} "
                     f"{a['async_vs_raw']:>6} {a['raw_filelog_per_s']:>12} "
                     f"{a['eventsourcing_sqlite_per_s'] or '-':>14} {a['vs_eventsourcing'] or '-':>6}")
        es = f"{a['eventsourcing_cpu_us']} / {a['eventsourcing_ctx']}" if "eventsourcing_cpu_us" in a else "-"
        costs.append(f"  {a['writers']:>7} {a['engine_cpu_us']:>7} / {a['engine_ctx']:<5} "
                     f"{a['async_cpu_us']:>7} / {a['async_ctx']:<5} {a['raw_cpu_us']:>7} / {a['raw_ctx']:<5} {es:>16}")
    lines = rates + costs
    r = result["replay"]
    lines.append(f"replay: {r['batches']} batches at {r['replay_batches_per_s']}/s "
                 f"(raw scan+decode {r['raw_scan_decode_per_s']}/s, ratio {r['vs_raw_scan']})")
    lines.append("read latency (µs)")
    for x in result["reads"]:
        lines.append(f"  {x['messages']:>6} messages: read p50 {x['read_p50_us']} p99 {x['read_p99_us']}; "
                     f"window(20) p50 {x['window20_p50_us']} p99 {x['window20_p99_us']}")
    return "\n".join(lines)


if __name__ == "__main__":
    res = run(quick="--quick" in sys.argv)
    print(report(res))
    print(json.dumps(res))
