"""Where a Kafka append's decision wait goes: a bench-only probe (nothing here ships in the engine).

``attach(engine)`` wraps, on the instances of one open ``HistoryEngine`` on Kafka, the four
points a record passes after the producer sends it, and stamps each with ``perf_counter_ns``:

* **ack**: the producer's future completes (its callback, on the producer's I/O thread);
* **appended**: ``KafkaLog.append`` returns the position to the writer (it woke from the ack);
* **polled**: the projector's ``cursor.poll`` returns the record;
* **committed**: the step's WriteBatch is written (``Deliveries.publish`` is entered: the
  decisions are handed out from there);
* **woken**: ``engine.append`` returns the receipt to the writer (``record_woken``).

``Probe.summary()`` gives the median and p90 of each interval over every record, and the
projector's poll shape (records per non-empty poll, empty polls): the numbers that say whether
the wait is in the consumer (ack -> polled), the step (polled -> committed) or the wake-up
(committed -> woken). The wrappers cost a dict store each, on every thread alike.
"""

from __future__ import annotations

import os
import re
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common import Run
from schemas.positions import LogPosition

__all__ = ["Probe", "attach", "roles_us", "thread_cpu"]

_Key = tuple[int, int]


def _ms(samples: list[int]) -> dict[str, float]:
    if not samples:
        return {"p50": 0.0, "p90": 0.0}
    ordered = sorted(samples)
    p90 = ordered[min(int(len(ordered) * 0.9), len(ordered) - 1)]
    return {"p50": round(statistics.median(ordered) / 1e6, 2), "p90": round(p90 / 1e6, 2)}


def _group(name: str) -> str:
    if name.startswith("histlog-projector"):
        return "projector"
    if name.startswith("kafka-io-") and name.endswith("-cursor"):
        return "consumer io"
    if "producer" in name:
        return "producer io"
    if re.fullmatch(r"Thread-\d+( \(work\))?", name):
        return "writers"
    return "other"


def thread_cpu() -> dict[str, float]:
    """CPU seconds used so far by this process's live threads, summed per role (``_group``),
    each live ``threading.Thread`` matched to its task by ``native_id``. From
    ``/proc/self/task/*/schedstat`` (nanoseconds on the CPU), else ``stat`` (clock ticks: 10 ms,
    too coarse for a short run)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            seconds = int((task / "schedstat").read_text().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            try:
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # the thread ended meanwhile
                continue
            seconds = (int(fields[11]) + int(fields[12])) / tick
        role = _group(names.get(int(task.name), "other"))
        out[role] = out.get(role, 0.0) + seconds
    return out


def roles_us(before: dict[str, float], after: dict[str, float], run: Run, calls: int) -> dict[str, float]:
    """CPU µs per call of each thread role between two ``thread_cpu`` snapshots; the writer
    threads (ended by then, so absent from ``/proc``) are the rest of the process's CPU
    (``run.cpu_us_per_op``)."""
    out = {role: round((after.get(role, 0.0) - before.get(role, 0.0)) * 1e6 / calls, 1)
           for role in sorted(set(after) - {"writers"})}
    out = {role: us for role, us in out.items() if us > 0}
    out["writers"] = round(run.cpu_us_per_op - sum(out.values()), 1)
    return out


class Probe:
    """The stamps of one engine's records (see the module)."""

    def __init__(self) -> None:
        self.ack: dict[_Key, int] = {}
        self.appended: dict[_Key, int] = {}
        self.polled: dict[_Key, int] = {}
        self.committed: dict[_Key, int] = {}
        self.woken: dict[_Key, int] = {}
        self.polls = 0
        self.empty_polls = 0
        self.poll_sizes: list[int] = []
        self.step_ms: list[float] = []
        self._lock = threading.Lock()

    def record_woken(self, position: LogPosition) -> None:
        self.woken[(position.partition, position.offset)] = time.perf_counter_ns()

    def summary(self) -> dict[str, Any]:
        keys = [k for k in self.woken if k in self.ack and k in self.polled and k in self.committed
                and k in self.appended]

        def span(a: dict[_Key, int], b: dict[_Key, int]) -> dict[str, float]:
            return _ms([b[k] - a[k] for k in keys])

        sizes = self.poll_sizes or [0]
        return {
            "records": len(keys),
            "ack_to_appended_ms": span(self.ack, self.appended),
            "ack_to_polled_ms": span(self.ack, self.polled),
            "polled_to_committed_ms": span(self.polled, self.committed),
            "committed_to_woken_ms": span(self.committed, self.woken),
            "appended_to_woken_ms": span(self.appended, self.woken),
            "polls": self.polls, "empty_polls": self.empty_polls,
            "records_per_poll_p50": statistics.median(sizes), "records_per_poll_max": max(sizes),
            "step_ms_p50": round(statistics.median(self.step_ms or [0.0]), 2),
        }


def attach(engine: Any) -> Probe:
    """Wrap the producer, the log's append, the projector's cursor and its step of ``engine``
    (an open ``HistoryEngine`` on Kafka) to stamp ``Probe``; lasts as long as the engine."""
    probe = Probe()
    kafka_log = engine._log
    producer = kafka_log._producer
    send = producer.send

    def on_ack(metadata: Any) -> None:
        probe.ack[(int(metadata.partition), int(metadata.offset))] = time.perf_counter_ns()

    def probed_send(*args: Any, **kwargs: Any) -> Any:
        future = send(*args, **kwargs)
        future.add_callback(on_ack)
        return future

    producer.send = probed_send
    append = kafka_log.append

    def probed_append(*args: Any, **kwargs: Any) -> LogPosition:
        position: LogPosition = append(*args, **kwargs)
        probe.appended[(position.partition, position.offset)] = time.perf_counter_ns()
        return position

    kafka_log.append = probed_append
    projector = engine._projector
    cursor = projector._cursor
    poll: Callable[..., Sequence[Any]] = cursor.poll

    def probed_poll(*args: Any, **kwargs: Any) -> Sequence[Any]:
        records = poll(*args, **kwargs)
        now = time.perf_counter_ns()
        probe.polls += 1
        if not records:
            probe.empty_polls += 1
        else:
            probe.poll_sizes.append(len(records))
            for r in records:
                probe.polled[(r.partition, r.offset)] = now
        return records

    cursor.poll = probed_poll
    publish = projector.deliveries.publish

    def probed_publish(decided: Sequence[tuple[LogPosition, bytes, Any]], events: Sequence[Any]) -> None:
        now = time.perf_counter_ns()
        for position, _, _ in decided:
            probe.committed[(position.partition, position.offset)] = now
        publish(decided, events)

    projector.deliveries.publish = probed_publish
    apply = projector.apply

    def probed_apply(records: Sequence[Any]) -> None:
        started = time.perf_counter()
        apply(records)
        probe.step_ms.append((time.perf_counter() - started) * 1000)

    projector.apply = probed_apply
    return probe
