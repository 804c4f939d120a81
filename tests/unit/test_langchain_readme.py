"""The README's "LangChain" block prints what its comment promises (tests/unit/test_readme.py
runs every block; this checks that one's output)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("langchain")

from tests.unit.test_readme import PYTHON


def test_the_langchain_block_stores_both_turns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    [block] = [b for b in PYTHON if b.heading == "LangChain"]
    monkeypatch.chdir(tmp_path)
    exec(compile(block.code, "README LangChain block", "exec"), {"__name__": "__readme__"})
    stored = ["Hi, I'm Ana.", "Hello Ana.", "What's my name?", "Hello Ana."]
    assert capsys.readouterr().out.splitlines() == [repr(stored)]
