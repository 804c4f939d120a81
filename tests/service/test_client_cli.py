"""``histlog --url URL ...``: every command that reads or writes the history runs against a real
server (uvicorn on loopback over a FileLog engine) through ``HistoryClient``; the commands that
need the files are refused with one line saying what to run instead."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.service.conftest import Served

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 60


def histlog(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    for name in ("HISTLOG_URL", "HISTLOG_DATA", "HISTLOG_KAFKA", "HISTLOG_TOKEN"):
        if env is None or name not in env:
            full.pop(name, None)
    return subprocess.run([sys.executable, "-m", "engine", *args], capture_output=True, text=True, env=full,
                          timeout=TIMEOUT_S, cwd=REPO, check=False)


def ok(*args: str, env: dict[str, str] | None = None) -> str:
    done = histlog(*args, env=env)
    assert done.returncode == 0, (args, done.stderr)
    return done.stdout


def test_append_read_list_turns_replace_clear_stats_over_url(served: Served) -> None:
    url = served.url
    receipt = json.loads(ok("--url", url, "append", "bot/7 é", "a1", "--text", "hello"))
    assert receipt["conversation_id"] == "bot/7 é" and receipt["append_id"] == "a1"
    assert json.loads(ok("append", "bot/7 é", "a1", "--text", "hello", "--url", url)) == receipt  # after the command
    assert histlog("--url", url, "append", "bot/7 é", "a1", "--text", "changed").returncode == 3  # AppendConflict
    ok("--url", url, "append", "bot/7 é", "a2", "--text", "answer", "--role", "assistant")

    entries = json.loads(ok("--url", url, "read", "bot/7 é", "--json"))
    assert [(e["id"], e["position"]) for e in entries] == [("a1/0", "1:1"), ("a2/0", "1:2")]
    assert [m.text() for m in served.engine.read("bot/7 é")] == ["hello", "answer"]
    assert "[1:1] user: hello" in ok("--url", url, "read", "bot/7 é")
    assert "[1:2] assistant: answer" in ok("--url", url, "read", "bot/7 é", "--window", "5")
    assert json.loads(ok("--url", url, "read", "bot/7 é", "--measure", "--json")) == {
        "content_bytes": served.engine.measure("bot/7 é").content_bytes, "messages": 2, "turns": 1}
    budget = json.loads(ok("--url", url, "read", "bot/7 é", "--max-bytes", "1000", "--json"))
    assert budget["truncated"] is False and len(budget["entries"]) == 2

    turns = json.loads(ok("--url", url, "turns", "bot/7 é", "--json"))
    assert turns == [{"id": "a1/0", "position": 1, "request_message_id": "a1/0", "assistant_message_id": "a2/0",
                      "messages": 2}]
    replaced = json.loads(ok("--url", url, "replace-turn", "bot/7 é", "a1/0", "a3", "--reason", "edit",
                             "--text", "hello again", "--answer", "hi"))
    assert replaced["append_id"] == "a3"
    assert [m.text() for m in served.engine.read("bot/7 é")] == ["hello again", "hi"]
    assert histlog("--url", url, "replace-turn", "bot/7 é", "a1/0", "a4", "--reason", "edit",
                   "--text", "x").returncode == 3  # TurnNotReplaceable: a1/0 is hidden now

    ok("--url", url, "append", "other", "b1", "--text", "x")
    assert json.loads(ok("--url", url, "list", "--json")) == ["bot/7 é", "other"]
    ok("--url", url, "clear", "other")
    assert ok("--url", url, "list").split("\n")[0] == "bot/7 é" and served.engine.conversations() == ["bot/7 é"]
    assert histlog("--url", url, "append", "other", "b2", "--text", "y").returncode == 3  # ConversationClosed

    stats = json.loads(ok("--url", url, "stats", "--json"))
    assert stats["accepted"] == served.engine.stats().accepted and stats["poison"] == []
    assert "accepted" in ok("--url", url, "stats")


def test_histlog_url_from_the_environment(served: Served) -> None:
    env = {"HISTLOG_URL": served.url}
    ok("append", "c", "a1", "--text", "from env", env=env)
    assert [m.text() for m in served.engine.read("c")] == ["from env"]
    assert json.loads(ok("list", "--json", env=env)) == ["c"]


@pytest.mark.parametrize("command", [["rebuild"], ["replay", "--projection", "x:Y"], ["log", "verify"],
                                     ["tail"], ["tail", "--no-follow"], ["bench", "--quick"],
                                     ["serve", "--listen", "127.0.0.1:0"]])
def test_local_commands_are_refused_with_what_to_run_instead(command: list[str]) -> None:
    done = histlog("--url", "http://127.0.0.1:9", *command)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not run against a server" in lines[0], lines
    assert any(hint in lines[0] for hint in ("run `histlog", "drop --url", "curl -N")), lines


def test_bad_url_and_conflicting_targets_are_usage_errors() -> None:
    for args in (["--url", "127.0.0.1:8420", "list"], ["--url", "http://x:1", "--data", "d", "list"]):
        done = histlog(*args)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_an_unreachable_server_is_backend_unavailable() -> None:
    with socket.socket() as s:  # a port nobody listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        done = histlog("--url", f"http://127.0.0.1:{port}", "list", env={"HISTLOG_TIMEOUT": "1"})
    assert done.returncode == 4, done.stderr
    assert done.stderr.startswith("histlog: error: ") and "could not be reached" in done.stderr
