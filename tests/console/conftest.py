"""Fixtures of the console tests: a real ``histlog serve`` process on loopback over a history
written by an engine before it starts, and headless Chromium (Debian's, never a downloaded one)
driven by Playwright's sync API (``tests.console.browser_support``, which other test packages
import too).

Without ``/usr/bin/chromium`` (or Playwright) the tests are skipped, except under ``CI=true``
where they fail: CI must run them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from engine.facade import HistoryEngine
from schemas.batch import Batch
from schemas.messages import Message, ReasoningPart, ToolCallPart, ToolOutput, ToolResultPart
from tests.console.browser_support import Watched, launched, watch
from tests.service.test_http_serve import ROOT, TIMEOUT, listening

BULK = 120
"""Conversations under ``bulk/``: three pages of 50, 50, 20."""
BIG = "big/one thousand"
"""A conversation of 1,000 messages (500 turns); its id has a space and a slash on purpose."""
BIG_MESSAGES = 1000
RICH = "rich/tools"
REPLACED = "edit/replaced"


def seed(data: Path) -> None:
    """The history the console tests read, written before the server starts."""
    with HistoryEngine.open(data, fsync="never") as engine:
        for i in range(BULK):
            engine.append(Batch(f"bulk/{i:03d}", "a", [Message.user(f"hello {i}")] * (1 + i % 3)))
        for t in range(BIG_MESSAGES // 2):
            meta = {"external_id": f"ext-{t}"}
            engine.append(Batch(BIG, f"t{t}", [Message.user(f"question {t}", metadata=meta),
                                               Message.assistant(f"answer {t}")]))
        engine.append(Batch(RICH, "r1", [
            Message.system("You are a calculator."),
            Message.user("what is 6*7?", metadata={"external_id": "slack-1", "channel": "#math"}),
            Message.assistant(ReasoningPart("multiply the two numbers"),
                              ToolCallPart("call-1", "calc", '{"expr": "6*7"}')),
            Message.tool(ToolResultPart("call-1", "calc", ToolOutput.text("42"))),
            Message.assistant(ToolCallPart("call-2", "calc", '{"expr": "6/0"}')),
            Message.tool(ToolResultPart("call-2", "calc", ToolOutput.text("division by zero"), is_error=True)),
            Message.assistant("6*7 is 42."),
        ]))
        engine.append(Batch(REPLACED, "e1", [Message.user("first question"), Message.assistant("first answer")]))
        engine.append(Batch(REPLACED, "e2", [Message.user("typo questoin"), Message.assistant("typo answer")]))
        engine.replace_turn(Batch(REPLACED, "e3", [Message.user("fixed question"), Message.assistant("fixed answer")]),
                            "e2/0", "edit")
        for name in ("live/append", "clear/me", "locate/me"):
            engine.append(Batch(name, "a", [Message.user(f"in {name}"), Message.assistant("ok")]))


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[bytes]


def serve(data: Path, env: dict[str, str] | None = None) -> Iterator[Server]:
    proc = subprocess.Popen([sys.executable, "-m", "engine", "--data", str(data), "serve", "--listen", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    try:
        yield Server(listening(proc), proc)
    finally:
        proc.terminate()
        try:
            proc.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(TIMEOUT)
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``histlog serve`` (no token) over the seeded history."""
    data = tmp_path_factory.mktemp("console") / "data"
    seed(data)
    yield from serve(data)


@pytest.fixture(scope="module")
def token_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``histlog serve`` with the token ``console-secret`` (env ``HISTLOG_TOKEN``)."""
    data = tmp_path_factory.mktemp("console-token") / "data"
    with HistoryEngine.open(data, fsync="never") as engine:
        engine.append(Batch("guarded/1", "a", [Message.user("behind a token")]))
    yield from serve(data, {"HISTLOG_TOKEN": "console-secret"})


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Chromium for one module's tests. Never longer: Playwright's sync API runs an event loop in
    this thread while it lives, and every later test that calls ``asyncio.run`` would fail."""
    with launched() as chromium:
        yield chromium


@pytest.fixture
def watched(browser: Any, server: Server) -> Iterator[Watched]:
    yield from watch(browser, server.url)


@pytest.fixture
def watched_token(browser: Any, token_server: Server) -> Iterator[Watched]:
    yield from watch(browser, token_server.url)
