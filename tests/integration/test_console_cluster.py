"""The console (docs/console.md) against a real cluster: two ``histlog serve --group`` members as
subprocesses on a real Kafka broker, six partitions, member 1's console in headless Chromium
(``tests.console.browser_support``).

* The Operations page lists both members (this server first and marked), each with exactly the
  partitions the agreed map gives it and a lag on every one of them: member 2's lag comes through
  member 1 (``GET /v1/cluster?lag=true``), since the page talks to its own origin only.
* A conversation owned by member 2, opened through member 1's console (member 1 forwards its
  reads and its event stream), shows an append made through member 2 live.
* No request of the page left member 1's origin, and it logged no error.

Every member is killed at the end; waits are bounded (Playwright's ``expect``, ``wait_until``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from engine import HistoryEngine
from schemas.records import partition_for_key, record_key
from tests.console.browser_support import Watched, launched, watch
from tests.integration.cluster_support import PARTITIONS, MemberProcess, get_json, start_all, wait_until, whole_map
from tests.kafka_broker import unique_topic

try:
    from playwright.sync_api import expect
except ImportError:  # skipped like the browser, a failure under CI
    if os.environ.get("CI", "").lower() == "true":
        raise
    pytest.skip("playwright is not installed", allow_module_level=True)

pytestmark = pytest.mark.kafka

JOIN_S = 60.0  # bound on two members starting and agreeing on one map
WAIT = 15_000  # ms: every browser wait is bounded


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Chromium for this module only (never a session: see tests.console.browser_support)."""
    with launched() as chromium:
        yield chromium


@pytest.fixture
def members(kafka_bootstrap: str, tmp_path: Path) -> Iterator[list[MemberProcess]]:
    """Two members of one new group on a new topic of six partitions, agreed on a whole map."""
    topic, group = unique_topic("console-cluster"), unique_topic("console-group")
    HistoryEngine.open(kafka=kafka_bootstrap, topic=topic, state_dir=tmp_path / "creator",
                       partitions=PARTITIONS).close()
    started = [MemberProcess(f"m{i}", kafka_bootstrap, topic, group, tmp_path / f"m{i}", tmp_path / f"m{i}.log")
               for i in (1, 2)]
    try:
        start_all(started, JOIN_S)
        wait_until(lambda: whole_map(started), JOIN_S, "two members agree on one map of every partition")
        yield started
    finally:
        for m in started:
            m.stop()


@pytest.fixture
def watched(members: list[MemberProcess], browser: Any) -> Iterator[Watched]:
    """A page on member 1's origin; after the test, no request left it and nothing was logged as an error."""
    yield from watch(browser, members[0].url)


def _owned_by(url: str, owners: dict[int, str]) -> str:
    """A conversation id whose partition (the log's partitioner) ``url`` owns."""
    for i in range(10_000):
        c = f"console/{i}"
        if owners[partition_for_key(record_key(c), PARTITIONS)] == url:
            return c
    raise AssertionError(f"no conversation id on a partition of {url} among 10,000")


def _append(url: str, c: str, a: str, *texts: tuple[str, str]) -> None:
    body = {"messages": [{"role": role, "parts": [{"kind": "text", "text": t}]} for role, t in texts]}
    answer = httpx.put(f"{url}/v1/conversations/{quote(c, safe='')}/appends/{a}", json=body, timeout=30.0)
    assert answer.status_code == 200, answer.text


def test_member_1_console_shows_both_members_lag_and_a_forwarded_live_conversation(
        members: list[MemberProcess], watched: Watched) -> None:
    one, two = members
    owners = whole_map(members)
    mine = {m.url: sorted(p for p, u in owners.items() if u == m.url) for m in members}
    assert all(mine.values()), f"each of two members on six partitions owns some: {mine}"
    c = _owned_by(two.url, owners)
    _append(two.url, c, "t1", ("user", "first question"), ("assistant", "first answer"))
    lagged = get_json(one.url, "/v1/cluster?lag=true")
    assert [(m["url"], m["partitions"], m["reachable"]) for m in lagged["members"]] == \
        sorted((m.url, mine[m.url], True) for m in members), lagged

    page = watched.page
    page.goto(f"{one.url}/console/#/ops")
    cluster = page.get_by_test_id("cluster")
    listed = cluster.get_by_test_id("member")
    expect(listed).to_have_count(2, timeout=WAIT)
    expect(listed.first).to_have_attribute("data-url", one.url)  # this server first
    expect(listed.first).to_have_attribute("data-self", "true")
    for m in members:
        row = cluster.locator(f"[data-testid=member][data-url='{m.url}']")
        expect(row).to_have_attribute("data-reachable", "true", timeout=WAIT)
        expect(row.locator("a").first).to_have_attribute("href", f"{m.url}/console/")
        partitions = row.locator("[data-partition]")
        expect(partitions).to_have_count(len(mine[m.url]))
        assert [int(p) for p in partitions.evaluate_all("els => els.map(e => e.dataset.partition)")] == mine[m.url]
        lags = row.locator("[data-lag]")
        expect(lags).to_have_count(len(mine[m.url]))  # a lag on every partition, member 2's included
        assert all(v.isdigit() for v in lags.evaluate_all("els => els.map(e => e.dataset.lag)"))
    expect(cluster.get_by_test_id("member-error")).to_have_count(0)
    other = cluster.locator(f"[data-testid=member][data-url='{two.url}'] a").first
    other.focus()  # a real link: the keyboard reaches it (and it is never fetched from here)
    expect(other).to_be_focused()

    # member 2's conversation through member 1's console: member 1 forwards the reads and the stream
    page.goto(f"{one.url}/console/#/c/{quote(c, safe='')}")
    turns = page.get_by_test_id("turns")
    expect(turns).to_contain_text("first answer", timeout=WAIT)
    page.wait_for_function("() => window.__histlog && window.__histlog.firstPageMs > 0", timeout=WAIT)
    # the stream resumes from the newest message shown (after=T:S): an append made before it is
    # connected arrives through its catch-up, so there is no race to wait out
    _append(two.url, c, "t2", ("user", "are you there?"), ("assistant", "live through member 2"))
    expect(turns).to_contain_text("live through member 2", timeout=WAIT)
    expect(page.get_by_test_id("turn").first).to_contain_text("are you there?")
    expect(page.get_by_test_id("message")).to_have_count(4)
    assert any("/events" in u for u in watched.requests), watched.requests
