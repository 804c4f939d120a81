"""``histlog --url URL cluster``: the map of the member asked and each owner's lag, over real
servers on loopback; an owner that does not answer is shown and makes the exit status 4."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.cli import main
from engine.cluster import OwnershipMap
from engine.facade import HistoryEngine
from engine.service.app import build_app
from schemas import Batch, Message
from tests.service.conftest import Served
from tests.service.server_support import running

Capsys = pytest.CaptureFixture[str]
DEAD = "http://127.0.0.1:9"  # nothing listens on the discard port


def test_a_single_server_owns_its_one_partition_with_no_lag(served: Served, capsys: Capsys) -> None:
    served.engine.append(Batch("c", "a1", [Message.user("hi")]))
    assert main(["--url", served.url, "cluster", "--json"]) == 0
    tree = json.loads(capsys.readouterr().out)
    assert tree["group"] is None and tree["owners"] == {"0": served.url}
    assert tree["members"] == {served.url: {"owned": [0], "lag": {"0": 0}}}


def test_an_owner_that_does_not_answer_is_shown_and_exits_4(tmp_path: Path, capsys: Capsys) -> None:
    cell: list[str] = []
    with HistoryEngine.open(tmp_path / "data", partitions=2) as engine:
        app = build_app(engine, ownership=lambda: OwnershipMap("bots", 3, 2, cell[0], {0: cell[0], 1: DEAD}))
        with running(app) as url:
            cell.append(url)
            assert main(["--url", url, "cluster"]) == 4
            out = capsys.readouterr().out.splitlines()
            assert out[0].startswith("group bots  generation 3  partitions 2")
            assert out[2].split() == ["0", "0", url]
            assert out[3].split() == ["1", "unreachable", DEAD]
            assert out[4].startswith(f"{DEAD}: ")


def test_without_url_it_is_a_usage_error(tmp_path: Path, capsys: Capsys) -> None:
    assert main(["--data", str(tmp_path / "d"), "cluster"]) == 2
    assert "give --url" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()
