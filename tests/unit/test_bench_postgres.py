"""The PostgreSQL benchmark measures both stores and leaves no server behind (a tiny run:
performance itself is never asserted), and says in one line what is missing when it cannot run."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from bench import NAMES, pg_server
from bench import bench_postgres as bp

TINY = bp.Sizes(appends=128, solo_appends=32, rounds=2, read_messages=40, read_samples=20)


def _refused(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) != 0


def _positive(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and x > 0


def test_a_tiny_run_measures_both_stores_and_stops_its_server() -> None:
    pytest.importorskip("psycopg", reason="psycopg 3 is not installed (pip install 'histlog[bench]')")
    why = bp.missing()
    if why is not None:
        pytest.skip(why)
    result = bp.run(progress=False, sizes=TINY)
    assert "skipped" not in result, result.get("skipped")
    assert {"postgres_version", "psycopg_version", "postgres_settings", "appends", "reads", "disk"} <= result.keys()
    assert result["postgres_settings"]["fsync"] == "on" and result["postgres_settings"]["synchronous_commit"] == "on"

    assert [a["writers"] for a in result["appends"]] == list(bp.WRITERS)
    for a in result["appends"]:
        assert all(_positive(a[k]) for k in ("postgres_per_s", "histlog_per_s", "ratio", "postgres_p50_ms",
                                             "postgres_p99_ms", "histlog_p50_ms", "histlog_p99_ms"))
    reads = result["reads"]
    assert reads["messages"] == TINY.read_messages and "Index Scan" in reads["postgres_plan"]
    assert all(_positive(reads[k]) for k in ("postgres_p50_us", "postgres_p99_us", "postgres_decoded_p50_us",
                                             "histlog_p50_us", "histlog_p99_us", "ratio_p50"))
    disk = result["disk"]
    assert all(_positive(v) for v in disk.values())

    # The server is gone: its postmaster exited, its port refuses, its directory was removed.
    assert not pg_server.alive(result["postgres_pid"])
    assert _refused(result["port"]) and not Path(result["postgres_dir"]).exists()
    assert "histlog/postgres" in bp.report(result) and "postgres" in NAMES


def test_without_psycopg_the_run_is_skipped_with_one_line_saying_how_to_install_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # makes ``import psycopg`` raise ImportError
    result = bp.run(quick=True, progress=False)
    assert result["skipped"].startswith("skipped: psycopg") and "pip install 'histlog[bench]'" in result["skipped"]
    assert bp.report(result) == result["skipped"] and "\n" not in result["skipped"]


def test_without_postgresql_the_run_is_skipped_with_one_line_saying_how_to_install_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("psycopg", reason="psycopg 3 is not installed (pip install 'histlog[bench]')")
    monkeypatch.setattr(pg_server, "pg_bin", lambda: None)
    result = bp.run(quick=True, progress=False)
    assert "apt-get install postgresql" in result["skipped"] and bp.report(result) == result["skipped"]
