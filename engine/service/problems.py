"""Errors over HTTP: the one map between histlog's error classes and statuses, and the
``application/problem+json`` body (RFC 9457) both the server writes and the clients read.

A body is ``{"type": "urn:histlog:error:NAME", "title": "NAME", "status": N, "detail": "..."}``,
``NAME`` being the exception class (``schemas.errors``); a client raises that class with ``detail``
as its message, so code that catches ``AppendConflict`` from a ``HistoryEngine`` catches it from a
``HistoryClient`` too. Statuses are SERVICE.md's table; an error class not in it (a ``CorruptLog``...)
is a 500 whose detail is still one line that says what to do, never a traceback. ``Retry-After``
goes with the 503s a retry can get past without a restart: not with a ``StateUnavailable`` (the
state failed: only a reopen helps) nor a fail-stopped log's ``LogUnavailable``.
"""

from __future__ import annotations

from typing import Any

from schemas import errors
from schemas.commit import CommitError
from schemas.errors import HistoryError

__all__ = ["CONTENT_TYPE", "RETRY_AFTER_S", "STATUS", "error_of", "problem_of", "retry_after", "status_of"]

CONTENT_TYPE = "application/problem+json"
_URN = "urn:histlog:error:"
RETRY_AFTER_S = 1
"""What ``Retry-After`` says on a 503: the log or the owner may be back in about a second."""

STATUS: dict[type[HistoryError], int] = {
    errors.InvalidConversationID: 400,
    errors.InvalidAppendID: 400,
    errors.InvalidMessage: 400,
    errors.InvalidBatch: 400,
    errors.InvalidReceipt: 400,
    errors.InvalidWindow: 400,
    errors.InvalidRequest: 400,
    errors.Unauthorized: 401,
    errors.NotFound: 404,
    errors.AppendConflict: 409,
    errors.TurnNotReplaceable: 409,
    errors.Fenced: 409,
    errors.SlotUnavailable: 409,
    errors.ConversationClosed: 410,
    errors.PreconditionFailed: 412,
    errors.NotOwner: 421,
    errors.WindowTooSmall: 422,
    errors.LogUnavailable: 503,
    errors.StateUnavailable: 503,
    errors.NotReady: 503,
    errors.CommitUnconfirmed: 504,
}
"""SERVICE.md's table. Subclasses map through their nearest listed base (``TopicRefused`` is
not listed: a server never raises a configuration error for a request)."""

_BY_NAME: dict[str, type[HistoryError]] = {
    name: cls for name in errors.__all__
    if isinstance(cls := getattr(errors, name), type) and issubclass(cls, HistoryError)
} | {"CommitError": CommitError}  # the middleware's error, beside Batch in schemas.commit


def status_of(exc: BaseException) -> int:
    """The HTTP status for ``exc``: its class's (or nearest listed base's) status, else 500."""
    for cls in type(exc).__mro__:
        status = STATUS.get(cls)
        if status is not None:
            return status
    return 500


def problem_of(exc: BaseException, *, status: int | None = None) -> dict[str, Any]:
    """The problem+json body for ``exc`` (``status`` overrides, e.g. 413 for a body too large).
    The title is the nearest histlog class, so a client can raise it; the detail is its message
    on one line."""
    cls = next((c for c in type(exc).__mro__ if c.__name__ in _BY_NAME and _BY_NAME[c.__name__] is c),
               HistoryError)
    name = cls.__name__
    detail = " ".join(str(exc).split()) or name
    return {"type": _URN + name, "title": name, "status": status if status is not None else status_of(exc),
            "detail": detail}


def retry_after(exc: BaseException, status: int) -> str | None:
    """The ``Retry-After`` header value for ``exc`` answered with ``status``, or None when a
    retry would not help (see the module)."""
    if status != 503 or isinstance(exc, errors.StateUnavailable):
        return None
    return None if isinstance(exc, errors.LogUnavailable) and not exc.retryable else str(RETRY_AFTER_S)


def error_of(status: int, body: object) -> HistoryError:
    """The exception a client raises for an error response: the class the problem names (when it
    is a histlog error), with its detail as the message; otherwise a ``LogUnavailable`` for a
    5xx (a proxy, a server going down) or an ``InvalidRequest`` for a 4xx, saying what came."""
    if isinstance(body, dict) and isinstance(body.get("title"), str) and isinstance(body.get("detail"), str):
        cls = _BY_NAME.get(body["title"])
        if cls is not None:
            return _make(cls, body["detail"])
    shown = repr(body)[:200]
    if status >= 500:
        return errors.LogUnavailable(f"the service answered {status} without a histlog problem ({shown}); retry later")
    return errors.InvalidRequest(f"the service answered {status} without a histlog problem ({shown})")


def _make(cls: type[HistoryError], detail: str) -> HistoryError:
    """An instance of ``cls`` carrying ``detail``; classes whose constructor wants more than a
    message (``AppendConflict``, ``CommitError``...) are built without running it."""
    try:
        return cls(detail)
    except TypeError:
        exc = cls.__new__(cls)
        Exception.__init__(exc, detail)
        return exc
