"""What ``begin_run`` returns: a run's ``Fence`` (docs/runs.md).

A fence is the conversation's *epoch* when the run began: admission numbers every new run of a
conversation 1, 2, 3 ... in log order, so every instance that reads the log gives the same run
the same epoch. A write made with ``fence=`` is accepted only while its epoch is still the
conversation's latest: once another run began (its ``RunBegun`` precedes the write in the log),
the write is refused with ``Fenced``, even if it reached the log first.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.errors import InvalidRequest
from schemas.ids import ConversationID, RunID

__all__ = ["Fence", "check_fence"]


@dataclass(frozen=True, slots=True)
class Fence:
    """A run's ownership of a conversation's writes: ``epoch`` grows with every ``begin_run`` of
    the conversation (the first run's is 1). Pass it to ``append``, ``replace_turn`` (``fence=``)."""

    conversation_id: ConversationID
    run_id: RunID
    epoch: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "conversation_id", ConversationID(self.conversation_id))
        object.__setattr__(self, "run_id", RunID(self.run_id))
        if type(self.epoch) is not int or not 1 <= self.epoch < 1 << 63:
            raise InvalidRequest(f"invalid fence: epoch must be an int of at least 1, got {self.epoch!r}; "
                                 "pass the Fence that begin_run returned")


def check_fence(fence: object, conversation_id: str) -> Fence | None:
    """``fence`` as a write's fence: None, or a ``Fence`` of ``conversation_id``. Raises
    ``InvalidRequest`` (before any I/O) for anything else."""
    if fence is None:
        return None
    if not isinstance(fence, Fence):
        raise InvalidRequest(f"invalid fence: expected the Fence that begin_run returned (or None), "
                             f"got {type(fence).__name__}")
    if fence.conversation_id != conversation_id:
        raise InvalidRequest(f"invalid fence: it is conversation {str(fence.conversation_id)!r}'s, not "
                             f"{str(conversation_id)!r}'s; begin a run of this conversation")
    return fence
