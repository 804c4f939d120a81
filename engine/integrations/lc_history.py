"""``HistlogChatMessageHistory``: the **legacy** LangChain chat history, for code still on
``RunnableWithMessageHistory``. LangChain deprecated ``BaseChatMessageHistory`` in
langchain-core 1.6.4 (removal in 2.0; instantiating it warns); new agents should use
``HistlogMiddleware`` with ``create_agent``.

What it promises, which the stock histories do not:

* ``add_messages(ms)`` appends the messages as **one** ``Batch``: all or nothing, in order,
  losslessly converted (tool calls, tool results, reasoning, media, ids, usage; what cannot be
  represented raises ``ConversionError`` before anything is written). When every message
  carries an ``id`` the append id derives from those ids, so adding the same messages again
  (a retry) stores nothing twice; otherwise each call is a new UUIDv7 append.
* ``messages`` is the whole stored conversation in stored order (``store.read``).
* ``clear()`` is histlog's ``clear``: it erases the conversation's content **and closes it for
  good**, so a later ``add_messages`` raises ``ConversationClosed``. Start a new conversation
  id (``f"{session}/{n}"``) to begin afresh.

The store is a ``HistoryEngine`` or a ``HistoryClient`` (LangChain's async methods run the sync
ones in an executor).
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Sequence
from typing import Any

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import BaseMessage

from engine.integrations.lc_messages import from_langchain, to_langchain
from engine.uuid7 import uuid7
from schemas.batch import Batch, Receipt
from schemas.errors import InvalidComponent
from schemas.ids import AppendID, ConversationID

__all__ = ["HistlogChatMessageHistory"]


def _append_id(messages: Sequence[BaseMessage]) -> AppendID:
    ids = [m.id for m in messages]
    if ids and all(isinstance(i, str) and i for i in ids):
        key = "\0".join(["history", *(str(i) for i in ids)])
        derived: AppendID = AppendID("langchain-history:" + hashlib.sha256(key.encode("utf-8", "surrogatepass"))
                                     .hexdigest()[:32])
        return derived
    fresh: AppendID = AppendID(str(uuid7()))
    return fresh


class HistlogChatMessageHistory(BaseChatMessageHistory):
    """Legacy ``BaseChatMessageHistory`` over a histlog store (see the module docstring)."""

    def __init__(self, store: Any, conversation_id: str) -> None:
        for name in ("read", "append", "clear"):
            method = getattr(store, name, None)
            if not callable(method):
                raise InvalidComponent(f"HistlogChatMessageHistory: store {type(store).__name__} has no {name}() "
                                       "method; pass a HistoryEngine or a HistoryClient")
            if inspect.iscoroutinefunction(method):
                raise InvalidComponent("HistlogChatMessageHistory needs a sync store (HistoryEngine, HistoryClient); "
                                       "LangChain runs its async methods in an executor")
        self._conversation: ConversationID = ConversationID(conversation_id)
        self._store = store
        self.last_receipt: Receipt | None = None
        super().__init__()

    @property
    def conversation_id(self) -> ConversationID:
        return self._conversation

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]  # a read-only view of the store
        """The stored conversation, oldest first (``[]`` when unknown or cleared)."""
        return to_langchain(self._store.read(self._conversation))

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append ``messages`` as one batch (nothing for an empty list)."""
        messages = list(messages)
        if not messages:
            return
        batch = Batch(self._conversation, _append_id(messages), from_langchain(messages))
        self.last_receipt = self._store.append(batch)

    def clear(self) -> None:
        """Erase and close the conversation (histlog ``clear``: later appends raise ``ConversationClosed``)."""
        self._store.clear(self._conversation)
