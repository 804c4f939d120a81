"""The facade's argument rules, checked before any I/O: one function per kind of argument, so
the sync engine (and later faces over it) refuse bad input with the same typed error."""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

from schemas.batch import Batch, Receipt
from schemas.errors import (
    InvalidConfiguration,
    InvalidConversationID,
    InvalidReceipt,
    InvalidRequest,
    InvalidWindow,
    NotFound,
)
from schemas.ids import ConversationID, MessageID
from schemas.positions import HistoryPosition
from schemas.times import ms_bound

__all__ = [
    "EMPTY",
    "MAX_IDS",
    "Empty",
    "check_budget",
    "check_clear_prefix",
    "check_context",
    "check_cursors",
    "check_directory",
    "check_ids",
    "check_limit",
    "check_message_id",
    "check_order",
    "check_partitions",
    "check_prefix",
    "check_timeout",
    "check_window",
    "expected_of",
    "time_bound",
]

MAX_IDS = 10_000
"""The most message ids one read by ids takes (``check_ids``)."""


def check_cursors(after: HistoryPosition | None, before: HistoryPosition | None) -> None:
    for name, cursor in (("after", after), ("before", before)):
        if cursor is not None and not isinstance(cursor, HistoryPosition):
            raise InvalidWindow(f"invalid {name}: expected a HistoryPosition (e.g. HistoryPosition(3, 7)) or None, "
                                f"got {type(cursor).__name__}")


def check_limit(limit: int | None, name: str = "limit") -> None:
    """A page size: a non-negative int, or None for no limit."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise InvalidWindow(f"invalid {name} {limit!r}: expected a non-negative int or None")


def check_context(count: int, name: str) -> None:
    """How many neighbours ``locate`` returns on one side: a non-negative int."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise InvalidWindow(f"invalid {name} {count!r}: expected a non-negative int")


def check_order(order: str) -> None:
    if order not in ("asc", "desc"):
        raise InvalidWindow(f"invalid order {order!r}: expected 'asc' (oldest first) or 'desc' (newest first)")


def time_bound(when: datetime | None, name: str) -> int | None:
    """A time-range end as the stored-ms bound it selects (``schemas.times.ms_bound``): an aware
    ``datetime`` (a naive one names no instant), or None for no bound."""
    if when is None:
        return None
    if not isinstance(when, datetime):
        raise InvalidWindow(f"invalid {name}: expected a datetime or None, got {type(when).__name__}")
    if when.tzinfo is None or when.utcoffset() is None:
        raise InvalidWindow(f"invalid {name} {when.isoformat()}: a naive datetime names no instant; "
                            "give a timezone, e.g. datetime.now(UTC)")
    return ms_bound(when)


def check_prefix(prefix: str | None) -> str:
    """A conversation-id prefix: ``""`` or None (every conversation) or a string that starts some
    valid id (checked as an id, so it has no control character and fits 1024 bytes)."""
    if prefix is None or prefix == "":
        return ""
    if not isinstance(prefix, str):
        raise InvalidWindow(f"invalid prefix: expected a str or None, got {type(prefix).__name__}")
    # a prefix may end in whitespace ("bot 7 "), which an id may not: check it with a stand-in end
    ConversationID(prefix + "x" if prefix[-1].isspace() else prefix)
    return prefix


def check_clear_prefix(prefix: str) -> str:
    """``clear_prefix``'s prefix: as ``check_prefix``, but never empty (that would clear every
    conversation: clear them one by one if that is what you mean)."""
    if isinstance(prefix, str) and prefix == "":
        raise InvalidConversationID("clear_prefix needs a non-empty prefix (e.g. 'bot-7/'): an empty one would "
                                    "clear every conversation; clear them one by one if you mean that")
    if prefix is None:
        raise InvalidConversationID("clear_prefix needs a prefix (a str such as 'bot-7/'), got None")
    return check_prefix(prefix)


def check_ids(ids: Iterable[str]) -> list[MessageID]:
    """The message ids of a read by ids: a list or tuple of at most ``MAX_IDS`` str; a str that
    spells no message id names no message and is left out (``MessageID.parse``)."""
    if isinstance(ids, (str, bytes)) or not isinstance(ids, (list, tuple)):
        raise InvalidWindow(f"invalid ids: expected a list of message ids (APPEND_ID/INDEX), got {type(ids).__name__}")
    if len(ids) > MAX_IDS:
        raise InvalidWindow(f"invalid ids: {len(ids)} ids, at most {MAX_IDS} in one call; split the call")
    out = []
    for k, text in enumerate(ids):
        if not isinstance(text, str):
            raise InvalidWindow(f"invalid ids[{k}]: expected a message id str (APPEND_ID/INDEX), "
                                f"got {type(text).__name__}")
        try:
            out.append(MessageID.parse(text))
        except NotFound:
            continue
    return out


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


def check_message_id(message_id: object) -> str:
    """``message_id`` as a message id (``APPEND_ID/INDEX``); ``InvalidRequest`` naming it otherwise."""
    if not isinstance(message_id, str):
        raise InvalidRequest(f"invalid message_id: expected a message id (APPEND_ID/INDEX), got "
                             f"{type(message_id).__name__}")
    try:
        return str(MessageID.parse(message_id))
    except NotFound as e:
        raise InvalidRequest(f"invalid message_id {message_id[:80]!r}: {e}") from None
