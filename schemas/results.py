"""The read-side value types: what the reads of a conversation return (``StoredMessage``,
``HistoryTurn``, ``Located``, ``HistoryLoad``, ``TurnSource``, ``Measure``, ``StoredWindow``).
``schemas.batch`` re-exports them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

import orjson

from schemas.assets import AssetRef
from schemas.ids import AppendID
from schemas.messages import Message, Role
from schemas.positions import HistoryPosition
from schemas.times import iso_time

__all__ = ["HistoryLoad", "HistoryTurn", "Located", "Measure", "StoredMessage", "StoredWindow", "TurnSource"]

@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A message as stored: stable ``id`` (unique in its conversation), ``position``, the
    ``append_id`` of its batch and ``created_at`` (the event's time).

    ``superseded_by`` and ``reason`` are set only on hidden messages (listed by
    ``entries(..., include_hidden=True)``): the id of the turn that replaced theirs, and
    ``"edit"`` or ``"retry"``. ``assets`` are the media references linked to it (``link_assets``),
    in ordinal order."""

    id: str
    message: Message
    position: HistoryPosition
    append_id: AppendID
    created_at: datetime
    superseded_by: str | None = None
    reason: str | None = None
    assets: tuple[AssetRef, ...] = ()

    @property
    def hidden(self) -> bool:
        return self.superseded_by is not None

    def to_json(self) -> bytes:
        """``{"append_id", "created_at", "id", "message", "position"}`` (plus ``"reason"`` and
        ``"superseded_by"`` when hidden, ``"assets"`` when it has some) as compact JSON with sorted
        keys: the message embedded as its canonical JSON, ``created_at`` as ``iso_time`` spells it,
        the position as ``"TURN:SEQ"``."""
        tree: dict[str, Any] = {
            "append_id": str(self.append_id),
            "created_at": iso_time(self.created_at),
            "id": self.id,
            "message": self.message.fragment(),
            "position": str(self.position),
        }
        if self.superseded_by is not None:
            tree["reason"] = self.reason
            tree["superseded_by"] = self.superseded_by
        if self.assets:
            tree["assets"] = [a.tree() for a in self.assets]
        return orjson.dumps(tree, option=orjson.OPT_SORT_KEYS)


@dataclass(frozen=True, slots=True)
class HistoryTurn:
    """A visible user-led turn: ``id`` (the id of its user message, stable; for a turn filed under
    a slot, ``allocate_turn``'s ``TurnSlot.turn_id``), ``position`` (its
    ``HistoryPosition.turn``: compare, never count), the ids of its user message and of its
    last assistant message (None until there is one), and its messages in stored order."""

    id: str
    position: int
    request_message_id: str
    assistant_message_id: str | None
    messages: list[StoredMessage]


@dataclass(frozen=True, slots=True)
class Located:
    """``locate``'s answer: the newest visible message with that external id, with up to the
    asked number of visible messages before and after it, each list in stored order."""

    message: StoredMessage
    before: list[StoredMessage]
    after: list[StoredMessage]


_Row = TypeVar("_Row", "StoredMessage", "TurnSource")


@dataclass(frozen=True)  # no slots: HistoryLoad[TurnSource](...) must be able to try __orig_class__
class HistoryLoad(Generic[_Row]):
    """A budgeted window in stored order; ``truncated`` is true when older messages of the
    window were left out. ``messages`` holds ``StoredMessage`` (``read_within_bytes``) or
    ``TurnSource`` (``turn_sources``)."""

    messages: list[_Row]
    truncated: bool


@dataclass(frozen=True, slots=True)
class TurnSource:
    """What turn-response composition reads of a message: ``content`` is its canonical JSON
    without message metadata; ``interrupted`` is true only when metadata ``interrupted`` is JSON ``true``."""

    id: str
    role: Role
    content: bytes
    created_at: datetime
    interrupted: bool

    def to_json(self) -> bytes:
        """``{"content", "created_at", "id", "interrupted", "role"}`` as compact JSON with sorted
        keys; ``content`` is embedded as the canonical JSON it is."""
        return orjson.dumps({
            "content": orjson.Fragment(self.content),
            "created_at": iso_time(self.created_at),
            "id": self.id,
            "interrupted": self.interrupted,
            "role": self.role.value,
        }, option=orjson.OPT_SORT_KEYS)


@dataclass(frozen=True, slots=True)
class Measure:
    """Counts after a position, without payloads: ``messages``, ``content_bytes``, ``turns``."""

    messages: int
    content_bytes: int
    turns: int


@dataclass(frozen=True, slots=True)
class StoredWindow:
    """The message-count window with where its messages are stored (``HistoryEngine.window_entries``):
    ``system`` is the merged system message (None when the conversation has none; merged, it has
    no one position), ``entries`` the whole turns after it in stored order. ``messages`` is
    exactly what ``HistoryEngine.window`` returns for the same state."""

    system: Message | None
    entries: list[StoredMessage]

    @property
    def messages(self) -> list[Message]:
        return ([self.system] if self.system is not None else []) + [e.message for e in self.entries]
