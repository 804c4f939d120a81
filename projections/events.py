"""The accepted events that projections see, in log order per partition."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from schemas.ids import AppendID, ConversationID
from schemas.messages import Message
from schemas.positions import HistoryPosition, LogPosition

__all__ = ["BatchEvent", "ClearEvent", "MessagesDeleted", "ProjectedEvent", "TurnReplacedEvent"]


@dataclass(frozen=True, slots=True)
class BatchEvent:
    """An accepted batch: its messages got sequence numbers ``first_seq .. first_seq+len-1`` and
    the ``positions`` ``entries`` reports for them (``()`` in an event built without them)."""

    conversation_id: ConversationID
    append_id: AppendID
    messages: tuple[Message, ...]
    digest: str
    position: LogPosition
    created_at: datetime
    first_seq: int
    positions: tuple[HistoryPosition, ...] = ()


@dataclass(frozen=True, slots=True)
class ClearEvent:
    """A conversation was closed forever (delivered once, the first time)."""

    conversation_id: ConversationID
    position: LogPosition
    created_at: datetime


@dataclass(frozen=True, slots=True)
class TurnReplacedEvent:
    """An accepted edit or retry: the turn ``old_turn_id`` (its messages had the sequence numbers
    ``hidden_seqs``) is now hidden, and the replacement turn's ``messages`` got the sequence
    numbers ``first_seq .. first_seq+len-1`` and ``positions`` (as ``BatchEvent``). A projection
    that mirrors the visible history drops ``hidden_seqs`` and adds the messages, as one step."""

    conversation_id: ConversationID
    old_turn_id: str
    reason: str
    append_id: AppendID
    messages: tuple[Message, ...]
    digest: str
    position: LogPosition
    created_at: datetime
    first_seq: int
    hidden_seqs: range
    positions: tuple[HistoryPosition, ...] = ()


@dataclass(frozen=True, slots=True)
class MessagesDeleted:
    """Stored messages were deleted (``delete_messages``): ``message_ids`` are those that were
    still stored, visible or hidden (delivered only when there was at least one). A projection
    that mirrors the history drops them; they never come back (their append ids stay known)."""

    conversation_id: ConversationID
    message_ids: tuple[str, ...]
    position: LogPosition
    created_at: datetime


ProjectedEvent = BatchEvent | ClearEvent | TurnReplacedEvent | MessagesDeleted
