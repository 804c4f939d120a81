"""``histlog assets link`` (docs/cli.md), on an embedded data directory and over ``--url``
against a server: the same output and exit codes, and ``read --json`` shows the assets."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.facade import HistoryEngine
from tests.service.server_support import serving
from tests.unit.cli_support import Capsys, clean_cli_env, run

HASH = "sha256:" + "ab" * 32


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


def test_a_link_prints_the_messages_assets_and_reads_show_them(capsys: Capsys, where: list[str]) -> None:
    assert run(capsys, *where, "append", "c", "a1", "--text", "look")[0] == 0
    code, out, err = run(capsys, *where, "assets", "link", "c", "a1/0", "--hash", HASH, "--role", "image",
                         "--mime", "image/png", "--size", "2048", "--storage-key", "media/cat.png")
    assert code == 0, err
    image = {"content_hash": HASH, "mime": "image/png", "ordinal": 0, "role": "image", "size_bytes": 2048,
             "storage_key": "media/cat.png"}
    assert [json.loads(line) for line in out.splitlines()] == [image]
    code, out, _ = run(capsys, *where, "assets", "link", "c", "a1/0", "--hash", HASH, "--role", "thumb",
                       "--ordinal", "1")
    assert code == 0 and len(out.splitlines()) == 2
    code, out, _ = run(capsys, *where, "read", "c", "--json")
    assert code == 0 and json.loads(out)[0]["assets"][0] == image


@pytest.mark.parametrize(("args", "code", "words"), [
    (["a1/0", "--hash", "sha256:AB", "--role", "image"], 2, "content_hash"),
    (["a1/0", "--hash", HASH, "--role", ""], 2, "role"),
    (["a1/0", "--hash", HASH, "--role", "image", "--ordinal", "-1"], 2, "ordinal"),
    (["nope/0", "--hash", HASH, "--role", "image"], 2, "nope/0"),
    (["a1", "--hash", HASH, "--role", "image"], 2, "message_id"),
    (["a1/0", "--hash", "sha256:" + "cd" * 32, "--role", "image"], 3, "ordinal 0"),
])
def test_bad_input_and_conflicts_exit_with_one_line(capsys: Capsys, where: list[str], args: list[str], code: int,
                                                     words: str) -> None:
    assert run(capsys, *where, "append", "c", "a1", "--text", "look")[0] == 0
    assert run(capsys, *where, "assets", "link", "c", "a1/0", "--hash", HASH, "--role", "image")[0] == 0
    got, _, err = run(capsys, *where, "assets", "link", "c", *args)
    assert got == code and err.count("\n") == 1 and words in err, err
