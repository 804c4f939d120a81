"""``CommitError``: generation succeeded but persisting it did not (the middleware's error).

It lives apart from ``schemas.errors`` because it carries a ``Batch`` and a ``Receipt``:
``schemas.batch`` raises the errors of ``schemas.errors``, so the dependency runs one way,
errors <- batch <- commit.
"""

from __future__ import annotations

from typing import Any

from schemas.batch import Batch, Receipt
from schemas.errors import HistoryError, _rebuild

__all__ = ["CommitError"]


class CommitError(HistoryError):
    """Generation succeeded but persisting it did not.

    ``batch`` is the exact Batch to retry with ``engine.append(err.batch)`` (no new model
    call needed); ``receipt`` is set when the append was in fact confirmed; ``response`` is
    the model's response; ``__cause__`` is the underlying error.
    """

    def __init__(self, message: str, *, batch: Batch, receipt: Receipt | None = None,
                 response: Any = None, old_turn_id: str | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.batch = batch
        self.receipt = receipt
        self.response = response
        self.old_turn_id = old_turn_id
        """Set when the batch replaces a turn (middleware ``retry``/``edit``): complete it with
        ``engine.replace_turn(err.batch, err.old_turn_id, err.reason)`` instead of ``append``."""
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, self.__dict__))
