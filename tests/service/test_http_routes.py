"""Every route of SERVICE.md over a real socket (raw ``http.client``), answering its success form.

Ids travel as one percent-encoded segment: the conversation ids here hold ``/``, a space and
``é`` on purpose (the server routes on the raw path).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any
from urllib.parse import quote

import pytest

from schemas.batch import Receipt
from tests.service.conftest import Served
from tests.service.server_support import call

C = "team/\u03c9 bot é"
PATH = "/v1/conversations/" + quote(C, safe="")


def text(role: str, words: str, **metadata: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": role, "parts": [{"kind": "text", "text": words}]}
    if metadata:
        message["metadata"] = metadata
    return message


def put(served: Served, append_id: str, *messages: dict[str, Any], c: str = C, **extra: Any) -> tuple[int, Any]:
    path = "/v1/conversations/" + quote(c, safe="") + "/appends/" + quote(append_id, safe="")
    status, _, body = call(served.url, "PUT", path, {"messages": list(messages), **extra})
    return status, body


@pytest.fixture
def history(served: Served) -> Served:
    """Two turns in C: a system message, then user/assistant twice."""
    assert put(served, "a/1", text("system", "be brief"), text("user", "hi"), text("assistant", "hello"))[0] == 200
    assert put(served, "a/2", text("user", "how are you?"), text("assistant", "fine"))[0] == 200
    return served


def test_append_returns_the_receipt_and_an_identical_retry_the_same_one(served: Served) -> None:
    status, first = put(served, "x 1/é", text("user", "hi"))
    assert status == 200
    receipt = Receipt.from_dict(first)
    assert (receipt.conversation_id, receipt.append_id) == (C, "x 1/é")
    assert put(served, "x 1/é", text("user", "hi")) == (200, first)
    assert served.engine.read(C) == [m.message for m in served.engine.entries(C)]


def test_append_with_expected_last_empty_then_the_last_receipt(served: Served) -> None:
    status, first = put(served, "a", text("user", "one"), expected_last="empty")
    assert status == 200
    assert put(served, "b", text("user", "two"), expected_last=first)[0] == 200


def test_messages_lists_stored_messages_and_filters(history: Served) -> None:
    status, head, body = call(history.url, "GET", PATH + "/messages")
    assert (status, head["content-type"]) == (200, "application/json")
    rows = body["messages"]
    assert [r["message"]["parts"][0]["text"] for r in rows] == ["be brief", "hi", "hello", "how are you?", "fine"]
    assert rows[0]["created_at"].endswith("Z") and rows[0]["append_id"] == "a/1"
    after = rows[2]["position"]
    _, _, later = call(history.url, "GET", PATH + f"/messages?after={after}&limit=1&include_hidden=false")
    assert [r["id"] for r in later["messages"]] == [rows[3]["id"]]
    _, _, before = call(history.url, "GET", PATH + f"/messages?before={rows[1]['position']}")
    assert [r["id"] for r in before["messages"]] == [rows[0]["id"]]


def test_messages_at_least_a_receipt_position_reads_the_write(served: Served) -> None:
    _, receipt = put(served, "a", text("user", "one"))
    pos = receipt["position"]
    status, _, body = call(served.url, "GET", PATH + f"/messages?at_least={pos['partition']}:{pos['offset']}")
    assert status == 200 and len(body["messages"]) == 1


def test_window_returns_messages(history: Served) -> None:
    status, _, body = call(history.url, "GET", PATH + "/window?limit=3")
    assert status == 200
    assert body == {"messages": [text("system", "be brief"), text("user", "how are you?"), text("assistant", "fine")]}


def test_budget_and_turn_sources_and_measure(history: Served) -> None:
    status, _, load = call(history.url, "GET", PATH + "/budget?max_bytes=1000000&unit=message")
    assert status == 200 and load["truncated"] is False and len(load["messages"]) == 5
    _, _, small = call(history.url, "GET", PATH + "/budget?max_bytes=1")
    assert small["truncated"] is True
    status, _, sources = call(history.url, "GET", PATH + "/turn-sources?max_bytes=1000000")
    assert status == 200 and sources["truncated"] is False
    assert sources["sources"][1]["content"] == {"parts": [{"kind": "text", "text": "hi"}], "role": "user"}
    assert set(sources["sources"][1]) == {"id", "role", "content", "created_at", "interrupted"}
    status, _, measure = call(history.url, "GET", PATH + "/measure")
    assert (status, measure) == (200, asdict(history.engine.measure(C)))


def test_turns_latest_and_turn_of_a_message(history: Served) -> None:
    status, _, latest = call(history.url, "GET", PATH + "/turns/latest")
    assert status == 200
    turn = latest["turn"]
    assert turn["request_message_id"] == turn["id"] == "a/2/0" and turn["assistant_message_id"] == "a/2/1"
    status, _, same = call(history.url, "GET", PATH + "/messages/" + quote("a/2/1", safe="") + "/turn")
    assert (status, same) == (200, turn)
    _, _, empty = call(history.url, "GET", "/v1/conversations/nobody/turns/latest")
    assert empty == {"turn": None}


def test_replace_turn_hides_the_old_one(history: Served) -> None:
    status, _ = put(history, "r", text("user", "how are you?"), text("assistant", "great"),
                    replaces={"turn_id": "a/2/0", "reason": "retry"})
    assert status == 200
    _, _, window = call(history.url, "GET", PATH + "/window?limit=10")
    assert window["messages"][-1] == text("assistant", "great")
    _, _, rows = call(history.url, "GET", PATH + "/messages?include_hidden=true")
    hidden = [r for r in rows["messages"] if "superseded_by" in r]
    assert {r["reason"] for r in hidden} == {"retry"} and len(hidden) == 2


def test_interrupted_checkpoint(served: Served) -> None:
    _, _, none = call(served.url, "GET", PATH + "/interrupted-checkpoint")
    assert none == {"message": None}
    put(served, "a", text("user", "go"), text("assistant", "half", interrupted=True))
    status, _, body = call(served.url, "GET", PATH + "/interrupted-checkpoint")
    assert status == 200 and body["message"]["message"] == text("assistant", "half", interrupted=True)


def test_conversations_pages_lexically(served: Served) -> None:
    for c in ("b", "a/1", "a/2", "c"):
        put(served, "x", text("user", "hi"), c=c)
    status, _, page = call(served.url, "GET", "/v1/conversations?limit=2")
    assert (status, page) == (200, {"conversations": ["a/1", "a/2"], "next": "a/2"})
    _, _, rest = call(served.url, "GET", "/v1/conversations?limit=2&after=a%2F2")
    assert rest == {"conversations": ["b", "c"], "next": None}
    _, _, prefixed = call(served.url, "GET", "/v1/conversations?prefix=a%2F")
    assert prefixed == {"conversations": ["a/1", "a/2"], "next": None}


def test_delete_clears_and_is_idempotent(history: Served) -> None:
    for _ in range(2):
        status, _, body = call(history.url, "DELETE", PATH)
        assert (status, body) == (204, None)
    _, _, listed = call(history.url, "GET", "/v1/conversations")
    assert C not in listed["conversations"]


def test_stats_is_the_cli_json_object(history: Served) -> None:
    status, _, stats = call(history.url, "GET", "/v1/stats")
    assert status == 200
    assert stats["accepted"] == 2 and stats["poison"] == [] and stats["end_offsets"] == [2]


def test_openapi_json_is_served(served: Served) -> None:
    status, _, doc = call(served.url, "GET", "/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.1")
