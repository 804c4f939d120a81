"""The clients' retry policy against real sockets: a scripted ASGI server on loopback answers
each request with the next scripted status (503 with ``Retry-After``, 421, 504, a stall), then
the real answer. Checked for both faces: what is retried, that an append is resent as the same
bytes, that ``Retry-After`` is honoured, and what running out of time raises."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from starlette.types import Receive, Scope, Send

from engine import AsyncHistoryClient, HistoryClient
from engine.service.problems import problem_of
from schemas import (
    AppendConflict,
    Batch,
    CommitUnconfirmed,
    InvalidBatch,
    InvalidConversationID,
    InvalidReceipt,
    InvalidWindow,
    LogUnavailable,
    Message,
    NotOwner,
    NotReady,
    Receipt,
)
from schemas.positions import LogPosition
from tests.service.server_support import running

BATCH = Batch("c/1", "a 1", [Message.user("hi")])
RECEIPT = Receipt(BATCH.conversation_id, BATCH.append_id, BATCH.digest, LogPosition(0, 7))


@dataclass
class Seen:
    at: float
    method: str
    path: bytes
    body: bytes


@dataclass
class Script:
    """Answers the n-th request with ``steps[n]`` (the last one repeats): a status with a body
    and headers, or ``"stall"`` (no answer for ``stall_s``)."""

    steps: list[tuple[Any, ...]]
    stall_s: float = 1.5
    seen: list[Seen] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.seen.append(Seen(time.monotonic(), scope["method"], scope["raw_path"], body))
        step = self.steps[min(len(self.seen) - 1, len(self.steps) - 1)]
        if step[0] == "stall":
            await asyncio.sleep(self.stall_s)
            return
        status, payload, headers = step
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), *headers]})
        await send({"type": "http.response.body", "body": payload})


def problem(exc: Exception, status: int, retry_after: str | None = None) -> tuple[Any, ...]:
    headers = [(b"retry-after", retry_after.encode())] if retry_after is not None else []
    return (status, orjson.dumps(problem_of(exc, status=status)), headers)


OK: tuple[Any, ...] = (200, RECEIPT.to_json(), [])


@pytest.fixture(params=["sync", "async"])
def face(request: pytest.FixtureRequest) -> Iterator[Callable[..., Any]]:
    """``face(url, timeout)`` -> ``call(name, *args)`` on a HistoryClient or an AsyncHistoryClient."""
    loop = asyncio.new_event_loop()
    opened: list[Any] = []

    def make(url: str | list[str], timeout: float) -> Callable[..., Any]:
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


def free_port() -> int:
    """A port nothing listens on (bound then released: connections to it are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("refusal", [
    problem(LogUnavailable("log down"), 503, "0"),
    problem(NotReady("catching up"), 503, "0"),
    problem(NotOwner("not mine"), 421),
    problem(CommitUnconfirmed("not decided in time"), 504),
])
def test_a_retryable_refusal_is_retried_and_the_append_resent_as_is(face: Any, refusal: tuple[Any, ...]) -> None:
    script = Script([refusal, refusal, OK])
    with running(script) as url:
        assert face(url, 10)("append", BATCH) == RECEIPT
    assert len(script.seen) == 3
    assert len({(s.method, s.path, s.body) for s in script.seen}) == 1  # the same request each time
    assert script.seen[0].path == b"/v1/conversations/c%2F1/appends/a%201"


def test_retry_after_is_honoured(face: Any) -> None:
    script = Script([problem(LogUnavailable("log down"), 503, "1"), OK])
    with running(script) as url:
        assert face(url, 10)("append", BATCH) == RECEIPT
    assert script.seen[1].at - script.seen[0].at >= 0.95


def test_a_final_refusal_is_raised_at_once(face: Any) -> None:
    script = Script([problem(AppendConflict("other content"), 409)])
    with running(script) as url, pytest.raises(AppendConflict, match="other content"):
        face(url, 10)("append", BATCH)
    assert len(script.seen) == 1


def test_a_read_is_not_resent_on_504(face: Any) -> None:
    script = Script([problem(CommitUnconfirmed("?"), 504)])
    with running(script) as url, pytest.raises(CommitUnconfirmed):
        face(url, 10)("read", "c")
    assert len(script.seen) == 1


def test_out_of_time_the_last_refusal_stands(face: Any) -> None:
    script = Script([problem(NotReady("catching up"), 503, "0")])
    started = time.monotonic()
    with running(script) as url, pytest.raises(NotReady):
        face(url, 0.5)("read", "c")
    assert 0.4 < time.monotonic() - started < 5 and len(script.seen) >= 2


@pytest.mark.parametrize(("method", "args", "error"), [
    ("append", (BATCH,), CommitUnconfirmed),
    ("clear", ("c",), CommitUnconfirmed),
    ("replace_turn", (BATCH, "x/0", "edit"), CommitUnconfirmed),
    ("entries", ("c",), LogUnavailable),
])
def test_no_answer_in_time_is_commit_unconfirmed_for_a_write(face: Any, method: str, args: tuple[Any, ...],
                                                             error: type[Exception]) -> None:
    script = Script([("stall",)], stall_s=1.0)
    with running(script) as url, pytest.raises(error) as raised:
        face(url, 0.3)(method, *args)
    assert type(raised.value) is error
    assert "within 0.3s" in str(raised.value)


def test_an_unreachable_server_is_log_unavailable_even_for_an_append(face: Any) -> None:
    call = face(f"http://127.0.0.1:{free_port()}", 0.3)
    with pytest.raises(LogUnavailable, match="could not be reached"):
        call("append", BATCH)  # never sent: nothing to confirm


def test_a_dead_url_is_skipped_for_the_next_one(face: Any) -> None:
    script = Script([OK])
    with running(script) as url:
        assert face([f"http://127.0.0.1:{free_port()}", url], 10)("append", BATCH) == RECEIPT
    assert len(script.seen) == 1


@pytest.mark.parametrize("bad", [
    lambda c: c("read_within_bytes", "d", "8192"),
    lambda c: c("read_within_bytes", "d", True),
    lambda c: c("read_within_bytes", "d", 10, unit="turns"),
    lambda c: c("read_within_bytes", "d", 10, after=(1, 2)),
    lambda c: c("turn_sources", "d", 10, before="3:4"),
    lambda c: c("measure", "d", after="1:2"),
    lambda c: c("entries", "d", after=(1, 2)),
    lambda c: c("window", "d", 0),
    lambda c: c("window", "d", "20"),
])
def test_bad_arguments_send_no_request(face: Any, bad: Callable[[Any], Any]) -> None:
    script = Script([OK])
    with running(script) as url, pytest.raises(InvalidWindow):
        bad(face(url, 10))
    assert script.seen == []


def test_invalid_ids_and_replacements_send_no_request(face: Any) -> None:
    script = Script([OK])
    with running(script) as url:
        call = face(url, 10)
        for bad_id in ("", " padded", "ctl\x07", "x" * 1025):
            with pytest.raises(InvalidConversationID):
                call("entries", bad_id)
        with pytest.raises(InvalidBatch):
            call("replace_turn", BATCH, "a/0", "regenerate")
        with pytest.raises(InvalidBatch):
            call("append", [Message.user("x")])
        with pytest.raises(InvalidReceipt):
            call("append", BATCH, expected_last="a1")
    assert script.seen == []
