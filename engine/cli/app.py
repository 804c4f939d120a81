"""``main``: parse the arguments, resolve the target, run the command's handler, and turn what
goes wrong into one line on stderr and an exit code (``engine.cli.exits``).

Warnings and errors logged while a command runs (a state rebuilt, a projector that stopped)
are one line each on stderr, ``histlog: warning: ...``, without a traceback.
``HISTLOG_DEBUG=1`` prints the tracebacks of unexpected errors and of logged failures.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Sequence

from engine.cli.exits import OK, UsageError, report, stdout_closed
from engine.cli.parser import SERVER_MISSING, build_parser
from engine.cli.target import resolve
from engine.render import one_line

__all__ = ["main"]

_OWN_LOGGERS = ("histlog", "engine", "projections", "schemas")


class _OneLine(logging.Formatter):
    """``histlog: LEVEL: message (ExceptionType: text)`` on one line; the traceback only in debug."""

    def __init__(self, *, debug: bool) -> None:
        super().__init__()
        self.debug = debug

    def format(self, record: logging.LogRecord) -> str:
        text = one_line(record.getMessage())
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:
            text += f" ({type(exc).__name__}: {one_line(str(exc))})"
        line = f"histlog: {record.levelname.lower()}: {text}"
        if self.debug and record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


@contextlib.contextmanager
def _logging_to_stderr() -> Iterator[None]:
    """While a command runs, log records reach stderr as one line each (``_OneLine``) instead of
    through logging's last-resort handler, which prints tracebacks. Records of histlog's own
    modules are shown from WARNING; other libraries' (kafka-python's retry chatter) only when
    CRITICAL, or from WARNING with ``HISTLOG_DEBUG=1``: the final error line says what to do."""
    debug = bool(os.environ.get("HISTLOG_DEBUG"))
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(_OneLine(debug=debug))
    if not debug:
        handler.addFilter(lambda r: r.levelno >= logging.CRITICAL or r.name.split(".")[0] in _OWN_LOGGERS)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``histlog``; returns the exit code (``engine.cli.exits``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        with _logging_to_stderr():
            try:
                parser = build_parser()
                ns, extra = parser.parse_known_args(args)
                if ns.command == "serve" and SERVER_MISSING is not None:
                    raise UsageError(SERVER_MISSING)  # whatever its flags: they are the extra's
                if extra:  # what parse_args says
                    parser.error(f"unrecognized arguments: {' '.join(extra)}")
            except SystemExit as exc:  # --help / --version
                return exc.code if isinstance(exc.code, int) else OK
            if ns.command in ("demo", "keygen"):
                # The demo picks its own (temporary) data dir; keygen writes only its file.
                code: int = ns.handler(ns, sys.stdout)
            else:
                code = ns.handler(ns, resolve(ns), sys.stdout)
            sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
            return code
    except BrokenPipeError:  # only stdout is written to a pipe; the backends translate their own errors
        return stdout_closed()
    except KeyboardInterrupt:
        print("histlog: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        return report(exc)
