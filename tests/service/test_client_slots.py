"""Turn slots in both clients (``HistoryClient``, ``AsyncHistoryClient``) at the wire: what they
send (``POST .../turn-slots``; an append's ``"turn": {"turn_id", "position"}``), what they raise
(``SlotUnavailable`` for a 409, never retried; ``InvalidRequest`` for an answer that is no slot)
and that bad arguments send nothing, with the in-process engine's classes. Their behaviour against
a real server is the slots contract (``tests/conformance/slots_contract.py``, run over both
clients by ``test_conformance_http.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest

from engine import AsyncHistoryClient, HistoryClient
from engine.facade import HistoryEngine
from schemas import (
    Batch,
    Fence,
    InvalidBatch,
    InvalidConfiguration,
    InvalidConversationID,
    InvalidRequest,
    Message,
    SlotUnavailable,
    TurnSlot,
)
from tests.service.server_support import running, serving
from tests.service.test_client_retries import OK, Script, problem

BATCH = Batch("c/1", "a 1", [Message.user("hi")])
SLOT = TurnSlot("c/1", "slot-1/0", 4)
HI = [{"role": "user", "parts": [{"kind": "text", "text": "hi"}]}]
PATH = b"/v1/conversations/c%2F1/appends/a%201"


@pytest.fixture(params=["sync", "async"])
def face(request: pytest.FixtureRequest) -> Iterator[Callable[[str], Callable[..., Any]]]:
    """``face(url)`` -> ``call(name, *args)`` on a HistoryClient or an AsyncHistoryClient."""
    loop = asyncio.new_event_loop()
    opened: list[HistoryClient | AsyncHistoryClient] = []

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


def test_an_append_under_a_slot_sends_its_turn_id_and_position(face: Callable[[str], Callable[..., Any]]) -> None:
    script = Script([OK])
    with running(script) as url:
        call = face(url)
        call("append", BATCH, turn=SLOT)
        call("append", BATCH, turn=SLOT, fence=Fence("c/1", "run/1", 3))
        call("append", BATCH, turn=None)
    assert _sent(script) == [
        ("PUT", PATH, {"messages": HI, "turn": {"turn_id": "slot-1/0", "position": 4}}),
        ("PUT", PATH, {"messages": HI, "fence": 3, "turn": {"turn_id": "slot-1/0", "position": 4},
                       "run_id": "run/1"}),
        ("PUT", PATH, {"messages": HI}),  # no slot: no "turn" member at all
    ]


def test_allocate_turn_posts_to_the_turn_slots_segment(face: Callable[[str], Callable[..., Any]]) -> None:
    answer = {"conversation_id": "c/1", "turn_id": "slot-1/0", "position": 4}
    script = Script([(200, orjson.dumps(answer), [])])
    with running(script) as url:
        assert face(url)("allocate_turn", "c/1") == SLOT
    assert _sent(script) == [("POST", b"/v1/conversations/c%2F1/turn-slots", None)]


def test_a_409_slot_unavailable_is_raised_as_such_and_not_retried(face: Callable[[str], Callable[..., Any]]) -> None:
    script = Script([problem(SlotUnavailable("turn slot 'slot-1/0' was already used"), 409), OK])
    with running(script) as url, pytest.raises(SlotUnavailable, match="already used"):
        face(url)("append", BATCH, turn=SLOT)
    assert len(script.seen) == 1


@pytest.mark.parametrize("answer", [
    {"conversation_id": "c/1", "turn_id": "slot-1/0", "position": 0},
    {"conversation_id": "c/1", "turn_id": "slot-1/0", "position": True},
    {"conversation_id": "c/1", "turn_id": "slot-1/0", "position": "4"},
    {"conversation_id": "c/1", "turn_id": "slot-1/0"},
    {"conversation_id": "c/1", "turn_id": "slot-1/1", "position": 4},  # no slot's turn id
    {"conversation_id": "other", "turn_id": "slot-1/0", "position": 4},  # another conversation's
    {"conversation_id": "c/1", "turn_id": "slot-1/0", "position": 4, "epoch": 1},
])
def test_an_answer_that_is_no_slot_of_the_conversation_is_an_invalid_request(
        face: Callable[[str], Callable[..., Any]], answer: dict[str, Any]) -> None:
    with running(Script([(200, orjson.dumps(answer), [])])) as url, pytest.raises(InvalidRequest):
        face(url)("allocate_turn", "c/1")


@pytest.mark.parametrize(("bad", "error", "words"), [
    (lambda c: c("append", BATCH, turn="slot-1/0"), InvalidRequest, "TurnSlot"),
    (lambda c: c("append", BATCH, turn=("c/1", "slot-1/0", 4)), InvalidRequest, "TurnSlot"),
    (lambda c: c("append", BATCH, turn={"turn_id": "slot-1/0", "position": 4}), InvalidRequest, "TurnSlot"),
    (lambda c: c("append", BATCH, turn=TurnSlot("other", "slot-1/0", 4)), SlotUnavailable, "conversation"),
    (lambda c: c("append", Batch("c/1", "a", [Message.assistant("no user")]), turn=SLOT), InvalidBatch,
     "opens a turn"),
    (lambda c: c("append", Batch("c/1", "a", [Message.system("be brief")]), turn=SLOT), InvalidBatch,
     "opens a turn"),
    (lambda c: c("append", BATCH, turn=SLOT, fence=3), InvalidRequest, "fence"),  # the fence is checked first
    (lambda c: c("allocate_turn", "bad\x01id"), InvalidConversationID, "conversation"),
    (lambda c: c("allocate_turn", "c", timeout=-1), InvalidConfiguration, "timeout"),
])
def test_bad_slot_arguments_send_no_request(face: Callable[[str], Callable[..., Any]], bad: Callable[[Any], Any],
                                            error: type[Exception], words: str) -> None:
    script = Script([OK])
    with running(script) as url, pytest.raises(error, match=words):
        bad(face(url))
    assert script.seen == []


def test_the_same_refusals_as_the_engine_over_a_real_server(engine: HistoryEngine,
                                                              face: Callable[[str], Callable[..., Any]]) -> None:
    with serving(engine) as url:
        call = face(url)
        slot = call("allocate_turn", "c")
        assert isinstance(slot, TurnSlot) and (slot.conversation_id, slot.position) == ("c", 1)
        batch = Batch("c", "a", [Message.user("q"), Message.assistant("r")])
        receipt = call("append", batch, turn=slot)
        assert call("append", batch, turn=slot) == receipt  # an identical resend: its receipt
        assert [(t.id, t.position) for t in call("turns", "c")] == [(slot.turn_id, 1)]
        with pytest.raises(SlotUnavailable, match="already used"):
            call("append", Batch("c", "b", [Message.user("again")]), turn=slot)
        with pytest.raises(SlotUnavailable, match="no turn slot"):
            call("append", Batch("c", "b", [Message.user("forged")]), turn=TurnSlot("c", "slot-never/0", 2))
        assert [e.id for e in call("entries", "c")] == ["a/0", "a/1"]
        assert call("allocate_turn", "c").position == 2
