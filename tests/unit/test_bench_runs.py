"""The runs benchmark measures fenced and plain appends in the same run (a tiny run: performance
itself is never asserted)."""

from __future__ import annotations

from bench import NAMES
from bench import bench_runs as br


def test_a_tiny_run_measures_fenced_and_plain_appends() -> None:
    result = br.run(progress=False, sizes=(2, 16))
    for key in ("writers_1", f"writers_{br.WRITERS}"):
        row = result[key]
        assert row["plain"]["per_s"] > 0 and row["fenced"]["per_s"] > 0 and row["ratio"] > 0
        assert row["plain"]["cpu_us"] > 0 and row["fenced"]["cpu_us"] > 0
    assert "fenced" in br.report(result) and "runs" in NAMES
