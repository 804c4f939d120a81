"""The README's code must stay true: its Python blocks run here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine import HistoryEngine
from schemas import Batch, Message, ToolCallPart

README = Path(__file__).resolve().parents[2] / "README.md"


def python_block(after_heading: str) -> str:
    text = README.read_text()
    section = text[text.index(after_heading):]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, f"no python block after {after_heading!r}"
    return match.group(1)


def test_quick_start_runs_and_is_at_most_20_lines(capsys: object) -> None:
    code = python_block("## Quick start")
    assert len(code.strip().splitlines()) <= 20
    exec(compile(code, "README quick start", "exec"), {})


def test_custom_projection_example_runs(tmp_path: Path) -> None:
    code = python_block("## Writing a custom projection")
    with HistoryEngine.open(tmp_path / "data") as engine:
        engine.append(Batch("c", "a1", [Message.user("find A1"),
                                        Message.assistant(ToolCallPart("t1", "lookup_order", "{}"))]))
        scope = {"engine": engine}
        exec(compile(code, "README custom projection", "exec"), scope)
        assert engine.view("tool-usage").get(b"lookup_order") == b"1"


def test_turns_example_runs_and_prints_what_it_says(capsys: pytest.CaptureFixture[str]) -> None:
    code = python_block("## Edit, retry, and one writer at a time")
    exec(compile(code, "README turns", "exec"), {})
    assert capsys.readouterr().out.splitlines() == [
        "someone else wrote since; read again", "['Hi', 'Hey there!']", "4"]


def test_middleware_example_runs_and_prints_what_it_says(capsys: pytest.CaptureFixture[str]) -> None:
    code = python_block("## Wrapping a chat model")
    exec(compile(code, "README middleware", "exec"), {})
    assert capsys.readouterr().out.splitlines() == ["I see 2 messages.", "I see 4 messages.", "4"]
