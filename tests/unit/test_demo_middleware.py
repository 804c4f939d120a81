"""``histlog demo`` shows the middleware: a tool round, a streamed reply, a CommitError recovery."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from engine import demo


def test_the_demo_runs_the_middleware_part_and_its_checks_hold(tmp_path: Path) -> None:
    out = io.StringIO()
    assert demo.run_demo(tmp_path / "d", out, err=io.StringIO()) == 0, out.getvalue()
    text = out.getvalue()
    assert "stored after the tool round: nothing" in text
    assert "one batch of 4 messages" in text
    assert "'You paid 49.90 EUR by card on 12 March.'" in text
    assert "CommitError (expected): cause LogUnavailable" in text
    assert "a second retry returns the same receipt ✓; 8 messages stored; model calls for this turn: 1 ✓" in text
    assert "rebuild: identical state ✓" in text


def test_the_demo_fails_when_the_recovery_does_not_hold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demo.FlakyWriter, "__init__", lambda self, engine: setattr(self, "engine", engine) or
                        setattr(self, "failures_left", 0))  # no outage: no CommitError to recover from
    out = io.StringIO()
    assert demo.run_demo(tmp_path / "d", out, err=io.StringIO()) == 1
    assert "the simulated outage did not raise CommitError" in out.getvalue()
