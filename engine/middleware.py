"""``HistoryMiddleware``: wrap a chat model so history is read and written around each call
(DESIGN.md §6, API.md "contract pieces"). Long (≈580 lines) because the sync and asyncio flows
are still written twice; writing the flow once, as steps run by a sync and an async driver,
removes about half of it.

One call, in this order:

1. **Validate the input** (no I/O yet): the request is a ``ChatRequest`` whose messages are a
   system prefix and exactly one *open turn*; the append id, when given, is a valid
   ``AppendID``. The open turn is checked like this (``_open_turn``):

   * after the system prefix there is at least one message, and the first is a **user**
     message; no other user message follows (earlier turns come from the store: a request
     that resends them would store them twice);
   * after the user message come only this turn's tool exchange: **assistant messages that
     each make at least one tool call**, each followed by **tool messages** whose results
     answer those calls by id. A call id is used once in the turn; a result answers a call of
     this turn that has no result yet; every call has its result before the next assistant
     message and before the model is called. (An assistant message without a tool call ends a
     turn, so it cannot be part of an open one.)

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

Streams (``stream``/``astream``) return a generator at once and do nothing until the first
``next()``; they pass every chunk through unchanged, fold it into a ``ResponseAccumulator``,
and persist when upstream is exhausted, in the consumer's ``next()`` after the last chunk
(which raises ``CommitError`` if persistence fails). Closing the generator earlier (even right
after the finish chunk) closes upstream and persists nothing; an upstream error propagates
unchanged, once, and persists nothing; a malformed chunk (or a stream that ends without a
finish reason) raises ``InvalidMessage`` and persists nothing.

asyncio (``acall``/``astream``): the reader and the writer run in worker threads
(``asyncio.to_thread``), never on the event loop. Cancellation: a cancellation that lands
before the append starts (while reading, while the model runs, while streaming) persists
nothing. An append that has started (the batch was handed to the writer's worker thread, the
first await after the model returned) cannot be recalled, since the log may already hold it: the
task then waits for that append to be decided and only then raises ``CancelledError``, with a
note saying the batch may have been stored; no append is ever left running after the task
ended. The flow's decisions (``_Turn``) are written once; the four drivers only do the I/O.

Edit and retry (``retry``/``edit`` and ``aretry``/``aedit``) wrap a model the same way but
*replace* the conversation's latest visible turn instead of adding one; they need an engine as
the writer (``latest_turn``, ``entries``, ``replace_turn``). The model sees the request's system
messages, the stored history *before* the replaced turn (cut to the ``WindowReader``'s limit if
the reader is one), then the open turn. For ``retry`` the open turn is the stored user message
when the request holds only system messages (or the request's own open turn, whose user message
must have the same content); for ``edit`` it is the request's open turn with the new user
message. On completion the batch goes through ``replace_turn(batch, old_turn_id, reason)``,
which admission refuses with ``TurnNotReplaceable`` if another writer replaced or extended the
turn meanwhile; a failed persistence raises ``CommitError`` with ``old_turn_id`` and ``reason``
set, to complete with ``engine.replace_turn(err.batch, err.old_turn_id, err.reason)``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterable, Awaitable, Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from engine.uuid7 import uuid7
from engine.window import Reader, WindowReader, check_reader
from projections.window import select_window
from schemas.batch import Batch, HistoryTurn, Receipt, StoredMessage
from schemas.chat import ChatDelta, ChatRequest, ChatResponse, ResponseAccumulator
from schemas.errors import CommitError, InvalidComponent, InvalidMessage, InvalidReceipt, TurnNotReplaceable
from schemas.ids import AppendID, ConversationID
from schemas.messages import Message, Role, ToolCallPart, ToolResultPart
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
    """The writer ``retry``/``edit`` need: an engine that finds and replaces the latest turn."""

    def latest_turn(self, conversation_id: str) -> HistoryTurn | None: ...

    def entries(self, conversation_id: str, after: HistoryPosition | None = None,
                before: HistoryPosition | None = None) -> list[StoredMessage]: ...

    def replace_turn(self, batch: Batch, old_turn_id: str, reason: str) -> Receipt: ...


class WrappedModel(Protocol):
    """What ``HistoryMiddleware.call`` (and ``retry``/``edit``) return."""

    def __call__(self, request: ChatRequest, /, *, append_id: str | None = None) -> ChatResponse: ...


class WrappedStreamer(Protocol):
    """What ``HistoryMiddleware.stream`` returns: a lazy generator of the upstream chunks."""

    def __call__(
        self, request: ChatRequest, /, *, append_id: str | None = None
    ) -> Generator[ChatDelta, None, None]: ...


class AsyncWrappedModel(Protocol):
    """What ``HistoryMiddleware.acall`` (and ``aretry``/``aedit``) return."""

    def __call__(self, request: ChatRequest, /, *, append_id: str | None = None) -> Awaitable[ChatResponse]: ...


class AsyncWrappedStreamer(Protocol):
    """What ``HistoryMiddleware.astream`` returns: a lazy async generator of the upstream chunks."""

    def __call__(
        self, request: ChatRequest, /, *, append_id: str | None = None
    ) -> AsyncGenerator[ChatDelta, None]: ...


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
        if not callable(getattr(self.writer, "append", None)):
            raise InvalidComponent(
                f"MiddlewareConfig: writer {type(self.writer).__name__} has no append() method; "
                "pass a HistoryEngine")


# --------------------------------------------------------------------------- the decisions (no I/O)


def _open_turn(request: ChatRequest) -> tuple[tuple[Message, ...], tuple[Message, ...]]:
    """Split a request into its system prefix and its open turn; raise ``InvalidMessage`` unless
    the open turn is one user message followed only by its tool exchange (module docstring)."""
    messages = request.messages
    start = 0
    while start < len(messages) and messages[start].role is Role.SYSTEM:
        start += 1
    if start == len(messages):
        raise InvalidMessage(
            "invalid request: no open turn after the system messages; add the user's message "
            "(earlier turns come from the store)")
    if messages[start].role is not Role.USER:
        raise InvalidMessage(
            f"invalid request: messages[{start}]: the open turn starts with a {messages[start].role.value} "
            "message; it must start with the user's message (earlier turns come from the store: do not resend them)")
    pending: dict[str, int] = {}  # call id -> index of the assistant message that made it
    seen: set[str] = set()
    for i in range(start + 1, len(messages)):
        m = messages[i]
        if m.role is Role.USER:
            raise InvalidMessage(
                f"invalid request: messages[{i}]: a second user message; a request holds one open turn "
                "(earlier turns come from the store): send only the newest user message and its tool exchange")
        if m.role is Role.ASSISTANT:
            calls = [p.id for p in m.parts if isinstance(p, ToolCallPart)]
            if not calls:
                raise InvalidMessage(
                    f"invalid request: messages[{i}]: an assistant message without a tool call ends a turn, "
                    "so it cannot be in the open turn; resubmit only the user message, the assistant's tool "
                    "calls and their tool results")
            if pending:
                raise InvalidMessage(
                    f"invalid request: messages[{i}]: tool call {next(iter(pending))!r} has no result before "
                    "the next assistant message; add a tool message with its result")
            for call_id in calls:
                if call_id in seen:
                    raise InvalidMessage(
                        f"invalid request: messages[{i}]: tool call id {call_id!r} is used twice in the open "
                        "turn; give every call its own id")
                seen.add(call_id)
                pending[call_id] = i
        elif m.role is Role.TOOL:
            for part in m.parts:
                call_id = part.id if isinstance(part, ToolResultPart) else ""
                if call_id not in pending:
                    raise InvalidMessage(
                        f"invalid request: messages[{i}]: tool result {call_id!r} answers no open tool call of "
                        "this turn; every result must answer an earlier assistant tool call, once")
                del pending[call_id]
        else:  # Invariant: ChatRequest allows system messages only as the leading prefix.
            raise AssertionError(f"system message at {i} after the prefix")
    if pending:
        raise InvalidMessage(
            f"invalid request: tool call {next(iter(pending))!r} (messages[{pending[next(iter(pending))]}]) "
            "has no result; add a tool message with its result before calling the model")
    return messages[:start], messages[start:]


class _Turn:
    """One wrapped call's decisions: built from validated input, fed the I/O results by a driver."""

    __slots__ = ("_append_id", "_conversation_id", "_open", "_request", "_system")

    def __init__(self, conversation_id: ConversationID, request: object, append_id: str | None) -> None:
        if not isinstance(request, ChatRequest):
            raise InvalidMessage(
                f"invalid request: expected a schemas.ChatRequest, got {type(request).__name__}; "
                "build one with ChatRequest([Message.system(...), Message.user(...)])")
        self._system, self._open = _open_turn(request)
        self._append_id = AppendID(append_id) if append_id is not None else None
        self._conversation_id = conversation_id
        self._request = request

    def model_request(self, stored: object) -> ChatRequest:
        """The model's request: system prefix, stored non-system messages, the open turn.
        Every stored message is checked first."""
        if not isinstance(stored, (list, tuple)):
            raise InvalidMessage(
                f"the reader returned {type(stored).__name__} for {str(self._conversation_id)!r}; "
                "a reader must return a list of schemas.Message")
        prior: list[Message] = []
        for i, m in enumerate(stored):
            if not isinstance(m, Message):
                raise InvalidMessage(
                    f"invalid stored message: {str(self._conversation_id)!r}[{i}] is a {type(m).__name__}, "
                    "not a schemas.Message; the reader must return validated messages. The model was not called")
            if m.role is not Role.SYSTEM:
                prior.append(m)
        if not prior:
            return self._request
        return ChatRequest((*self._system, *prior, *self._open), self._request.tools, self._request.options)

    def batch_for(self, response: object) -> Batch | None:
        """The batch to append after a natural completion, or ``None`` when nothing is stored."""
        if not isinstance(response, ChatResponse):
            raise InvalidMessage(
                f"the model returned {type(response).__name__}, not a schemas.ChatResponse; nothing was stored. "
                "Fix the model adapter")
        message = response.message
        if message is None or any(isinstance(p, ToolCallPart) for p in message.parts):
            return None
        append_id = self._append_id if self._append_id is not None else AppendID(str(uuid7()))
        return Batch(self._conversation_id, append_id, (*self._open, message))


@dataclass(frozen=True, slots=True)
class _Replacing:
    """A retry or edit in progress: the turn it replaces."""

    old_turn_id: str
    reason: str


def _commit_error(batch: Batch, response: ChatResponse, cause: BaseException,
                  receipt: Receipt | None = None, replacing: _Replacing | None = None) -> CommitError:
    if replacing is None:
        how = "retry with engine.append(err.batch)"
    else:
        how = "retry with engine.replace_turn(err.batch, err.old_turn_id, err.reason)"
    return CommitError(
        f"the model answered but appending its turn ({str(batch.append_id)!r}, {len(batch)} messages) to "
        f"{str(batch.conversation_id)!r} failed: {cause}; {how} (safe to repeat, the model is not called again)",
        batch=batch, receipt=receipt, response=response,
        old_turn_id=replacing.old_turn_id if replacing else None, reason=replacing.reason if replacing else None)


def _receipt(batch: Batch, response: ChatResponse, receipt: object, replacing: _Replacing | None = None) -> Receipt:
    """``receipt`` if it names ``batch``; otherwise a ``CommitError``."""
    if not isinstance(receipt, Receipt):
        cause = InvalidReceipt(f"the writer returned {type(receipt).__name__}, not a Receipt")
        raise _commit_error(batch, response, cause, None, replacing) from cause
    try:
        receipt.validate_for(batch)
    except InvalidReceipt as exc:
        raise _commit_error(batch, response, exc, receipt, replacing) from exc
    return receipt


def _replacement_request(request: object, old: HistoryTurn, reason: str) -> ChatRequest:
    """The request of a retry or edit: for a retry without an open turn, the stored user message
    is the open turn; a retry's user message must keep the old content (as admission demands)."""
    if not isinstance(request, ChatRequest):
        raise InvalidMessage(f"invalid request: expected a schemas.ChatRequest, got {type(request).__name__}")
    old_user = old.messages[0].message
    has_turn = any(m.role is not Role.SYSTEM for m in request.messages)
    if reason == "edit":
        if not has_turn:
            raise InvalidMessage("invalid edit: the request holds no user message; put the edited user message "
                                 "after the system messages")
        return request
    if not has_turn:
        return ChatRequest((*request.messages, old_user), request.tools, request.options)
    user = next(m for m in request.messages if m.role is not Role.SYSTEM)
    if user.content_json() != old_user.content_json():
        raise TurnNotReplaceable(
            f"a retry keeps the user message of turn {old.id!r}, but the request's differs; use edit for a "
            "new user message, or send only the system messages to retry the stored one")
    return request


def _accumulate(acc: ResponseAccumulator, delta: object) -> None:
    try:
        acc.add(delta)  # type: ignore[arg-type]  # checked inside: a non-ChatDelta raises InvalidMessage
    except InvalidMessage as exc:
        raise InvalidMessage(f"{exc}; the stream was abandoned and nothing was stored") from exc


def _finish(acc: ResponseAccumulator) -> ChatResponse:
    try:
        return acc.response()
    except InvalidMessage as exc:
        raise InvalidMessage(f"{exc}; the stream ended without a finish reason, nothing was stored") from exc


# --------------------------------------------------------------------------- the drivers (I/O only)


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

    def _turn(self, request: object, append_id: str | None) -> _Turn:
        return _Turn(self._conversation_id, request, append_id)

    def _read(self) -> list[Message]:
        return self._config.reader.read(self._conversation_id)

    # ----- sync
    def _persist(self, batch: Batch, response: ChatResponse) -> Receipt:
        try:
            receipt = self._config.writer.append(batch)
        except Exception as exc:
            raise _commit_error(batch, response, exc) from exc
        return _receipt(batch, response, receipt)

    def _replacer(self) -> TurnReplacer:
        writer = self._config.writer
        for name in ("latest_turn", "entries", "replace_turn"):
            if not callable(getattr(writer, name, None)):
                raise InvalidComponent(f"retry/edit replace the latest turn through the writer, and "
                                f"{type(writer).__name__} has no {name}(); use a HistoryEngine as the writer")
        return writer  # type: ignore[return-value]  # checked above, method by method

    def _replacement(self, engine: TurnReplacer, request: object, reason: str,
                     append_id: str | None) -> tuple[_Turn, _Replacing, list[Message]]:
        """Read the latest turn and the history before it; validate the request (no model call yet)."""
        old = engine.latest_turn(self._conversation_id)
        if old is None:
            raise TurnNotReplaceable(f"conversation {str(self._conversation_id)!r} has no turn to {reason}")
        turn = self._turn(_replacement_request(request, old, reason), append_id)
        before = [e.message for e in engine.entries(self._conversation_id, before=HistoryPosition(old.position, 0))]
        reader = self._config.reader
        if isinstance(reader, WindowReader):
            before = select_window(before, reader.limit)
        return turn, _Replacing(old.id, reason), before

    def _replace(self, engine: TurnReplacer, batch: Batch, response: ChatResponse, replacing: _Replacing) -> Receipt:
        try:
            receipt = engine.replace_turn(batch, replacing.old_turn_id, replacing.reason)
        except Exception as exc:
            raise _commit_error(batch, response, exc, None, replacing) from exc
        return _receipt(batch, response, receipt, replacing)

    def retry(self, model: Callable[[ChatRequest], ChatResponse]) -> WrappedModel:
        """Wrap ``model`` to regenerate the latest turn's answer: call the result with a request of
        the system messages only (the stored user message is used) or with the same user message;
        the new turn replaces the old one (``replace_turn(..., "retry")``)."""
        return self._replacing(model, "retry")

    def edit(self, model: Callable[[ChatRequest], ChatResponse]) -> WrappedModel:
        """Wrap ``model`` to answer an edited user message: call the result with the system messages
        and the new user message; the new turn replaces the latest one (``replace_turn(..., "edit")``)."""
        return self._replacing(model, "edit")

    def _replacing(self, model: Callable[[ChatRequest], ChatResponse], reason: str) -> WrappedModel:
        engine = self._replacer()

        def wrapped(request: ChatRequest, /, *, append_id: str | None = None) -> ChatResponse:
            turn, replacing, before = self._replacement(engine, request, reason, append_id)
            response = model(turn.model_request(before))
            batch = turn.batch_for(response)
            if batch is not None:
                self._replace(engine, batch, response, replacing)
            return response

        return wrapped

    def aretry(self, amodel: Callable[[ChatRequest], Awaitable[ChatResponse]]) -> AsyncWrappedModel:
        """``retry`` for an ``async`` model; the engine runs in worker threads."""
        return self._areplacing(amodel, "retry")

    def aedit(self, amodel: Callable[[ChatRequest], Awaitable[ChatResponse]]) -> AsyncWrappedModel:
        """``edit`` for an ``async`` model; the engine runs in worker threads."""
        return self._areplacing(amodel, "edit")

    def _areplacing(self, amodel: Callable[[ChatRequest], Awaitable[ChatResponse]], reason: str) -> AsyncWrappedModel:
        engine = self._replacer()

        async def wrapped(request: ChatRequest, /, *, append_id: str | None = None) -> ChatResponse:
            turn, replacing, before = await asyncio.to_thread(self._replacement, engine, request, reason, append_id)
            response = await amodel(turn.model_request(before))
            batch = turn.batch_for(response)
            if batch is not None:
                try:
                    await _decided(lambda b: self._replace(engine, b, response, replacing), batch)
                except asyncio.CancelledError as exc:
                    exc.add_note(f"histlog: the replacement {str(batch.append_id)!r} had started and completed "
                                 "before the cancellation took effect; the turn may be replaced")
                    raise
            return response

        return wrapped

    def call(self, model: Callable[[ChatRequest], ChatResponse]) -> WrappedModel:
        """Wrap ``model(request) -> ChatResponse``; the result also takes ``append_id=None``."""

        def wrapped(request: ChatRequest, /, *, append_id: str | None = None) -> ChatResponse:
            turn = self._turn(request, append_id)
            response = model(turn.model_request(self._read()))
            batch = turn.batch_for(response)
            if batch is not None:
                self._persist(batch, response)
            return response

        return wrapped

    def stream(self, streamer: Callable[[ChatRequest], Iterable[ChatDelta]]) -> WrappedStreamer:
        """Wrap ``streamer(request) -> Iterator[ChatDelta]``; the result returns a lazy generator."""

        def wrapped(request: ChatRequest, /, *, append_id: str | None = None) -> Generator[ChatDelta, None, None]:
            return self._stream(self._turn(request, append_id), streamer)

        return wrapped

    def _stream(self, turn: _Turn, streamer: Callable[[ChatRequest], Iterable[ChatDelta]]
                ) -> Generator[ChatDelta, None, None]:
        upstream = streamer(turn.model_request(self._read()))
        if not isinstance(upstream, Iterable):
            raise InvalidMessage(f"the streamer returned {type(upstream).__name__}, not an iterator of ChatDelta; "
                                 "nothing was stored")
        chunks = iter(upstream)
        acc = ResponseAccumulator()
        try:
            for delta in chunks:
                _accumulate(acc, delta)
                yield delta
        finally:  # exhausted, failed, or closed by the consumer: upstream is closed either way
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        response = _finish(acc)
        batch = turn.batch_for(response)
        if batch is not None:
            self._persist(batch, response)

    # ----- asyncio
    async def _apersist(self, batch: Batch, response: ChatResponse) -> Receipt:
        try:
            receipt = await _decided(self._config.writer.append, batch)
        except asyncio.CancelledError as exc:
            exc.add_note(f"histlog: the append of {str(batch.append_id)!r} to {str(batch.conversation_id)!r} "
                         "had started and completed before the cancellation took effect; the batch may be stored")
            raise
        except Exception as exc:
            raise _commit_error(batch, response, exc) from exc
        return _receipt(batch, response, receipt)

    def acall(self, amodel: Callable[[ChatRequest], Awaitable[ChatResponse]]) -> AsyncWrappedModel:
        """Wrap ``async amodel(request) -> ChatResponse``; the store runs in worker threads."""

        async def wrapped(request: ChatRequest, /, *, append_id: str | None = None) -> ChatResponse:
            turn = self._turn(request, append_id)
            stored = await asyncio.to_thread(self._read)
            response = await amodel(turn.model_request(stored))
            batch = turn.batch_for(response)
            if batch is not None:
                await self._apersist(batch, response)
            return response

        return wrapped

    def astream(self, astreamer: Callable[[ChatRequest], AsyncIterable[ChatDelta]]) -> AsyncWrappedStreamer:
        """Wrap ``astreamer(request) -> AsyncIterator[ChatDelta]``; the result returns a lazy async generator."""

        def wrapped(request: ChatRequest, /, *, append_id: str | None = None) -> AsyncGenerator[ChatDelta, None]:
            return self._astream(self._turn(request, append_id), astreamer)

        return wrapped

    async def _astream(self, turn: _Turn, astreamer: Callable[[ChatRequest], AsyncIterable[ChatDelta]]
                       ) -> AsyncGenerator[ChatDelta, None]:
        stored = await asyncio.to_thread(self._read)
        upstream = astreamer(turn.model_request(stored))
        if not isinstance(upstream, AsyncIterable):
            raise InvalidMessage(f"the async streamer returned {type(upstream).__name__}, not an async iterator of "
                                 "ChatDelta; nothing was stored")
        chunks = aiter(upstream)
        acc = ResponseAccumulator()
        try:
            async for delta in chunks:
                _accumulate(acc, delta)
                yield delta
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()
        response = _finish(acc)
        batch = turn.batch_for(response)
        if batch is not None:
            await self._apersist(batch, response)


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

