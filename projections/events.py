"""The accepted events that projections see, in log order per partition."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from schemas.ids import AppendID, ConversationID
from schemas.messages import Message
from schemas.positions import LogPosition

__all__ = ["BatchEvent", "ClearEvent", "ProjectedEvent"]


@dataclass(frozen=True, slots=True)
class BatchEvent:
    """An accepted batch: its messages got sequence numbers ``first_seq .. first_seq+len-1``."""

    conversation_id: ConversationID
    append_id: AppendID
    messages: tuple[Message, ...]
    digest: str
    position: LogPosition
    created_at: datetime
    first_seq: int


@dataclass(frozen=True, slots=True)
class ClearEvent:
    """A conversation was closed forever (delivered once, the first time)."""

    conversation_id: ConversationID
    position: LogPosition
    created_at: datetime


ProjectedEvent = BatchEvent | ClearEvent
