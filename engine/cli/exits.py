"""The exit codes of ``histlog`` and how an error becomes one line on stderr (docs/cli.md).

====  ============================================================================
0     ok
1     anything else (a damaged log, an unexpected error): one line saying what to do
2     bad input: one clear line on stderr (``histlog: error: ...``), never a traceback
3     conflict or closed (``AppendConflict``, ``ConversationClosed``, ``PreconditionFailed``,
      ``TurnNotReplaceable``, ``Fenced``, ``SlotUnavailable``)
4     backend unavailable (``LogUnavailable``, ``CommitUnconfirmed``, ``StateUnavailable``: a
      data or state dir another process holds, a state that failed)
141   stdout was closed by its reader (``histlog read c | head -1``): nothing more is printed
====  ============================================================================
"""

from __future__ import annotations

import os
import signal
import sys
import traceback

from engine.render import one_line
from schemas.errors import (
    AppendConflict,
    CommitUnconfirmed,
    ConversationClosed,
    CorruptLog,
    Fenced,
    HistoryError,
    InvalidAppendID,
    InvalidBatch,
    InvalidConfiguration,
    InvalidConversationID,
    InvalidMessage,
    InvalidProjection,
    InvalidReceipt,
    InvalidRequest,
    InvalidWindow,
    LogUnavailable,
    NotFound,
    PreconditionFailed,
    SlotUnavailable,
    StateUnavailable,
    TurnNotReplaceable,
    WindowTooSmall,
)

__all__ = ["BAD_INPUT", "CONFLICT", "FAILED", "OK", "PIPE_CLOSED", "UNAVAILABLE", "UsageError",
           "exit_code", "report", "stdout_closed"]

OK, FAILED, BAD_INPUT, CONFLICT, UNAVAILABLE = 0, 1, 2, 3, 4
PIPE_CLOSED = 128 + signal.SIGPIPE
"""141: stdout's reader went away (``histlog read c | head -1``); the status of a process killed by
SIGPIPE, as ``git log | head`` ends, so ``set -o pipefail`` scripts see an undelivered output."""


class UsageError(Exception):
    """Bad command-line input found by the CLI itself (exit 2)."""


_BAD_INPUT: tuple[type[BaseException], ...] = (
    UsageError, InvalidConversationID, InvalidAppendID, InvalidMessage, InvalidBatch,
    InvalidReceipt, InvalidWindow, InvalidConfiguration, InvalidProjection, WindowTooSmall, NotFound,
    InvalidRequest,
)


def exit_code(exc: BaseException) -> int:
    """The exit code for an error (see the module docstring)."""
    if isinstance(exc, _BAD_INPUT):
        return BAD_INPUT
    if isinstance(exc, AppendConflict | ConversationClosed | PreconditionFailed | TurnNotReplaceable | Fenced
                  | SlotUnavailable):
        return CONFLICT
    if isinstance(exc, LogUnavailable | CommitUnconfirmed | StateUnavailable):
        return UNAVAILABLE
    return FAILED


def _error_line(exc: BaseException) -> str:
    if isinstance(exc, CorruptLog):
        text = one_line(str(exc))
        if "log verify" in text or "accept-log-loss" in text:  # it says what to do already
            return f"the log is damaged: {text}"
        return (f"the log is damaged: {text} "
                "(run `histlog log verify` to see where; restore the damaged file from a backup)")
    if isinstance(exc, HistoryError | UsageError):
        return one_line(str(exc)) or type(exc).__name__
    if isinstance(exc, OSError):
        return one_line(f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else ""))
    return (f"unexpected error: {type(exc).__name__}: {one_line(str(exc))} "
            "(set HISTLOG_DEBUG=1 to see the traceback)")


def report(exc: BaseException) -> int:
    """Print ``exc`` as one ``histlog: error:`` line (its traceback too with ``HISTLOG_DEBUG``);
    return its exit code."""
    if os.environ.get("HISTLOG_DEBUG"):
        traceback.print_exception(exc, file=sys.stderr)
    print(f"histlog: error: {_error_line(exc)}", file=sys.stderr)
    return exit_code(exc)


def stdout_closed() -> int:
    """stdout's reader went away: end quietly with ``PIPE_CLOSED``. As the Python docs advise,
    point the stdout descriptor at /dev/null so that flushing what is still buffered at
    interpreter exit cannot raise again ("Exception ignored ... BrokenPipeError")."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (an in-process capture)
        return PIPE_CLOSED
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)
    return PIPE_CLOSED
