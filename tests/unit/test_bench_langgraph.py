"""The LangGraph benchmark runs every checkpointer in the same run (a tiny run: performance itself
is never asserted)."""

from __future__ import annotations

from bench import NAMES
from bench import bench_langgraph as bl


def test_a_tiny_run_measures_every_checkpointer() -> None:
    result = bl.run(progress=False, sizes=(32, 1))
    for name in ("histlog", "in_memory", "sqlite"):
        assert result[name]["steps_per_s_1"] > 0 and result[name]["steps_per_s_16"] > 0
    assert result["histlog"]["bytes_per_checkpoint"] > 0 and result["sqlite"]["bytes_per_checkpoint"] > 0
    assert result["ratio_to_sqlite"]["1"] > 0
    assert "histlog ÷ sqlite" in bl.report(result) and "langgraph" in NAMES
