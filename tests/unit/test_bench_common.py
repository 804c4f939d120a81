"""The benchmarks' cost columns measure what they claim: ``run_measured`` counts every call,
charges the process's CPU and context switches to them, and re-raises a call's error."""

from __future__ import annotations

import asyncio
import time

import pytest

from bench.common import Run, run_measured, run_measured_async


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_run_measured_counts_every_call_and_charges_its_cpu() -> None:
    calls: list[tuple[int, int]] = []

    def one(t: int, i: int) -> None:
        calls.append((t, i))
        _spin(0.002)

    run = run_measured(4, 5, one)
    assert sorted(calls) == [(t, i) for t in range(4) for i in range(5)]
    assert len(run.latencies_us) == 20 and all(x > 0 for x in run.latencies_us)
    assert run.per_s > 0
    # 20 calls x 2 ms of CPU each = 40 ms at least; getrusage ticks may round down by a few ms.
    assert run.cpu_us_per_op * 20 >= 0.5 * 40_000


def test_a_call_that_blocks_shows_a_context_switch() -> None:
    run = run_measured(2, 10, lambda t, i: time.sleep(0.001))
    assert run.switches_per_op >= 1.0  # every sleep gives the CPU up once at least (voluntary)


def test_run_measured_reraises_the_first_error() -> None:
    def fail(t: int, i: int) -> None:
        if i == 2:
            raise KeyError("boom")

    with pytest.raises(KeyError):
        run_measured(2, 4, fail)


def test_run_measured_async_counts_every_call_of_every_task_and_charges_its_cpu() -> None:
    calls: list[tuple[int, int]] = []

    async def one(t: int, i: int) -> None:
        calls.append((t, i))
        await asyncio.sleep(0)  # every task yields: they interleave on the one loop
        _spin(0.002)

    run = run_measured_async(4, 5, one)
    assert sorted(calls) == [(t, i) for t in range(4) for i in range(5)]
    assert calls[:4] == [(0, 0), (1, 0), (2, 0), (3, 0)]  # started together, not one after another
    assert len(run.latencies_us) == 20 and all(x > 0 for x in run.latencies_us)
    assert run.per_s > 0 and run.cpu_us_per_op * 20 >= 0.5 * 40_000


def test_run_measured_async_reraises_the_first_error() -> None:
    async def fail(t: int, i: int) -> None:
        if i == 2:
            raise KeyError("boom")

    with pytest.raises(KeyError):
        run_measured_async(2, 4, fail)


def test_shape_names_the_cost_columns() -> None:
    assert Run(10.0, [1.0], 123.456, 4.567).shape("engine") == {"engine_cpu_us": 123.5, "engine_ctx": 4.57}
