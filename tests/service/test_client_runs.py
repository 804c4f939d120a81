"""The runs' calls of both clients (``HistoryClient``, ``AsyncHistoryClient``) at the wire: what
they send (a write's ``"fence": epoch`` and ``"run_id"``, the run's path segment, ``root_turn``),
what they raise (``Fenced`` for a 409, never retried; ``NotFound`` for a null request) and that bad
arguments send nothing. Their behaviour against a real server is the runs contract
(``tests/conformance/runs_contract.py``, run over both clients by ``test_conformance_http.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest

from engine import AsyncHistoryClient, HistoryClient
from engine.facade import HistoryEngine
from schemas import Batch, Fence, Fenced, InvalidRequest, Message, NotFound
from tests.service.server_support import running, serving
from tests.service.test_client_retries import OK, Script, problem

BATCH = Batch("c/1", "a 1", [Message.user("hi")])
FENCE = Fence("c/1", "run/1", 3)


@pytest.fixture(params=["sync", "async"])
def face(request: pytest.FixtureRequest) -> Iterator[Callable[[str], Callable[..., Any]]]:
    """``face(url)`` -> ``call(name, *args)`` on a HistoryClient or an AsyncHistoryClient."""
    loop = asyncio.new_event_loop()
    opened: list[Any] = []

    def make(url: str) -> Callable[..., Any]:
        if request.param == "sync":
            client = HistoryClient(url, timeout=5)
            opened.append(client)
            return lambda name, *a, **k: getattr(client, name)(*a, **k)
        aclient = AsyncHistoryClient(url, timeout=5)
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


def _sent(script: Script) -> list[tuple[str, bytes, Any]]:
    return [(s.method, s.path, orjson.loads(s.body) if s.body else None) for s in script.seen]


def test_a_fenced_write_sends_the_epoch_and_the_run(face: Callable[[str], Callable[..., Any]]) -> None:
    script = Script([OK])
    traced = Batch("c/1", "a 1", [Message.user("hi")], run_id="tool-run")
    with running(script) as url:
        call = face(url)
        call("append", BATCH, fence=FENCE)
        call("append", traced, fence=FENCE)
        call("append", traced)
        call("replace_turn", BATCH, "a 0/0", "edit", fence=FENCE)
    hi = [{"role": "user", "parts": [{"kind": "text", "text": "hi"}]}]
    path = b"/v1/conversations/c%2F1/appends/a%201"
    assert _sent(script) == [
        ("PUT", path, {"messages": hi, "fence": 3, "run_id": "run/1"}),  # the fence's run
        ("PUT", path, {"messages": hi, "fence": 3, "run_id": "tool-run"}),  # the batch's own
        ("PUT", path, {"messages": hi, "run_id": "tool-run"}),
        ("PUT", path, {"messages": hi, "replaces": {"turn_id": "a 0/0", "reason": "edit"}, "fence": 3,
                       "run_id": "run/1"}),
    ]


def test_a_409_fenced_is_raised_as_fenced_and_not_retried(face: Callable[[str], Callable[..., Any]]) -> None:
    script = Script([problem(Fenced("write 'a 1' to 'c/1' refused: fence 3 is older"), 409)])
    with running(script) as url, pytest.raises(Fenced, match="fence 3 is older"):
        face(url)("append", BATCH, fence=FENCE)
    assert len(script.seen) == 1


def test_begin_run_posts_to_the_runs_segment(face: Callable[[str], Callable[..., Any]]) -> None:
    answer = {"conversation_id": "c/1", "run_id": "run/1", "epoch": 3}
    script = Script([(200, orjson.dumps(answer), [])])
    with running(script) as url:
        assert face(url)("begin_run", "c/1", "run/1") == FENCE
    assert _sent(script) == [("POST", b"/v1/conversations/c%2F1/runs/run%2F1", None)]


@pytest.mark.parametrize("answer", [{"conversation_id": "c/1", "run_id": "run/1", "epoch": 0},
                                    {"conversation_id": "c/1", "run_id": "run/1", "epoch": True},
                                    {"conversation_id": "c/1", "run_id": "run/1"}])
def test_a_bad_fence_answer_is_an_invalid_request(face: Callable[[str], Callable[..., Any]],
                                                  answer: dict[str, Any]) -> None:
    with running(Script([(200, orjson.dumps(answer), [])])) as url, pytest.raises(InvalidRequest, match="epoch"):
        face(url)("begin_run", "c/1", "run/1")


@pytest.mark.parametrize("bad", [
    lambda c: c("begin_run", "c", ""),
    lambda c: c("begin_run", "c", "r\x07"),
    lambda c: c("begin_run", "c", " r"),
    lambda c: c("run_wrote_history", "c", "r", root_turn="nope"),
    lambda c: c("run_wrote_history", "c", "r\x00"),
    lambda c: c("run_request_message", "c", "r", "a/01"),
    lambda c: c("append", BATCH, fence=3),
    lambda c: c("append", BATCH, fence=Fence("other", "r", 1)),
    lambda c: c("replace_turn", BATCH, "a/0", "edit", fence=(FENCE.run_id, FENCE.epoch)),
])
def test_bad_runs_arguments_send_no_request(face: Callable[[str], Callable[..., Any]],
                                            bad: Callable[[Any], Any]) -> None:
    script = Script([OK])
    with running(script) as url, pytest.raises(InvalidRequest):
        bad(face(url))
    assert script.seen == []


def test_what_a_run_wrote_over_a_real_server(engine: HistoryEngine,
                                             face: Callable[[str], Callable[..., Any]]) -> None:
    with serving(engine) as url:
        call = face(url)
        first = call("begin_run", "c", "r 1")
        assert first == Fence("c", "r 1", 1) and call("begin_run", "c", "r 1") == first
        call("append", Batch("c", "a", [Message.user("q"), Message.assistant("r")]), fence=first)
        assert call("run_wrote_history", "c", "r 1") is True
        assert call("run_wrote_history", "c", "r 1", root_turn="a/0") is True
        assert call("run_wrote_history", "c", "r 1", "b/0") is False
        assert call("run_request_message", "c", "r 1", "a/0") == "a/0"
        with pytest.raises(NotFound):  # the server answers null: no request of the run, no such turn
            call("run_request_message", "c", "never", "b/0")
        second = call("begin_run", "c", "r 2")
        assert second.epoch == 2
        with pytest.raises(Fenced, match="latest run"):
            call("append", Batch("c", "b", [Message.user("late")]), fence=first)
        call("replace_turn", Batch("c", "e", [Message.user("q edited")]), "a/0", "edit", fence=second)
        assert [e.id for e in call("entries", "c")] == ["e/0"]
        assert call("run_request_message", "c", "r 2", "e/0") == "e/0"
        assert call("run_wrote_history", "c", "r 1", "a/0") is True  # hidden rows count
