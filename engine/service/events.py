"""``GET /v1/conversations/{c}/events``: the accepted events of one conversation as server-sent
events (SERVICE.md, "Events").

What a stream promises:

- ``event: message`` (``id: TURN:SEQ``, a StoredMessage as ``data``) for each accepted message,
  in stored order; ``event: replaced`` (``{"hidden":[ids],"superseded_by","reason"}``) right
  before the messages of a turn that replaced one; ``event: deleted`` (``{"ids":[message ids]}``)
  when ``delete_messages`` removed stored messages (a resumed stream never shows them again: its
  catch-up reads the state); ``event: closed`` once the conversation is
  cleared, after which the stream ends (at once for a conversation cleared already, resumed or
  not); ``: keepalive`` comment lines while idle.
- ``after=TURN:SEQ`` or ``Last-Event-ID`` resumes **without a gap or a duplicate**: the stream
  registers for live events *first*, then reads ``entries(c, after=...)`` to catch up, then
  delivers only the live messages at positions past the last one sent (positions are a total
  order, so deduplication is one comparison). Without either: from now.
- A slow or vanished consumer never stalls the projector and never holds more than
  ``stream_buffer`` events: past that its stream gets ``event: error`` (a ``SubscriptionLost``
  problem) and ends; a send that cannot complete within ``stall_timeout`` (the peer stopped
  reading) drops the connection. A disconnect unregisters the stream at once.
- On a cluster member that gives a partition up (``EventHub.revoked``), the streams of its
  conversations end with ``event: error`` (``NotOwner``): the client reconnects with
  ``Last-Event-ID`` and any member forwards it to the new owner.

**Threads.** The engine's ``Subscription`` is a blocking, thread-safe iterator. Two ways to bring
it into the event loop were weighed: (a) each stream polls its own subscription with
``get(timeout)`` on a worker thread: every idle stream then holds a thread of the default
executor for its whole timeout, so 6 idle streams (2 cores) starve every ``to_thread`` read of
the app, and a short timeout turns into a busy poll per stream; (b) one ``EventHub`` per app owns
**one** engine subscription and **one** pump thread, which drains it in batches and hands each
batch to the loop with ``call_soon_threadsafe``; the loop fans the batch out to the streams of
each conversation (a dict lookup per event). (b) costs one thread whatever the number of
streams, and a stream costs only a deque and an ``asyncio.Event``; it is what this module does.
Measured in-process (FileLog, 2 cores; a read is ``to_thread(engine.entries)``): with 100 idle
streams, a read's p50 is 8,007 ms under (a) (the executor's threads all wait in ``get``) and
0.18 ms under (b) (0.08 ms with no stream); under (b) an append's event reaches the loop 0.39 ms
(p50) after the append started, the append included.
The hub subscribes when its first stream opens and closes its subscription when the last one
leaves (the projector builds no events for nobody). Since a stream registers on the loop and the
pump's batches run on the loop after it, every event applied after registration reaches it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Sequence
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from engine.aio import AsyncHistoryEngine
from engine.facade import HistoryEngine
from engine.service import problems
from engine.service.forward import stream_until_disconnected
from engine.service.routes import Context, Op
from engine.service.routing import Param, segment
from engine.service.wire import history_position_of
from projections.events import BatchEvent, ClearEvent, MessagesDeleted, ProjectedEvent, TurnReplacedEvent
from schemas.batch import StoredMessage
from schemas.errors import HistoryError, NotOwner, NotReady, SubscriptionLost
from schemas.ids import ConversationID, MessageID
from schemas.positions import HistoryPosition
from schemas.records import partition_for_key, record_key

__all__ = ["HEARTBEAT_S", "STALL_TIMEOUT_S", "STREAM_BUFFER", "EventHub", "EventStream", "Follower", "event_frames",
           "event_op", "frame"]

log = logging.getLogger("histlog.service.events")

HEARTBEAT_S = 15.0
"""Seconds between ``: keepalive`` comments on an idle stream (proxies close silent ones)."""
STREAM_BUFFER = 1000
"""Events one stream may hold unsent before it is dropped with ``event: error``."""
STALL_TIMEOUT_S = 30.0
"""Seconds one send may wait for a peer that does not read before the connection is dropped."""
HUB_BUFFER = 10_000
"""The hub's engine subscription buffer: the pump only moves events to the loop, so it falls
behind only when starved of CPU; then every stream gets ``event: error`` and the hub resubscribes."""
_PUMP_WAKE = 0.5  # the longest the pump sleeps in ``get`` before re-checking that it should run
_PUMP_BATCH = 512  # events handed to the loop per call_soon_threadsafe


def frame(event: str | None, data: bytes | None = None, event_id: str | None = None,
          comment: str | None = None) -> bytes:
    """One SSE frame (``data`` is one line of compact JSON)."""
    out = bytearray()
    if comment is not None:
        out += b": " + comment.encode() + b"\n"
    if event_id is not None:
        out += b"id: " + event_id.encode() + b"\n"
    if event is not None:
        out += b"event: " + event.encode() + b"\n"
    if data is not None:
        out += b"data: " + data + b"\n"
    return bytes(out + b"\n")


KEEPALIVE = frame(None, comment="keepalive")


def _message_frame(stored: StoredMessage) -> bytes:
    return frame("message", stored.to_json(), str(stored.position))


def _stored_of(event: BatchEvent | TurnReplacedEvent) -> list[StoredMessage]:
    """The StoredMessages an accepted event added, as ``entries`` reports them."""
    return [StoredMessage(MessageID.format(event.append_id, i), message, position, event.append_id, event.created_at)
            for i, (message, position) in enumerate(zip(event.messages, event.positions, strict=True))]


class Follower:
    """One stream's registration with the hub: a bounded queue of its conversation's events,
    filled on the loop by the hub, drained by the stream."""

    __slots__ = ("capacity", "conversation_id", "error", "generation", "queue", "wake")

    def __init__(self, conversation_id: str, capacity: int, generation: int) -> None:
        self.conversation_id = conversation_id
        self.capacity = capacity
        self.generation = generation
        self.queue: collections.deque[ProjectedEvent] = collections.deque()
        self.error: HistoryError | None = None
        self.wake = asyncio.Event()

    def _offer(self, event: ProjectedEvent) -> bool:
        """Queue ``event``; False (and the follower is lost, its queue freed) when it is full."""
        if len(self.queue) >= self.capacity:
            self._fail(SubscriptionLost(
                f"this event stream fell more than {self.capacity} events behind, so it was dropped; "
                "reconnect with Last-Event-ID (the last id you received) to resume without a gap",
                position=event.position))
            return False
        self.queue.append(event)
        self.wake.set()
        return True

    def _fail(self, error: HistoryError) -> None:
        self.error = error
        self.queue.clear()
        self.wake.set()

    async def next(self, timeout: float) -> ProjectedEvent | None:
        """The next event, None after ``timeout`` seconds without one; raises the error that
        dropped this follower (after nothing: a lost stream's queue is freed at once)."""
        if not self.queue and self.error is None:
            self.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout)
        if self.error is not None:
            raise self.error
        return self.queue.popleft() if self.queue else None


class EventHub:
    """The app's one engine subscription, fanned out to the streams of each conversation (see the
    module). Register and unregister on the event loop; ``close()`` from anywhere."""

    def __init__(self, engine: HistoryEngine, *, stream_buffer: int = STREAM_BUFFER, buffer: int = HUB_BUFFER) -> None:
        self.engine = engine
        self.stream_buffer = stream_buffer
        self.buffer = buffer
        self._followers: dict[str, set[Follower]] = {}
        self._count = 0
        self._lock = threading.Lock()  # the pump's subscription and generation, shared with its thread
        self._generation = 0
        self._subscription: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self.dropped = 0
        """Streams dropped because they fell more than ``stream_buffer`` events behind."""

    @property
    def streams(self) -> int:
        """Registered streams (what a test counts: they must not accumulate)."""
        return self._count

    @property
    def subscribed(self) -> bool:
        """Whether the hub holds an engine subscription now (only while a stream is registered)."""
        with self._lock:
            return self._subscription is not None

    def register(self, conversation_id: str) -> Follower:
        """A follower of ``conversation_id``: it gets every event applied after this returns."""
        if self._closed:
            raise NotReady("the service is shutting down; reconnect to another instance or later")
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._subscription is None:
                self._loop = loop
                self._generation += 1
                self._subscription = self.engine.subscribe(buffer=self.buffer)
                threading.Thread(target=self._pump, args=(self._subscription, self._generation, loop),
                                 name=f"histlog-events-{self._generation}", daemon=True).start()
            generation = self._generation
        follower = Follower(conversation_id, self.stream_buffer, generation)
        self._followers.setdefault(conversation_id, set()).add(follower)
        self._count += 1
        return follower

    def unregister(self, follower: Follower) -> None:
        """Forget ``follower`` (idempotent); the last one out closes the engine subscription."""
        group = self._followers.get(follower.conversation_id)
        if group is None or follower not in group:
            return
        group.discard(follower)
        if not group:
            del self._followers[follower.conversation_id]
        self._count -= 1
        if self._count == 0:
            self._unsubscribe()

    def _unsubscribe(self) -> None:
        with self._lock:
            subscription, self._subscription = self._subscription, None
        if subscription is not None:
            subscription.close()

    def close(self) -> None:
        """End the hub: streams get ``event: error`` at their next wake-up (idempotent)."""
        self._closed = True
        self._unsubscribe()
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._fail_all, None, SubscriptionLost("the service is shutting down"))

    def revoked(self, partitions: Iterable[int]) -> None:
        """End the streams of conversations in ``partitions`` (this member gave them up) with
        ``event: error`` (a ``NotOwner`` problem): an EventSource reconnects with its
        ``Last-Event-ID`` to any member, which forwards it to the new owner, so a stream follows
        its partition when it moves. Callable from any thread (membership calls it)."""
        parts = frozenset(partitions)
        loop = self._loop
        if parts and loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._end_partitions, parts)

    def _end_partitions(self, parts: frozenset[int]) -> None:
        count = self.engine.log.partitions
        for conversation_id, group in list(self._followers.items()):
            partition = partition_for_key(record_key(conversation_id), count)
            if partition not in parts:
                continue
            for follower in list(group):
                follower._fail(NotOwner(f"this member gave up partition {partition} (conversation "
                                        f"{conversation_id!r}): reconnect with Last-Event-ID to resume at its owner"))
                self.unregister(follower)

    # -- the pump thread and its hand-off ------------------------------------------------------
    def _pump(self, subscription: Any, generation: int, loop: asyncio.AbstractEventLoop) -> None:
        """Drain ``subscription`` in batches into the loop until it is closed or ends."""
        try:
            while True:
                try:
                    first = subscription.get(_PUMP_WAKE)
                except HistoryError as error:  # SubscriptionLost, or the projector's failure
                    loop.call_soon_threadsafe(self._fail_all, generation, error)
                    return
                if first is None:
                    if subscription.done:
                        loop.call_soon_threadsafe(self._fail_all, generation, SubscriptionLost(
                            "the engine stopped (the service is shutting down); reconnect later"))
                        return
                    continue
                batch = [first]
                while len(batch) < _PUMP_BATCH:
                    try:
                        more = subscription.get(0)
                    except HistoryError:
                        break  # raised again at the next get, after this batch is handed over
                    if more is None:
                        break
                    batch.append(more)
                loop.call_soon_threadsafe(self._dispatch, generation, batch)
        except RuntimeError:  # the loop closed under us: nothing left to hand events to
            subscription.close()

    def _dispatch(self, generation: int, events: Sequence[ProjectedEvent]) -> None:
        for event in events:
            group = self._followers.get(event.conversation_id)
            if not group:
                continue
            for follower in list(group):
                if follower.generation == generation and not follower._offer(event):
                    self.dropped += 1
                    self.unregister(follower)

    def _fail_all(self, generation: int | None, error: HistoryError) -> None:
        """End every follower of ``generation`` (all when None) with ``error``."""
        for group in list(self._followers.values()):
            for follower in list(group):
                if generation is None or follower.generation == generation:
                    follower._fail(error)
                    self.unregister(follower)
        with self._lock:
            if self._generation == generation and self._count == 0:
                self._subscription = None


async def event_frames(hub: EventHub, engine: AsyncHistoryEngine, follower: Follower,
                       after: HistoryPosition | None, *, heartbeat: float = HEARTBEAT_S) -> AsyncGenerator[bytes]:
    """The SSE frames of one stream, whose ``follower`` the caller registered before reading
    anything (and unregisters when done). Catch-up from ``after``, then live events deduplicated
    by position; ends after ``closed`` or ``error``."""
    try:
        async for chunk in _frames(engine, follower, after, heartbeat):
            yield chunk
    except HistoryError as error:  # lost, the engine stopped, a read failed: say so, then end
        yield frame("error", orjson.dumps(problems.problem_of(error)))
    finally:
        hub.unregister(follower)


async def _frames(engine: AsyncHistoryEngine, follower: Follower, after: HistoryPosition | None,
                  heartbeat: float) -> AsyncGenerator[bytes]:
    c = follower.conversation_id
    last = after
    if after is not None:
        rows = await engine.entries(c, after=after)
        for chunk in await _catch_up(engine, c, after, rows):
            yield chunk
        if rows:
            last = rows[-1].position
    if engine.engine._is_closed(c):  # cleared before the follower registered: its event is past
        yield frame("closed", orjson.dumps({"conversation_id": c}))
        return
    while True:
        event = await follower.next(heartbeat)
        if event is None:
            yield KEEPALIVE
            continue
        if isinstance(event, ClearEvent):
            yield frame("closed", orjson.dumps({"conversation_id": c}))
            return
        if isinstance(event, MessagesDeleted):
            yield frame("deleted", orjson.dumps({"ids": list(event.message_ids)}))
            continue
        fresh = [m for m in _stored_of(event) if last is None or m.position > last]
        if not fresh:
            continue  # the catch-up read covered it
        if isinstance(event, TurnReplacedEvent) and len(fresh) == len(event.messages):
            hidden = await _hidden_ids(engine, c, event)
            yield _replaced_frame(hidden, event.append_id, event.reason)
        for stored in fresh:
            yield _message_frame(stored)
        last = fresh[-1].position


def _replaced_frame(hidden: Iterable[str], append_id: str, reason: str | None) -> bytes:
    return frame("replaced", orjson.dumps({"hidden": list(hidden), "superseded_by": MessageID.format(append_id, 0),
                                           "reason": reason}))


async def _hidden_ids(engine: AsyncHistoryEngine, c: str, event: TurnReplacedEvent) -> list[str]:
    """The ids of the messages ``event`` hid: the hidden rows before its first position whose
    seq is in ``hidden_seqs`` (one read of the conversation with its hidden rows: replacements
    are rare, and a read is the only home of message ids)."""
    rows = await engine.entries(c, before=event.positions[0], include_hidden=True)
    return [m.id for m in rows if m.hidden and m.position.seq in event.hidden_seqs]


async def _catch_up(engine: AsyncHistoryEngine, c: str, after: HistoryPosition,
                    rows: list[StoredMessage]) -> list[bytes]:
    """The frames of a resume: ``replaced`` for every turn the client saw (at or before
    ``after``) that a turn it has not seen (past ``after``) hid, then the messages past ``after``.
    A replacement starts with a user message, so without one past ``after`` none happened and
    the hidden rows are not read."""
    out: list[bytes] = []
    if any(m.message.role == "user" for m in rows):
        every = await engine.entries(c, include_hidden=True)
        first_of = {m.id: m.position for m in every}
        by_turn: dict[str, tuple[list[str], str | None]] = {}
        for m in every:
            if m.hidden and m.position <= after and m.superseded_by is not None:
                at = first_of.get(m.superseded_by)
                if at is not None and at > after:
                    by_turn.setdefault(m.superseded_by, ([], m.reason))[0].append(m.id)
        for turn_id, (ids, reason) in sorted(by_turn.items(), key=lambda kv: first_of[kv[0]]):
            append_id = MessageID.parse(turn_id).append_id
            out.append(_replaced_frame(ids, append_id, reason))
    out.extend(_message_frame(m) for m in rows)
    return out


class EventStream(Response):
    """The ASGI response of one events request, for a ``follower`` registered before it was made
    (so a client that has the headers misses nothing applied afterwards): streams the frames and
    unregisters on the end, a disconnect (watched on ``receive``) or a send stalled past
    ``stall_timeout`` (the peer stopped reading: the connection is dropped, not waited on)."""

    def __init__(self, hub: EventHub, engine: AsyncHistoryEngine, follower: Follower,
                 after: HistoryPosition | None, *, heartbeat: float = HEARTBEAT_S,
                 stall_timeout: float = STALL_TIMEOUT_S) -> None:
        super().__init__(status_code=200, media_type="text/event-stream")
        self.hub = hub
        self.engine = engine
        self.follower = follower
        self.conversation_id = follower.conversation_id
        self.after = after
        self.heartbeat = heartbeat
        self.stall_timeout = stall_timeout

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        follower = self.follower
        frames = event_frames(self.hub, self.engine, follower, self.after, heartbeat=self.heartbeat)
        try:
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                (b"x-accel-buffering", b"no")]})
            await stream_until_disconnected(self._stream(frames, send), receive)
        finally:
            await frames.aclose()
            self.hub.unregister(follower)

    async def _stream(self, frames: AsyncIterator[bytes], send: Any) -> None:
        try:
            async for chunk in frames:
                await asyncio.wait_for(send({"type": "http.response.body", "body": chunk, "more_body": True}),
                                       self.stall_timeout)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except TimeoutError:
            log.info("an event stream of %r stalled (the client stopped reading): dropped", self.conversation_id)
        except OSError:
            pass  # the client went away mid-send


def event_op(hub: EventHub, *, heartbeat: float = HEARTBEAT_S, stall_timeout: float = STALL_TIMEOUT_S) -> Op:
    """The ``GET .../events`` row of the route table, streaming from ``hub``."""

    async def get_events(request: Request, ctx: Context, query: dict[str, Any]) -> Response:
        c = str(ConversationID(segment(request, "c")))
        after: HistoryPosition | None = query.get("after")
        resume = request.headers.get("last-event-id")
        if resume is not None:  # a reconnecting EventSource: newer than the URL's after
            after = history_position_of(resume, "header Last-Event-ID")
        engine = ctx.router.engine(c)
        follower = hub.register(c)  # before any read and before the headers: see the module
        return EventStream(hub, engine, follower, after, heartbeat=heartbeat, stall_timeout=stall_timeout)

    return Op("GET", "/v1/conversations/{c}/events", "events",
              "Server-sent events of what is accepted for the conversation: message (id TURN:SEQ), replaced, "
              "closed; resume with after= or Last-Event-ID", get_events, (200, None),
              query=(Param("after", "history", "resume after this position (default: from now)"),),
              errors=(400, 401, 503), ok_media="text/event-stream")
