"""``histlog run begin``, ``histlog run show`` and ``histlog append --run --fence`` (docs/cli.md), on
an embedded data directory and over ``--url`` against a server: the same output and exit codes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

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


def test_a_run_begins_writes_under_its_fence_and_is_fenced_by_the_next(capsys: Capsys, where: list[str]) -> None:
    code, out, _ = run(capsys, *where, "run", "begin", "c", "r1", "--json")
    assert (code, json.loads(out)) == (0, {"conversation_id": "c", "run_id": "r1", "epoch": 1})
    code, out, err = run(capsys, *where, "append", "c", "a1", "--text", "hi", "--run", "r1", "--fence", "1")
    assert code == 0 and json.loads(out)["append_id"] == "a1", err
    code, out, _ = run(capsys, *where, "run", "begin", "c", "r2")
    assert code == 0 and "epoch 2" in out and "--run r2 --fence 2" in out
    code, _, err = run(capsys, *where, "append", "c", "a2", "--text", "late", "--run", "r1", "--fence", "1")
    assert code == 3 and "latest run" in err and err.endswith("\n") and err.count("\n") == 1
    code, out, _ = run(capsys, *where, "run", "show", "c", "r1", "--root-turn", "a1/0", "--json")
    assert (code, json.loads(out)) == (0, {"wrote_history": True, "request_message_id": "a1/0"})
    code, out, _ = run(capsys, *where, "run", "show", "c", "r2")
    assert (code, out) == (0, "wrote history: no\n")
    code, out, _ = run(capsys, *where, "read", "c", "--json")
    assert [e["id"] for e in json.loads(out)] == ["a1/0"]


@pytest.mark.parametrize("args", [
    ["append", "c", "a", "--text", "x", "--fence", "1"],  # a fence without its run
    ["append", "c", "a", "--text", "x", "--run", "r", "--fence", "0"],
    ["run", "begin", "c", " r"],
    ["run", "show", "c", "r", "--root-turn", "nope"],
])
def test_bad_runs_input_exits_2_with_one_line(capsys: Capsys, where: list[str], args: list[str]) -> None:
    code, out, err = run(capsys, *where, *args)
    assert (code, out) == (2, "") and err.startswith("histlog: error: ") and err.count("\n") == 1
