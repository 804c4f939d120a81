"""The histlog console in headless Chromium against a real ``histlog serve``: every page, paging,
a 1,000-message conversation scrolled to its start, live appends, replaced turns, locate, clear,
the token prompt; no request leaves the server's origin and the page logs no error. Screenshots
go to ``tests/console/screenshots/`` (with ``HISTLOG_UPDATE_SCREENSHOTS=1``, two are copied to
``docs/`` for the README); the first load's bytes and the
first page's render time go to ``bench/results/console.json`` (printed, only the size asserted)."""

from __future__ import annotations

import http.client
import itertools
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson
import pytest

from tests.console.browser_support import Watched
from tests.console.conftest import BIG, BIG_MESSAGES, BULK, REPLACED, RICH, Server
from tests.service.server_support import call

try:
    from playwright.sync_api import expect
except ImportError:  # as for the browser: skipped here, a failure under CI
    if os.environ.get("CI", "").lower() == "true":
        raise
    pytest.skip("playwright is not installed", allow_module_level=True)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SHOTS = HERE / "screenshots"
RESULTS = ROOT / "bench" / "results" / "console.json"
WAIT = 10_000  # ms: every wait is bounded
FIRST_LOAD_MAX = 200_000


def shot(page: Any, name: str, docs: str | None = None) -> None:
    SHOTS.mkdir(exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=False)
    if docs is not None and os.environ.get("HISTLOG_UPDATE_SCREENSHOTS") == "1":
        shutil.copyfile(path, ROOT / "docs" / docs)


def record(**numbers: float) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    RESULTS.write_text(json.dumps({**old, **numbers}, indent=2) + "\n")
    print(f"console: {numbers}")


def conversation(watched: Watched, c: str) -> Any:
    page = watched.page
    page.goto(f"{watched.origin}/console/#/c/{quote(c, safe='')}")
    expect(page.get_by_test_id("message").first).to_be_visible(timeout=WAIT)
    return page


def append(server: Server, c: str, a: str, *messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    status, _, body = call(server.url, "PUT", f"/v1/conversations/{quote(c, safe='')}/appends/{a}",
                           orjson.dumps({"messages": list(messages), **extra}))
    assert status == 200, body
    return body  # type: ignore[no-any-return]


def text(role: str, value: str) -> dict[str, Any]:
    return {"role": role, "parts": [{"kind": "text", "text": value}]}


def test_static_files_redirect_and_404(server: Server) -> None:
    status, head, _ = call(server.url, "GET", "/")
    assert status in (302, 307) and head["location"].endswith("/console/")
    for name, kind in (("", "text/html"), ("app.js", "text/javascript"), ("style.css", "text/css")):
        conn_status, head, _ = _raw(server.url, f"/console/{name}")
        assert conn_status == 200 and head["content-type"].startswith(kind), (name, head)
        assert "default-src 'none'" in head["content-security-policy"]
    assert _raw(server.url, "/console/nope.js")[0] == 404
    assert _raw(server.url, "/console/..%2Fapp.py")[0] == 404


def _raw(url: str, path: str) -> tuple[int, dict[str, str], bytes]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def test_conversations_page_pages_by_prefix_and_first_load_size(watched: Watched) -> None:
    page, sizes = watched.page, []
    page.on("requestfinished", lambda request: sizes.append(
        request.sizes()["responseBodySize"] + request.sizes()["responseHeadersSize"]))
    page.goto(f"{watched.origin}/")
    expect(page).to_have_url(re.compile(r"/console/"))
    items = page.get_by_test_id("conversation-list").locator("li")
    expect(items).to_have_count(50, timeout=WAIT)
    page.wait_for_load_state("networkidle")
    first_load = sum(sizes)
    record(first_load_bytes=first_load, first_load_requests=len(sizes))
    assert first_load < FIRST_LOAD_MAX, first_load

    page.get_by_label("Filter by id prefix").fill("bulk/")
    expect(items.first).to_have_attribute("data-id", "bulk/000", timeout=WAIT)
    expect(items).to_have_count(50)
    expect(items.first.get_by_test_id("count")).to_have_text("1", timeout=WAIT)
    expect(items.nth(2).get_by_test_id("count")).to_have_text("3", timeout=WAIT)
    expect(page.get_by_test_id("page-prev")).to_be_disabled()
    shot(page, "conversations", "console-conversations.png")
    seen = [items.evaluate_all("els => els.map(e => e.dataset.id)")]
    for first, n in (("bulk/050", 50), ("bulk/100", BULK - 100)):
        page.get_by_test_id("page-next").click()
        expect(items.first).to_have_attribute("data-id", first, timeout=WAIT)
        expect(items).to_have_count(n)
        seen.append(items.evaluate_all("els => els.map(e => e.dataset.id)"))
    expect(page.get_by_test_id("page-next")).to_be_disabled()
    assert [len(s) for s in seen] == [50, 50, 20]
    assert list(itertools.chain.from_iterable(seen)) == [f"bulk/{i:03d}" for i in range(BULK)]
    page.get_by_test_id("page-prev").click()
    expect(items.first).to_have_attribute("data-id", "bulk/050", timeout=WAIT)
    expect(items).to_have_count(50)

    page.get_by_label("Open a conversation by id").fill(RICH)
    page.get_by_test_id("open-go").click()
    expect(page).to_have_url(re.compile(re.escape(quote(RICH, safe=""))))
    expect(page.get_by_test_id("turns")).to_contain_text("6*7 is 42.", timeout=WAIT)


def test_conversation_page_shows_roles_tools_reasoning_metadata(watched: Watched) -> None:
    page = conversation(watched, RICH)
    messages = page.get_by_test_id("message")
    expect(messages).to_have_count(7)
    roles = messages.evaluate_all("els => els.map(e => e.dataset.role)")
    assert sorted(roles) == sorted(["system", "user", "assistant", "tool", "assistant", "tool", "assistant"])
    turns = page.get_by_test_id("turns")
    expect(turns).to_contain_text("calc")
    expect(turns).to_contain_text('"expr": "6*7"')
    expect(turns.locator(".tool-result.error")).to_contain_text("division by zero")
    expect(turns.locator(".tool-result:not(.error)")).to_contain_text("42")
    reasoning = turns.locator("details.reasoning")
    expect(reasoning).to_have_count(1)
    assert reasoning.get_attribute("open") is None  # collapsed
    expect(turns.get_by_test_id("external-id")).to_have_text("ext: slack-1")
    expect(turns.locator("details.metadata")).to_contain_text("#math")
    expect(page.get_by_test_id("turn").first).to_have_attribute("data-turn-id", re.compile(r"^r1/"))
    expect(page.get_by_test_id("history-start")).to_be_visible()
    shot(page, "conversation-tools")


def test_a_thousand_messages_newest_first_then_scrolled_to_the_start(watched: Watched) -> None:
    page = conversation(watched, BIG)
    messages = page.get_by_test_id("message")
    expect(page.get_by_test_id("turn").first).to_contain_text(f"answer {BIG_MESSAGES // 2 - 1}")
    page.wait_for_function("() => window.__histlog && window.__histlog.firstPageMs > 0", timeout=WAIT)
    metrics = page.evaluate("() => window.__histlog")
    record(render_first_page_ms=round(metrics["firstPageMs"], 1), first_page_messages=metrics["firstPageMessages"])
    shot(page, "conversation", "console-conversation.png")
    start = page.get_by_test_id("history-start")
    for _ in range(BIG_MESSAGES // 100 + 5):  # scroll to the bottom until the start shows (bounded)
        if start.is_visible():
            break
        shown = messages.count()
        page.mouse.wheel(0, 100_000)
        page.wait_for_function(
            "n => document.querySelectorAll('[data-testid=message]').length > n"
            " || !document.querySelector('[data-testid=history-start]').hidden", arg=shown, timeout=WAIT)
    expect(start).to_be_visible()
    expect(messages).to_have_count(BIG_MESSAGES)
    expect(page.get_by_test_id("turn").last).to_contain_text("question 0")
    expect(page.locator("[data-message-id='t0/0']")).to_be_attached()


def test_live_append_shows_up(watched: Watched, server: Server) -> None:
    page = conversation(watched, "live/append")
    page.wait_for_function("() => window.__histlog && window.__histlog.firstPageMs > 0", timeout=WAIT)
    # the page follows the stream from the newest message it shows (after=T:S): an append made
    # before the stream is connected arrives through its catch-up, so there is no race to wait out
    append(server, "live/append", "live-1", text("user", "are you there?"), text("assistant", "live reply"))
    turns = page.get_by_test_id("turns")
    expect(turns).to_contain_text("live reply", timeout=WAIT)
    expect(page.get_by_test_id("turn").first).to_contain_text("are you there?")
    expect(page.get_by_test_id("message")).to_have_count(4)


def test_replaced_turn_shown_struck_through_only_when_asked(watched: Watched) -> None:
    page = conversation(watched, REPLACED)
    turns = page.get_by_test_id("turns")
    expect(turns).to_contain_text("fixed answer")
    expect(page.get_by_test_id("message")).to_have_count(4)
    expect(turns).not_to_contain_text("typo questoin")
    page.get_by_label("Show replaced turns").check()
    hidden = page.locator(".hidden-msg")
    expect(hidden).to_have_count(2, timeout=WAIT)
    expect(hidden.first).to_contain_text("Replaced (edit) by turn")
    expect(turns).to_contain_text("typo questoin")
    decoration = hidden.first.locator(".text").evaluate("e => getComputedStyle(e).textDecorationLine")
    assert decoration == "line-through"
    shot(page, "conversation-replaced")
    page.get_by_label("Show replaced turns").uncheck()
    expect(hidden).to_have_count(0, timeout=WAIT)
    expect(page.get_by_test_id("message")).to_have_count(4)


def test_locate_by_external_id_highlights_an_old_message(watched: Watched) -> None:
    page = conversation(watched, BIG)
    page.get_by_label("Locate by external id").fill("ext-3")  # turn 3: far past the first page
    page.get_by_test_id("locate-go").click()
    found = page.locator("[data-message-id='t3/0']")
    expect(found).to_have_class(re.compile(r"\bhighlight\b"), timeout=WAIT)
    expect(found).to_be_in_viewport()
    expect(page.locator(".highlight")).to_have_count(1)


def test_clear_needs_the_id_typed_then_shows_the_closed_banner(watched: Watched, server: Server) -> None:
    page = conversation(watched, "clear/me")
    page.get_by_test_id("clear").click()
    dialog = page.get_by_test_id("clear-dialog")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("clear/me")
    confirm = page.get_by_test_id("clear-confirm")
    expect(confirm).to_be_disabled()
    page.get_by_label("Type the conversation id to confirm").fill("clear/m")
    expect(confirm).to_be_disabled()
    page.get_by_test_id("clear-confirm-input").fill("clear/me")
    expect(confirm).to_be_enabled()
    shot(page, "clear-dialog")
    confirm.click()
    expect(page.get_by_test_id("closed-banner")).to_be_visible(timeout=WAIT)
    expect(dialog).to_be_hidden()
    assert call(server.url, "GET", "/v1/conversations/clear%2Fme/messages")[2] == {"messages": []}
    page.reload()  # a cleared conversation says so on a fresh load too (its event stream is closed at once)
    expect(page.get_by_test_id("closed-banner")).to_be_visible(timeout=WAIT)


def test_ops_page_shows_stats_and_cluster(watched: Watched, server: Server) -> None:
    page = watched.page
    page.goto(f"{watched.origin}/console/#/ops")
    stats = page.get_by_test_id("stats")
    expect(stats).to_contain_text("applied offset", timeout=WAIT)
    expect(stats).to_contain_text("lag")
    expect(stats.locator("[data-count=accepted]")).to_have_text(re.compile(r"^[1-9][0-9]*$"))
    expect(stats.locator("[data-count=erased]")).to_be_attached()
    expect(stats).to_contain_text("Poison records")
    cluster = page.get_by_test_id("cluster")
    expect(cluster).to_contain_text(watched.origin)
    expect(cluster.locator("tbody tr").first).to_contain_text(watched.origin)
    expect(page.get_by_test_id("nav-ops")).to_have_attribute("aria-current", "page")

    # the cluster map: one member per owner URL, this server marked, its console a plain link
    cluster_doc = call(server.url, "GET", "/v1/cluster")[2]
    members = cluster.get_by_test_id("member")
    expect(members).to_have_count(len(set(cluster_doc["owners"].values())))
    me = cluster.locator("[data-testid=member][data-self=true]")
    expect(me).to_have_count(1)
    expect(me).to_have_attribute("data-url", watched.origin)
    expect(me).to_contain_text("this server")
    link = me.locator("a").first
    expect(link).to_have_attribute("href", re.compile(r"/console/$"))
    assert link.get_attribute("href") == f"{watched.origin}/console/"
    mine = sorted(int(p) for p, url in cluster_doc["owners"].items() if url == cluster_doc["self"])
    assert mine == list(range(cluster_doc["partitions"]))  # one server (no --group) owns every partition
    listed = me.locator("[data-partition]")
    expect(listed).to_have_count(len(mine))
    assert [int(p) for p in listed.evaluate_all("els => els.map(e => e.dataset.partition)")] == mine
    # each member's lag per partition, as /v1/cluster?lag=true gives it (the server asks each member)
    lagged = call(server.url, "GET", "/v1/cluster?lag=true")[2]
    assert [m["url"] for m in lagged["members"]] == [watched.origin]
    lags = me.locator("[data-lag]").evaluate_all("els => els.map(e => e.dataset.lag)")
    assert lags == [str(lagged["members"][0]["lag"][str(p)]) for p in mine], lags
    expect(me).to_have_attribute("data-reachable", "true")
    expect(me.get_by_test_id("member-error")).to_have_count(0)
    owners_table = cluster.locator("table").filter(has_text="Partition owners")
    header = owners_table.locator("thead th").evaluate_all("els => els.map(e => e.textContent)")
    assert header == ["partition", "owner", "lag"], header
    lag_column = owners_table.locator("tbody tr td:nth-child(3)").evaluate_all("els => els.map(e => e.textContent)")
    assert lag_column == lags, lag_column  # the lag column of the owners table renders the same numbers
    expect(cluster.locator("[data-unowned]")).to_be_hidden()  # every partition has an owner
    expect(cluster).not_to_contain_text("null")
    shot(page, "ops")


def test_api_page_renders_the_openapi_document(watched: Watched, server: Server) -> None:
    page = watched.page
    page.goto(f"{watched.origin}/console/")
    page.get_by_test_id("nav-api").click()
    entries = page.get_by_test_id("api-path")
    expect(entries.first).to_be_visible(timeout=WAIT)
    document = call(server.url, "GET", "/openapi.json")[2]
    operations = sum(1 for item in document["paths"].values() for m in item if m in ("get", "put", "post", "delete"))
    expect(entries).to_have_count(operations)
    append_entry = page.locator(
        "[data-testid=api-path][data-method=PUT][data-path='/v1/conversations/{c}/appends/{a}']")
    expect(append_entry).to_contain_text("AppendBody")
    expect(append_entry).to_contain_text("ReceiptModel")
    # the append body's fields, its $ref into components.schemas resolved
    operation = document["paths"]["/v1/conversations/{c}/appends/{a}"]["put"]
    body_ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    body_schema = document["components"]["schemas"][body_ref.rsplit("/", 1)[-1]]
    body_block = append_entry.locator("[data-testid=api-schema][data-kind=request]")
    expect(body_block).to_have_count(1)
    expect(body_block).to_contain_text(body_ref.rsplit("/", 1)[-1])
    for name in body_schema["properties"]:
        expect(body_block.locator(f"tr[data-field='{name}']")).to_contain_text(name)
    required = body_schema["required"][0]
    expect(body_block.locator(f"tr[data-field='{required}'] td").nth(1)).to_have_text("yes")
    ok_block = append_entry.locator("[data-testid=api-schema][data-kind=response]")
    expect(ok_block).to_contain_text("ReceiptModel")
    expect(ok_block.locator("tr[data-field=digest]")).to_contain_text("string")
    # the append body's examples (engine/service/examples.py, each one a body the server accepts)
    examples = body_block.get_by_test_id("api-example")
    shown = operation["requestBody"]["content"]["application/json"]["examples"]
    expect(examples).to_have_count(len(shown))
    first = examples.filter(has_text=shown["append"]["summary"])
    expect(first).to_have_count(1)
    assert json.loads(first.locator("pre").inner_text()) == shown["append"]["value"]
    window = page.locator("[data-testid=api-path][data-method=GET][data-path='/v1/conversations/{c}/window']")
    expect(window.locator("tr", has_text="limit").locator("[data-example]")).to_have_text(" e.g. 20")
    messages = page.locator("[data-testid=api-path][data-method=GET][data-path='/v1/conversations/{c}/messages']")
    expect(messages).to_contain_text("include_hidden")
    expect(messages).to_contain_text("The stored messages of a conversation")
    shot(page, "api")


def test_token_prompt_then_the_page_loads(watched_token: Watched, token_server: Server) -> None:
    assert _raw(token_server.url, "/console/app.js")[0] == 200  # the console's files need no token
    assert call(token_server.url, "GET", "/v1/stats")[0] == 401  # the API keeps its auth
    assert call(token_server.url, "GET", "/v1/conversations/guarded%2F1/events")[0] == 401
    watched_token.allowed = ("status of 401",)  # the browser logs the 401 the prompt answers
    page = watched_token.page
    page.goto(f"{watched_token.origin}/console/")
    dialog = page.get_by_test_id("token-dialog")
    expect(dialog).to_be_visible(timeout=WAIT)
    shot(page, "token")
    page.get_by_label("Token", exact=True).fill("console-secret")
    page.get_by_test_id("token-save").click()
    expect(dialog).to_be_hidden()
    expect(page.locator("[data-testid=conversation-list] li[data-id='guarded/1']")).to_be_visible(timeout=WAIT)
    assert page.evaluate("() => sessionStorage.getItem('histlog-token')") == "console-secret"
    page.evaluate("() => sessionStorage.setItem('histlog-token', 'wrong')")  # a later 401 asks again
    page.get_by_test_id("nav-ops").click()
    expect(dialog).to_be_visible(timeout=WAIT)
    page.get_by_test_id("token-input").fill("console-secret")
    page.get_by_test_id("token-save").click()
    expect(page.get_by_test_id("stats")).to_contain_text("applied offset", timeout=WAIT)
