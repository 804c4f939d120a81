"""Assets over a real socket, by raw HTTP (SERVICE.md, docs/service.md): ``PUT
.../messages/{m}/assets`` links refs and answers all the message's assets, every read of stored
messages carries ``"assets"``, the same refs again change nothing, another ref at a linked ordinal
is a 409 ``AppendConflict``, a message that is not visible a 404, and every bad body a 400 problem
naming the field, with nothing linked."""

from __future__ import annotations

from typing import Any

import pytest

from tests.service.conftest import Served
from tests.service.server_support import call
from tests.service.test_http_errors import HI, problem

C = "/v1/conversations/c"
IMAGE = {"content_hash": "sha256:" + "ab" * 32, "role": "image", "ordinal": 0, "mime": "image/png",
         "size_bytes": 2048, "storage_key": "media/cat.png", "name": "cat.png"}
THUMB = {"content_hash": "sha256:" + "cd" * 32, "role": "thumbnail", "ordinal": 1}


def _link(served: Served, message: str, *refs: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
    return call(served.url, "PUT", f"{C}/messages/{message.replace('/', '%2F')}/assets", {"assets": list(refs)})


def _assets(served: Served) -> list[list[dict[str, Any]] | None]:
    return [m.get("assets") for m in call(served.url, "GET", f"{C}/messages")[2]["messages"]]


def test_a_link_answers_the_messages_assets_and_every_read_carries_them(served: Served) -> None:
    assert call(served.url, "PUT", f"{C}/appends/a1", {"messages": [HI, HI]})[0] == 200
    status, head, body = _link(served, "a1/0", THUMB, IMAGE)
    assert (status, head.get("content-type"), body) == (200, "application/json", {"assets": [IMAGE, THUMB]})
    assert _link(served, "a1/0", IMAGE)[2] == {"assets": [IMAGE, THUMB]}  # the same ref again: no change
    assert _assets(served) == [[IMAGE, THUMB], None]
    by_ids = call(served.url, "POST", f"{C}/messages:by-ids", {"ids": ["a1/0"]})[2]["messages"]
    assert by_ids[0]["assets"] == [IMAGE, THUMB]
    turn = call(served.url, "GET", f"{C}/messages/a1%2F0/turn")[2]
    assert turn["messages"][0]["assets"] == [IMAGE, THUMB]


def test_a_conflict_a_hidden_or_unknown_message_and_a_cleared_conversation(served: Served) -> None:
    assert call(served.url, "PUT", f"{C}/appends/a1", {"messages": [HI]})[0] == 200
    assert _link(served, "a1/0", IMAGE)[0] == 200
    problem(_link(served, "a1/0", {**THUMB, "ordinal": 0}), 409, "AppendConflict", "ordinal 0")
    problem(_link(served, "zz/0", IMAGE), 404, "NotFound", "zz/0")
    replaced = {"messages": [HI], "replaces": {"turn_id": "a1/0", "reason": "edit"}}
    assert call(served.url, "PUT", f"{C}/appends/b1", replaced)[0] == 200
    problem(_link(served, "a1/0", THUMB), 404, "NotFound", "hidden")
    assert call(served.url, "DELETE", C)[0] == 204
    assert _link(served, "b1/0", IMAGE)[0] == 410


@pytest.mark.parametrize(("body", "field"), [
    ({}, "assets"), ({"assets": []}, "assets"), ({"assets": [IMAGE], "x": 1}, "x"),
    ({"assets": [{**IMAGE, "content_hash": "sha256:AB"}]}, "content_hash"),
    ({"assets": [{**IMAGE, "ordinal": -1}]}, "ordinal"), ({"assets": [{**IMAGE, "ordinal": "0"}]}, "ordinal"),
    ({"assets": [{**IMAGE, "ordinal": True}]}, "ordinal"), ({"assets": [{**IMAGE, "role": ""}]}, "role"),
    ({"assets": [{**IMAGE, "size_bytes": -5}]}, "size_bytes"), ({"assets": [{**IMAGE, "extra": 1}]}, "extra"),
    ({"assets": [{"role": "image", "ordinal": 0}]}, "content_hash"),
    ({"assets": [{**IMAGE, "mime": "a\u0000b"}]}, "mime"),
    ({"assets": [IMAGE, {**THUMB, "ordinal": 0}]}, "ordinal 0"),
    ({"assets": [IMAGE] * 1001}, "assets"),
])
def test_a_bad_body_is_a_400_naming_the_field_and_links_nothing(served: Served, body: dict[str, Any],
                                                                 field: str) -> None:
    assert call(served.url, "PUT", f"{C}/appends/a1", {"messages": [HI]})[0] == 200
    problem(call(served.url, "PUT", f"{C}/messages/a1%2F0/assets", body), 400, "InvalidRequest", field)
    problem(call(served.url, "PUT", f"{C}/messages/a1%2F0/assets", "{not json"), 400, "InvalidRequest", "JSON")
    problem(_link(served, "not-a-message-id", IMAGE), 400, "InvalidRequest", "message_id")
    assert _assets(served) == [None]


def test_openapi_documents_the_route(served: Served) -> None:
    doc = call(served.url, "GET", "/openapi.json")[2]
    op = doc["paths"]["/v1/conversations/{c}/messages/{m}/assets"]["put"]
    assert op["operationId"] == "link_assets" and {"200", "404", "409"} <= set(op["responses"])
    assert "AssetModel" in doc["components"]["schemas"]
