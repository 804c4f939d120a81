"""How histlog's values look on a terminal: one line per message, per stored entry and per log
record, a progress bar, and JSON arrays of values the schemas serialise themselves.

Shared by the CLI (``engine.cli``) and the demo (``engine.demo``). It lives beside the CLI
package rather than in it, so the demo imports it without importing the CLI (which imports the
demo to run ``histlog demo``).
"""

from __future__ import annotations

import sys
import time
from typing import Literal, TextIO

import orjson

from engine.keys.base import KeyStore
from engine.log.base import Record
from schemas.batch import StoredMessage
from schemas.errors import CorruptLog, HistoryError, KeyErased, KeyStoreDamaged
from schemas.event_content import open_content
from schemas.events import (
    AssetsLinked,
    BatchAppended,
    Checkpointed,
    ConversationCleared,
    Event,
    MessagesDeleted,
    RunBegun,
    TurnAllocated,
    TurnReplaced,
    decode_event,
)
from schemas.messages import MediaPart, Message, Part, ReasoningPart, TextPart, ToolCallPart, ToolResultPart
from schemas.times import MAX_TIME_MS, MIN_TIME_MS, iso_time, time_of

__all__ = ["ProgressBar", "RecordStatus", "entry_line", "json_text", "one_line", "print_lines", "record_line",
           "record_status", "render_message"]


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines too) as one space."""
    return " ".join(text.split())


def print_lines(out: TextIO, *lines: str) -> None:
    for line in lines:
        out.write(line + "\n")


# --------------------------------------------------------------------------- messages and entries


def _part_text(part: Part) -> str:
    if isinstance(part, TextPart):
        return part.text
    if isinstance(part, ToolCallPart):
        return f"→ {part.name}({part.arguments})"
    if isinstance(part, ToolResultPart):
        content = " ".join(c.text if isinstance(c, TextPart) else f"<{c.kind}>" for c in part.output.content)
        if part.output.details is not None:
            content = (content + " " if content else "") + str(part.output.details)
        return f"← {part.name}{' [error]' if part.is_error else ''}: {content}"
    if isinstance(part, MediaPart):
        return f"<media {part.media.mime_type}>"
    if isinstance(part, ReasoningPart):
        return f"(reasoning: {part.text})" if part.text else "(reasoning)"
    return f"(refusal: {part.text})"


def render_message(message: Message, *, width: int | None = None) -> str:
    """``role: text`` on one line (tool calls as ``→ name(args)``, results as ``← name: ...``)."""
    body = one_line(" ".join(_part_text(p) for p in message.parts))
    if width is not None and len(body) > width:
        body = body[: width - 1] + "…"
    return f"{message.role.value}: {body}"


def entry_line(entry: StoredMessage) -> str:
    """``[TURN:SEQ] role: text``, and ``(hidden: REASON by turn ID)`` for a replaced turn's message."""
    hidden = f" (hidden: {entry.reason} by turn {entry.superseded_by})" if entry.superseded_by is not None else ""
    return f"[{entry.position}] {render_message(entry.message)}{hidden}"


# --------------------------------------------------------------------------- JSON


def json_text(tree: object) -> str:
    """``tree`` (lists, dicts, ``str``, ``int``, ``bool``, ``None``) as compact JSON with sorted
    keys, where each ``bytes`` value is JSON already (a value's ``to_json()``, a message's
    canonical JSON) and is embedded exactly as it is."""
    return orjson.dumps(tree, default=orjson.Fragment, option=orjson.OPT_SORT_KEYS).decode()


# --------------------------------------------------------------------------- log records


RecordStatus = Literal["plain", "sealed", "erased", "missing key", "poison", "clear", "run", "slot", "delete"]
"""What a log record is to a reader: a plain or a sealed event (opened under its key), a sealed
event whose key ``clear`` destroyed (*erased*: on purpose, never poison), a sealed event whose key
the key store lacks for a conversation never erased (a lost or foreign key store), poison
(undecodable, or sealed content that does not open), a clear, a run's begin, a turn slot, or a
delete of messages."""


def record_status(value: bytes, keys: KeyStore | None) -> tuple[RecordStatus, Event | None, str]:
    """``(status, event, why)`` of one record's value (``event`` None for undecodable bytes; ``why``
    the poison reason or the key store's answer). A sealed record is opened under its key (the
    content is checked, never returned): one AES-GCM pass over it. Without ``keys`` a sealed
    record is ``sealed``, unchecked."""
    try:
        event = decode_event(value)
    except HistoryError as exc:
        return "poison", None, one_line(str(exc))
    if isinstance(event, ConversationCleared):
        return "clear", event, ""
    if isinstance(event, RunBegun):
        return "run", event, ""
    if isinstance(event, TurnAllocated):
        return "slot", event, ""
    if isinstance(event, MessagesDeleted):
        return "delete", event, ""
    if event.sealed is None:
        return "plain", event, ""
    if keys is None:
        return "sealed", event, ""
    try:
        open_content(event, keys.get(event.conversation_id, event.sealed.key_id))
    except KeyErased:
        return "erased", event, ""
    except KeyStoreDamaged as exc:
        return "missing key", event, one_line(str(exc))
    except CorruptLog as exc:  # DecryptionFailed: a changed byte, a moved record, the wrong key
        return "poison", event, one_line(str(exc))
    return "sealed", event, ""


def record_line(record: Record, keys: KeyStore | None = None) -> str:
    """``PARTITION:OFFSET  TIME  append|replace|clear|run|slot|assets|delete|graph|poison  ...``: one
    log record, decoded.

    A plain event shows its digest; a sealed one ``sealed KEYID…`` (the first 8 hex digits of its
    key id) and its sizes, never its content (``keys``: checked to open, see ``record_status``);
    one whose key was destroyed ``erased``; one whose key the store lacks ``sealed ... key
    missing``; poison its reason."""
    if MIN_TIME_MS <= record.timestamp_ms <= MAX_TIME_MS:  # a producer may stamp any 64-bit value
        when = iso_time(time_of(record.timestamp_ms))
    else:
        when = f"(time {record.timestamp_ms} ms)"
    head = f"{record.partition}:{record.offset}  {when}"
    status, event, why = record_status(record.value, keys)
    if status == "poison":
        return f"{head}  poison  {why}"
    if isinstance(event, RunBegun):
        return f"{head}  run     {event.conversation_id}  {event.run_id}"
    if isinstance(event, TurnAllocated):
        return f"{head}  slot    {event.conversation_id}  {event.slot_id}"
    if isinstance(event, MessagesDeleted):
        n = len(event.message_ids)
        fence = f"  (fence {event.fence})" if event.fence is not None else ""
        return f"{head}  delete  {event.conversation_id}  {n} message id{'s' if n != 1 else ''}{fence}"
    if isinstance(event, Checkpointed):  # its content is the graph's state: never shown
        return f"{head}  graph   {event.conversation_id}  checkpoint {event.kind}  ({status})"
    if isinstance(event, AssetsLinked):  # its refs are content: never shown
        return f"{head}  assets  {event.conversation_id}  {event.message_id}  ({status})"
    if not isinstance(event, BatchAppended | TurnReplaced):
        return f"{head}  clear   {event.conversation_id if event is not None else ''}"
    n = event.message_count
    what = "append" if isinstance(event, BatchAppended) else "replace"
    extra = ""
    if isinstance(event, TurnReplaced):
        extra = f"  ({event.reason} of turn {event.old_turn_id})"
    elif event.expected_last is not None:
        extra = f"  (if last is {event.expected_last or 'none'})"
    if event.fence is not None:
        extra += f"  (fence {event.fence})"
    if event.run_id is not None:
        extra += f"  (run {event.run_id})"
    if isinstance(event, BatchAppended) and event.turn_id is not None:
        extra += f"  (turn slot {event.turn_id} at {event.turn_position})"
    if event.sealed is None:
        content = f"{event.digest[:19]}…"
    else:
        sizes = f"{event.content_bytes} content bytes, {len(event.sealed.ciphertext)} sealed"
        key = f"key {event.sealed.key_id[:8]}…"
        content = {"sealed": f"sealed  {key}  {sizes}",
                   "erased": f"erased  {key} destroyed  {sizes}",
                   "missing key": f"sealed  {key} not in the key store  {sizes}"}[status]
    return (f"{head}  {what}  {event.conversation_id}  {event.append_id}  "
            f"{n} message{'s' if n != 1 else ''}  {content}{extra}")


# --------------------------------------------------------------------------- progress bar


class ProgressBar:
    """A dependency-free progress bar on a stream (stderr by default).

    On a TTY it redraws one line with ``\\r``; otherwise it prints a line each time another
    ~10% is done, so logs stay short. Call it with ``(done, total)``; ``finish()`` ends it.
    """

    WIDTH = 30

    def __init__(self, label: str, stream: TextIO | None = None) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._decile = -1
        self._last = (-1, -1)
        self._drawn = False
        self._started = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        if (done, total) == self._last:
            return
        self._last = (done, total)
        if total <= 0:  # nothing left to replay when it started
            if self._decile < 10:
                self._decile = 10
                line = f"{self.label}: up to date"
                self.stream.write("\r" + line if self.tty else line + "\n")
                self._drawn = self.tty
                self.stream.flush()
            return
        fraction = min(max(done / total, 0.0), 1.0)
        if self.tty:
            filled = int(fraction * self.WIDTH)
            bar = "#" * filled + "." * (self.WIDTH - filled)
            self.stream.write(f"\r{self.label} [{bar}] {fraction:4.0%} {done}/{total}")
            self._drawn = True
        else:
            decile = int(fraction * 10)
            if decile > self._decile:
                self._decile = decile
                self.stream.write(f"{self.label}: {fraction:.0%} ({done}/{total})\n")
        self.stream.flush()

    def finish(self) -> None:
        if self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
        self._drawn = False
