"""Projections: the projector runtime, admission (dedup + closure), and the read projections.

Everything here is a deterministic function of the log prefix consumed: deleting the state and
replaying the log rebuilds exactly the same state.
"""

from projections.admission import Decision, Outcome
from projections.custom import Projection, ProjectionTx, ProjectionView
from projections.delivery import Subscription
from projections.events import BatchEvent, ClearEvent, MessagesDeleted, ProjectedEvent, TurnReplacedEvent
from projections.runtime import Projector
from projections.store import StateStore

__all__ = [
    "BatchEvent",
    "ClearEvent",
    "Decision",
    "MessagesDeleted",
    "Outcome",
    "ProjectedEvent",
    "Projection",
    "ProjectionTx",
    "ProjectionView",
    "Projector",
    "StateStore",
    "Subscription",
    "TurnReplacedEvent",
]
