"""Kafka benchmark (issue 4), on a real broker: engine appends vs a raw kafka-python producer,
and replay from Kafka into a fresh state directory vs a raw consumer scan.

Run ``python -m bench.bench_kafka [--quick]`` with ``HISTLOG_KAFKA=host:port``, or without it
to start a broker from the Maven Central jars (``scripts/kafka``) for the run. Cases:

* **appends** at 1, 16 and 64 writer threads, 2-message batches: ``HistoryEngine.append``
  (validate, encode, produce with acks=all + idempotence, wait for this instance's projector
  to decide) vs a raw ``KafkaProducer`` with the same settings sending the same encoded events,
  each thread waiting for its acknowledgement (the same durability point). Throughput,
  per-append latency p50/p99, and the cost per append of each: the process's CPU µs (every
  thread, the clients' I/O threads and the projector included) and context switches.
* **decision wait** at 64 writers (``bench.kafka_probe``, bench-only wrappers): where an
  append's time goes after the broker's ack (ack -> the projector's poll returns the record ->
  the step's commit -> the writer wakes) and the CPU µs per append of each thread role, for the
  consumer settings as they were (``BEFORE``) and as they are (``CONSUMER_TUNING``), and (full
  runs) an experiment where the cursor's consumer runs its network on the projector's thread,
  each against a raw producer measured just before it.
* **replay**: N batches on the topic, then ``HistoryEngine.open`` with a fresh state
  directory (events/s) vs a raw consumer reading and decoding the same records.

What it showed (issue 15; 2 cores shared with other work, load 6-11, so rates swing by 2x between
runs while CPU per append moves by ~15%): at 64 writers the process is bound by its CPU under one
interpreter lock, so the engine's rate against a raw producer follows the CPU-per-append ratio
(about 400-450 µs vs 160-230 µs: 0.4-0.5x). Of the engine's CPU per append the writer threads
take ~60% (validation, the admission pre-check, the ticket, two wake-ups), the projector ~23%
(admission, the WriteBatch, handing out decisions), the producer's I/O thread ~11% and the
consumer's I/O thread ~8%. The decision wait (writer's ack -> its receipt, ~12 ms p50) is
GIL queueing, not a fetch that waits: ack -> polled ~4 ms (half a step plus the wait for the
lock), the step ~2.7 ms (about 33 records, all that are in flight), committed -> woken ~5 ms
(the woken writers queue for the lock behind each other). Running the cursor's network on the
projector's thread (no consumer I/O thread) halved context switches at 1 writer but put the
fetch's Python on the path between a commit and the writers' wake-up: slower at 64 writers
(0.30x vs 0.50x, CPU 561 vs 404 µs in one full run), so it stays an experiment here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from bench import kafka_probe
from bench.common import Run, batch, conversation, event_bytes, percentiles, progress_printer, run_measured
from engine import HistoryEngine
from engine.log import kafka as kafka_log
from engine.log.base import partition_for_key, record_key
from engine.log.kafka import KafkaLog
from schemas.events import decode_event

__all__ = ["report", "run"]

REPO = Path(__file__).resolve().parents[1]


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@contextmanager
def _broker() -> Iterator[str]:
    external = os.environ.get("HISTLOG_KAFKA", "").strip()
    if external:
        yield external
        return
    if not (REPO / "scripts" / "kafka").exists():
        raise RuntimeError("bench kafka needs a broker: set HISTLOG_KAFKA=host:port, or run it from a source "
                           "checkout, whose scripts/kafka starts one from the Maven Central jars")
    directory = tempfile.mkdtemp(prefix="histlog-bench-kafka-")
    started = time.perf_counter()
    out = subprocess.run([str(REPO / "scripts" / "kafka"), "start", "--dir", directory],
                         capture_output=True, text=True, check=True).stdout
    print(f"(started a broker from the Maven jars in {time.perf_counter() - started:.1f} s)", file=sys.stderr)
    try:
        yield out.strip().splitlines()[-1].split("=", 1)[1]
    finally:
        subprocess.run([str(REPO / "scripts" / "kafka"), "stop", "--dir", directory], capture_output=True)
        shutil.rmtree(directory, ignore_errors=True)


def _raw_run(bootstrap: str, writers: int, per: int) -> Run:
    """A raw producer with the engine's settings, each thread waiting for its acknowledgement."""
    raw_topic = f"histlog-bench-raw-{uuid.uuid4().hex[:8]}"
    KafkaLog(bootstrap, raw_topic).close()  # same topic settings, created the same way
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=2,
                             compression_type=None, max_in_flight_requests_per_connection=5)

    def raw_one(t: int, i: int) -> None:
        b = batch(conversation(t, i), f"a-{t}-{i}")
        key = record_key(b.conversation_id, b.append_id)
        producer.send(raw_topic, key=key, value=event_bytes(b, _now_ms()), partition=partition_for_key(key, 1)).get(30)

    try:
        return run_measured(writers, per, raw_one)
    finally:
        producer.close()


def _appends(bootstrap: str, root: Path, writers: int, total: int) -> dict[str, Any]:
    per = max(total // writers, 1)
    topic = f"histlog-bench-{uuid.uuid4().hex[:8]}"
    with HistoryEngine.open(kafka=bootstrap, topic=topic, state_dir=root / f"state-{writers}") as engine:
        eng = run_measured(writers, per, lambda t, i: engine.append(batch(conversation(t, i), f"a-{t}-{i}")))
    raw = _raw_run(bootstrap, writers, per)
    e50, e99 = percentiles(eng.latencies_us)
    r50, r99 = percentiles(raw.latencies_us)
    return {"writers": writers, "engine_per_s": round(eng.per_s), "raw_producer_per_s": round(raw.per_s),
            "vs_raw": round(eng.per_s / raw.per_s, 3), "engine_p50_ms": round(e50 / 1000, 2),
            "engine_p99_ms": round(e99 / 1000, 2), "raw_p50_ms": round(r50 / 1000, 2),
            "raw_p99_ms": round(r99 / 1000, 2), **eng.shape("engine"), **raw.shape("raw")}


BEFORE = {"metrics_enabled": True}
"""The consumer settings the projector's cursor had before issue 15 (the rest is unchanged)."""


@contextmanager
def _cursor_variant(tuning: dict[str, Any], drives_io: bool) -> Iterator[None]:
    """Open the engines of this block with other consumer settings, and (``drives_io``) with
    cursors whose consumer runs its network inside ``poll`` on the projector's thread instead of
    on kafka-python's I/O thread (the selector's caller-driven mode, reached by stopping that
    thread; a bench-only experiment on a private attribute)."""
    saved = dict(kafka_log.CONSUMER_TUNING)
    cursor = KafkaLog.cursor

    def driving_cursor(self: KafkaLog, start: Mapping[int, int]) -> kafka_log.KafkaCursor:
        opened = cursor(self, start)
        opened._consumer._net.stop()
        return opened

    kafka_log.CONSUMER_TUNING.update(tuning)
    if drives_io:
        KafkaLog.cursor = driving_cursor  # type: ignore[method-assign]
    try:
        yield
    finally:
        KafkaLog.cursor = cursor  # type: ignore[method-assign]
        kafka_log.CONSUMER_TUNING.clear()
        kafka_log.CONSUMER_TUNING.update(saved)


def _probed(bootstrap: str, root: Path, writers: int, per: int) -> dict[str, Any]:
    """One engine run with the probe attached: rate, cost, spans, CPU per thread role."""
    name = f"probe-{uuid.uuid4().hex[:8]}"
    with HistoryEngine.open(kafka=bootstrap, topic=f"histlog-bench-{name}", state_dir=root / name) as engine:
        probe = kafka_probe.attach(engine)

        def one(t: int, i: int) -> None:
            probe.record_woken(engine.append(batch(conversation(t, i), f"a-{t}-{i}")).position)

        cpu0 = kafka_probe.thread_cpu()
        run = run_measured(writers, per, one)
        roles = kafka_probe.roles_us(cpu0, kafka_probe.thread_cpu(), run, writers * per)
    return {"engine_per_s": round(run.per_s), **run.shape("engine"), "cpu_us_by_role": roles, **probe.summary()}


def _decision_wait(bootstrap: str, root: Path, writers: int, total: int, quick: bool) -> list[dict[str, Any]]:
    per = max(total // writers, 1)
    cases: list[tuple[str, dict[str, Any], bool]] = [("before: consumer metrics on", BEFORE, False),
                                                     ("after: CONSUMER_TUNING", {}, False)]
    if not quick:
        cases.append(("experiment: the cursor drives its own I/O", {}, True))
    out = []
    for case, tuning, drives_io in cases:
        raw = _raw_run(bootstrap, writers, per)
        with _cursor_variant(tuning, drives_io):
            row = _probed(bootstrap, root, writers, per)
        out.append({"case": case, "writers": writers, "raw_producer_per_s": round(raw.per_s),
                    "vs_raw": round(row["engine_per_s"] / raw.per_s, 3), **raw.shape("raw"), **row})
    return out


def _replay(bootstrap: str, root: Path, batches: int, progress: bool) -> dict[str, Any]:
    topic = f"histlog-bench-replay-{uuid.uuid4().hex[:8]}"
    KafkaLog(bootstrap, topic).close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=20,
                             batch_size=256 * 1024)
    for i in range(batches):
        b = batch(f"conv-{i % 1000}", f"a-{i}")
        key = record_key(b.conversation_id, b.append_id)
        producer.send(topic, key=key, value=event_bytes(b, _now_ms()), partition=0)
    producer.flush()
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             max_poll_records=2000)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek(tp, 0)
    start, n = time.perf_counter(), 0
    while n < batches:
        for records in consumer.poll(timeout_ms=1000).values():
            for r in records:
                decode_event(r.value)
            n += len(records)
    scan_rate = n / (time.perf_counter() - start)
    consumer.close()

    start = time.perf_counter()
    with HistoryEngine.open(kafka=bootstrap, topic=topic, state_dir=root / "replay",
                            progress=progress_printer(progress)) as engine:
        rate = batches / (time.perf_counter() - start)
        assert engine.stats().accepted == batches  # Invariant: the replay applied every batch.
    if progress:
        print(file=sys.stderr)
    return {"batches": batches, "replay_events_per_s": round(rate), "raw_consume_decode_per_s": round(scan_rate),
            "vs_raw": round(rate / scan_rate, 3)}


def run(quick: bool = False, progress: bool = True) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="histlog-bench-kafka-state-"))
    try:
        with _broker() as bootstrap:
            total = 1500 if quick else 6000
            appends = [_appends(bootstrap, root, w, total) for w in (1, 16, 64)]
            wait = _decision_wait(bootstrap, root, 64, 1280 if quick else 6400, quick)
            replay = _replay(bootstrap, root, 10_000 if quick else 50_000, progress)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"bench": "kafka", "appends": appends, "decision_wait": wait, "replay": replay}


def report(result: dict[str, Any]) -> str:
    lines = ["Kafka appends (acks=all, idempotent, 2-message batches)",
             f"  {'writers':>7} {'engine/s':>9} {'raw/s':>8} {'ratio':>6} "
             f"{'engine p50/p99 ms':>18} {'raw p50/p99 ms':>15}"]
    for a in result["appends"]:
        lines.append(f"  {a['writers']:>7} {a['engine_per_s']:>9} {a['raw_producer_per_s']:>8} {a['vs_raw']:>6} "
                     f"{a['engine_p50_ms']:>8} / {a['engine_p99_ms']:<7} {a['raw_p50_ms']:>6} / {a['raw_p99_ms']:<6}")
    lines.append("  cost per append: CPU µs / context switches (whole process)")
    for a in result["appends"]:
        lines.append(f"  {a['writers']:>7} engine {a['engine_cpu_us']:>7} / {a['engine_ctx']:<6} "
                     f"raw {a['raw_cpu_us']:>7} / {a['raw_ctx']}")
    lines.append("decision wait at 64 writers (p50 / p90 ms per record; CPU µs per append by thread)")
    for d in result["decision_wait"]:
        def span(name: str, d: dict[str, Any] = d) -> str:
            return f"{d[name]['p50']}/{d[name]['p90']}"
        roles = ", ".join(f"{k} {v}" for k, v in d["cpu_us_by_role"].items())
        lines.append(f"  {d['case']}: {d['engine_per_s']}/s vs raw {d['raw_producer_per_s']}/s = {d['vs_raw']}; "
                     f"CPU {d['engine_cpu_us']} µs (raw {d['raw_cpu_us']}), ctx {d['engine_ctx']} (raw {d['raw_ctx']})")
        lines.append(f"    ack->appended {span('ack_to_appended_ms')}  ack->polled {span('ack_to_polled_ms')}  "
                     f"polled->committed {span('polled_to_committed_ms')}  committed->woken "
                     f"{span('committed_to_woken_ms')}; {d['records_per_poll_p50']} records/poll, "
                     f"step {d['step_ms_p50']} ms")
        lines.append(f"    {roles}")
    r = result["replay"]
    lines.append(f"replay from Kafka into a fresh state: {r['batches']} events at {r['replay_events_per_s']}/s "
                 f"(raw consume+decode {r['raw_consume_decode_per_s']}/s, ratio {r['vs_raw']})")
    return "\n".join(lines)


if __name__ == "__main__":
    res = run(quick="--quick" in sys.argv)
    print(report(res))
    print(json.dumps(res))
