"""``GET /v1/conversations/{c}/events`` over a real socket: order and ids, resume without a gap
or a duplicate, replacements, closing, heartbeats, a stalled reader, disconnect cleanup."""

from __future__ import annotations

import asyncio
import itertools
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pytest

from engine.facade import HistoryEngine
from engine.service.events import EventHub, event_op
from schemas.batch import Batch
from schemas.messages import Message
from tests.service.server_support import serving

HEARTBEAT = 0.2
WAIT = 10.0


@dataclass
class Events:
    url: str
    engine: HistoryEngine
    hub: EventHub


def _start(engine: HistoryEngine, **hub_options: int) -> Iterator[Events]:
    hub = EventHub(engine, **hub_options)
    try:
        with serving(engine, extra_ops=(event_op(hub, heartbeat=HEARTBEAT, stall_timeout=1.0),)) as url:
            yield Events(url, engine, hub)
            hub.close()  # ends any stream still open, so the server can stop
    finally:
        hub.close()


@pytest.fixture
def events(engine: HistoryEngine) -> Iterator[Events]:
    yield from _start(engine)


@pytest.fixture
def small(engine: HistoryEngine) -> Iterator[Events]:
    yield from _start(engine, stream_buffer=20)


def wait_until(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@dataclass
class Frame:
    event: str | None
    id: str | None
    data: str | None
    comments: list[str]

    def json(self) -> object:
        assert self.data is not None
        return orjson.loads(self.data)


def frames(response: httpx.Response) -> Iterator[Frame]:
    """SSE frames as the server writes them (one line each of id, event, data, comment)."""
    current = Frame(None, None, None, [])
    for line in response.iter_lines():
        if line == "":
            yield current
            current = Frame(None, None, None, [])
        elif line.startswith(":"):
            current.comments.append(line[1:].strip())
        else:
            name, _, value = line.partition(": ")
            setattr(current, {"id": "id", "event": "event", "data": "data"}[name], value)


def events_of(response: httpx.Response) -> Iterator[Frame]:
    return (f for f in frames(response) if f.event is not None)


def open_stream(client: httpx.Client, base: str, c: str, *, after: str | None = None,
                last_event_id: str | None = None) -> httpx.Response:
    """The open stream: its headers have arrived, so it is registered (nothing applied later is missed)."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id is not None else {}
    params = {"after": after} if after is not None else {}
    request = client.build_request("GET", f"{base}/v1/conversations/{c}/events", params=params, headers=headers)
    response = client.send(request, stream=True)
    assert response.status_code == 200, response.read()
    assert response.headers["content-type"].startswith("text/event-stream")
    return response


@contextmanager
def stream(client: httpx.Client, base: str, c: str, *, after: str | None = None,
           last_event_id: str | None = None) -> Iterator[httpx.Response]:
    response = open_stream(client, base, c, after=after, last_event_id=last_event_id)
    try:
        yield response
    finally:
        response.close()


def turn(engine: HistoryEngine, c: str, a: str, question: str = "q", answer: str = "a") -> None:
    engine.append(Batch(c, a, [Message.user(question), Message.assistant(answer)]))


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=WAIT) as c:
        yield c


def test_messages_arrive_in_order_with_their_positions_as_ids(events: Events, client: httpx.Client) -> None:
    with stream(client, events.url, "c") as response:
        turn(events.engine, "c", "a1")
        turn(events.engine, "c", "a2")
        turn(events.engine, "other", "x")  # another conversation's events are not this stream's
        got = [f for _, f in zip(range(4), events_of(response), strict=False)]
    stored = events.engine.entries("c")
    assert [f.event for f in got] == ["message"] * 4
    assert [f.id for f in got] == [str(m.position) for m in stored]
    assert [f.json() for f in got] == [orjson.loads(m.to_json()) for m in stored]


def test_resume_by_last_event_id_has_no_gap_and_no_duplicate(events: Events, client: httpx.Client) -> None:
    total = 300
    stop = threading.Event()

    def writer() -> None:
        for i in range(total):
            turn(events.engine, "c", f"w{i}")
        stop.set()

    seen: list[str] = []
    thread = threading.Thread(target=writer)
    with stream(client, events.url, "c", after="0:0") as response:
        thread.start()
        for f in events_of(response):
            seen.append(str(f.id))
            if len(seen) == 50:
                break  # disconnect mid-flow
    while len(seen) < 2 * total:  # reconnect from the last id, as an EventSource does, until all arrived
        with stream(client, events.url, "c", after="0:0", last_event_id=seen[-1]) as response:
            for f in events_of(response):
                seen.append(str(f.id))
                if len(seen) % 97 == 0 or len(seen) == 2 * total:
                    break
    thread.join(WAIT)
    assert stop.is_set()
    assert seen == [str(m.position) for m in events.engine.entries("c")]


def test_after_catches_up_then_follows(events: Events, client: httpx.Client) -> None:
    turn(events.engine, "c", "a1")
    with stream(client, events.url, "c", after="1:1") as response:
        turn(events.engine, "c", "a2")
        got = [f.id for _, f in zip(range(3), events_of(response), strict=False)]
    assert got == ["1:2", "2:3", "2:4"]


def test_a_replacement_announces_the_hidden_messages_then_the_new_turn(events: Events, client: httpx.Client) -> None:
    turn(events.engine, "c", "a1")
    turn(events.engine, "c", "a2")
    with stream(client, events.url, "c") as response:
        events.engine.replace_turn(Batch("c", "a3", [Message.user("q2b"), Message.assistant("b")]), "a2/0", "edit")
        got = [f for _, f in zip(range(3), events_of(response), strict=False)]
    assert got[0].event == "replaced"
    assert got[0].json() == {"hidden": ["a2/0", "a2/1"], "superseded_by": "a3/0", "reason": "edit"}
    assert [(f.event, f.id) for f in got[1:]] == [("message", "3:5"), ("message", "3:6")]


def test_a_resume_announces_a_replacement_of_a_turn_already_seen(events: Events, client: httpx.Client) -> None:
    turn(events.engine, "c", "a1")
    turn(events.engine, "c", "a2")
    events.engine.replace_turn(Batch("c", "a3", [Message.user("q"), Message.assistant("b")]), "a2/0", "retry")
    with stream(client, events.url, "c", last_event_id="2:4") as response:
        got = [f for _, f in zip(range(3), events_of(response), strict=False)]
    assert got[0].event == "replaced"
    assert got[0].json() == {"hidden": ["a2/0", "a2/1"], "superseded_by": "a3/0", "reason": "retry"}
    assert [f.id for f in got[1:]] == ["3:5", "3:6"]


def test_closed_is_the_last_event_and_ends_the_stream(events: Events, client: httpx.Client) -> None:
    turn(events.engine, "c", "a1")
    with stream(client, events.url, "c", after="0:0") as response:
        seen = events_of(response)
        got = [next(seen), next(seen)]
        events.engine.clear("c")
        got += list(seen)  # returns: the server ended the stream
    assert [f.event for f in got] == ["message", "message", "closed"]
    wait_until(lambda: events.hub.streams == 0, "the stream to unregister")


@pytest.mark.parametrize("resume", [{"after": "0:0"}, {"last_event_id": "1:0"}, {}],
                         ids=["after", "last-event-id", "from-now"])
def test_a_stream_of_a_conversation_cleared_already_says_closed_at_once(events: Events, client: httpx.Client,
                                                                       resume: dict[str, str]) -> None:
    """A consumer reconnecting after the clear (its ClearEvent is past) must not wait forever."""
    turn(events.engine, "c", "a1")
    events.engine.clear("c")
    with stream(client, events.url, "c", after=resume.get("after"), last_event_id=resume.get("last_event_id")) \
            as response:
        got = list(events_of(response))  # returns: the server ended the stream
    assert [(f.event, f.json()) for f in got] == [("closed", {"conversation_id": "c"})]


def test_an_idle_stream_gets_keepalive_comments(events: Events, client: httpx.Client) -> None:
    started = time.monotonic()
    with stream(client, events.url, "c") as response:
        first = next(frames(response))
    assert first.comments == ["keepalive"] and first.event is None
    assert time.monotonic() - started < WAIT


def test_bad_positions_are_400_naming_the_parameter(events: Events, client: httpx.Client) -> None:
    for params, headers, named in (({"after": "x"}, {}, "after"), ({}, {"Last-Event-ID": "1"}, "Last-Event-ID")):
        r = client.get(f"{events.url}/v1/conversations/c/events", params=params, headers=headers)
        assert r.status_code == 400 and r.headers["content-type"] == "application/problem+json"
        assert named in r.json()["detail"]


def _deliveries(engine: HistoryEngine) -> int:
    """The engine's live subscriptions (private: what must not accumulate)."""
    return sum(not s._closed for s in engine._projector.deliveries._subscriptions)


def test_disconnects_unregister_every_stream_and_release_the_subscription(events: Events) -> None:
    for _ in range(3):
        with httpx.Client(timeout=WAIT) as c:
            responses = [open_stream(c, events.url, f"c{i}") for i in range(10)]
            assert events.hub.streams == 10 and _deliveries(events.engine) == 1
            for r in responses:
                r.close()
        wait_until(lambda: events.hub.streams == 0, "every stream to unregister")
        wait_until(lambda: not events.hub.subscribed, "the hub to drop its subscription")
        turn(events.engine, "c0", f"after-{time.monotonic_ns()}")
        wait_until(lambda: _deliveries(events.engine) == 0, "the engine to forget the subscription")


def test_a_stalled_reader_never_stalls_appends_and_is_dropped(small: Events) -> None:
    host, port = small.url.removeprefix("http://").split(":")
    stalled = socket.create_connection((host, int(port)))
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.sendall(b"GET /v1/conversations/c/events HTTP/1.1\r\nHost: x\r\n\r\n")  # and never reads
    try:
        wait_until(lambda: small.hub.streams == 1, "the stalled stream to register")
        big = "x" * 4096
        started = time.monotonic()
        for i in range(2000):
            small.engine.append(Batch("c", f"a{i}", [Message.user(big)]))
        elapsed = time.monotonic() - started
        assert elapsed < 60, elapsed
        wait_until(lambda: small.hub.streams == 0, "the stalled stream to be dropped")
        assert small.hub.dropped == 1  # dropped for falling behind, while its send was stuck
        wait_until(lambda: not small.hub.subscribed, "the hub to drop its subscription")
    finally:
        stalled.close()


def test_a_reader_that_falls_behind_gets_an_error_event(small: Events, client: httpx.Client) -> None:
    with stream(client, small.url, "c") as response:
        loop = asyncio_loop_of(small)
        done = threading.Event()
        # Hold the event loop for a moment while many events arrive, so the stream's queue overflows.
        loop.call_soon_threadsafe(lambda: (done.wait(WAIT), None))
        for i in range(50):
            turn(small.engine, "c", f"a{i}")
        wait_until(lambda: len(small.engine.entries("c")) == 100, "the appends to apply")
        done.set()
        got = list(events_of(response))
    assert got[-1].event == "error"
    assert got[-1].json()["title"] == "SubscriptionLost"  # type: ignore[index]
    assert all(f.event == "message" for f in got[:-1])


def asyncio_loop_of(events: Events) -> asyncio.AbstractEventLoop:
    loop = events.hub._loop
    assert loop is not None
    return loop


def test_closing_the_hub_ends_open_streams_with_an_error_event(events: Events, client: httpx.Client) -> None:
    """What a server does on SIGTERM before it drains: uvicorn waits for open responses."""
    with stream(client, events.url, "c") as response:
        events.hub.close()
        got = list(events_of(response))
    assert [f.event for f in got] == ["error"]
    assert got[0].json()["title"] == "SubscriptionLost"  # type: ignore[index]
    wait_until(lambda: events.hub.streams == 0 and not events.hub.subscribed, "the hub to release everything")
    r = client.get(f"{events.url}/v1/conversations/c/events")
    assert r.status_code == 503 and r.json()["title"] == "NotReady" and r.headers["retry-after"] == "1"


def test_giving_a_partition_up_ends_its_streams_with_not_owner_and_leaves_the_others(
        tmp_path: Path, client: httpx.Client) -> None:
    """A cluster member that gives a partition up ends the streams of its conversations, so each
    client reconnects (Last-Event-ID) and reaches the new owner; other partitions' streams go on."""
    from schemas.records import partition_for_key, record_key

    by_part: dict[int, str] = {}
    i = 0
    while len(by_part) < 2:
        by_part.setdefault(partition_for_key(record_key(f"c{i}"), 2), f"c{i}")
        i += 1
    with HistoryEngine.open(tmp_path / "two", partitions=2) as engine:
        for events in _start(engine):
            with stream(client, events.url, by_part[1]) as moved, stream(client, events.url, by_part[0]) as kept:
                events.hub.revoked([1])
                got = list(events_of(moved))  # returns: the server ended the stream
                assert [f.event for f in got] == ["error"] and got[0].json()["title"] == "NotOwner"  # type: ignore[index]
                turn(engine, by_part[0], "a1")
                assert [f.event for f in itertools.islice(events_of(kept), 2)] == ["message", "message"]
