"""``HistlogMiddleware``: histlog as the memory of a langchain 1.x agent (``create_agent``).

One agent run, in this order:

1. ``before_agent``: find the run's *open turn* in the agent state: its last user message
   (one flagged ``internal_feedback`` does not start a turn) and what follows. Read the
   conversation's stored window (``store.window(conversation, window)``: whole user-led turns,
   O(window)), drop stored system messages (the agent's ``system_prompt`` is the system
   message) and keep it, converted to LangChain messages, in private agent state for the run.
2. ``wrap_model_call``, every step: the model sees the stored window, then the open turn.
   State messages before the open turn (earlier runs kept by a LangGraph checkpointer) are not
   shown twice: histlog already holds them.
3. ``after_agent``: the open turn plus the final answer is appended as **one** ``Batch``, under
   the rules of ``HistoryMiddleware`` (``engine/flow.py`` decides, this only drives it): the
   open turn must be one user message and its tool exchange (``InvalidMessage`` otherwise), and
   only a final assistant message without tool calls is stored (a run stopped mid-tool-round
   stores nothing). A failed append raises ``CommitError`` carrying the batch. A run that fails
   never reaches ``after_agent``: it stores nothing.

The append id derives from the run, so a retried run stores nothing twice: from LangChain's
``run_id`` when the caller gives one (``config={"run_id": ...}``), else from the id of the
run's user message (LangGraph gives every message one; pass your platform's message id to make
redeliveries safe too). A retry after the first attempt was stored meets that append id: its
content differs (new message ids, maybe a new answer), admission reports ``AppendConflict``,
and the middleware looks up the stored turn (the latest turn, else a scan of the
conversation: a rare path) and, if it has the same user message, makes the run's result that
stored turn: the retry returns what the first attempt stored and stores nothing. A different
user message under the same run identity is a genuine conflict: ``CommitError`` from
``AppendConflict``. A LangGraph node retry or a resume from a checkpoint replays the same
state, so the same id.

The store is a ``HistoryEngine`` or ``HistoryClient`` (sync agents; asyncio agents run it in a
worker thread) or an ``AsyncHistoryEngine`` / ``AsyncHistoryClient`` (asyncio agents only:
``ainvoke`` / ``astream``). The conversation is ``conversation_id``, else the run's
``config["configurable"]["thread_id"]``. The middleware holds no per-run state of its own, so
one instance serves every conversation and concurrent runs.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Any, NotRequired, cast

from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest, ModelResponse
from langchain.agents.middleware.types import PrivateStateAttr
from langchain_core.messages import AnyMessage, BaseMessage, HumanMessage, RemoveMessage
from langgraph.config import get_config
from langgraph.runtime import Runtime

from engine.flow import Persist, advance, append_flow
from engine.integrations.lc_messages import from_langchain, to_langchain
from schemas.batch import Batch, HistoryTurn, StoredMessage
from schemas.chat import ChatRequest, ChatResponse, FinishReason
from schemas.commit import CommitError
from schemas.errors import (
    AppendConflict,
    InvalidComponent,
    InvalidConversationID,
    InvalidMessage,
    InvalidWindow,
)
from schemas.ids import AppendID, ConversationID
from schemas.messages import Message, Role

__all__ = ["HistlogMiddleware", "HistlogState"]


class HistlogState(AgentState[Any]):
    """The agent state the middleware adds: the stored window and the open turn's first message
    id, private to the run (neither input nor output of the agent)."""

    histlog_window: NotRequired[Annotated[list[AnyMessage], PrivateStateAttr]]
    histlog_turn: NotRequired[Annotated[str, PrivateStateAttr]]


def _turn_start(messages: Sequence[BaseMessage]) -> int:
    """Index of the open turn's user message: the last user message not flagged internal feedback."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if isinstance(m, HumanMessage) and not _feedback(m):
            return i
    raise _no_turn()


def _no_turn() -> InvalidMessage:
    return InvalidMessage("invalid agent input: no user message; the run's input must hold the user's "
                          "message (earlier turns come from histlog)")


def _feedback(m: BaseMessage) -> bool:
    bag = m.additional_kwargs.get("histlog_metadata")
    return isinstance(bag, dict) and bag.get("internal_feedback") == "true"


def _run_append_id(run_id: object, user_message_id: str | None) -> AppendID:
    """The run's append id: from LangChain's run id when the caller gave one, else the user message id."""
    if run_id is not None:
        key = f"run\0{run_id}"
    elif user_message_id:
        key = f"message\0{user_message_id}"
    else:
        raise _no_turn()
    append_id: AppendID = AppendID("langchain:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32])
    return append_id


class HistlogMiddleware(AgentMiddleware[HistlogState, Any, Any]):
    """Agent middleware that loads the stored window before the model and appends each run's
    turn as one batch when the agent finishes (the module docstring has the exact rules)."""

    state_schema = HistlogState

    def __init__(self, store: Any, *, conversation_id: str | None = None, window: int = 20) -> None:
        super().__init__()
        for name in ("window", "append"):
            if not callable(getattr(store, name, None)):
                raise InvalidComponent(f"HistlogMiddleware: store {type(store).__name__} has no {name}() method; "
                                       "pass a HistoryEngine, HistoryClient or their asyncio forms")
        if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
            raise InvalidWindow(f"HistlogMiddleware: window must be a positive number of messages, got {window!r}")
        self._store = store
        self._conversation: ConversationID | None = (
            ConversationID(conversation_id) if conversation_id is not None else None)
        self._window = window
        self._async = inspect.iscoroutinefunction(store.append)

    @property
    def store(self) -> Any:
        return self._store

    # ----- the run's identity
    def _conversation_id(self) -> ConversationID:
        given: ConversationID | None = self._conversation
        if given is not None:
            return given
        thread = (get_config().get("configurable") or {}).get("thread_id")
        if thread is None:
            raise InvalidConversationID("histlog: no conversation: pass HistlogMiddleware(store, conversation_id=...) "
                                        "or run the agent with config={'configurable': {'thread_id': ...}}")
        conversation: ConversationID = ConversationID(str(thread))
        return conversation

    def _sync_store(self) -> None:
        if self._async:
            raise InvalidComponent(f"HistlogMiddleware: the store {type(self._store).__name__} is asyncio; run the "
                                   "agent with ainvoke()/astream(), or pass a HistoryEngine/HistoryClient")

    # ----- 1. before the agent: the stored window
    def _window_update(self, state: HistlogState, stored: list[Message]) -> dict[str, Any]:
        messages = state["messages"]
        start = _turn_start(messages)
        prior = to_langchain([m for m in stored if m.role is not Role.SYSTEM])
        return {"histlog_window": prior, "histlog_turn": messages[start].id or ""}

    def before_agent(self, state: HistlogState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        self._sync_store()
        _turn_start(state["messages"])  # no user message: fail before any read
        return self._window_update(state, self._store.window(self._conversation_id(), self._window))

    async def abefore_agent(self, state: HistlogState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        _turn_start(state["messages"])
        conversation = self._conversation_id()
        stored = await self._call(self._store.window, conversation, self._window)
        return self._window_update(state, stored)

    # ----- 2. every model call: window + open turn
    @staticmethod
    def _request(request: ModelRequest[Any]) -> ModelRequest[Any]:
        window = cast("list[AnyMessage]", request.state.get("histlog_window") or [])
        turn_id = request.state.get("histlog_turn")
        messages = request.messages
        for i, m in enumerate(messages):
            if turn_id and m.id == turn_id:
                messages = messages[i:]
                break
        return request.override(messages=[*window, *messages])

    def wrap_model_call(self, request: ModelRequest[Any],
                        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]]) -> Any:
        return handler(self._request(request))

    async def awrap_model_call(self, request: ModelRequest[Any],
                               handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]]) -> Any:
        return await handler(self._request(request))

    # ----- 3. after the agent: one batch
    def _batch(self, state: HistlogState, runtime: Runtime[Any]) -> tuple[Any, Persist | None, int]:
        """Drive ``append_flow`` to its ``Persist`` step: the batch to store (or None), and
        where the open turn starts in the state's messages."""
        messages = state["messages"]
        turn_id = state.get("histlog_turn")
        start = next((i for i, m in enumerate(messages) if turn_id and m.id == turn_id), None)
        if start is None:
            start = _turn_start(messages)
        turn = from_langchain(messages[start:])
        if len(turn) < 2 or turn[-1].role is not Role.ASSISTANT:
            return None, None, start  # the run ended without an answer (a tool returned directly): nothing to store
        info = getattr(runtime, "execution_info", None)  # langgraph >= 1.1; older: the user message id decides
        run_id = getattr(info, "run_id", None)
        append_id = _run_append_id(run_id, messages[start].id)
        flow = append_flow(self._conversation_id(), ChatRequest(turn[:-1]), append_id)
        next(flow)  # ReadHistory: the window was read before the agent; nothing to read again
        advance(flow, [], None)  # Generate: the agent already generated...
        step = advance(flow, ChatResponse(turn[-1], FinishReason.STOP), None)  # ...this answer
        return flow, step if isinstance(step, Persist) else None, start

    @staticmethod
    def _earlier(batch: Batch, latest: HistoryTurn | None, entries: Callable[[], list[StoredMessage]] | None
                 ) -> list[Message] | None:
        """The turn an earlier attempt of this run stored under the batch's append id, if the
        conflict is that (same user message content); None for a genuine conflict."""
        found = [e.message for e in (latest.messages if latest else []) if e.append_id == batch.append_id]
        if not found and entries is not None:
            found = [e.message for e in entries() if e.append_id == batch.append_id]
        if not found or found[0].content_json() != batch.messages[0].content_json():
            return None
        return found

    @staticmethod
    def _replayed(state: HistlogState, start: int, stored: list[Message]) -> dict[str, Any]:
        """The state update that makes this attempt's result the stored turn: an idempotent retry
        returns what the first attempt stored, not a second answer."""
        earlier = to_langchain(stored)
        keep = {m.id for m in earlier if m.id}
        removed = [RemoveMessage(id=m.id) for m in state["messages"][start:] if m.id and m.id not in keep]
        return {"messages": [*removed, *earlier]}

    def after_agent(self, state: HistlogState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        self._sync_store()
        flow, step, start = self._batch(state, runtime)
        if step is None:
            return None
        try:
            try:
                receipt = self._store.append(step.batch)
            except Exception as exc:
                advance(flow, None, exc)  # raises CommitError carrying the batch
            else:
                advance(flow, receipt, None)  # raises CommitError if the receipt does not name the batch
        except CommitError as err:
            if not isinstance(err.__cause__, AppendConflict):
                raise
            cid = step.batch.conversation_id
            stored = self._earlier(step.batch, self._store.latest_turn(cid), lambda: self._store.entries(cid))
            if stored is None:
                raise
            return self._replayed(state, start, stored)
        return None

    async def aafter_agent(self, state: HistlogState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        flow, step, start = self._batch(state, runtime)
        if step is None:
            return None
        try:
            try:
                receipt = await self._call(self._store.append, step.batch)
            except Exception as exc:
                advance(flow, None, exc)
            else:
                advance(flow, receipt, None)
        except CommitError as err:
            if not isinstance(err.__cause__, AppendConflict):
                raise
            cid = step.batch.conversation_id
            latest = await self._call(self._store.latest_turn, cid)
            stored = self._earlier(step.batch, latest, None)
            if stored is None:
                everything = await self._call(self._store.entries, cid)
                stored = self._earlier(step.batch, None, lambda: everything)
            if stored is None:
                raise
            return self._replayed(state, start, stored)
        return None

    async def _call(self, method: Callable[..., Any], *args: Any) -> Any:
        """Run a store method: awaited on an asyncio store, in a worker thread on a sync one."""
        if self._async:
            return await method(*args)
        return await asyncio.to_thread(method, *args)
