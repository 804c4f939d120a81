"""Headless Chromium for the console's tests, importable from any test package (the console's
own tests, and tests/integration/test_console_cluster.py against a real cluster): Debian's
``/usr/bin/chromium``, never a downloaded one, driven by Playwright's sync API.

``launched()`` is the browser for one module at most (use it from a module-scoped fixture, never
a session-scoped one: Playwright's sync API runs an event loop in this thread while it lives, and
every later test that calls ``asyncio.run`` would fail). ``watch(browser, origin)`` is a page
that records every request and console error, and checks on exit that no request left
``origin`` and nothing was logged as an error. Without the browser (or Playwright) the caller is
skipped, except under ``CI=true`` where it fails: CI must run these tests.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pytest

__all__ = ["ARGS", "CHROMIUM", "Watched", "launched", "unavailable", "watch"]

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def unavailable(reason: str) -> NoReturn:
    """Fail under CI (the browser tests must run there), skip elsewhere."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"the console tests need a browser under CI: {reason}")
    pytest.skip(f"no browser: {reason}")


@contextlib.contextmanager
def launched() -> Iterator[Any]:
    """Headless Chromium, closed (with its Playwright) on exit."""
    if not CHROMIUM.exists():
        unavailable(f"{CHROMIUM} is not installed (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        unavailable(f"playwright is not installed: {exc}")
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
    """A new browser context and page on ``origin`` (for a fixture: ``yield from watch(...)``);
    ``Watched.check`` runs when the test body returned without failing."""
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
