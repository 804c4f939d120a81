"""Deletes over a real socket, by raw HTTP (SERVICE.md, docs/service.md): ``POST
.../messages:delete`` with ``{"ids": [...]}`` deletes the visible messages it names from every
read and answers ``{"deleted": n}``; ids that name no visible message (unknown, hidden, already
deleted, malformed) count nothing, so a resend answers 0; an unknown conversation is 0, a cleared
one ``410 ConversationClosed``; ``?fence=EPOCH`` of a superseded run is ``409 Fenced``; every bad
body or query a 400 problem naming the field, with nothing deleted. The route is in
``/openapi.json`` and does not clash with ``.../messages/{m}/...`` nor ``.../messages:by-ids``."""

from __future__ import annotations

from typing import Any

import pytest

from tests.service.conftest import Served
from tests.service.server_support import call
from tests.service.test_http_errors import HI, problem

C = "/v1/conversations/c"
ANSWER = {"role": "assistant", "parts": [{"kind": "text", "text": "hello"}]}


def _delete(served: Served, body: Any, query: str = "", conversation: str = C) -> tuple[int, dict[str, str], Any]:
    return call(served.url, "POST", f"{conversation}/messages:delete{query}", body)


def _ids(served: Served, conversation: str = C) -> list[str]:
    return [m["id"] for m in call(served.url, "GET", f"{conversation}/messages")[2]["messages"]]


def _four(served: Served, conversation: str = C) -> None:
    for a in ("a1", "a2"):
        assert call(served.url, "PUT", f"{conversation}/appends/{a}", {"messages": [HI, ANSWER]})[0] == 200
    assert _ids(served, conversation) == ["a1/0", "a1/1", "a2/0", "a2/1"]


def test_a_delete_answers_how_many_and_every_read_leaves_them_out(served: Served) -> None:
    _four(served)
    status, head, body = _delete(served, {"ids": ["a1/1", "a2/1"]})
    assert (status, head.get("content-type"), body) == (200, "application/json", {"deleted": 2})
    assert _ids(served) == ["a1/0", "a2/0"]
    by_ids = call(served.url, "POST", f"{C}/messages:by-ids", {"ids": ["a1/0", "a1/1", "a2/1"]})[2]
    assert [m["id"] for m in by_ids["messages"]] == ["a1/0"]
    assert _delete(served, {"ids": ["a1/1", "a2/1"]})[:3:2] == (200, {"deleted": 0})  # again: a no-op


def test_ids_that_name_no_visible_message_count_nothing(served: Served) -> None:
    _four(served)
    body = {"ids": ["a1/1", "a1/1", "zz/0", "not-a-message-id", "a1/01", "a9/7"]}
    assert _delete(served, body)[:3:2] == (200, {"deleted": 1})  # a1/1 once, whatever repeats it
    assert _delete(served, {"ids": []})[:3:2] == (200, {"deleted": 0})
    replaced = {"messages": [HI, ANSWER], "replaces": {"turn_id": "a2/0", "reason": "retry"}}
    assert call(served.url, "PUT", f"{C}/appends/b1", replaced)[0] == 200  # a2's turn is hidden now
    assert _delete(served, {"ids": ["a2/0", "a2/1"]})[:3:2] == (200, {"deleted": 0})
    assert _ids(served) == ["a1/0", "b1/0", "b1/1"]


def test_an_unknown_conversation_is_0_and_a_cleared_one_is_closed(served: Served) -> None:
    assert _delete(served, {"ids": ["a1/0"]}, conversation="/v1/conversations/never")[:3:2] == (200, {"deleted": 0})
    _four(served)
    assert call(served.url, "DELETE", C)[0] == 204
    problem(_delete(served, {"ids": ["a1/0"]}), 410, "ConversationClosed")


def test_an_id_with_a_slash_routes_to_its_conversation(served: Served) -> None:
    bot = "/v1/conversations/bot-9%2Fu"
    _four(served, bot)
    assert _delete(served, {"ids": ["a1/0"]}, conversation=bot)[:3:2] == (200, {"deleted": 1})
    assert _ids(served, bot) == ["a1/1", "a2/0", "a2/1"]
    assert call(served.url, "GET", f"{bot}/messages:delete")[0] == 405  # POST only


def test_a_fence_of_a_superseded_run_is_fenced_and_deletes_nothing(served: Served) -> None:
    _four(served)
    assert call(served.url, "POST", f"{C}/runs/r1")[2]["epoch"] == 1
    assert _delete(served, {"ids": ["a1/1"]}, "?fence=1")[:3:2] == (200, {"deleted": 1})
    assert call(served.url, "POST", f"{C}/runs/r2")[2]["epoch"] == 2
    problem(_delete(served, {"ids": ["a2/1"]}, "?fence=1"), 409, "Fenced")
    problem(_delete(served, {"ids": ["a2/1"]}, "?fence=3"), 409, "Fenced", "epoch 3")  # no run has it
    assert _ids(served) == ["a1/0", "a2/0", "a2/1"]
    assert _delete(served, {"ids": ["a2/1"]}, "?fence=2")[:3:2] == (200, {"deleted": 1})
    assert _ids(served) == ["a1/0", "a2/0"]


@pytest.mark.parametrize(("body", "title", "words"), [
    ("{not json", "InvalidRequest", ("request body",)),
    ('["a1/0"]', "InvalidRequest", ("expected a JSON object", "ids")),
    ('"a1/0"', "InvalidRequest", ("expected a JSON object",)),
    ('{"ids": "a1/0"}', "InvalidRequest", ("ids",)),
    ('{"ids": {"a1/0": 1}}', "InvalidRequest", ("ids",)),
    ('{"ids": ["a1/0", 7]}', "InvalidRequest", ("ids[1]",)),
    ('{"ids": ["a1/0", null]}', "InvalidRequest", ("ids[1]",)),
    ('{"ids": ["a1/0"], "fence": 1}', "InvalidRequest", ("fence",)),
    ('{"ids": [], "more": 1}', "InvalidRequest", ("more",)),
    ("{}", "InvalidRequest", ("ids",)),
    ("", "InvalidRequest", ("request body",)),
    ('{"ids": [' + ",".join(['"a1/0"'] * 10_001) + "]}", "InvalidWindow", ("ids", "10000")),
])
def test_a_bad_body_is_a_400_naming_the_field_and_deletes_nothing(served: Served, body: str, title: str,
                                                                  words: tuple[str, ...]) -> None:
    _four(served)
    problem(_delete(served, body), 400, title, *words)
    assert _ids(served) == ["a1/0", "a1/1", "a2/0", "a2/1"]


@pytest.mark.parametrize(("query", "words"), [
    ("?fence=abc", ("query parameter fence", "int >= 1")), ("?fence=0", ("query parameter fence", "int >= 1")),
    ("?fence=-1", ("query parameter fence", "int >= 1")), ("?fence=", ("query parameter fence",)),
    ("?fence=1.5", ("query parameter fence",)), ("?fence=99999999999999999999", ("query parameter fence",)),
    ("?fence=1&fence=1", ("fence", "twice")), ("?epoch=1", ("'epoch'", "fence")),
])
def test_a_bad_fence_query_is_a_400_naming_it_and_deletes_nothing(served: Served, query: str,
                                                                   words: tuple[str, ...]) -> None:
    _four(served)
    assert call(served.url, "POST", f"{C}/runs/r1")[0] == 200
    problem(_delete(served, {"ids": ["a1/0"]}, query), 400, "InvalidRequest", *words)
    assert _ids(served) == ["a1/0", "a1/1", "a2/0", "a2/1"]


def test_a_bad_conversation_id_is_a_400(served: Served) -> None:
    problem(_delete(served, {"ids": ["a1/0"]}, conversation="/v1/conversations/%20c"), 400, "InvalidConversationID")


def test_openapi_documents_the_route(served: Served) -> None:
    doc = call(served.url, "GET", "/openapi.json")[2]
    op = doc["paths"]["/v1/conversations/{c}/messages:delete"]["post"]
    assert op["operationId"] == "delete_messages"
    assert {"200", "400", "409", "410"} <= set(op["responses"])
    assert op["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/DeletedOut"}
    assert op["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/IdsBody"}
    fence = next(p for p in op["parameters"] if p["name"] == "fence")
    assert fence["in"] == "query" and not fence["required"] and fence["schema"]["minimum"] == 1
    deleted = doc["components"]["schemas"]["DeletedOut"]
    assert deleted["properties"]["deleted"]["minimum"] == 0 and deleted["required"] == ["deleted"]
    assert "/v1/conversations/{c}/messages:by-ids" in doc["paths"]  # beside it, not instead of it
