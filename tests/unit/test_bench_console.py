"""The console benchmark: a tiny run measures the render against the fetch of the same page in
the same run (performance itself is never asserted); without the browser it measures nothing
and its report is the one line saying what to install."""

from __future__ import annotations

from bench import NAMES
from bench import bench_console as bc


def test_a_tiny_run_measures_render_against_fetch_or_says_what_to_install() -> None:
    assert "console" in NAMES
    result = bc.run(progress=False, loads=1, messages=200)
    if bc.missing() is not None:
        assert result["skipped"] == bc.missing() and bc.report(result) == result["skipped"]
        assert "\n" not in bc.report(result) and "install" in bc.report(result)
        return
    assert result["first_load"]["bytes"] > 0 and result["first_load"]["requests"] > 0
    assert result["render_first_page_ms"] > 0 and result["fetch_first_page_json_ms"] > 0
    assert result["first_page_messages"] == 100 and result["ratio_render_to_fetch"] > 0
    assert "ratio render / fetch" in bc.report(result)
