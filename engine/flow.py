"""The middleware's flow, written once: every decision of a wrapped call, and no I/O.

A flow is a generator of *steps*. It yields what it needs done (read the history, read the
turn to replace and the history before it, generate an answer, persist a batch), receives each
result through ``send``, and returns the model's ``ChatResponse``. A step that fails is thrown
into the flow (``throw``): that is how a failed write becomes a ``CommitError`` carrying the
exact batch, in one place. The middleware's two drivers (``engine/middleware.py``, one sync, one
asyncio, as httpx drives its auth flows) only run the steps, so the sync and asyncio faces, and
the plain and streaming forms of every wrapper, cannot drift apart.

``append_flow`` and ``replace_flow`` validate their input when called, before the flow exists:
invalid input fails before any step runs (and before a lazy stream is even started).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import cast

from engine.uuid7 import uuid7
from schemas.batch import Batch, HistoryTurn, Receipt
from schemas.chat import ChatRequest, ChatResponse, ResponseAccumulator
from schemas.commit import CommitError
from schemas.errors import InvalidMessage, InvalidReceipt, TurnNotReplaceable
from schemas.ids import AppendID, ConversationID
from schemas.messages import Message, Role, ToolCallPart, ToolResultPart, starts_turn
from schemas.positions import HistoryPosition

__all__ = [
    "Flow",
    "Generate",
    "Persist",
    "ReadBefore",
    "ReadHistory",
    "ReadTurn",
    "Step",
    "accumulate",
    "advance",
    "append_flow",
    "finish",
    "replace_flow",
]


# --------------------------------------------------------------------------- the steps


@dataclass(frozen=True, slots=True)
class ReadHistory:
    """Read the conversation through the reader; the result is its list of messages."""


@dataclass(frozen=True, slots=True)
class ReadTurn:
    """Read the latest visible turn (``HistoryTurn`` or ``None``) through the engine."""


@dataclass(frozen=True, slots=True)
class ReadBefore:
    """Read the messages before ``position``, cut to the reader's window if it is a ``WindowReader``."""

    position: HistoryPosition


@dataclass(frozen=True, slots=True)
class Generate:
    """Call the model (or run the streamer) with ``request``; the result is its ``ChatResponse``."""

    request: ChatRequest


@dataclass(frozen=True, slots=True)
class Replacing:
    """A retry or edit in progress: the turn it replaces."""

    old_turn_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Persist:
    """Append ``batch`` (or replace the turn ``replacing`` names with it); the result is the
    writer's receipt. Once started it cannot be recalled: the log may already hold it."""

    batch: Batch
    replacing: Replacing | None = None

    def note(self) -> str:
        """What a cancellation that lands while this write runs must tell the caller."""
        what = "append" if self.replacing is None else f"replacement of turn {self.replacing.old_turn_id!r}"
        return (f"histlog: the {what} {str(self.batch.append_id)!r} in {str(self.batch.conversation_id)!r} had "
                "started and completed before the cancellation took effect; the batch may be stored")


Step = ReadHistory | ReadTurn | ReadBefore | Generate | Persist
Flow = Generator[Step, object, ChatResponse]


def advance(flow: Flow, result: object, error: Exception | None) -> Step | ChatResponse:
    """Hand ``flow`` the last step's result (or throw its error in): the next step, or the
    flow's ``ChatResponse`` once it has finished. Both drivers advance through this one call."""
    try:
        return flow.send(result) if error is None else flow.throw(error)
    except StopIteration as done:
        return cast(ChatResponse, done.value)


# --------------------------------------------------------------------------- the decisions


def _open_turn(request: ChatRequest) -> tuple[tuple[Message, ...], tuple[Message, ...]]:
    """Split a request into its system prefix and its open turn; raise ``InvalidMessage`` unless
    the open turn is one user message followed only by its tool exchange and internal feedback
    (user messages that start no turn: ``schemas.messages.starts_turn``; docs/middleware.md)."""
    messages = request.messages
    start = 0
    while start < len(messages) and messages[start].role is Role.SYSTEM:
        start += 1
    if start == len(messages):
        raise InvalidMessage(
            "invalid request: no open turn after the system messages; add the user's message "
            "(earlier turns come from the store)")
    if not starts_turn(messages[start]):
        if messages[start].role is Role.USER:
            raise InvalidMessage(
                f"invalid request: messages[{start}]: the open turn starts with internal feedback; it must start "
                "with the user's own message (internal feedback belongs inside a turn)")
        raise InvalidMessage(
            f"invalid request: messages[{start}]: the open turn starts with a {messages[start].role.value} "
            "message; it must start with the user's message (earlier turns come from the store: do not resend them)")
    pending: dict[str, int] = {}  # call id -> index of the assistant message that made it
    seen: set[str] = set()
    for i in range(start + 1, len(messages)):
        m = messages[i]
        if starts_turn(m):
            raise InvalidMessage(
                f"invalid request: messages[{i}]: a second user message; a request holds one open turn "
                "(earlier turns come from the store): send only the newest user message and its tool exchange "
                "(a harness's injected feedback carries metadata internal_feedback: true and stays in the turn)")
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
        elif m.role is Role.USER:  # internal feedback (starts_turn is false): part of this turn
            if pending:
                raise InvalidMessage(
                    f"invalid request: messages[{i}]: internal feedback before the result of tool call "
                    f"{next(iter(pending))!r}; add the tool message with its result first")
        else:  # Invariant: ChatRequest allows system messages only as the leading prefix.
            raise AssertionError(f"system message at {i} after the prefix")
    if pending:
        raise InvalidMessage(
            f"invalid request: tool call {next(iter(pending))!r} (messages[{pending[next(iter(pending))]}]) "
            "has no result; add a tool message with its result before calling the model")
    return messages[:start], messages[start:]


def _request(request: object) -> ChatRequest:
    if not isinstance(request, ChatRequest):
        raise InvalidMessage(
            f"invalid request: expected a schemas.ChatRequest, got {type(request).__name__}; "
            "build one with ChatRequest([Message.system(...), Message.user(...)])")
    return request


class _Turn:
    """One wrapped call's validated input: what the model is asked, what is stored after."""

    __slots__ = ("_append_id", "_conversation_id", "_open", "_request", "_system")

    def __init__(self, conversation_id: ConversationID, request: object, append_id: str | None) -> None:
        self._request = _request(request)
        self._system, self._open = _open_turn(self._request)
        self._append_id = AppendID(append_id) if append_id is not None else None
        self._conversation_id = conversation_id

    @property
    def user(self) -> Message:
        return self._open[0]

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
        """The batch to store after a natural completion, or ``None`` when nothing is stored:
        a tool-call round, or a response without a message (the finish reason does not decide)."""
        if not isinstance(response, ChatResponse):
            raise InvalidMessage(
                f"the model returned {type(response).__name__}, not a schemas.ChatResponse; nothing was stored. "
                "Fix the model adapter")
        message = response.message
        if message is None or any(isinstance(p, ToolCallPart) for p in message.parts):
            return None
        append_id = self._append_id if self._append_id is not None else AppendID(str(uuid7()))
        return Batch(self._conversation_id, append_id, (*self._open, message))


def _commit_error(batch: Batch, response: ChatResponse, cause: BaseException,
                  receipt: Receipt | None, replacing: Replacing | None) -> CommitError:
    if replacing is None:
        how = "retry with engine.append(err.batch)"
    else:
        how = "retry with engine.replace_turn(err.batch, err.old_turn_id, err.reason)"
    return CommitError(
        f"the model answered but appending its turn ({str(batch.append_id)!r}, {len(batch)} messages) to "
        f"{str(batch.conversation_id)!r} failed: {cause}; {how} (safe to repeat, the model is not called again)",
        batch=batch, receipt=receipt, response=response,
        old_turn_id=replacing.old_turn_id if replacing else None, reason=replacing.reason if replacing else None)


def _answer(turn: _Turn, stored: object, replacing: Replacing | None) -> Flow:
    """Generate from ``stored`` and the open turn; persist a final answer (or nothing)."""
    response = cast(ChatResponse, (yield Generate(turn.model_request(stored))))
    batch = turn.batch_for(response)
    if batch is None:
        return response
    try:
        receipt = yield Persist(batch, replacing)
    except Exception as exc:
        raise _commit_error(batch, response, exc, None, replacing) from exc
    if not isinstance(receipt, Receipt):
        cause = InvalidReceipt(f"the writer returned {type(receipt).__name__}, not a Receipt")
        raise _commit_error(batch, response, cause, None, replacing) from cause
    try:
        receipt.validate_for(batch)
    except InvalidReceipt as exc:
        raise _commit_error(batch, response, exc, receipt, replacing) from exc
    return response


def append_flow(conversation_id: ConversationID, request: object, append_id: str | None) -> Flow:
    """``call``/``stream``: read the history, generate, append the turn. Validates now."""
    turn = _Turn(conversation_id, request, append_id)

    def flow() -> Flow:
        stored = yield ReadHistory()
        return (yield from _answer(turn, stored, None))

    return flow()


def replace_flow(conversation_id: ConversationID, reason: str, request: object, append_id: str | None) -> Flow:
    """``retry``/``edit``: read the latest turn and the history before it, generate, replace the
    turn. Validates now what needs no read: the request, the append id, the open turn when the
    request holds one (a retry may send only system messages: the stored user message is used)."""
    req = _request(request)
    has_turn = any(m.role is not Role.SYSTEM for m in req.messages)
    if reason == "edit" and not has_turn:
        raise InvalidMessage("invalid edit: the request holds no user message; put the edited user message "
                             "after the system messages")
    given = _Turn(conversation_id, req, append_id) if has_turn else None
    if given is None and append_id is not None:
        AppendID(append_id)

    def flow() -> Flow:
        old = cast("HistoryTurn | None", (yield ReadTurn()))
        if old is None:
            raise TurnNotReplaceable(f"conversation {str(conversation_id)!r} has no turn to {reason}")
        old_user = old.messages[0].message
        turn = given
        if turn is None:
            turn = _Turn(conversation_id, ChatRequest((*req.messages, old_user), req.tools, req.options), append_id)
        elif reason == "retry" and turn.user.content_json() != old_user.content_json():
            raise TurnNotReplaceable(
                f"a retry keeps the user message of turn {old.id!r}, but the request's differs; use edit for a "
                "new user message, or send only the system messages to retry the stored one")
        stored = yield ReadBefore(HistoryPosition(old.position, 0))
        return (yield from _answer(turn, stored, Replacing(old.id, reason)))

    return flow()


# --------------------------------------------------------------------------- streamed answers


def accumulate(acc: ResponseAccumulator, delta: object) -> None:
    """Fold one streamed chunk into ``acc``; a malformed chunk abandons the stream."""
    try:
        acc.add(delta)  # type: ignore[arg-type]  # checked inside: a non-ChatDelta raises InvalidMessage
    except InvalidMessage as exc:
        raise InvalidMessage(f"{exc}; the stream was abandoned and nothing was stored") from exc


def finish(acc: ResponseAccumulator) -> ChatResponse:
    """The streamed response once upstream is exhausted; one without a finish reason stores nothing."""
    try:
        return acc.response()
    except InvalidMessage as exc:
        raise InvalidMessage(f"{exc}; the stream ended without a finish reason, nothing was stored") from exc
