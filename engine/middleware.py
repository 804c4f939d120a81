"""``HistoryMiddleware``: wrap a chat model so history is read and written around each call
(docs/middleware.md is the user's guide; this docstring is the contract).

One call, in this order (the decisions live in ``engine/flow.py``, written once):

1. **Validate the input** (no I/O yet): the request is a ``ChatRequest`` whose messages are a
   system prefix and exactly one *open turn*: one user message, then only that turn's tool
   exchange (assistant messages that each make a tool call, each followed by the tool results
   answering those calls by id, every call answered before the model is called). Earlier turns
   come from the store: a request that resends them would store them twice. The append id,
   when given, is a valid ``AppendID``.
2. **Read** the conversation through the reader and check every stored message (a
   ``schemas.Message`` is validated on construction and immutable, so the check is by type);
   an invalid one fails the call before the model runs.
3. **Call the model** with: the request's system messages, the stored messages minus stored
   system messages, then the open turn (``tools`` and ``options`` passed through).
4. **Persist** only after natural, error-free completion with an assistant message that makes
   no tool call: one ``Batch`` = the open turn's messages + that assistant message, appended
   atomically through the writer with the caller's ``append_id`` or a new UUIDv7. A tool-call
   round, or a response without a message, writes nothing; the finish reason does not decide.
   If the append fails, ``CommitError`` carries the exact ``batch``, any ``receipt``, the
   ``response`` and the cause: ``engine.append(err.batch)`` completes it without calling the
   model again.

Streams (``stream``, ``retry_stream``, ``edit_stream`` and their asyncio forms) return a
generator at once and do nothing until the first ``next()``; they pass every chunk through
unchanged, fold it into a ``ResponseAccumulator``, and persist when upstream is exhausted, in
the consumer's ``next()`` after the last chunk (which raises ``CommitError`` if persistence
fails). Closing the generator earlier (even right after the finish chunk) closes upstream and
persists nothing; an upstream error propagates unchanged, once, and persists nothing; a
malformed chunk (or a stream that ends without a finish reason) raises ``InvalidMessage`` and
persists nothing.

asyncio (``acall``, ``astream``, ``aretry``, ``aedit``...): the reader and the writer run in
worker threads (``asyncio.to_thread``), never on the event loop. A cancellation that lands
before the append starts (while reading, while the model runs, while streaming) persists
nothing. An append that has started cannot be recalled, since the log may already hold it: the
task then waits for that append to be decided and only then raises ``CancelledError``, with a
note saying the batch may have been stored; no append is ever left running after the task ended.

Edit and retry *replace* the conversation's latest visible turn instead of adding one; they need
an engine as the writer (``latest_turn``, ``replace_turn``, and ``window`` or ``entries``). The
model sees the request's system messages, the stored history *before* the replaced turn (read
up to that turn only and, if the reader is a ``WindowReader``, cut to its limit by the engine's
window read: O(window), not O(history)), then the open turn. For ``retry`` the open turn is the
stored user message when the request holds only system messages (or the request's own open
turn, whose user message must have the same content); for ``edit`` it is the request's open
turn with the new user message. On completion the batch goes through ``replace_turn(batch,
old_turn_id, reason)``, which admission refuses with ``TurnNotReplaceable`` if another writer
replaced or extended the turn meanwhile; a failed persistence raises ``CommitError`` with
``old_turn_id`` and ``reason`` set, to complete with ``engine.replace_turn(err.batch,
err.old_turn_id, err.reason)``.

The drivers below only run the flow's steps: ``_drive`` in the caller's thread, ``_adrive`` on
the event loop with the store in worker threads (as httpx runs one auth flow through a sync and
an async driver).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterable, Awaitable, Callable, Generator, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, TypeVar, cast

from engine.flow import (
    Flow,
    Generate,
    Persist,
    ReadBefore,
    ReadHistory,
    ReadTurn,
    Step,
    accumulate,
    advance,
    append_flow,
    finish,
    replace_flow,
)
from engine.window import Reader, WindowReader, check_reader
from schemas.batch import Batch, HistoryTurn, Receipt, StoredMessage
from schemas.chat import ChatDelta, ChatRequest, ChatResponse, ResponseAccumulator
from schemas.errors import InvalidComponent, InvalidMessage
from schemas.ids import ConversationID
from schemas.messages import Message
from schemas.positions import HistoryPosition

__all__ = [
    "AsyncWrappedModel",
    "AsyncWrappedStreamer",
    "HistoryMiddleware",
    "MiddlewareConfig",
    "TurnReplacer",
    "WrappedModel",
    "WrappedStreamer",
    "Writer",
]

_T = TypeVar("_T")


class Writer(Protocol):
    """Anything that appends a batch atomically and returns its receipt (e.g. ``HistoryEngine``)."""

    def append(self, batch: Batch) -> Receipt: ...


class TurnReplacer(Writer, Protocol):
    """The writer ``retry``/``edit`` need: an engine that finds the latest turn, reads what comes
    before it (``window`` under a ``WindowReader``, else ``entries``) and replaces it."""

    def latest_turn(self, conversation_id: str) -> HistoryTurn | None: ...

    def entries(self, conversation_id: str, after: HistoryPosition | None = None,
                before: HistoryPosition | None = None) -> list[StoredMessage]: ...

    def window(self, conversation_id: str, limit: int, before: HistoryPosition | None = None) -> list[Message]: ...

    def replace_turn(self, batch: Batch, old_turn_id: str, reason: str) -> Receipt: ...


class WrappedModel(Protocol):
    """What ``HistoryMiddleware.call`` (and ``retry``/``edit``) return."""

    def __call__(self, request: ChatRequest, /, *, append_id: str | None = None) -> ChatResponse: ...


class WrappedStreamer(Protocol):
    """What ``HistoryMiddleware.stream`` (and ``retry_stream``/``edit_stream``) return: a lazy
    generator of the upstream chunks."""

    def __call__(
        self, request: ChatRequest, /, *, append_id: str | None = None
    ) -> Generator[ChatDelta, None, None]: ...


class AsyncWrappedModel(Protocol):
    """What ``HistoryMiddleware.acall`` (and ``aretry``/``aedit``) return."""

    def __call__(self, request: ChatRequest, /, *, append_id: str | None = None) -> Awaitable[ChatResponse]: ...


class AsyncWrappedStreamer(Protocol):
    """What ``HistoryMiddleware.astream`` (and ``aretry_stream``/``aedit_stream``) return: a lazy
    async generator of the upstream chunks."""

    def __call__(
        self, request: ChatRequest, /, *, append_id: str | None = None
    ) -> AsyncGenerator[ChatDelta, None]: ...


def _require(obj: object, role: str, names: Iterable[str], what: str) -> None:
    for name in names:
        if not callable(getattr(obj, name, None)):
            raise InvalidComponent(f"{role} {type(obj).__name__} has no {name}() method; {what}")


@dataclass(frozen=True, slots=True)
class MiddlewareConfig:
    """Binds one conversation to a reader and a writer.

    ``reader``: anything with ``read(conversation_id) -> list[Message]`` (a ``HistoryEngine``,
    a ``WindowReader``...). ``writer``: anything with ``append(batch) -> Receipt`` (a
    ``HistoryEngine``). Checked here: an invalid ``conversation_id`` raises
    ``InvalidConversationID``, a reader or writer without its method (``None`` included)
    ``InvalidComponent`` (a ``TypeError``), before any call.
    """

    reader: Reader
    writer: Writer
    conversation_id: str  # a ConversationID once constructed

    def __post_init__(self) -> None:
        object.__setattr__(self, "conversation_id", ConversationID(self.conversation_id))
        check_reader(self.reader, "MiddlewareConfig")
        _require(self.writer, "MiddlewareConfig: writer", ["append"], "pass a HistoryEngine")


_Plan = Callable[[object, str | None], Flow]


class HistoryMiddleware:
    """Wraps chat models so each call reads the conversation's history and persists its turn.

    See the module docstring for the exact flow and guarantees. The middleware holds no state
    between calls: it is safe to share across threads (each call is independent), and one
    middleware serves one conversation.
    """

    __slots__ = ("_config", "_conversation_id")

    def __init__(self, config: MiddlewareConfig) -> None:
        if not isinstance(config, MiddlewareConfig):
            raise TypeError(f"HistoryMiddleware takes a MiddlewareConfig, got {type(config).__name__}")
        self._config = config
        self._conversation_id: ConversationID = ConversationID(config.conversation_id)

    @property
    def config(self) -> MiddlewareConfig:
        return self._config

    @property
    def conversation_id(self) -> ConversationID:
        return self._conversation_id

    # ----- the wrappers: add a turn
    def call(self, model: Callable[[ChatRequest], ChatResponse]) -> WrappedModel:
        """Wrap ``model(request) -> ChatResponse``; the result also takes ``append_id=None``."""
        return self._called(partial(append_flow, self._conversation_id), model)

    def stream(self, streamer: Callable[[ChatRequest], Iterable[ChatDelta]]) -> WrappedStreamer:
        """Wrap ``streamer(request) -> Iterator[ChatDelta]``; the result returns a lazy generator."""
        return self._streamed(partial(append_flow, self._conversation_id), streamer)

    def acall(self, amodel: Callable[[ChatRequest], Awaitable[ChatResponse]]) -> AsyncWrappedModel:
        """Wrap ``async amodel(request) -> ChatResponse``; the store runs in worker threads."""
        return self._acalled(partial(append_flow, self._conversation_id), amodel)

    def astream(self, astreamer: Callable[[ChatRequest], AsyncIterable[ChatDelta]]) -> AsyncWrappedStreamer:
        """Wrap ``astreamer(request) -> AsyncIterator[ChatDelta]``; the result returns a lazy async generator."""
        return self._astreamed(partial(append_flow, self._conversation_id), astreamer)

    # ----- the wrappers: replace the latest turn
    def retry(self, model: Callable[[ChatRequest], ChatResponse]) -> WrappedModel:
        """Wrap ``model`` to regenerate the latest turn's answer: call the result with a request of
        the system messages only (the stored user message is used) or with the same user message;
        the new turn replaces the old one (``replace_turn(..., "retry")``)."""
        return self._called(self._replacing("retry"), model)

    def retry_stream(self, streamer: Callable[[ChatRequest], Iterable[ChatDelta]]) -> WrappedStreamer:
        """``retry`` for a streamer: a lazy generator, replacing the turn on natural exhaustion."""
        return self._streamed(self._replacing("retry"), streamer)

    def aretry(self, amodel: Callable[[ChatRequest], Awaitable[ChatResponse]]) -> AsyncWrappedModel:
        """``retry`` for an ``async`` model; the engine runs in worker threads."""
        return self._acalled(self._replacing("retry"), amodel)

    def aretry_stream(self, astreamer: Callable[[ChatRequest], AsyncIterable[ChatDelta]]) -> AsyncWrappedStreamer:
        """``retry_stream`` for an async streamer; the engine runs in worker threads."""
        return self._astreamed(self._replacing("retry"), astreamer)

    def edit(self, model: Callable[[ChatRequest], ChatResponse]) -> WrappedModel:
        """Wrap ``model`` to answer an edited user message: call the result with the system messages
        and the new user message; the new turn replaces the latest one (``replace_turn(..., "edit")``)."""
        return self._called(self._replacing("edit"), model)

    def edit_stream(self, streamer: Callable[[ChatRequest], Iterable[ChatDelta]]) -> WrappedStreamer:
        """``edit`` for a streamer: a lazy generator, replacing the turn on natural exhaustion."""
        return self._streamed(self._replacing("edit"), streamer)

    def aedit(self, amodel: Callable[[ChatRequest], Awaitable[ChatResponse]]) -> AsyncWrappedModel:
        """``edit`` for an ``async`` model; the engine runs in worker threads."""
        return self._acalled(self._replacing("edit"), amodel)

    def aedit_stream(self, astreamer: Callable[[ChatRequest], AsyncIterable[ChatDelta]]) -> AsyncWrappedStreamer:
        """``edit_stream`` for an async streamer; the engine runs in worker threads."""
        return self._astreamed(self._replacing("edit"), astreamer)

    def _replacing(self, reason: str) -> _Plan:
        """The plan of a retry or edit; refuses, when wrapping, a writer that cannot replace turns."""
        before = "window" if isinstance(self._config.reader, WindowReader) else "entries"
        _require(self._config.writer, "retry/edit replace the latest turn through the writer, and",
                 ["latest_turn", before, "replace_turn"], "use a HistoryEngine as the writer")
        return partial(replace_flow, self._conversation_id, reason)

    # ----- the four faces of one driver pair
    def _called(self, plan: _Plan, model: Callable[[ChatRequest], object]) -> WrappedModel:
        def wrapped(request: ChatRequest, /, *, append_id: str | None = None) -> ChatResponse:
            out: list[ChatResponse] = []
            for _ in self._drive(plan(request, append_id), model, False, out):
                pass  # Invariant: a plain call yields no chunk.
            return out[0]

        return wrapped

    def _streamed(self, plan: _Plan, streamer: Callable[[ChatRequest], object]) -> WrappedStreamer:
        def wrapped(request: ChatRequest, /, *, append_id: str | None = None) -> Generator[ChatDelta, None, None]:
            return self._drive(plan(request, append_id), streamer, True, [])

        return wrapped

    def _acalled(self, plan: _Plan, amodel: Callable[[ChatRequest], Any]) -> AsyncWrappedModel:
        async def wrapped(request: ChatRequest, /, *, append_id: str | None = None) -> ChatResponse:
            out: list[ChatResponse] = []
            async for _ in self._adrive(plan(request, append_id), amodel, False, out):
                pass  # Invariant: a plain call yields no chunk.
            return out[0]

        return wrapped

    def _astreamed(self, plan: _Plan, astreamer: Callable[[ChatRequest], object]) -> AsyncWrappedStreamer:
        def wrapped(request: ChatRequest, /, *, append_id: str | None = None) -> AsyncGenerator[ChatDelta, None]:
            return self._adrive(plan(request, append_id), astreamer, True, [])

        return wrapped

    # ----- the drivers (I/O only)
    def _io(self, step: Step) -> object:
        """Run one store step (every step but ``Generate``), in the calling thread."""
        cid, writer = self._conversation_id, self._config.writer
        engine = cast(TurnReplacer, writer)  # Invariant: replace steps come only from _replacing's checked plan.
        if isinstance(step, ReadHistory):
            return self._config.reader.read(cid)
        if isinstance(step, ReadTurn):
            return engine.latest_turn(cid)
        if isinstance(step, ReadBefore):
            reader = self._config.reader
            if isinstance(reader, WindowReader):
                return engine.window(cid, reader.limit, before=step.position)
            return [e.message for e in engine.entries(cid, before=step.position)]
        assert isinstance(step, Persist), step  # Invariant: the drivers run Generate themselves.
        if step.replacing is None:
            return writer.append(step.batch)
        return engine.replace_turn(step.batch, step.replacing.old_turn_id, step.replacing.reason)

    def _drive(self, flow: Flow, model: Callable[[ChatRequest], Any], stream: bool,
               out: list[ChatResponse]) -> Generator[ChatDelta, None, None]:
        """Run ``flow`` in this thread: each step's result is sent in, its error thrown in. With
        ``stream``, ``model`` is a streamer whose chunks are yielded as they come."""
        try:
            step = advance(flow, None, None)
            while not isinstance(step, ChatResponse):
                result: object = None
                error: Exception | None = None
                try:
                    if not isinstance(step, Generate):
                        result = self._io(step)
                    elif not stream:
                        result = model(step.request)
                    else:
                        upstream = model(step.request)
                        if not isinstance(upstream, Iterable):
                            raise InvalidMessage(f"the streamer returned {type(upstream).__name__}, not an "
                                                 "iterator of ChatDelta; nothing was stored")
                        chunks, acc = iter(upstream), ResponseAccumulator()
                        try:
                            for delta in chunks:
                                accumulate(acc, delta)
                                yield delta
                        finally:  # exhausted, failed, or closed by the consumer: upstream is closed either way
                            close = getattr(chunks, "close", None)
                            if close is not None:
                                close()
                        result = finish(acc)
                except Exception as exc:
                    error = exc
                step = advance(flow, result, error)
            out.append(step)
        finally:
            flow.close()

    async def _adrive(self, flow: Flow, amodel: Callable[[ChatRequest], Any], stream: bool,
                      out: list[ChatResponse]) -> AsyncGenerator[ChatDelta, None]:
        """``_drive`` on the event loop: reads in a worker thread (a cancellation leaves them),
        writes through ``_decided`` (a cancellation waits for them, then says so in a note)."""
        try:
            step = advance(flow, None, None)
            while not isinstance(step, ChatResponse):
                result: object = None
                error: Exception | None = None
                try:
                    if isinstance(step, Persist):
                        try:
                            result = await _decided(self._io, step)
                        except asyncio.CancelledError as cancelled:
                            cancelled.add_note(step.note())
                            raise
                    elif not isinstance(step, Generate):
                        result = await asyncio.to_thread(self._io, step)
                    elif not stream:
                        result = await amodel(step.request)
                    else:
                        upstream = amodel(step.request)
                        if not isinstance(upstream, AsyncIterable):
                            raise InvalidMessage(f"the async streamer returned {type(upstream).__name__}, not an "
                                                 "async iterator of ChatDelta; nothing was stored")
                        chunks, acc = aiter(upstream), ResponseAccumulator()
                        try:
                            async for delta in chunks:
                                accumulate(acc, delta)
                                yield delta
                        finally:
                            aclose = getattr(chunks, "aclose", None)
                            if aclose is not None:
                                await aclose()
                        result = finish(acc)
                except Exception as exc:
                    error = exc
                step = advance(flow, result, error)
            out.append(step)
        finally:
            flow.close()


async def _decided(fn: Callable[[Any], _T], arg: Any) -> _T:
    """Run ``fn(arg)`` in a worker thread and wait until it has returned, even through
    cancellation: a cancellation is re-raised only once ``fn`` has finished, so nothing is left
    in flight behind a cancelled task."""
    inner = asyncio.ensure_future(asyncio.to_thread(fn, arg))
    cancelled: asyncio.CancelledError | None = None
    while not inner.done():
        try:
            await asyncio.wait((inner,))
        except asyncio.CancelledError as exc:
            cancelled = exc
    if cancelled is not None:
        if not inner.cancelled():
            inner.exception()  # retrieved: the outcome is superseded by the cancellation
        raise cancelled
    return inner.result()
