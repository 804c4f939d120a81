"""The recording half of the history checker (``tests/history_checker.py``, which re-exports it):
``History`` holds every operation a test's clients made, ``Recorded`` / ``AsyncRecorded`` wrap an
engine or client so each append and read is recorded, and ``outcome_of`` is the one home of the
rule "did this error leave anything written?".

* ``ok``: the call returned; for an append, the value is its ``Receipt``.
* ``fail``: a *definite* failure; the contract says nothing was written (``DEFINITE``: the
  validation errors, ``AppendConflict``, ``ConversationClosed``, ``PreconditionFailed``,
  ``TurnNotReplaceable``, ``NotFound``, ``InvalidRequest``, ``Unauthorized``...).
* ``unknown``: anything else (timeouts, ``CommitUnconfirmed``, ``CommitError``,
  ``LogUnavailable``, ``NotReady``, ``NotOwner`` (ownership may move under a write in flight), a
  reset connection, a killed server, a cancelled coroutine): it may or may not have been applied.
  An operation never completed counts as unknown.

Timestamps are ``time.monotonic_ns`` (real-time order within the test process).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from schemas import (
    AppendConflict,
    Batch,
    ConversationClosed,
    InvalidAppendID,
    InvalidBatch,
    InvalidConfiguration,
    InvalidConversationID,
    InvalidMessage,
    InvalidReceipt,
    InvalidRequest,
    InvalidWindow,
    Message,
    NotFound,
    PreconditionFailed,
    Receipt,
    StoredMessage,
    TurnNotReplaceable,
    Unauthorized,
    WindowTooSmall,
)

__all__ = ["DEFINITE", "AsyncRecorded", "History", "Op", "Outcome", "Recorded", "outcome_of"]

Outcome = Literal["ok", "fail", "unknown"]

DEFINITE: tuple[type[BaseException], ...] = (
    InvalidConversationID, InvalidAppendID, InvalidMessage, InvalidBatch, InvalidReceipt, InvalidWindow,
    InvalidRequest, InvalidConfiguration, AppendConflict, ConversationClosed, PreconditionFailed,
    TurnNotReplaceable, NotFound, WindowTooSmall, Unauthorized)
"""The errors after which nothing was written (API.md, SERVICE.md); the HTTP clients raise the
same classes from the problem+json, and their own transport failures become ``CommitUnconfirmed``
or ``LogUnavailable`` (unknown), as raw httpx errors are."""


def outcome_of(error: BaseException) -> Literal["fail", "unknown"]:
    """``fail`` when ``error`` says nothing was written, else ``unknown``: the one home of the rule."""
    return "fail" if isinstance(error, DEFINITE) else "unknown"


@dataclass(slots=True, eq=False)
class Op:
    """One operation: who (``process``), what (``kind``: append, read, entries, window), its
    arguments (``conversation``, ``batch``, ``at_least``, ...), when it was invoked and completed
    (monotonic ns), and how it ended (None while pending)."""

    index: int
    process: Hashable
    kind: str
    args: Mapping[str, Any]
    invoked_ns: int
    completed_ns: int | None = None
    outcome: Outcome | None = None
    value: Any = None
    error: BaseException | None = None

    @property
    def conversation(self) -> str:
        batch = self.args.get("batch")
        return str(batch.conversation_id) if isinstance(batch, Batch) else str(self.args["conversation"])

    def __str__(self) -> str:
        return f"#{self.index} {self.kind} by {self.process!r} -> {self.outcome or 'pending'}"


class History:
    """Every operation of a test, in invoke order. Safe to share between threads and coroutines:
    each method takes a lock for a few list operations and never awaits."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ops: list[Op] = []

    def invoke(self, process: Hashable, op: str, args: Mapping[str, Any]) -> Op:
        """Record that ``process`` starts ``op``; complete the returned handle with one of the below."""
        with self._lock:
            handle = Op(len(self._ops), process, op, dict(args), time.monotonic_ns())
            self._ops.append(handle)
            return handle

    def ok(self, handle: Op, value: Any) -> None:
        self._complete(handle, "ok", value, None)

    def fail(self, handle: Op, error: BaseException) -> None:
        """A definite failure: nothing was written."""
        self._complete(handle, "fail", None, error)

    def unknown(self, handle: Op, error: BaseException) -> None:
        """The operation may or may not have taken effect."""
        self._complete(handle, "unknown", None, error)

    def error(self, handle: Op, error: BaseException) -> None:
        """``fail`` or ``unknown``, as ``outcome_of`` decides from the error's type."""
        self._complete(handle, outcome_of(error), None, error)

    def _complete(self, handle: Op, outcome: Outcome, value: Any, error: BaseException | None) -> None:
        with self._lock:
            if handle.outcome is not None:
                raise ValueError(f"operation {handle} was already completed")
            handle.completed_ns, handle.outcome, handle.value, handle.error = time.monotonic_ns(), outcome, value, error

    @property
    def ops(self) -> tuple[Op, ...]:
        with self._lock:
            return tuple(self._ops)

    def conversations(self) -> list[str]:
        """Every conversation an operation touched, sorted: what to read the finals of."""
        return sorted({o.conversation for o in self.ops})

    @contextmanager
    def recording(self, process: Hashable, op: str, args: Mapping[str, Any]) -> Iterator[Op]:
        """Invoke ``op``; an exception leaving the block completes it by ``error`` (and propagates).
        The block calls ``ok`` itself."""
        handle = self.invoke(process, op, args)
        try:
            yield handle
        except BaseException as exc:
            if handle.outcome is None:
                self.error(handle, exc)
            raise


class Recorded:
    """A sync engine or ``HistoryClient`` whose appends and reads are recorded as ``process``."""

    def __init__(self, target: Any, history: History, process: Hashable) -> None:
        self.target, self.history, self.process = target, history, process

    def _call(self, op: str, args: dict[str, Any], *call: Any, **kw: Any) -> Any:
        with self.history.recording(self.process, op, args) as handle:
            value = getattr(self.target, op)(*call, **kw)
            self.history.ok(handle, value)
            return value

    def append(self, batch: Batch, **kw: Any) -> Receipt:
        out: Receipt = self._call("append", {"batch": batch, **kw}, batch, **kw)
        return out

    def read(self, conversation: str, **kw: Any) -> list[Message]:
        out: list[Message] = self._call("read", {"conversation": conversation, **kw}, conversation, **kw)
        return out

    def entries(self, conversation: str, **kw: Any) -> list[StoredMessage]:
        out: list[StoredMessage] = self._call("entries", {"conversation": conversation, **kw}, conversation, **kw)
        return out

    def window(self, conversation: str, limit: int, **kw: Any) -> list[Message]:
        args = {"conversation": conversation, "limit": limit, **kw}
        out: list[Message] = self._call("window", args, conversation, limit, **kw)
        return out


class AsyncRecorded:
    """``Recorded`` for an ``AsyncHistoryClient`` or ``AsyncHistoryEngine`` (the same method names)."""

    def __init__(self, target: Any, history: History, process: Hashable) -> None:
        self.target, self.history, self.process = target, history, process

    async def _call(self, op: str, args: dict[str, Any], *call: Any, **kw: Any) -> Any:
        with self.history.recording(self.process, op, args) as handle:
            value = await getattr(self.target, op)(*call, **kw)
            self.history.ok(handle, value)
            return value

    async def append(self, batch: Batch, **kw: Any) -> Receipt:
        out: Receipt = await self._call("append", {"batch": batch, **kw}, batch, **kw)
        return out

    async def read(self, conversation: str, **kw: Any) -> list[Message]:
        out: list[Message] = await self._call("read", {"conversation": conversation, **kw}, conversation, **kw)
        return out

    async def entries(self, conversation: str, **kw: Any) -> list[StoredMessage]:
        args = {"conversation": conversation, **kw}
        out: list[StoredMessage] = await self._call("entries", args, conversation, **kw)
        return out

    async def window(self, conversation: str, limit: int, **kw: Any) -> list[Message]:
        args = {"conversation": conversation, "limit": limit, **kw}
        out: list[Message] = await self._call("window", args, conversation, limit, **kw)
        return out
