"""examples/langchain_agent.py runs as shipped (fake model, no network) on a real embedded engine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("langchain")

from examples.langchain_agent import main

ROOT = Path(__file__).resolve().parents[2]


def test_the_example_stores_two_turns_once_each(tmp_path: Path) -> None:
    lines = main(str(tmp_path / "data"))
    assert lines == [
        "1:1 user      Where is order A1042?",
        "1:2 assistant tool_call",
        "1:3 tool      tool_result",
        "1:4 assistant A1042 arrives today by 14:00.",
        "2:5 user      And can I change the address?",
        "2:6 assistant Not for A1042 any more: it is out for delivery.",
    ]


def test_the_example_runs_as_a_module(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "examples.langchain_agent", str(tmp_path / "d")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert done.returncode == 0, done.stderr
    assert "model sees 6 messages" in done.stdout  # run 2 was shown run 1's stored turn
    assert "stores nothing, returns the stored answer\n" in done.stdout
    assert done.stdout.count("  answer: A1042 arrives today by 14:00.") == 2
