"""The facade's argument rules, checked before any I/O: one function per kind of argument, so
the sync engine (and later faces over it) refuse bad input with the same typed error."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

from schemas.batch import Batch, Receipt
from schemas.errors import InvalidConfiguration, InvalidReceipt, InvalidWindow
from schemas.positions import HistoryPosition

__all__ = ["EMPTY", "Empty", "check_budget", "check_cursors", "check_directory", "check_partitions", "check_timeout",
           "check_window", "expected_of"]


def check_cursors(after: HistoryPosition | None, before: HistoryPosition | None) -> None:
    for name, cursor in (("after", after), ("before", before)):
        if cursor is not None and not isinstance(cursor, HistoryPosition):
            raise InvalidWindow(f"invalid {name}: expected a HistoryPosition (e.g. HistoryPosition(3, 7)) or None, "
                                f"got {type(cursor).__name__}")


def check_directory(path: str | Path | None) -> None:
    """A data or state directory must be a directory or not exist yet (it is created): a file
    there, or above it, would fail later with a bare ``NotADirectoryError`` after the log opened."""
    if path is None:
        return
    for existing in (Path(path), *Path(path).parents):
        if existing.exists():
            if not existing.is_dir():
                raise InvalidConfiguration(f"{existing} is a file, not a directory; give a directory for the "
                                           "history (it is created if missing)")
            return


def check_timeout(timeout: object) -> None:
    """The one timeout rule of the facade: a finite int or float >= 0 (seconds), checked before
    any I/O, so a bad value never writes an event it then cannot wait for."""
    if (isinstance(timeout, bool) or not isinstance(timeout, int | float)
            or not math.isfinite(timeout) or timeout < 0):
        raise InvalidConfiguration(f"timeout must be a finite number of seconds >= 0, got {timeout!r}; "
                                   "pass e.g. timeout=30.0 (0 means: do not wait)")


def check_budget(max_bytes: int, unit: str) -> None:
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int):
        raise InvalidWindow(f"invalid max_bytes: expected an int, got {type(max_bytes).__name__}")
    if unit not in ("turn", "message"):
        raise InvalidWindow(f"invalid unit {unit!r}: expected 'turn' or 'message'")


def check_window(limit: int) -> None:
    """A message-count window's limit: a positive int."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise InvalidWindow(f"invalid window: limit must be an int, got {type(limit).__name__}")
    if limit <= 0:
        raise InvalidWindow(f"invalid window: limit must be positive, got {limit}")


class Empty:
    """``EMPTY``: as ``append(..., expected_last=EMPTY)``, the conversation must have no accepted append."""

    _instance: Empty | None = None

    def __new__(cls) -> Empty:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "EMPTY"

    def __reduce__(self) -> str:
        return "EMPTY"


EMPTY = Empty()
"""``append(batch, expected_last=EMPTY)``: accept only if the conversation has no accepted append yet."""


def expected_of(batch: Batch, expected_last: Receipt | Empty | None) -> str | None:
    """The event's precondition: None, "" (EMPTY) or the expected last append id."""
    if expected_last is None:
        return None
    if expected_last is EMPTY:
        return ""
    if not isinstance(expected_last, Receipt):
        raise InvalidReceipt("invalid expected_last: expected a Receipt, EMPTY or None, "
                             f"got {type(expected_last).__name__}")
    if expected_last.conversation_id != batch.conversation_id:
        raise InvalidReceipt("invalid expected_last: the receipt is for conversation "
                             f"{str(expected_last.conversation_id)!r}, not {str(batch.conversation_id)!r}")
    return str(expected_last.append_id)


def check_partitions(parts: Iterable[int], partitions: int | None) -> frozenset[int]:
    """``parts`` as a set of partition numbers (each an int in ``0..partitions - 1`` when the
    count is known), else ``InvalidConfiguration``; no I/O."""
    if isinstance(parts, str | bytes) or not isinstance(parts, Iterable):
        raise InvalidConfiguration(f"partitions are given as an iterable of ints, got {parts!r}")
    out = frozenset(parts)
    for p in out:
        if isinstance(p, bool) or not isinstance(p, int) or p < 0 or (partitions is not None and p >= partitions):
            bound = "" if partitions is None else f" (this log has {partitions}: 0..{partitions - 1})"
            raise InvalidConfiguration(f"invalid partition {p!r}: expected an int >= 0{bound}")
    return out
