"""Positions: where an event sits in the log, and where a message sits in its conversation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

__all__ = ["HistoryPosition", "LogPosition"]


@dataclass(frozen=True, slots=True, order=True)
class LogPosition:
    """The ``(partition, offset)`` of one record in the log. Ordered within a partition."""

    partition: int
    offset: int

    def __str__(self) -> str:
        return f"{self.partition}:{self.offset}"


@dataclass(frozen=True, slots=True, order=True)
class HistoryPosition:
    """Where a stored message sits in its conversation, totally ordered as ``(turn, seq)``.

    ``turn`` is the position of the message's user-led turn (0 before the first user message;
    it may advance with gaps, so compare, never count); ``seq`` is the 1-based sequence number
    of the message in the conversation. ``HistoryPosition.START`` precedes every message.
    Text form ``TURN:SEQ`` (see ``parse``). Frozen, hashable, and never equal to a plain tuple.
    """

    turn: int
    seq: int

    START: ClassVar[HistoryPosition]

    def __str__(self) -> str:
        return f"{self.turn}:{self.seq}"

    @classmethod
    def parse(cls, text: str) -> HistoryPosition:
        """Parse ``TURN:SEQ`` (two non-negative integers). Raises ``ValueError`` otherwise."""
        turn, sep, seq = text.partition(":")
        if not sep or not turn.isdigit() or not seq.isdigit():
            raise ValueError(f"invalid history position {text!r}: expected TURN:SEQ, e.g. 3:7")
        return cls(int(turn), int(seq))


HistoryPosition.START = HistoryPosition(0, 0)
