"""Fixtures of the console tests: a real ``histlog serve`` process on loopback over a history
written by an engine before it starts, and headless Chromium (Debian's, never a downloaded one)
driven by Playwright's sync API.

Without ``/usr/bin/chromium`` (or Playwright) the tests are skipped, except under ``CI=true``
where they fail: CI must run them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from engine.facade import HistoryEngine
from schemas.batch import Batch
from schemas.messages import Message, ReasoningPart, ToolCallPart, ToolOutput, ToolResultPart
from tests.service.test_http_serve import ROOT, TIMEOUT, listening

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
BULK = 120
"""Conversations under ``bulk/``: three pages of 50, 50, 20."""
BIG = "big/one thousand"
"""A conversation of 1,000 messages (500 turns); its id has a space and a slash on purpose."""
BIG_MESSAGES = 1000
RICH = "rich/tools"
REPLACED = "edit/replaced"


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"the console tests need a browser under CI: {reason}")
    pytest.skip(f"no browser: {reason}")


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
    if not CHROMIUM.exists():
        _unavailable(f"{CHROMIUM} is not installed (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        _unavailable(f"playwright is not installed: {exc}")
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@dataclass
class Watched:
    """A page with every request it made and every console error it logged."""

    page: Any
    origin: str
    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    allowed: tuple[str, ...] = ()
    """Console errors containing one of these are expected (a 401 the token prompt answers)."""

    def check(self) -> None:
        foreign = [u for u in self.requests if not (u == self.origin or u.startswith(self.origin + "/"))]
        assert not foreign, f"requests to other origins: {foreign}"
        errors = [e for e in self.errors if not any(a in e for a in self.allowed)]
        assert not errors, f"console errors: {errors}"


def watch(browser: Any, origin: str) -> Iterator[Watched]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(10_000)
    watched = Watched(page, origin)
    page.on("request", lambda request: watched.requests.append(request.url))
    page.on("console", lambda message: watched.errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: watched.errors.append(f"pageerror: {error}"))
    try:
        yield watched
        watched.check()
    finally:
        context.close()


@pytest.fixture
def watched(browser: Any, server: Server) -> Iterator[Watched]:
    yield from watch(browser, server.url)


@pytest.fixture
def watched_token(browser: Any, token_server: Server) -> Iterator[Watched]:
    yield from watch(browser, token_server.url)
