"""``histlog messages delete`` (docs/cli.md), on an embedded data directory and over ``--url``
against a server: the same output (``deleted N``, ``--json``: ``{"deleted": N}``), the same exit
codes (3 for a cleared conversation or a superseded run's fence, 2 for bad input, nothing deleted),
and ``read`` no longer shows what was deleted."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.cli.parser import build_parser, subcommands
from engine.facade import HistoryEngine
from tests.service.server_support import serving
from tests.unit.cli_support import Capsys, clean_cli_env, run


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    clean_cli_env(monkeypatch)


@pytest.fixture(params=["data", "url"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[str]]:
    if request.param == "data":
        yield ["--data", str(tmp_path / "d")]
        return
    with HistoryEngine.open(tmp_path / "served") as engine, serving(engine) as url:
        yield ["--url", url]


def _four(capsys: Capsys, where: list[str]) -> None:
    for append_id, role in (("a1", "user"), ("a2", "assistant"), ("a3", "user"), ("a4", "assistant")):
        assert run(capsys, *where, "append", "c", append_id, "--text", f"text of {append_id}", "--role", role)[0] == 0
    assert _ids(capsys, where) == ["a1/0", "a2/0", "a3/0", "a4/0"]


def _ids(capsys: Capsys, where: list[str]) -> list[str]:
    code, out, err = run(capsys, *where, "read", "c", "--json")
    assert code == 0, err
    return [e["id"] for e in json.loads(out)]


def test_a_delete_prints_how_many_and_reads_leave_them_out(capsys: Capsys, where: list[str]) -> None:
    _four(capsys, where)
    assert run(capsys, *where, "messages", "delete", "c", "a2/0", "a4/0") == (0, "deleted 2\n", "")
    assert _ids(capsys, where) == ["a1/0", "a3/0"]
    assert run(capsys, *where, "messages", "delete", "c", "a2/0", "a4/0") == (0, "deleted 0\n", "")  # again: no-op
    code, out, _ = run(capsys, *where, "messages", "delete", "c", "a3/0", "--json")
    assert (code, json.loads(out)) == (0, {"deleted": 1})
    assert _ids(capsys, where) == ["a1/0"]


def test_ids_that_name_no_visible_message_and_an_unknown_conversation_are_0(capsys: Capsys,
                                                                             where: list[str]) -> None:
    _four(capsys, where)
    assert run(capsys, *where, "messages", "delete", "c", "zz/0", "not-an-id", "a1/01", "a1/0", "a1/0") == (
        0, "deleted 1\n", "")
    assert run(capsys, *where, "messages", "delete", "never-written", "a1/0") == (0, "deleted 0\n", "")
    assert _ids(capsys, where) == ["a2/0", "a3/0", "a4/0"]


def test_a_fence_of_a_superseded_run_exits_3_and_deletes_nothing(capsys: Capsys, where: list[str]) -> None:
    _four(capsys, where)
    assert run(capsys, *where, "run", "begin", "c", "r1")[0] == 0
    assert run(capsys, *where, "messages", "delete", "c", "a2/0", "--run", "r1", "--fence", "1") == (
        0, "deleted 1\n", "")
    assert run(capsys, *where, "run", "begin", "c", "r2")[0] == 0
    code, out, err = run(capsys, *where, "messages", "delete", "c", "a4/0", "--run", "r1", "--fence", "1")
    assert (code, out, err.count("\n")) == (3, "", 1) and err.startswith("histlog: error: "), err
    assert _ids(capsys, where) == ["a1/0", "a3/0", "a4/0"]
    assert run(capsys, *where, "messages", "delete", "c", "a4/0", "--run", "r2", "--fence", "2") == (
        0, "deleted 1\n", "")


def test_a_cleared_conversation_exits_3(capsys: Capsys, where: list[str]) -> None:
    _four(capsys, where)
    assert run(capsys, *where, "clear", "c")[0] == 0
    code, out, err = run(capsys, *where, "messages", "delete", "c", "a1/0")
    assert (code, out, err.count("\n")) == (3, "", 1) and "closed" in err, err


@pytest.mark.parametrize(("args", "words"), [
    (["c"], "MESSAGE_ID"),  # no id at all
    (["c", "a1/0", "--fence", "abc"], "--fence"),
    (["c", "a1/0", "--run", "r1", "--fence", "0"], "fence"),
    (["c", "a1/0", "--run", "r1", "--fence", "-1"], "fence"),
    (["c", "a1/0", "--fence", "1"], "--fence needs --run"),
    (["c", "a1/0", "--run", "r1"], "--run goes with --fence"),
    (["c", "a1/0", "--run", " r1", "--fence", "1"], "run"),
    ([" c", "a1/0"], "conversation"),
    (["c", *(["a1/0"] * 10_001)], "10001"),
    (["c", "a1/0", "--limit", "2"], "--limit"),
])
def test_bad_input_exits_2_with_one_line_and_deletes_nothing(capsys: Capsys, where: list[str], args: list[str],
                                                             words: str) -> None:
    _four(capsys, where)
    code, out, err = run(capsys, *where, "messages", "delete", *args)
    assert (code, out, err.count("\n")) == (2, "", 1) and words in err, err
    assert _ids(capsys, where) == ["a1/0", "a2/0", "a3/0", "a4/0"]


def test_the_group_needs_a_command_and_lists_delete(capsys: Capsys) -> None:
    code, out, err = run(capsys, "messages")
    assert (code, out, err.count("\n")) == (2, "", 1) and "MESSAGES_COMMAND" in err, err
    assert "messages delete" in subcommands(build_parser())
