"""The clears benchmark runs every case on the same state and every clear erases (a tiny run:
performance itself is never asserted)."""

from __future__ import annotations

from bench import NAMES
from bench import bench_clears as bc


def test_a_tiny_run_measures_appends_with_and_without_clears() -> None:
    result = bc.run(progress=False, sizes=bc.Sizes(conversations=64, appends=64, clearers=(0, 2)))
    assert [c["clearers"] for c in result["cases"]] == [0, 2]
    base, busy = result["cases"]
    assert base["clears"] == 0 and "clear_p50_ms" not in base and base["rate_ratio"] == 1.0
    assert busy["clears"] >= 1 and busy["clear_p50_ms"] > 0 and busy["rate_ratio"] > 0
    assert all(c["appends_per_s"] > 0 and c["append_p50_ms"] <= c["append_p99_ms"] <= c["append_max_ms"]
               for c in result["cases"])
    assert "clearers" in bc.report(result) and "clears" in NAMES
