"""The console's cost in a browser: a real ``histlog serve`` on loopback over a 1,000-message
conversation, its console opened in headless Debian Chromium (``/usr/bin/chromium``, driven by
Playwright's sync API; no browser is ever downloaded).

Measured, in the same run:

- **first load**: the bytes over the wire (response bodies + headers, Playwright's
  ``request.sizes()``, as tests/console/test_console.py takes them) and the request count of
  opening ``/console/`` until the network is idle;
- **render**: the time to render the first page (100 messages) of the 1,000-message conversation,
  ``window.__histlog.firstPageMs`` (the console's performance marks ``histlog:conversation:start``
  → ``histlog:conversation:first-page``: fetch, parse, DOM, layout, one frame), the median of
  ``loads`` loads, each in a new page;
- **baseline**: the time for the same page to ``fetch()`` the raw JSON of that first page
  (``.../messages?order=desc&limit=100``, parsed) from inside the page, in the same rounds,
  interleaved; reported with the ratio render ÷ fetch (1.0: rendering costs nothing over the
  bytes).

``python -m bench.bench_console [--quick]`` prints the table and writes
``bench/results/console-bench.json``; ``histlog bench console`` runs it with the others. Without
the browser (or Playwright) it prints one line saying what to install and measures nothing.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from bench.bench_service import _Server
from bench.common import save
from engine import HistoryEngine
from schemas import Batch, Message

__all__ = ["report", "run"]

RESULTS = Path(__file__).resolve().parent / "results" / "console-bench.json"
CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
BIG = "big/one thousand"
WAIT_MS = 30_000  # every browser wait is bounded
_FETCH = """async (path) => {
  const t0 = performance.now();
  const body = await (await fetch(path, { credentials: "omit" })).json();
  return { ms: performance.now() - t0, messages: body.messages.length };
}"""


def missing() -> str | None:
    """What to install before this bench can run (None: nothing)."""
    if not CHROMIUM.exists():
        return f"bench console: skipped, {CHROMIUM} is not installed (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "bench console: skipped, Playwright is not installed (pip install 'histlog[test]')"
    return None


def _seed(data: Path, messages: int) -> None:
    with HistoryEngine.open(data, fsync="never") as engine:
        for t in range(messages // 2):
            engine.append(Batch(BIG, f"t{t}", [Message.user(f"question {t}", metadata={"external_id": f"ext-{t}"}),
                                               Message.assistant(f"answer {t}")]))


def _first_load(browser: Any, url: str) -> tuple[int, int]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        page = context.new_page()
        sizes: list[int] = []
        page.on("requestfinished", lambda r: sizes.append(r.sizes()["responseBodySize"]
                                                          + r.sizes()["responseHeadersSize"]))
        page.goto(f"{url}/console/")
        page.wait_for_selector("[data-testid=conversation-list] li", timeout=WAIT_MS)
        page.wait_for_load_state("networkidle", timeout=WAIT_MS)
        return sum(sizes), len(sizes)
    finally:
        context.close()


def _render_and_fetch(browser: Any, url: str) -> tuple[float, float, int]:
    """One round: a new page renders the conversation's first page, then fetches its JSON."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        page = context.new_page()
        page.goto(f"{url}/console/#/c/{quote(BIG, safe='')}")
        page.wait_for_function("() => window.__histlog && window.__histlog.firstPageMs > 0", timeout=WAIT_MS)
        metrics = page.evaluate("() => window.__histlog")
        fetched = page.evaluate(_FETCH, f"/v1/conversations/{quote(BIG, safe='')}/messages?order=desc&limit=100")
        return float(metrics["firstPageMs"]), float(fetched["ms"]), int(metrics["firstPageMessages"])
    finally:
        context.close()


def run(quick: bool = False, progress: bool = True, loads: int | None = None,
        messages: int = 1000) -> dict[str, Any]:
    """``loads``: rounds of render + fetch (default 5 quick, 21 full); ``messages``: the
    conversation's size (a tiny run in the tests)."""
    result: dict[str, Any] = {"bench": "console", "messages": messages}
    why = missing()
    if why is not None:  # report() prints it, as the one line of this bench
        return {**result, "skipped": why}
    from playwright.sync_api import sync_playwright

    rounds = loads or (5 if quick else 21)
    root = Path(tempfile.mkdtemp(prefix="histlog-bench-console-"))
    try:
        _seed(root / "data", messages)
        with _Server(root / "data") as server, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
            try:
                _render_and_fetch(browser, server.url)  # warm-up: the server's first reads, the browser's caches
                first_bytes, first_requests = _first_load(browser, server.url)
                renders: list[float] = []
                fetches: list[float] = []
                for r in range(rounds):
                    render_ms, fetch_ms, shown = _render_and_fetch(browser, server.url)
                    renders.append(render_ms)
                    fetches.append(fetch_ms)
                    if progress:
                        print(f"  round {r + 1}/{rounds}: render {render_ms:.1f} ms, fetch {fetch_ms:.1f} ms",
                              file=sys.stderr, flush=True)
            finally:
                browser.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    render, fetch = statistics.median(renders), statistics.median(fetches)
    return {**result, "loads": rounds, "first_page_messages": shown,
            "first_load": {"bytes": first_bytes, "requests": first_requests},
            "render_first_page_ms": round(render, 1), "fetch_first_page_json_ms": round(fetch, 1),
            "ratio_render_to_fetch": round(render / fetch, 2) if fetch > 0 else None,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def report(result: dict[str, Any]) -> str:
    if "skipped" in result:
        return result["skipped"]
    load = result["first_load"]
    return "\n".join([
        f"console in headless Chromium, a {result['messages']}-message conversation, "
        f"medians of {result['loads']} loads",
        f"  first load of /console/   {load['bytes']:>9,} bytes over the wire in {load['requests']} requests",
        f"  render first page ({result['first_page_messages']} msgs)  {result['render_first_page_ms']:>8} ms",
        f"  fetch() its JSON (baseline)  {result['fetch_first_page_json_ms']:>8} ms"
        f"   ratio render / fetch {result['ratio_render_to_fetch']}",
    ])


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    result = run(quick="--quick" in args)
    print(report(result))
    if "skipped" not in result:
        save(result, RESULTS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
