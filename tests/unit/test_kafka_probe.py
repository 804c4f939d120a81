"""The Kafka decision-wait probe's arithmetic is exact on known stamps: spans per record (only
records stamped at every point), and CPU per thread role with the ended writers as the rest."""

from __future__ import annotations

from bench.common import Run
from bench.kafka_probe import Probe, roles_us, thread_cpu


def test_roles_charge_the_rest_of_the_cpu_to_the_ended_writer_threads() -> None:
    run = Run(100.0, [], 500.0, 3.0)  # 500 µs per call over 1000 calls = 0.5 s in all
    before = {"projector": 1.0, "consumer io": 0.5}
    after = {"projector": 1.1, "consumer io": 0.5, "producer io": 0.05}
    assert roles_us(before, after, run, 1000) == {"producer io": 50.0, "projector": 100.0, "writers": 350.0}


def test_probe_spans_are_per_record_and_skip_records_not_seen_everywhere() -> None:
    probe = Probe()
    ms = 1_000_000
    for o in range(3):
        key = (0, o)
        probe.ack[key] = 0
        probe.appended[key] = 1 * ms
        probe.polled[key] = (2 + o) * ms
        probe.committed[key] = 10 * ms
        probe.woken[key] = 12 * ms
    probe.ack[(0, 9)] = 0  # acknowledged but never woken: not counted
    summary = probe.summary()
    assert summary["records"] == 3
    assert summary["ack_to_polled_ms"] == {"p50": 3.0, "p90": 4.0}
    assert summary["polled_to_committed_ms"] == {"p50": 7.0, "p90": 8.0}
    assert summary["committed_to_woken_ms"] == {"p50": 2.0, "p90": 2.0}
    assert summary["appended_to_woken_ms"] == {"p50": 11.0, "p90": 11.0}


def test_thread_cpu_charges_this_threads_work_to_its_role() -> None:
    before = thread_cpu()
    total = sum(i * i for i in range(300_000))
    after = thread_cpu()
    assert total > 0
    assert after["other"] > before["other"]  # the main thread is "other": not a writer, client or projector
