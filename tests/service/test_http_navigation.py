"""History navigation over a real socket (raw ``http.client``): ``order``, ``since`` and ``until``
on ``/messages``, ``prefix`` pages of ``/conversations``, ``/messages/{m}/position`` and
``/external/{external_id}``, and a 400 problem naming the parameter for each malformed value."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import pytest

from tests.service.conftest import Served
from tests.service.server_support import call
from tests.service.test_http_errors import problem
from tests.service.test_http_routes import put, text

C = "bot-7/chat é"
PATH = "/v1/conversations/" + quote(C, safe="")


@pytest.fixture
def chat(served: Served) -> Served:
    """Four turns; each user message carries a platform's id (``tg/1`` has a slash on purpose)."""
    for i in range(4):
        status, _ = put(served, f"a{i}", text("user", f"q{i}", external_id=f"tg/{i}"), text("assistant", f"r{i}"),
                        c=C)
        assert status == 200
    return served


def ids(body: Any) -> list[str]:
    return [m["id"] for m in body["messages"]]


def test_newest_first_pages(chat: Served) -> None:
    status, _, page = call(chat.url, "GET", PATH + "/messages?order=desc&limit=3")
    assert status == 200 and ids(page) == ["a3/1", "a3/0", "a2/1"]
    last = page["messages"][-1]["position"]
    _, _, older = call(chat.url, "GET", PATH + f"/messages?order=desc&limit=3&before={last}")
    assert ids(older) == ["a2/0", "a1/1", "a1/0"]
    _, _, oldest = call(chat.url, "GET", PATH + "/messages?order=asc&limit=1")
    assert ids(oldest) == ["a0/0"]


def test_time_ranges(chat: Served) -> None:
    rows = call(chat.url, "GET", PATH + "/messages")[2]["messages"]
    t = rows[4]["created_at"]  # a2's time, "...Z"
    _, _, since = call(chat.url, "GET", PATH + f"/messages?since={quote(t)}")
    assert ids(since) == [r["id"] for r in rows if r["created_at"] >= t]
    _, _, until = call(chat.url, "GET", PATH + f"/messages?until={quote(t)}&order=desc&limit=2")
    assert ids(until) == [r["id"] for r in rows if r["created_at"] < t][::-1][:2]
    offset = t.replace("Z", "+00:00")  # any offset names the same instant
    assert call(chat.url, "GET", PATH + f"/messages?since={quote(offset)}")[2] == since


def test_position_and_locate(chat: Served) -> None:
    rows = call(chat.url, "GET", PATH + "/messages")[2]["messages"]
    status, _, body = call(chat.url, "GET", PATH + "/messages/a2%2F1/position")
    assert (status, body) == (200, {"position": rows[5]["position"]})
    status, _, found = call(chat.url, "GET", PATH + "/external/" + quote("tg/2", safe="") + "?before=1&after=2")
    assert status == 200
    assert (found["message"]["id"], ids({"messages": found["before"]}), ids({"messages": found["after"]})) == \
        ("a2/0", ["a1/1"], ["a2/1", "a3/0"])
    assert call(chat.url, "GET", PATH + "/external/tg%2F2")[2]["before"] == []
    problem(call(chat.url, "GET", PATH + "/external/tg%2F9"), 404, "NotFound", "external_id")
    problem(call(chat.url, "GET", PATH + "/messages/a9%2F0/position"), 404, "NotFound")


def test_prefix_pages(served: Served) -> None:
    for c in ("bot-1/a", "bot-1/b", "bot-1/c", "bot-10/a", "bot-2/a"):
        assert put(served, "x", text("user", "hi"), c=c)[0] == 200
    call(served.url, "DELETE", "/v1/conversations/" + quote("bot-1/b", safe=""))
    _, _, page = call(served.url, "GET", "/v1/conversations?prefix=bot-1%2F&limit=1")
    assert page == {"conversations": ["bot-1/a"], "next": "bot-1/a"}
    _, _, rest = call(served.url, "GET", "/v1/conversations?prefix=bot-1%2F&limit=1&after=bot-1%2Fa")
    assert rest == {"conversations": ["bot-1/c"], "next": None}  # the cleared one is not listed
    _, _, every = call(served.url, "GET", "/v1/conversations?prefix=bot-1")
    assert every == {"conversations": ["bot-1/a", "bot-1/c", "bot-10/a"], "next": None}


@pytest.mark.parametrize(("query", "name"), [
    ("order=newest", "order"),
    ("order=DESC", "order"),
    ("since=yesterday", "since"),
    ("since=2025-01-01T00:00:00", "since"),  # no timezone: no instant
    ("until=2025-13-01T00:00:00Z", "until"),
    ("until=", "until"),
    ("order=desc&order=asc", "order"),
])
def test_malformed_navigation_parameters_are_a_400_naming_them(chat: Served, query: str, name: str) -> None:
    problem(call(chat.url, "GET", PATH + "/messages?" + query), 400, "InvalidRequest", name)


@pytest.mark.parametrize(("path", "name"), [
    ("/external/tg%2F1?before=-1", "before"),
    ("/external/tg%2F1?after=x", "after"),
    ("/external/tg%2F1?around=2", "around"),
])
def test_malformed_locate_parameters_are_a_400_naming_them(chat: Served, path: str, name: str) -> None:
    problem(call(chat.url, "GET", PATH + path), 400, "InvalidRequest", name)


@pytest.mark.parametrize(("query", "title", "word"), [
    ("prefix=bot%07", "InvalidConversationID", "control character"),
    ("after=%20x", "InvalidConversationID", "whitespace"),
])
def test_bad_conversation_pages_are_a_400(served: Served, query: str, title: str, word: str) -> None:
    problem(call(served.url, "GET", "/v1/conversations?" + query), 400, title, word)
