"""The deletes benchmark measures delete_messages against clear in the same run (a tiny run:
performance itself is never asserted)."""

from __future__ import annotations

from bench import NAMES
from bench import bench_deletes as bd


def test_a_tiny_run_measures_deletes_against_clears() -> None:
    result = bd.run(progress=False, sizes=(8, 2, 3))
    for name in ("delete_newest_10", "delete_oldest_10"):
        assert result[name]["ms"] > 0 and result[name]["ratio_to_clear"] > 0
    assert result["clear"]["ms"] > 0
    assert "ratio to clear" in bd.report(result) and "deletes" in NAMES
