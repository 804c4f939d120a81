"""What admission decides for one log position (``Outcome``, ``Decision``): the vocabulary shared
by admission (``projections.admission``), its pre-checks (``projections.prechecks``) and the
writers that read a decision (``engine.refusals``, ``engine.outcomes``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from schemas.batch import Receipt
from schemas.ids import AppendID, ConversationID
from schemas.positions import LogPosition

__all__ = ["Decision", "Outcome"]


class Outcome(enum.StrEnum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    CONFLICT = "conflict"
    REJECTED_CLOSED = "rejected_closed"
    CORRUPT = "corrupt"
    CLEARED = "cleared"
    PRECONDITION_FAILED = "precondition_failed"
    NOT_REPLACEABLE = "not_replaceable"
    ERASED = "erased"
    FENCED = "fenced"
    BEGUN = "begun"
    ALLOCATED = "allocated"
    SLOT_UNAVAILABLE = "slot_unavailable"
    LINKED = "linked"
    UNKNOWN_MESSAGE = "unknown_message"
    DELETED = "deleted"
    CHECKPOINTED = "checkpointed"


@dataclass(frozen=True, slots=True)
class Decision:
    """What admission decided for one log position.

    ``receipt_position`` is where the accepted event of that append id is: this record's own
    position when accepted, the original one for a duplicate. ``digest`` is the accepted
    digest (for a conflict: the one the append id already names). ``epoch``: a run's (begun,
    or a duplicate ``RunBegun``), or the conversation's latest (fenced); ``position``: a turn
    slot's (allocated, or a duplicate ``TurnAllocated``); ``count``: how many of a delete's
    messages were visible, ``removed`` how many it removed (hidden ones too).
    """

    outcome: Outcome
    digest: str = ""
    receipt_position: LogPosition | None = None
    reason: str = ""  # corrupt, precondition_failed, not_replaceable, fenced, slot_unavailable: why
    epoch: int = 0
    position: int = 0
    count: int = 0
    removed: int = 0

    def receipt(self, conversation_id: ConversationID, append_id: AppendID) -> Receipt:
        """The receipt this decision proves (accepted or duplicate decisions only)."""
        assert self.receipt_position is not None  # Invariant: only accepted/duplicate carry one.
        # Invariant: the ids are the batch's (typed), the digest one admission checked, computed or stored.
        assert type(conversation_id) is ConversationID and type(append_id) is AppendID, (conversation_id, append_id)
        return Receipt.of_valid(conversation_id, append_id, self.digest, self.receipt_position)
