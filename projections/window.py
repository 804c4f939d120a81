"""The message-count window of ``WindowReader`` (README, "Reading: windows, byte budgets..."),
as a pure function; the O(limit) projection query (``Reads.window``) shares its definitions of
"merged system message" and "turn"."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from schemas.errors import WindowTooSmall
from schemas.messages import Message, Role, TextPart, starts_turn

__all__ = ["merge_system", "select_window", "split_turns"]

T = TypeVar("T")


def merge_system(messages: Sequence[Message]) -> Message:
    """All system messages as one: parts in order with a ``"\\n\\n"`` text part between
    messages, metadata merged with later keys winning."""
    if len(messages) == 1:
        return messages[0]
    parts: list[TextPart] = []
    metadata: dict[str, object] = {}
    for i, m in enumerate(messages):
        if i:
            parts.append(TextPart("\n\n"))
        parts.extend(p for p in m.parts if isinstance(p, TextPart))
        metadata.update(m.metadata)
    return Message(Role.SYSTEM, parts, metadata)


def split_turns(messages: Sequence[Message]) -> list[list[Message]]:
    """Non-system messages grouped into turns: a turn starts at each user message that is not
    internal feedback (``schemas.messages.starts_turn``), or at the first non-system message when
    that is not one."""
    turns: list[list[Message]] = []
    for m in messages:
        if m.role == Role.SYSTEM:
            continue
        if starts_turn(m) or not turns:
            turns.append([m])
        else:
            turns[-1].append(m)
    return turns


def fit_turns(turns_newest_first: Sequence[Sequence[T]], budget: int) -> list[T]:
    """The longest suffix of whole turns within ``budget`` messages (walk stops at the first
    turn that does not fit). Raises ``WindowTooSmall`` when not even the newest turn fits.
    Only the turns' lengths matter: the items are messages, or the rows that store them."""
    chosen: list[Sequence[T]] = []
    for turn in turns_newest_first:
        if len(turn) > budget:
            break
        chosen.append(turn)
        budget -= len(turn)
    if turns_newest_first and not chosen:
        newest = len(turns_newest_first[0])
        raise WindowTooSmall(
            f"window too small: the newest turn has {newest} messages but only {max(budget, 0)} "
            "fit next to the merged system message; raise the limit")
    return [m for turn in reversed(chosen) for m in turn]


def select_window(messages: Sequence[Message], limit: int) -> list[Message]:
    """The merged system message (if any) followed by the longest suffix of whole turns that
    fits ``limit`` messages in total."""
    system = [m for m in messages if m.role == Role.SYSTEM]
    turns = split_turns(messages)
    budget = limit - (1 if system else 0)
    suffix = fit_turns(list(reversed(turns)), budget)
    return ([merge_system(system)] if system else []) + suffix
