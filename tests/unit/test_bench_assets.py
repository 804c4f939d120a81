"""The assets benchmark measures reads with and without assets in the same run (a tiny run:
performance itself is never asserted)."""

from __future__ import annotations

from bench import NAMES
from bench import bench_assets as ba


def test_a_tiny_run_measures_reads_with_and_without_assets() -> None:
    result = ba.run(progress=False, sizes=(12, 2, 4))
    for name in ("newest_50", "window_entries_50", "turns"):
        row = result[name]
        assert row["per_s"]["with"] > 0 and row["per_s"]["without"] > 0 and row["ratio"] > 0
        assert row["keys"]["with"] > row["keys"]["without"] > 0  # a message with assets costs a point read more
    assert result["link_assets_per_s"] > 0
    assert "ratio" in ba.report(result) and "assets" in NAMES
