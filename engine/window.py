"""``WindowReader``: a read projection over any reader, and the one rule of what a reader is
(``check_reader``, used by ``WindowReader`` and ``MiddlewareConfig`` alike)."""

from __future__ import annotations

from typing import Protocol

from engine.arguments import check_window
from engine.facade import HistoryEngine
from projections.window import select_window
from schemas.errors import InvalidComponent
from schemas.ids import ConversationID
from schemas.messages import Message

__all__ = ["Reader", "WindowReader"]


class Reader(Protocol):
    """Anything that reads a conversation's messages in stored order."""

    def read(self, conversation_id: str) -> list[Message]: ...


def check_reader(reader: object, where: str) -> None:
    """``InvalidComponent`` (a ``TypeError``) unless ``reader`` has a callable ``read``: checked
    when the reader is handed over, so ``None`` or a wrong object fails there, not at the first read."""
    if not callable(getattr(reader, "read", None)):
        raise InvalidComponent(
            f"{where}: reader {type(reader).__name__} has no read(conversation_id) method; "
            "pass a HistoryEngine, a WindowReader, or any object with read(conversation_id) -> list[Message]")


class WindowReader:
    """Reads at most ``limit`` messages: all system messages merged into one leading system
    message (it counts toward the limit), then the longest suffix of whole user-led turns that
    fits. A turn starts at each user message that is not internal feedback (metadata
    ``internal_feedback`` JSON ``true``: ``schemas.messages.starts_turn``), or at the first
    non-system message; the walk
    stops at the first turn that does not fit. If the newest turn (plus the merged system
    message) does not fit, ``read`` raises ``WindowTooSmall`` rather than split it.

    It has no write or clear authority: it only reads. Over a ``HistoryEngine`` it asks the
    engine's window projection (``engine.window``: the same result, in O(limit) instead of
    reading the whole conversation); over any other reader it windows ``reader.read``.
    """

    __slots__ = ("_limit", "_reader")

    def __init__(self, reader: Reader, limit: int) -> None:
        check_reader(reader, "WindowReader")
        check_window(limit)
        self._reader = reader
        self._limit = limit

    @property
    def limit(self) -> int:
        return self._limit

    def read(self, conversation_id: str) -> list[Message]:
        cid = ConversationID(conversation_id)
        if isinstance(self._reader, HistoryEngine):
            return self._reader.window(cid, self._limit)
        return select_window(self._reader.read(cid), self._limit)
