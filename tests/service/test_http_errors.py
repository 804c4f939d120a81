"""Every error status a route can give, over a real socket: the status, an
``application/problem+json`` body naming the histlog error class, and a detail that names the
field at fault. Bad input is never a 500 and no body holds a traceback."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import Response

from engine.facade import HistoryEngine
from engine.service import routes
from engine.service.routes import Context, Op
from tests.service.conftest import Served
from tests.service.server_support import call, serving

HI = {"role": "user", "parts": [{"kind": "text", "text": "hi"}]}
APPEND = "/v1/conversations/c/appends/a1"


def problem(result: tuple[int, dict[str, str], Any], status: int, title: str, *words: str) -> str:
    got_status, head, body = result
    assert (got_status, head.get("content-type"), body["title"], body["status"]) == (
        status, "application/problem+json", title, status), body
    assert body["type"] == f"urn:histlog:error:{title}"
    detail: str = body["detail"]
    assert "\n" not in detail and "Traceback" not in detail
    for word in words:
        assert word in detail, (word, detail)
    return detail


@pytest.mark.parametrize(("body", "title", "words"), [
    ("{not json", "InvalidRequest", ("request body", "invalid JSON")),
    ("[1, 2]", "InvalidRequest", ("expected a JSON object",)),
    ('{"messages": [], "extra": 1}', "InvalidRequest", ("extra", "unknown member")),
    ('{"messages": {}}', "InvalidBatch", ("messages",)),
    ('{"messages": [{"role": "user", "parts": [{"kind": "text", "text": "a"}]}, '
     '{"role": "user", "parts": [{"kind": "text", "text": 5}]}]}', "InvalidBatch", ("messages[1].parts[0].text",)),
    ('{"messages": [{"role": "robot", "parts": [{"kind": "text", "text": "a"}]}]}', "InvalidBatch",
     ("messages[0].role",)),
    ('{"messages": []}', "InvalidBatch", ("no messages",)),
    ('{"messages": [' + '{"role":"user","parts":[{"kind":"text","text":"a"}]}' + '], "expected_last": "full"}',
     "InvalidRequest", ("expected_last",)),
    ('{"messages": [' + '{"role":"user","parts":[{"kind":"text","text":"a"}]}' + '], "expected_last": '
     '{"conversation_id": "c", "append_id": "a", "digest": "sha256:' + "0" * 64 + '", '
     '"position": {"partition": -1, "offset": 0}}}', "InvalidRequest", ("expected_last", "partition")),
    ('{"messages": [' + '{"role":"user","parts":[{"kind":"text","text":"a"}]}' + '], "replaces": '
     '{"turn_id": "t", "reason": "whim"}}', "InvalidBatch", ("replaces.reason",)),  # as replace_turn's
    ('{"messages": [' + '{"role":"user","parts":[{"kind":"text","text":"a"}]}' + '], "replaces": '
     '{"turn_id": 7, "reason": "edit"}}', "InvalidBatch", ("replaces.turn_id",)),
    ('{"messages": [' + '{"role":"user","parts":[{"kind":"text","text":"a"}]}' + '], "replaces": '
     '{"turn_id": "t", "reason": "edit", "why": 1}}', "InvalidRequest", ("replaces.why",)),
    ('{"messages": [' + '{"role":"user","parts":[{"kind":"text","text":"a"}]}' + '], "replaces": '
     '{"turn_id": "t", "reason": "edit"}, "expected_last": "empty"}', "InvalidRequest", ("not both",)),
    (b'{"messages": "\xff"}', "InvalidRequest", ("UTF-8",)),
    # numbers no double holds, wherever they are in the envelope
    ('{"messages": [' + '{"role":"user","parts":[{"kind":"text","text":"a"}]}' + '], "expected_last": 1e999}',
     "InvalidRequest", ("expected_last", "1e999", "out of range")),
    ('{"messages": [' + '{"role":"user","parts":[{"kind":"text","text":"a"}]}' + '], "expected_last": -1e999}',
     "InvalidRequest", ("expected_last", "-1e999", "out of range")),
    ('{"messages": [' + '{"role":"user","parts":[{"kind":"text","text":"a"}]}' + '], "expected_last": '
     + "9" * 400 + '}', "InvalidRequest", ("expected_last", "400 characters", "out of range")),
    ('{"messages": [' + '{"role":"user","parts":[{"kind":"text","text":"a"}]}' + '], "replaces": '
     '{"turn_id": "t", "reason": 1e999}}', "InvalidRequest", ("replaces.reason", "out of range")),
    ('{"messages": [' + '{"role":"user","parts":[{"kind":"text","text":"a"}]}' + '], "expected_last": '
     '{"conversation_id": "c", "append_id": "a", "digest": "sha256:' + "0" * 64 + '", '
     '"position": {"partition": 0, "offset": 1e999}}}', "InvalidRequest", ("expected_last.position.offset",)),
    ('{"messages": [' + '{"role":"user","parts":[{"kind":"text","text":"a"}]}' + '], "unknown": [1, 1e999]}',
     "InvalidRequest", ("unknown[1]", "out of range")),
])
def test_a_bad_append_body_is_a_400_naming_the_field(served: Served, body: str | bytes, title: str,
                                                      words: tuple[str, ...]) -> None:
    problem(call(served.url, "PUT", APPEND, body), 400, title, *words)


BY_IDS = "/v1/conversations/c/messages:by-ids"


@pytest.mark.parametrize(("path", "body", "title", "words"), [
    (BY_IDS, "{not json", "InvalidRequest", ("request body",)),
    (BY_IDS, '["a/0"]', "InvalidRequest", ("expected a JSON object",)),
    (BY_IDS, '{"ids": "a/0"}', "InvalidRequest", ("ids",)),
    (BY_IDS, '{"ids": ["a/0", 7]}', "InvalidRequest", ("ids[1]",)),
    (BY_IDS, '{"ids": [], "more": 1}', "InvalidRequest", ("more",)),
    (BY_IDS, '{}', "InvalidRequest", ("ids",)),
    (BY_IDS, '{"ids": [' + ",".join(['"x/0"'] * 10_001) + ']}', "InvalidWindow", ("ids", "10000")),
    (BY_IDS + "?view=all", '{"ids": []}', "InvalidRequest", ("query parameter view", "turn-sources")),
    ("/v1/conversations:clear", '{"prefix": ""}', "InvalidConversationID", ("non-empty prefix",)),
    ("/v1/conversations:clear", '{"prefix": 7}', "InvalidRequest", ("prefix",)),
    ("/v1/conversations:clear", '{"prefix": " bot"}', "InvalidConversationID", ("whitespace",)),
    ("/v1/conversations:clear", '{}', "InvalidRequest", ("prefix",)),
])
def test_a_bad_by_ids_or_clear_prefix_body_is_a_400_naming_the_field(served: Served, path: str, body: str,
                                                                     title: str, words: tuple[str, ...]) -> None:
    problem(call(served.url, "POST", path, body), 400, title, *words)


def test_by_ids_and_clear_prefix_answer_as_the_engine(served: Served) -> None:
    assert call(served.url, "PUT", "/v1/conversations/bot-9%2Fu/appends/a1", {"messages": [HI, HI]})[0] == 200
    status, _, body = call(served.url, "POST", "/v1/conversations/bot-9%2Fu/messages:by-ids",
                           {"ids": ["a1/1", "zz/0", "a1/0", "a1/1"]})
    assert status == 200 and [m["id"] for m in body["messages"]] == ["a1/0", "a1/1"]
    status, _, body = call(served.url, "POST", "/v1/conversations/bot-9%2Fu/messages:by-ids?view=turn-sources",
                           {"ids": ["a1/1"]})
    assert status == 200 and [s["id"] for s in body["sources"]] == ["a1/1"] and body["sources"][0]["content"]
    for cleared in (1, 0):  # idempotent
        status, _, body = call(served.url, "POST", "/v1/conversations:clear", {"prefix": "bot-9/"})
        assert (status, body) == (200, {"cleared": cleared})
    assert call(served.url, "PUT", "/v1/conversations/bot-9%2Fu/appends/a2", {"messages": [HI]})[0] == 410


@pytest.mark.parametrize(("path", "title", "words"), [
    ("/v1/conversations/%20c/appends/a1", "InvalidConversationID", ("whitespace",)),
    ("/v1/conversations/c%01/appends/a1", "InvalidConversationID", ("control character",)),
    ("/v1/conversations/c/appends/" + "x" * 1100, "InvalidAppendID", ("longer than",)),
    ("/v1/conversations/%FF/appends/a1", "InvalidRequest", ("path segment c", "UTF-8")),
])
def test_invalid_ids_in_the_path_are_a_400(served: Served, path: str, title: str, words: tuple[str, ...]) -> None:
    problem(call(served.url, "PUT", path, {"messages": [HI]}), 400, title, *words)


@pytest.mark.parametrize(("query", "words"), [
    ("limit=x", ("query parameter limit", "expected an int >= 0", "'x'")),
    ("limit=-1", ("query parameter limit",)),
    ("limit=99999999999999999999", ("query parameter limit",)),
    ("after=3", ("query parameter after", "TURN:SEQ")),
    ("before=a:b", ("query parameter before",)),
    ("include_hidden=yes", ("query parameter include_hidden", "true or false")),
    ("at_least=0", ("query parameter at_least", "PARTITION:OFFSET")),
    ("at_least=0:99999999999999999999", ("query parameter at_least", "out of range")),
    ("colour=red", ("'colour'", "unknown")),
    ("limit=1&limit=2", ("given twice",)),
    ("after=%FF", ("not UTF-8",)),
    ("after=1%3A2%3A3", ("query parameter after",)),
    ("at_least=%D9%A3:0", ("query parameter at_least",)),
    ("after=%D9%A3:1", ("query parameter after",)),
])
def test_bad_query_parameters_are_a_400_naming_them(served: Served, query: str, words: tuple[str, ...]) -> None:
    problem(call(served.url, "GET", "/v1/conversations/c/messages?" + query), 400, "InvalidRequest", *words)


@pytest.mark.parametrize("path", [
    "/v1/conversations/c/window", "/v1/conversations/c/budget", "/v1/conversations/c/turn-sources"])
def test_a_missing_required_parameter_is_a_400(served: Served, path: str) -> None:
    problem(call(served.url, "GET", path), 400, "InvalidRequest", "missing")


def test_window_limit_zero_and_bad_unit_are_400(served: Served) -> None:
    problem(call(served.url, "GET", "/v1/conversations/c/window?limit=0"), 400, "InvalidRequest", "limit")
    problem(call(served.url, "GET", "/v1/conversations/c/budget?max_bytes=5&unit=word"), 400, "InvalidRequest",
            "unit")


def test_a_read_with_an_invalid_conversation_id_is_a_400(served: Served) -> None:
    problem(call(served.url, "GET", "/v1/conversations/%20x/messages"), 400, "InvalidConversationID")


def test_at_least_on_a_partition_the_log_lacks_is_a_400(served: Served) -> None:
    problem(call(served.url, "GET", "/v1/conversations/c/window?limit=3&at_least=7:0"), 400, "InvalidReceipt",
            "partition 7")


def test_at_least_never_applied_is_a_503_with_retry_after(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(routes, "AT_LEAST_TIMEOUT", 0.2)
    result = call(served.url, "GET", "/v1/conversations/c/messages?at_least=0:1000")
    problem(result, 503, "LogUnavailable", "0:1000")
    assert result[1]["retry-after"] == "1"


def test_unknown_message_turn_is_404_and_unknown_route_is_404(served: Served) -> None:
    call(served.url, "PUT", APPEND, {"messages": [HI]})
    problem(call(served.url, "GET", "/v1/conversations/c/messages/nope/turn"), 404, "NotFound")
    problem(call(served.url, "GET", "/v1/nothing"), 404, "NotFound", "/v1/nothing")


def test_a_wrong_method_is_a_405_problem(served: Served) -> None:
    result = call(served.url, "POST", "/v1/stats")
    problem(result, 405, "InvalidRequest")
    assert "GET" in result[1]["allow"]


def test_the_same_append_id_with_other_content_is_a_409(served: Served) -> None:
    assert call(served.url, "PUT", APPEND, {"messages": [HI]})[0] == 200
    other = {"role": "user", "parts": [{"kind": "text", "text": "other"}]}
    problem(call(served.url, "PUT", APPEND, {"messages": [other]}), 409, "AppendConflict")


def test_replacing_a_turn_that_is_not_the_latest_is_a_409(served: Served) -> None:
    call(served.url, "PUT", "/v1/conversations/c/appends/a1", {"messages": [HI]})
    call(served.url, "PUT", "/v1/conversations/c/appends/a2", {"messages": [HI]})
    body = {"messages": [HI], "replaces": {"turn_id": "a1/0", "reason": "edit"}}
    problem(call(served.url, "PUT", "/v1/conversations/c/appends/r", body), 409, "TurnNotReplaceable")


def test_appending_to_a_cleared_conversation_is_a_410(served: Served) -> None:
    assert call(served.url, "DELETE", "/v1/conversations/c")[0] == 204
    problem(call(served.url, "PUT", APPEND, {"messages": [HI]}), 410, "ConversationClosed")


def test_expected_last_that_does_not_match_is_a_412(served: Served) -> None:
    call(served.url, "PUT", APPEND, {"messages": [HI]})
    body = {"messages": [HI], "expected_last": "empty"}
    problem(call(served.url, "PUT", "/v1/conversations/c/appends/a2", body), 412, "PreconditionFailed")


def test_a_window_smaller_than_the_latest_turn_is_a_422(served: Served) -> None:
    answer = {"role": "assistant", "parts": [{"kind": "text", "text": "yo"}]}
    call(served.url, "PUT", APPEND, {"messages": [HI, answer]})
    problem(call(served.url, "GET", "/v1/conversations/c/window?limit=1"), 422, "WindowTooSmall")


@pytest.fixture
def small(engine: HistoryEngine) -> Iterator[str]:
    """A server whose body limit is 200 bytes."""
    with serving(engine, max_body=200) as url:
        yield url


def test_a_body_over_the_limit_is_a_413(small: str) -> None:
    big = {"messages": [{"role": "user", "parts": [{"kind": "text", "text": "x" * 300}]}]}
    problem(call(small, "PUT", APPEND, big), 413, "InvalidBatch", "200 bytes")


def test_a_chunked_body_over_the_limit_is_a_413_without_reading_it_all(small: str) -> None:
    host, port = small.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(f"PUT {APPEND} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
        chunk = b"x" * 150
        for _ in range(3):  # 450 bytes in three chunks: the server stops at the second
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        head = sock.recv(4096)
    assert head.startswith(b"HTTP/1.1 413 ") and b"application/problem+json" in head


def test_an_unexpected_failure_is_a_500_with_one_line_and_no_traceback(engine: HistoryEngine) -> None:
    async def boom(request: Request, ctx: Context, query: dict[str, Any]) -> Response:
        raise RuntimeError("boom\n  at line 2")

    op = Op("GET", "/v1/boom", "boom", "always fails", boom, (200, None))
    with serving(engine, extra_ops=[op]) as url:
        problem(call(url, "GET", "/v1/boom"), 500, "HistoryError", "boom at line 2")


@pytest.fixture
def guarded(engine: HistoryEngine) -> Iterator[str]:
    with serving(engine, token="s3cret") as url:
        yield url


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"},
                                     {"Authorization": "Bearer s3cret2"},
                                     {"Authorization": "Basic czNjcmV0"}])
def test_without_the_token_v1_is_a_401(guarded: str, headers: dict[str, str]) -> None:
    result = call(guarded, "GET", "/v1/stats", headers=headers)
    problem(result, 401, "Unauthorized", "Bearer")
    assert result[1]["www-authenticate"].startswith("Bearer")
    problem(call(guarded, "PUT", APPEND, {"messages": [HI]}, headers=headers), 401, "Unauthorized")


def test_with_the_token_v1_answers_and_openapi_needs_none(guarded: str) -> None:
    assert call(guarded, "GET", "/v1/stats", headers={"Authorization": "Bearer s3cret"})[0] == 200
    assert call(guarded, "GET", "/v1/stats", headers={"Authorization": "bearer s3cret"})[0] == 200
    assert call(guarded, "GET", "/openapi.json")[0] == 200


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_client_that_sends_its_whole_big_body_before_reading_gets_the_413(small: str, framing: str) -> None:
    """20 MB sent in full before the answer is read: the server discards the body it refused
    and the 413 arrives (a connection closed on unread data would reach the client as a reset)."""
    host, port = small.removeprefix("http://").rsplit(":", 1)
    body = b"x" * (20 * 1024 * 1024)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        if framing == "content-length":
            sock.sendall(f"PUT {APPEND} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode())
            sock.sendall(body)
        else:
            sock.sendall(f"PUT {APPEND} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
            step = 1024 * 1024
            for at in range(0, len(body), step):
                sock.sendall(b"%x\r\n%s\r\n" % (step, body[at:at + step]))
            sock.sendall(b"0\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            more = sock.recv(4096)
            assert more, head
            head += more
    assert head.startswith(b"HTTP/1.1 413 ") and b"application/problem+json" in head
