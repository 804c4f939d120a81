"""``histlog bench instructions`` measures what it says: callgrind's windows line up with the
bench's marks, a window of 2N operations costs twice one of N, and without valgrind the run is
skipped with one line saying how to install it. (The counts themselves are never asserted.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench import bench_instructions as bi

_LINEAR = """
work = [bytes(range(200)) * 4 for _ in range(3 * n + 40)]
def touch(lo, hi):
    for w in work[lo:hi]:
        w.hex()
touch(0, 20)
pair("hex", lambda: touch(20, n + 20), lambda: touch(n + 20, 3 * n + 20))
"""


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed (apt-get install valgrind)")
def test_the_windows_line_up_with_the_marks_and_2n_costs_twice_n(tmp_path: Path) -> None:
    counts = bi._windows(_LINEAR, 50, tmp_path)
    assert list(counts) == ["gap", "hex:n", "hex:2n"]
    assert 1.9 < counts["hex:2n"] / counts["hex:n"] < 2.1, counts
    per = bi._per(counts, "hex", 50)
    assert 0 < per < counts["hex:n"], counts


def test_without_valgrind_the_run_is_skipped_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bi.shutil, "which", lambda name: None)
    result = bi.run(quick=True)
    assert "apt-get install valgrind" in result["skipped"] and bi.report(result) == result["skipped"]
    assert "\n" not in result["skipped"]
