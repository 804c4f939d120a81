"""The README's code must stay true: every block runs here as printed.

Each Python block is executed in a fresh namespace and a fresh working directory; each shell
(``console``) block runs under ``bash -e`` in a fresh directory, with ``histlog`` being this
checkout's CLI, and a timeout. A block that must not run (it needs a broker, installs packages...)
says so on its first line, ``# not run by the tests: why``, and the README states how many there
are: the count is checked, so a block cannot silently drop out.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SKIP_MARK = "# not run by the tests"
SHELL_TIMEOUT_S = 120


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    heading: str
    number: int  # 1-based, in README order

    @property
    def skipped(self) -> bool:
        return self.code.startswith(SKIP_MARK)

    @property
    def id(self) -> str:
        return f"{self.number}-{self.lang}-{self.heading.lower().replace(' ', '-')[:40]}"


def readme_blocks(text: str) -> list[Block]:
    blocks: list[Block] = []
    heading = "top"
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            heading = line[3:].strip()
        if line.startswith("```"):
            lang = line[3:].strip()
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            blocks.append(Block(lang, "".join(lines[i + 1:end]), heading, len(blocks) + 1))
            i = end
        i += 1
    return blocks


TEXT = README.read_text()
BLOCKS = readme_blocks(TEXT)
PYTHON = [b for b in BLOCKS if b.lang == "python"]
SHELL = [b for b in BLOCKS if b.lang == "console"]

EXPECTED_OUTPUT: dict[str, list[str]] = {
    "Wrapping a chat model": ["I see 2 messages.", "I see 4 messages.", "4"],
    "Edit, retry, and one writer at a time": ["someone else wrote since; read again", "['Hi', 'Hey there!']", "4"],
    "Writing a custom projection": ["b'1'", "b'1'"],
    "Runs and fences: a run that lost the conversation never writes over its successor": [
        "run-1 lost the conversation", "['Hi', 'Hello!']", "True", "a1/0"],
    "Turn slots: name a turn before its rows exist": ["True 1", "a slot is used once"],
    "Assets: media references on messages": ["media/cat.jpg"],
    "Deleting messages: moderation and users' requests": ["2", "['a1/0', 'a1/1']"],
    "LangGraph": ["I have seen 3 message(s)."],
    "Reading: windows, byte budgets, turn sources, measures": ["BatchEvent c1", "ClearEvent c1", "[]"],
}
"""What a block prints, where the README shows it in its comments."""


def _block(heading: str) -> Block:
    [block] = [b for b in PYTHON if b.heading == heading]
    return block


def test_every_block_is_python_console_or_a_diagram() -> None:
    """No block escapes the tests by its fence: a fence without a language is a diagram, not code."""
    assert {b.lang for b in BLOCKS} <= {"python", "console", ""}
    for b in BLOCKS:
        if b.lang == "":
            assert not re.search(r"^\s*(import |from |\$ |histlog )", b.code, re.M), b.id


def test_the_skipped_blocks_are_as_many_as_the_readme_says_and_say_why() -> None:
    declared = re.search(r"except the (\d+) whose first line says `# not run by the tests`", TEXT)
    assert declared, "the README must say how many of its blocks are not run"
    skipped = [b for b in BLOCKS if b.skipped]
    assert len(skipped) == int(declared.group(1)), [b.id for b in skipped]
    for b in skipped:
        first = b.code.splitlines()[0]
        assert re.fullmatch(re.escape(SKIP_MARK) + r": \S.*", first), (b.id, first)
    assert len([b for b in BLOCKS if b.lang and not b.skipped]) >= 5  # the checks below do run code


def test_the_quick_start_is_at_most_20_lines() -> None:
    assert len(_block("Quick start").code.strip().splitlines()) <= 20


@pytest.mark.parametrize("block", [b for b in PYTHON if not b.skipped], ids=lambda b: b.id)
def test_python_block_runs_as_printed(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    exec(compile(block.code, f"README block {block.id}", "exec"), {"__name__": "__readme__"})
    out = capsys.readouterr().out.splitlines()
    if block.heading in EXPECTED_OUTPUT:
        assert out == EXPECTED_OUTPUT[block.heading]


def test_every_expected_output_names_a_block() -> None:
    for heading in EXPECTED_OUTPUT:
        assert not _block(heading).skipped


@pytest.mark.parametrize("block", [b for b in SHELL if not b.skipped], ids=lambda b: b.id)
def test_shell_block_runs_as_printed(block: Block, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "histlog"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m engine "$@"\n')
    shim.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": str(ROOT)}
    for name in ("HISTLOG_DATA", "HISTLOG_KAFKA", "HISTLOG_TOPIC", "HISTLOG_STATE"):
        env.pop(name, None)
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.code], cwd=work, env=env,
                          capture_output=True, text=True, timeout=SHELL_TIMEOUT_S)
    assert done.returncode == 0, (done.stdout, done.stderr)
    if "serve --listen" in block.code:  # the service block: a receipt, a window, a remote read
        assert '"append_id":"turn-1"' in done.stdout
        assert '{"messages":[{"parts":[{"kind":"text","text":"Hi"}]' in done.stdout
        assert "user: Hi" in done.stdout
    if "histlog append customer-7 turn-1" in block.code:  # what its comments promise
        assert '"append_id":"turn-1","conversation_id":"customer-7"' in done.stdout  # the receipt as JSON
        assert "user: Hi there" in done.stdout
        assert "clean" in done.stdout  # log verify
