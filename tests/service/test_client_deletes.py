"""``delete_messages`` in both clients (``HistoryClient``, ``AsyncHistoryClient``): at the wire, what
they send (``POST .../messages:delete`` with ``{"ids": [...]}``, ``?fence=EPOCH`` with a fence),
what they return and raise (``Fenced`` and ``ConversationClosed`` at once, never retried; a 503 or
504 retried, since deleting again is a no-op; ``InvalidRequest`` for an answer that is no count)
and that bad arguments send nothing, with the engine's classes; then against a real server, the
same behaviours as ``HistoryEngine.delete_messages``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from starlette.types import Receive, Scope, Send

from engine import AsyncHistoryClient, HistoryClient
from engine.facade import HistoryEngine
from schemas import (
    Batch,
    CommitUnconfirmed,
    ConversationClosed,
    Fence,
    Fenced,
    InvalidConfiguration,
    InvalidConversationID,
    InvalidRequest,
    InvalidWindow,
    LogUnavailable,
    Message,
)
from tests.service.server_support import running, serving
from tests.service.test_client_retries import Script, problem

Face = Callable[..., Callable[..., Any]]
PATH = b"/v1/conversations/c%2F1/messages:delete"
FENCE = Fence("c/1", "run/1", 3)


def _count(n: int) -> tuple[Any, ...]:
    return (200, orjson.dumps({"deleted": n}), [])


@pytest.fixture(params=["sync", "async"])
def face(request: pytest.FixtureRequest) -> Iterator[Face]:
    """``face(url, timeout=5)`` -> ``call(name, *args)`` on a HistoryClient or an AsyncHistoryClient."""
    loop = asyncio.new_event_loop()
    opened: list[Any] = []

    def make(url: str, timeout: float = 5) -> Callable[..., Any]:
        if request.param == "sync":
            client = HistoryClient(url, timeout=timeout)
            opened.append(client)
            return lambda name, *a, **k: getattr(client, name)(*a, **k)
        aclient = AsyncHistoryClient(url, timeout=timeout)
        opened.append(aclient)
        return lambda name, *a, **k: loop.run_until_complete(getattr(aclient, name)(*a, **k))

    try:
        yield make
    finally:
        for c in opened:
            if isinstance(c, AsyncHistoryClient):
                loop.run_until_complete(c.close())
            else:
                c.close()
        loop.close()


@dataclass
class Recorder:
    """``script``'s answers, and each request's query string beside what ``script`` records."""

    script: Script
    queries: list[bytes] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.queries.append(scope.get("query_string", b""))
        await self.script(scope, receive, send)

    def sent(self) -> list[tuple[str, bytes, bytes, Any]]:
        return [(s.method, s.path, q, orjson.loads(s.body) if s.body else None)
                for s, q in zip(self.script.seen, self.queries, strict=True)]


# ----- at the wire
def test_a_delete_posts_the_ids_and_returns_the_count(face: Face) -> None:
    recorder = Recorder(Script([_count(2), _count(0), _count(1)]))
    with running(recorder) as url:
        call = face(url)
        assert call("delete_messages", "c/1", ["a 1/0", "a 1/1"]) == 2
        assert call("delete_messages", "c/1", ("zz/0", "not-an-id")) == 0  # a tuple too; malformed ids sent as is
        assert call("delete_messages", "c/1", ["a 1/0"], fence=FENCE, timeout=2) == 1
    assert recorder.sent() == [
        ("POST", PATH, b"", {"ids": ["a 1/0", "a 1/1"]}),
        ("POST", PATH, b"", {"ids": ["zz/0", "not-an-id"]}),
        ("POST", PATH, b"fence=3", {"ids": ["a 1/0"]}),  # the epoch alone: the server finds its run
    ]


def test_an_empty_list_is_sent_and_counts_what_the_server_says(face: Face) -> None:
    recorder = Recorder(Script([_count(0)]))
    with running(recorder) as url:
        assert face(url)("delete_messages", "c/1", []) == 0
    assert recorder.sent() == [("POST", PATH, b"", {"ids": []})]


@pytest.mark.parametrize(("refusal", "error", "words"), [
    (problem(Fenced("delete from 'c/1' refused: fence 3 is older"), 409), Fenced, "fence 3 is older"),
    (problem(ConversationClosed("conversation 'c/1' is closed forever"), 410), ConversationClosed, "closed"),
    (problem(InvalidWindow("invalid ids: 10001 ids"), 400), InvalidWindow, "10001"),
])
def test_a_final_refusal_is_raised_as_its_class_and_not_retried(face: Face, refusal: tuple[Any, ...],
                                                                 error: type[Exception], words: str) -> None:
    script = Script([refusal, _count(1)])
    with running(script) as url, pytest.raises(error, match=words or None):
        face(url)("delete_messages", "c/1", ["a 1/0"], fence=FENCE)
    assert len(script.seen) == 1


@pytest.mark.parametrize("refusal", [problem(LogUnavailable("log down"), 503, "0"),
                                     problem(CommitUnconfirmed("not decided in time"), 504)])
def test_a_retryable_refusal_is_resent_as_is(face: Face, refusal: tuple[Any, ...]) -> None:
    recorder = Recorder(Script([refusal, refusal, _count(1)]))
    with running(recorder) as url:
        assert face(url, 10)("delete_messages", "c/1", ["a 1/0"], fence=FENCE) == 1
    first, *again = recorder.sent()
    assert len(again) == 2 and all(s == first for s in again)  # the same request each time


def test_no_answer_in_time_is_commit_unconfirmed_as_for_every_write(face: Face) -> None:
    with running(Script([("stall",)], stall_s=1.0)) as url, pytest.raises(CommitUnconfirmed) as raised:
        face(url, 0.3)("delete_messages", "c/1", ["a 1/0"])
    assert type(raised.value) is CommitUnconfirmed


@pytest.mark.parametrize("answer", [{}, {"deleted": -1}, {"deleted": "2"}, {"deleted": 1.5}, {"deleted": True},
                                    {"deleted": 1, "more": 0}, {"cleared": 1}, [1]])
def test_an_answer_that_is_no_count_is_an_invalid_request(face: Face, answer: Any) -> None:
    script = Script([(200, orjson.dumps(answer), [])])
    with running(script) as url, pytest.raises(InvalidRequest, match="delete_messages answer"):
        face(url)("delete_messages", "c/1", ["a 1/0"])


@pytest.mark.parametrize(("bad", "error", "words"), [
    (lambda c: c("delete_messages", "c/1", "a 1/0"), InvalidWindow, "list"),
    (lambda c: c("delete_messages", "c/1", {"a 1/0"}), InvalidWindow, "list"),
    (lambda c: c("delete_messages", "c/1", None), InvalidWindow, "list"),
    (lambda c: c("delete_messages", "c/1", ["a 1/0", 7]), InvalidWindow, r"ids\[1\]"),
    (lambda c: c("delete_messages", "c/1", [b"a 1/0"]), InvalidWindow, r"ids\[0\]"),
    (lambda c: c("delete_messages", "c/1", ["a/0"] * 10_001), InvalidWindow, "10001"),
    (lambda c: c("delete_messages", "c/1", ["a 1/0"], fence=3), InvalidRequest, "fence"),
    (lambda c: c("delete_messages", "c/1", ["a 1/0"], fence=(FENCE.run_id, 3)), InvalidRequest, "fence"),
    (lambda c: c("delete_messages", "c/1", ["a 1/0"], fence=Fence("other", "run/1", 3)), InvalidRequest, "other"),
    (lambda c: c("delete_messages", " c", ["a 1/0"]), InvalidConversationID, ""),
    (lambda c: c("delete_messages", 7, ["a 1/0"]), InvalidConversationID, ""),
    (lambda c: c("delete_messages", "c/1", ["a 1/0"], timeout=-1), InvalidConfiguration, "timeout"),
    (lambda c: c("delete_messages", "c/1", ["a 1/0"], timeout=float("inf")), InvalidConfiguration, "timeout"),
    (lambda c: c("delete_messages", "c/1", ["a 1/0"], FENCE), TypeError, ""),  # keyword-only, as the engine
])
def test_bad_arguments_send_no_request(face: Face, bad: Callable[[Any], Any], error: type[Exception],
                                       words: str) -> None:
    script = Script([_count(1)])
    with running(script) as url, pytest.raises(error, match=words or None):
        bad(face(url))
    assert script.seen == []


# ----- against a real server
def _four(call: Callable[..., Any], c: str) -> None:
    for a in ("a1", "a2"):
        call("append", Batch(c, a, [Message.user("q"), Message.assistant("r")]))
    assert [e.id for e in call("entries", c)] == ["a1/0", "a1/1", "a2/0", "a2/1"]


def test_deletes_over_a_real_server(engine: HistoryEngine, face: Face) -> None:
    with serving(engine) as url:
        call = face(url)
        _four(call, "c/1")
        assert call("delete_messages", "c/1", ["a1/1", "a2/1", "zz/0", "not-an-id"]) == 2
        assert [e.id for e in call("entries", "c/1")] == ["a1/0", "a2/0"]
        assert [e.id for e in call("entries_by_ids", "c/1", ["a1/1", "a2/0"])] == ["a2/0"]
        assert call("delete_messages", "c/1", ["a1/1", "a2/1"]) == 0  # again: a no-op
        assert call("delete_messages", "c/1", []) == 0
        assert call("delete_messages", "never-written", ["a1/0"]) == 0
        call("replace_turn", Batch("c/1", "b1", [Message.user("q2")]), "a2/0", "edit")
        assert call("delete_messages", "c/1", ["a2/0"]) == 0  # hidden by the edit: not visible, not counted
        assert [e.id for e in call("entries", "c/1")] == ["a1/0", "b1/0"]
        call("clear", "c/1")
        with pytest.raises(ConversationClosed):
            call("delete_messages", "c/1", ["a1/0"])


def test_a_fenced_delete_over_a_real_server(engine: HistoryEngine, face: Face) -> None:
    with serving(engine) as url:
        call = face(url)
        _four(call, "c")
        first = call("begin_run", "c", "r1")
        assert call("delete_messages", "c", ["a1/1"], fence=first) == 1
        second = call("begin_run", "c", "r2")
        with pytest.raises(Fenced):
            call("delete_messages", "c", ["a2/1"], fence=first)
        with pytest.raises(Fenced):  # an epoch no run has: the server finds no run to fence it with
            call("delete_messages", "c", ["a2/1"], fence=Fence("c", "r3", 3))
        assert [e.id for e in call("entries", "c")] == ["a1/0", "a2/0", "a2/1"]
        assert call("delete_messages", "c", ["a2/1"], fence=second) == 1
        assert [e.id for e in call("entries", "c")] == ["a1/0", "a2/0"]
