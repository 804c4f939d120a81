"""The CLI's navigation: ``read --order desc --limit N [--before T:S] [--since ISO] [--until ISO]``,
``list --prefix P`` and ``locate c EXTERNAL_ID [--context N]`` (docs/cli.md), in-process."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.facade import HistoryEngine
from schemas.batch import Batch
from schemas.messages import Message
from schemas.times import iso_time
from tests.unit.test_cli import Capsys, _clean_env, one_error_line, run

__all__ = ["_clean_env"]  # the autouse fixture, imported so it runs here too


@pytest.fixture
def data(tmp_path: Path) -> Iterator[str]:
    path = str(tmp_path / "data")
    with HistoryEngine.open(path) as engine:
        for i in range(4):
            engine.append(Batch("bot-1/chat", f"a{i}", [Message.user(f"q{i}", metadata={"external_id": f"tg-{i}"}),
                                                       Message.assistant(f"r{i}")]))
        engine.append(Batch("bot-2/chat", "a", [Message.user("hi")]))
        engine.append(Batch("bot-10/chat", "a", [Message.user("hi")]))
    yield path


def test_read_pages_newest_first(capsys: Capsys, data: str) -> None:
    code, out, _ = run(capsys, "--data", data, "read", "bot-1/chat", "--order", "desc", "--limit", "3")
    assert code == 0 and out.splitlines() == ["[4:8] assistant: r3", "[4:7] user: q3", "[3:6] assistant: r2"]
    code, out, _ = run(capsys, "--data", data, "read", "bot-1/chat", "--order", "desc", "--limit", "3",
                       "--before", "3:6")
    assert out.splitlines() == ["[3:5] user: q2", "[2:4] assistant: r1", "[2:3] user: q1"]


def test_read_a_time_range(capsys: Capsys, data: str) -> None:
    with HistoryEngine.open(data) as engine:
        rows = engine.entries("bot-1/chat")
    t = iso_time(rows[4].created_at)
    code, out, _ = run(capsys, "--data", data, "read", "bot-1/chat", "--since", t, "--json")
    assert code == 0
    assert [e["id"] for e in json.loads(out)] == [r.id for r in rows if r.created_at >= rows[4].created_at]
    code, out, _ = run(capsys, "--data", data, "read", "bot-1/chat", "--until", t, "--json")
    assert [e["id"] for e in json.loads(out)] == [r.id for r in rows if r.created_at < rows[4].created_at]
    naive = t.removesuffix("Z")  # no zone: UTC, as the CLI prints times
    assert run(capsys, "--data", data, "read", "bot-1/chat", "--since", naive, "--json")[1] == \
        run(capsys, "--data", data, "read", "bot-1/chat", "--since", t, "--json")[1]


def test_list_by_prefix(capsys: Capsys, data: str) -> None:
    code, out, _ = run(capsys, "--data", data, "list", "--prefix", "bot-1")
    assert code == 0 and out.splitlines() == ["bot-1/chat", "bot-10/chat"]
    code, out, _ = run(capsys, "--data", data, "list", "--prefix", "bot-1/", "--json")
    assert json.loads(out) == ["bot-1/chat"]
    code, out, _ = run(capsys, "--data", data, "list", "--after", "bot-10/chat", "--limit", "5")
    assert out.splitlines() == ["bot-2/chat"]


def test_locate_with_context(capsys: Capsys, data: str) -> None:
    code, out, _ = run(capsys, "--data", data, "locate", "bot-1/chat", "tg-2", "--context", "1")
    assert code == 0 and out.splitlines() == ["  [2:4] assistant: r1", "> [3:5] user: q2", "  [3:6] assistant: r2"]
    code, out, _ = run(capsys, "--data", data, "locate", "bot-1/chat", "tg-0", "--json")
    found = json.loads(out)
    assert (found["message"]["id"], found["before"], found["after"]) == ("a0/0", [], [])


@pytest.mark.parametrize(("args", "words"), [
    (["locate", "bot-1/chat", "tg-9"], "no visible message with external_id 'tg-9'"),
    (["read", "bot-1/chat", "--since", "yesterday"], "--since"),
    (["read", "bot-1/chat", "--before", "x"], "--before"),
    (["read", "bot-1/chat", "--window", "4", "--order", "desc"], "--order"),
    (["read", "bot-1/chat", "--max-bytes", "10", "--since", "2025-01-01"], "--since"),
    (["list", "--prefix", "bot\x07"], "control character"),
])
def test_bad_navigation_input_exits_2_with_one_line(capsys: Capsys, data: str, args: list[str], words: str) -> None:
    code, _, err = run(capsys, "--data", data, *args)
    assert code == 2
    assert words in one_error_line(err)
