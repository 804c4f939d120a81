"""Event times: the one definition of which times histlog can record, and their conversions.

An event's ``created_at_ms`` (ms since the Unix epoch, UTC) is representable when
``MIN_TIME_MS <= ms <= MAX_TIME_MS``, 1970-01-01T00:00:00.000Z to 9999-12-31T23:59:59.999Z:
exactly the times ``time_of`` turns into a ``datetime`` and the state's unsigned 64-bit fields
hold. Writers refuse any other time before any I/O (``check_time_ms``, and ``now_ms`` for the
host clock: ``InvalidConfiguration``); the reader (``schemas.events.decode_event``) treats a
record carrying one as poison.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Final

from schemas.errors import InvalidConfiguration

__all__ = ["MAX_TIME_MS", "MIN_TIME_MS", "check_time_ms", "iso_time", "ms_bound", "now_ms", "time_of", "time_problem"]

MIN_TIME_MS: Final = 0
"""The earliest event time: 1970-01-01T00:00:00.000Z, in ms since the Unix epoch."""

MAX_TIME_MS: Final = 253_402_300_799_999
"""The latest event time: 9999-12-31T23:59:59.999Z. ``MIN_TIME_MS..MAX_TIME_MS`` is the one
definition of a representable time: ``time_of`` turns each into a ``datetime`` and the state's
unsigned 64-bit fields hold each. Writers refuse any other time, readers treat it as poison."""

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def time_problem(ms: object) -> str:
    """Why ``ms`` is not a representable time ("" when it is)."""
    if type(ms) is not int:
        return f"{ms!r} is not an int"
    if not MIN_TIME_MS <= ms <= MAX_TIME_MS:
        return (f"{ms} is outside {MIN_TIME_MS}..{MAX_TIME_MS} ms since the Unix epoch "
                "(1970-01-01 to 9999-12-31 UTC)")
    return ""


def check_time_ms(ms: int) -> int:
    """``ms`` when it is a representable event time; else ``InvalidConfiguration``."""
    problem = time_problem(ms)
    if problem:
        raise InvalidConfiguration(f"created_at_ms {problem}: histlog can record no such time; "
                                   "give a time in that range (if it came from a clock, fix the clock)")
    return ms


def now_ms() -> int:
    """The host clock in ms since the epoch, checked: ``InvalidConfiguration`` when it reads a
    time no event can hold (before 1970 or after 9999), so nothing is written with it."""
    ns = time.time_ns()
    ms = ns // 1_000_000
    if not MIN_TIME_MS <= ms <= MAX_TIME_MS:
        raise InvalidConfiguration(
            f"the host clock reads {ns} ns since the Unix epoch, outside what histlog can record "
            "(1970-01-01 to 9999-12-31 UTC); fix the clock, nothing was written")
    return ms


def time_of(ms: int) -> datetime:
    """The UTC ``datetime`` of a representable time, exactly (no float rounding)."""
    return _EPOCH + timedelta(milliseconds=ms)


def iso_time(when: datetime) -> str:
    """``when`` as the JSON and the CLI spell event times: ISO 8601 in UTC, milliseconds, ``Z``
    (``2025-03-13T10:04:11.402Z``)."""
    return when.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def ms_bound(when: datetime) -> int:
    """The first stored time (ms) at or after the aware ``when``, clamped to
    ``MIN_TIME_MS..MAX_TIME_MS + 1``: ``t >= when`` exactly when ``t >= ms_bound(when)`` and
    ``t < when`` exactly when ``t < ms_bound(when)`` for every stored ``t``, so both ends of a
    time range (``since <= created_at < until``) are one integer bound."""
    delta = when - _EPOCH
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return min(max(-(-micros // 1000), MIN_TIME_MS), MAX_TIME_MS + 1)
