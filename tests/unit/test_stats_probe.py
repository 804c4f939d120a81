"""``StatsProbe`` (engine/service/metrics.py): a scrape waits for the engine's ``stats()`` at most
its bound, and however many scrapes wait, one reader calls ``stats()`` (no thread per scrape).
A ``stats()`` that blocks stands for a Kafka broker that does not answer; the real broker stopped
is ``tests/integration/test_cluster_faults.py::test_metrics_answer_within_a_bound_with_the_broker_down``."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from engine.facade import EngineStats
from engine.service.metrics import StatsProbe, StatsReading
from schemas.errors import LogUnavailable

STATS = EngineStats([5], [5], [0], 1, 0, 0, 0, 0)


class Log:
    """``stats()`` that answers at once until ``down`` is set, then blocks until ``up`` is set
    and raises ``LogUnavailable`` (as KafkaLog does after its retries)."""

    def __init__(self) -> None:
        self.down, self.up = threading.Event(), threading.Event()
        self.calls = 0

    def stats(self) -> EngineStats:
        self.calls += 1
        if self.down.is_set():
            assert self.up.wait(30)
            raise LogUnavailable("broker down")
        return STATS


def readers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "histlog-metrics-stats"]


def test_a_blocked_log_costs_each_scrape_the_bound_and_one_reader_in_all() -> None:
    log = Log()
    probe = StatsProbe(log.stats, wait_s=0.3)
    first = probe.read()
    assert first.fresh and first.stats == STATS and first.age_s < 0.3
    before = set(readers())  # other probes of this process (other tests' apps) may have theirs
    log.down.set()
    try:
        started = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            answers: list[StatsReading] = list(pool.map(lambda _: probe.read(), range(16)))
        took = time.monotonic() - started
        assert all(not a.fresh and a.stats == STATS for a in answers)  # the last reading, marked stale
        assert took < 0.3 * 16 / 2  # concurrent waits on one read, not 16 reads one after another
        assert log.calls == 2 and set(readers()) == before  # one stats() blocked; no other reader started
    finally:
        log.up.set()
    deadline = time.monotonic() + 10
    while probe.reads < 2 and time.monotonic() < deadline:  # the blocked stats() has returned (raised)
        time.sleep(0.01)
    log.down.clear()
    assert probe.read().fresh  # the log answers again: a fresh reading
    assert log.calls <= 4  # at most one more read for the 15 scrapes that gave up waiting, then this one


def test_before_any_reading_there_is_no_stats_and_the_reader_exits_when_idle() -> None:
    log = Log()
    log.down.set()
    probe = StatsProbe(log.stats, wait_s=0.1, idle_s=0.2)
    reading = probe.read()
    assert reading.stats is None and not reading.fresh and reading.age_s == float("inf")
    log.up.set()
    deadline = time.monotonic() + 10
    while probe._reader is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert probe._reader is None  # idle: no thread left behind
    log.down.clear()
    assert probe.read().fresh  # started again by the next scrape


def test_scrapes_on_the_event_loop_wait_there_holding_no_thread() -> None:
    log = Log()
    probe = StatsProbe(log.stats, wait_s=0.3)
    assert probe.read().fresh
    log.down.set()
    peak: list[int] = []

    async def scrapes() -> list[StatsReading]:
        async def one() -> StatsReading:
            return await probe.aread()

        tasks = [asyncio.ensure_future(one()) for _ in range(50)]
        await asyncio.sleep(0.1)  # all 50 waiting now
        peak.append(threading.active_count())
        return await asyncio.gather(*tasks)

    before = threading.active_count()
    try:
        started = time.monotonic()
        answers = asyncio.run(scrapes())
        took = time.monotonic() - started
    finally:
        log.up.set()
    assert all(not a.fresh and a.stats == STATS for a in answers)
    assert peak == [before] and took < 0.3 * 50 / 10  # 50 waits on the loop, together, no thread each
    deadline = time.monotonic() + 10
    while probe.reads < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    log.down.clear()
    assert asyncio.run(probe.aread()).fresh  # woken by the reader once the log answers
