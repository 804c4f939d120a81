"""``histlog turn allocate`` and ``histlog append --turn TURN_ID:POSITION`` (docs/cli.md), on an
embedded data directory and over ``--url`` against a server: the same output and exit codes."""

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


def _turns(capsys: Capsys, where: list[str]) -> list[tuple[str, int]]:
    code, out, err = run(capsys, *where, "turns", "c", "--json")
    assert code == 0, err
    return [(t["id"], t["position"]) for t in json.loads(out)]


def test_a_slot_is_allocated_and_an_append_files_its_turn_under_it(capsys: Capsys, where: list[str]) -> None:
    assert run(capsys, *where, "append", "c", "a1", "--text", "first")[0] == 0
    code, out, _ = run(capsys, *where, "turn", "allocate", "c", "--json")
    slot = json.loads(out)
    assert code == 0 and set(slot) == {"conversation_id", "turn_id", "position"}
    assert (slot["conversation_id"], slot["position"]) == ("c", 2) and slot["turn_id"].endswith("/0")
    flag = f"{slot['turn_id']}:{slot['position']}"
    code, out, err = run(capsys, *where, "append", "c", "a2", "--text", "second", "--turn", flag)
    assert code == 0 and json.loads(out)["append_id"] == "a2", err
    assert _turns(capsys, where) == [("a1/0", 1), (slot["turn_id"], 2)]
    code, out, _ = run(capsys, *where, "turn", "allocate", "c")
    assert code == 0 and out.count("\n") == 1 and "position 3" in out
    printed = out.split("--turn ", 1)[1].strip()  # the human line ends with the flag to pass
    code, _, err = run(capsys, *where, "append", "c", "a3", "--text", "third", "--turn", printed)
    assert code == 0, err
    assert [p for _, p in _turns(capsys, where)] == [1, 2, 3]


def test_a_slot_used_again_or_behind_a_later_turn_exits_3_with_one_line(capsys: Capsys, where: list[str]) -> None:
    first, later = (json.loads(run(capsys, *where, "turn", "allocate", "c", "--json")[1]) for _ in range(2))
    used = f"{first['turn_id']}:{first['position']}"
    assert run(capsys, *where, "append", "c", "a1", "--text", "q1", "--turn", used)[0] == 0
    code, out, err = run(capsys, *where, "append", "c", "a2", "--text", "q2", "--turn", used)
    assert (code, out) == (3, "") and "already used" in err and err.count("\n") == 1
    assert run(capsys, *where, "append", "c", "a3", "--text", "q3")[0] == 0  # a turn after the later slot
    behind = f"{later['turn_id']}:{later['position']}"
    code, out, err = run(capsys, *where, "append", "c", "a4", "--text", "q4", "--turn", behind)
    assert (code, out) == (3, "") and "behind the latest turn" in err and err.count("\n") == 1
    code, _, err = run(capsys, *where, "append", "c", "a5", "--text", "q5", "--turn", "slot-never/0:9")
    assert code == 3 and "no turn slot" in err
    assert _turns(capsys, where) == [(first["turn_id"], 1), ("a3/0", 3)]


def test_a_cleared_conversation_allocates_no_slot(capsys: Capsys, where: list[str]) -> None:
    assert run(capsys, *where, "clear", "c")[0] == 0
    code, out, err = run(capsys, *where, "turn", "allocate", "c")
    assert (code, out) == (3, "") and err.count("\n") == 1


@pytest.mark.parametrize(("args", "words"), [
    (["append", "c", "a", "--text", "x", "--turn", "nope"], "TURN_ID:POSITION"),
    (["append", "c", "a", "--text", "x", "--turn", "slot-x/0:"], "TURN_ID:POSITION"),
    (["append", "c", "a", "--text", "x", "--turn", ":1"], "TURN_ID:POSITION"),
    (["append", "c", "a", "--text", "x", "--turn", "slot-x/0:one"], "TURN_ID:POSITION"),
    (["append", "c", "a", "--text", "x", "--turn", "slot-x/0:-1"], "TURN_ID:POSITION"),
    (["append", "c", "a", "--text", "x", "--turn", "slot-x/0:0"], "position"),
    (["append", "c", "a", "--text", "x", "--turn", "slot-x/1:1"], "slot's turn id"),
    (["append", "c", "a", "--text", "x", "--role", "assistant", "--turn", "slot-x/0:1"], "user message"),
    (["append", "c", "a", "--text", "x", "--turn"], "--turn"),
    (["turn", "allocate", "bad\x01id"], "conversation id"),
    (["turn", "allocate"], "CONVERSATION"),
    (["turn"], "TURN_COMMAND"),
])
def test_bad_slot_input_exits_2_with_one_line_naming_it(capsys: Capsys, where: list[str], args: list[str],
                                                        words: str) -> None:
    code, out, err = run(capsys, *where, *args)
    assert (code, out) == (2, "") and err.startswith("histlog: error: ") and err.count("\n") == 1, err
    assert words in err
    assert run(capsys, *where, "read", "c", "--json")[1] == "[]\n"  # nothing written
