"""``histlog``: the command-line face of ``HistoryEngine`` (docs/cli.md). Long (≈1,100 lines):
every command's parser, help text and output format is here, pending its split into a package
``engine/cli/`` (parser and exit codes, target resolution, rendering, one module per command group).

Each command resolves where the history lives (``--data`` or ``--kafka/--topic/--state``,
flags over ``HISTLOG_*`` environment variables), opens the engine, calls one library method
and formats the result. Errors are translated to exit codes in one place (``exit_code``):

====  ============================================================================
0     ok
1     anything else (a damaged log, an unexpected error): one line saying what to do
2     bad input: one clear line on stderr (``histlog: error: ...``), never a traceback
3     conflict or closed (``AppendConflict``, ``ConversationClosed``, ``PreconditionFailed``,
      ``TurnNotReplaceable``)
4     backend unavailable (``LogUnavailable``, ``CommitUnconfirmed``, ``StateUnavailable``: a
      data or state dir another process holds, a state that failed)
141   stdout was closed by its reader (``histlog read c | head -1``): nothing more is printed
====  ============================================================================

Warnings and errors logged while a command runs (a state rebuilt, a projector that stopped)
are one line each on stderr, ``histlog: warning: ...``, without a traceback.
``HISTLOG_DEBUG=1`` prints the tracebacks of unexpected errors and of logged failures.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from projections.custom import Projection
from projections.reads import Unit
from schemas.errors import (
    AppendConflict,
    CommitUnconfirmed,
    ConversationClosed,
    CorruptLog,
    HistoryError,
    InvalidAppendID,
    InvalidBatch,
    InvalidConfiguration,
    InvalidConversationID,
    InvalidMessage,
    InvalidReceipt,
    InvalidWindow,
    LogUnavailable,
    NotFound,
    PreconditionFailed,
    StateUnavailable,
    TurnNotReplaceable,
    WindowTooSmall,
)
from schemas.ids import ConversationID
from schemas.messages import Message, Role, TextPart
from schemas.positions import HistoryPosition

if TYPE_CHECKING:  # pragma: no cover
    from engine.facade import HistoryEngine
    from engine.log.base import Record
    from schemas.batch import HistoryTurn, StoredMessage, TurnSource

__all__ = [
    "DEFAULT_DATA", "DEFAULT_TOPIC", "ProgressBar", "Target", "build_parser", "entry_json", "exit_code",
    "follow", "main", "render_message", "resolve", "subcommands",
]

DEFAULT_DATA = "./histlog-data"
DEFAULT_TOPIC = "histlog.events"

OK, FAILED, BAD_INPUT, CONFLICT, UNAVAILABLE = 0, 1, 2, 3, 4
PIPE_CLOSED = 128 + signal.SIGPIPE
"""141: stdout's reader went away (``histlog read c | head -1``); the status of a process killed by
SIGPIPE, as ``git log | head`` ends, so ``set -o pipefail`` scripts see an undelivered output."""


# --------------------------------------------------------------------------- errors and exit codes


class UsageError(Exception):
    """Bad command-line input found by the CLI itself (exit 2)."""


class Unsupported(Exception):
    """A command this version cannot run (a missing library piece): exit 2, said plainly."""


_BAD_INPUT: tuple[type[BaseException], ...] = (
    UsageError, Unsupported, InvalidConversationID, InvalidAppendID, InvalidMessage, InvalidBatch,
    InvalidReceipt, InvalidWindow, InvalidConfiguration, WindowTooSmall, NotFound,
)


def exit_code(exc: BaseException) -> int:
    """The exit code for an error (see the module docstring)."""
    if isinstance(exc, _BAD_INPUT):
        return BAD_INPUT
    if isinstance(exc, AppendConflict | ConversationClosed | PreconditionFailed | TurnNotReplaceable):
        return CONFLICT
    if isinstance(exc, LogUnavailable | CommitUnconfirmed | StateUnavailable):
        return UNAVAILABLE
    return FAILED


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _error_line(exc: BaseException) -> str:
    if isinstance(exc, CorruptLog):
        text = _one_line(str(exc))
        if "log verify" in text or "accept-log-loss" in text:  # it says what to do already
            return f"the log is damaged: {text}"
        return (f"the log is damaged: {text} "
                "(run `histlog log verify` to see where; restore the damaged file from a backup)")
    if isinstance(exc, HistoryError | UsageError | Unsupported):
        return _one_line(str(exc)) or type(exc).__name__
    if isinstance(exc, OSError):
        return _one_line(f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else ""))
    return (f"unexpected error: {type(exc).__name__}: {_one_line(str(exc))} "
            "(set HISTLOG_DEBUG=1 to see the traceback)")


def _report(exc: BaseException) -> int:
    if os.environ.get("HISTLOG_DEBUG"):
        traceback.print_exception(exc, file=sys.stderr)
    print(f"histlog: error: {_error_line(exc)}", file=sys.stderr)
    return exit_code(exc)


def _stdout_closed() -> int:
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


_OWN_LOGGERS = ("histlog", "engine", "projections", "schemas")


class _OneLine(logging.Formatter):
    """``histlog: LEVEL: message (ExceptionType: text)`` on one line; the traceback only in debug."""

    def __init__(self, *, debug: bool) -> None:
        super().__init__()
        self.debug = debug

    def format(self, record: logging.LogRecord) -> str:
        text = _one_line(record.getMessage())
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:
            text += f" ({type(exc).__name__}: {_one_line(str(exc))})"
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


# --------------------------------------------------------------------------- where the history lives


@dataclass(frozen=True, slots=True)
class Target:
    """Where the history lives: the embedded data dir, or Kafka plus this instance's state dir."""

    data: Path | None
    kafka: str | None = None
    topic: str = DEFAULT_TOPIC
    state: Path | None = None

    @property
    def embedded(self) -> bool:
        return self.kafka is None

    @property
    def state_dir(self) -> Path:
        if self.kafka is None:
            assert self.data is not None  # Invariant: an embedded target always has a data dir.
            return self.data / "state"
        assert self.state is not None  # Invariant: resolve() refuses Kafka without --state.
        return self.state

    def describe(self) -> str:
        if self.kafka is None:
            return f"embedded data dir {self.data}"
        return f"Kafka {self.kafka} topic {self.topic} (state {self.state})"

    def open(self, *, progress: Callable[[int, int], None] | None = None, rebuild: bool = False,
             accept_log_loss: bool = False) -> HistoryEngine:
        """Open the engine on this target (the one place the CLI opens one)."""
        from engine.facade import HistoryEngine

        if self.kafka is None:
            return HistoryEngine.open(self.data, progress=progress, rebuild=rebuild, accept_log_loss=accept_log_loss)
        return HistoryEngine.open(kafka=self.kafka, topic=self.topic, state_dir=self.state, progress=progress,
                                  rebuild=rebuild, accept_log_loss=accept_log_loss)


def _flag(ns: argparse.Namespace, name: str) -> str | None:
    """A global option's value; an empty one is refused rather than read as "not given"."""
    value: str | None = getattr(ns, name, None)
    if value is not None and not value.strip():
        raise UsageError(f"--{name} is empty: give a value or leave the option out (see `histlog --help`)")
    return value


def resolve(ns: argparse.Namespace, env: dict[str, str] | os._Environ[str] | None = None) -> Target:
    """Flags win over ``HISTLOG_*`` environment variables; an explicit ``--data`` means embedded."""
    env = os.environ if env is None else env
    data_flag, kafka_flag, topic_flag, state_flag = (_flag(ns, name) for name in ("data", "kafka", "topic", "state"))
    if data_flag is not None and kafka_flag is not None:
        raise UsageError("give either --data DIR (embedded) or --kafka HOST:PORT, not both")
    kafka = kafka_flag
    if kafka is None and data_flag is None:
        kafka = env.get("HISTLOG_KAFKA")
    if kafka:
        if ":" not in kafka:
            raise UsageError(f"invalid --kafka {kafka!r}: expected HOST:PORT, e.g. localhost:9092")
        state = state_flag or env.get("HISTLOG_STATE")
        if not state:
            raise UsageError("--kafka needs --state DIR (or HISTLOG_STATE): "
                             "where this instance keeps its state")
        topic = topic_flag or env.get("HISTLOG_TOPIC") or DEFAULT_TOPIC
        return Target(None, kafka, topic, Path(state))
    if state_flag is not None:
        raise UsageError("--state applies to --kafka only (the embedded state is DATA/state)")
    if topic_flag is not None:
        raise UsageError("--topic applies to --kafka only")
    return Target(Path(data_flag or env.get("HISTLOG_DATA") or DEFAULT_DATA))


# --------------------------------------------------------------------------- formatting


def _part_text(part: Any) -> str:
    kind = part.kind
    if kind == "text":
        return str(part.text)
    if kind == "tool_call":
        return f"→ {part.name}({part.arguments})"
    if kind == "tool_result":
        content = " ".join(str(getattr(c, "text", f"<{c.kind}>")) for c in part.output.content)
        if part.output.details is not None:
            content = (content + " " if content else "") + str(part.output.details)
        return f"← {part.name}{' [error]' if part.is_error else ''}: {content}"
    if kind == "media":
        return f"<media {part.media.mime_type}>"
    if kind == "reasoning":
        return f"(reasoning: {part.text})" if part.text else "(reasoning)"
    if kind == "refusal":
        return f"(refusal: {part.text})"
    return f"<{kind}>"


def render_message(message: Message, *, width: int | None = None) -> str:
    """``role: text`` on one line (tool calls as ``→ name(args)``, results as ``← name: ...``)."""
    body = _one_line(" ".join(_part_text(p) for p in message.parts))
    if width is not None and len(body) > width:
        body = body[: width - 1] + "…"
    return f"{message.role.value}: {body}"


def _entry_line(entry: StoredMessage) -> str:
    hidden = f" (hidden: {entry.reason} by turn {entry.superseded_by})" if entry.superseded_by is not None else ""
    return f"[{entry.position}] {render_message(entry.message)}{hidden}"


def _created(entry: StoredMessage) -> str:
    return _iso(entry.created_at)


def _iso(created: datetime) -> str:
    if isinstance(created, datetime):
        return created.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return str(created)


def entry_json(entry: StoredMessage) -> str:
    """One entry as JSON; the message is embedded as its exact canonical JSON."""
    return (
        "{" + f'"append_id":{json.dumps(str(entry.append_id), ensure_ascii=False)},'
        f'"created_at":{json.dumps(_created(entry))},'
        f'"id":{json.dumps(str(entry.id), ensure_ascii=False)},'
        f'"message":{entry.message.model_dump_json()},'
        f'"position":{json.dumps(str(entry.position))}'
        + (f',"reason":{json.dumps(entry.reason)},"superseded_by":{json.dumps(entry.superseded_by, ensure_ascii=False)}'
           if entry.superseded_by is not None else "") + "}"
    )


def _json_array(items: Iterable[str]) -> str:
    return "[" + ",".join(items) + "]"


def _receipt_json(receipt: Any) -> str:
    raw = receipt.to_json()
    text = raw.decode() if isinstance(raw, bytes | bytearray) else str(raw)
    return _one_line(text) if "\n" in text else text


# --------------------------------------------------------------------------- commands


Out = TextIO


def _print(out: Out, *lines: str) -> None:
    for line in lines:
        out.write(line + "\n")


def cmd_demo(ns: argparse.Namespace, out: Out) -> int:
    """Run the demo; it ignores HISTLOG_* variables (only an explicit --data keeps its files)."""
    from engine.demo import run_demo

    kafka: str | None = getattr(ns, "kafka", None)
    if kafka is not None:
        topic: str = getattr(ns, "topic", None) or "histlog.events"
        state: str | None = getattr(ns, "state", None)
        if state is not None:
            return run_demo(Path(state), out, kafka=(kafka, topic))
        with tempfile.TemporaryDirectory(prefix="histlog-demo-state-") as tmp:
            return run_demo(Path(tmp), out, temporary=True, kafka=(kafka, topic))
    data: str | None = getattr(ns, "data", None)
    if data is not None:
        return run_demo(Path(data), out)
    with tempfile.TemporaryDirectory(prefix="histlog-demo-") as tmp:
        return run_demo(Path(tmp), out, temporary=True)


def _load_messages(path: str) -> list[Message]:
    from schemas.canonical import loads_exact

    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read --file {path}: {exc.strerror or exc}") from None
    try:
        tree = loads_exact(raw)
    except ValueError as exc:
        raise UsageError(f"--file {path} is not valid JSON: {_one_line(str(exc))}") from None
    if isinstance(tree, dict):
        if set(tree) != {"messages"}:
            raise UsageError(f'--file {path}: expected a list of messages or {{"messages": [...]}}, '
                             f"got an object with keys {sorted(tree)}")
        tree = tree["messages"]
    if not isinstance(tree, list):
        raise UsageError(f'--file {path}: expected a list of messages or {{"messages": [...]}}')
    messages: list[Message] = []
    for i, item in enumerate(tree):
        try:
            messages.append(Message.model_validate(item))
        except InvalidMessage as exc:
            raise InvalidMessage(f"--file {path}: messages[{i}]: {_one_line(str(exc))}") from None
    return messages


def cmd_append(ns: argparse.Namespace, target: Target, out: Out) -> int:
    from schemas.batch import Batch

    if ns.file is not None:
        if ns.role is not None:
            raise UsageError("--role goes with --text; a --file gives each message's role")
        messages = _load_messages(ns.file)
    else:
        role = ns.role or "user"
        if role not in {r.value for r in Role}:
            raise UsageError(f"unknown role {role!r}: expected one of system, user, assistant, tool")
        if role == "tool":
            raise UsageError("--role tool needs a tool result; use --file with a tool_result part")
        messages = [Message(role, [TextPart(ns.text)])]
    batch = Batch(ns.conversation, ns.append_id, messages)  # validates before any I/O
    with target.open() as engine:
        receipt = engine.append(batch)
    _print(out, _receipt_json(receipt))
    return OK


def _parse_after(text: str | None) -> HistoryPosition | None:
    if text is None:
        return None
    try:
        return HistoryPosition.parse(text)
    except ValueError as exc:
        raise UsageError(f"invalid --after: {exc}") from None


def cmd_read(ns: argparse.Namespace, target: Target, out: Out) -> int:
    conversation = ConversationID(ns.conversation)
    after = _parse_after(ns.after)
    if ns.unit is not None and ns.max_bytes is None:
        raise UsageError("--unit goes with --max-bytes")
    if ns.include_hidden and (ns.window is not None or ns.max_bytes is not None or ns.measure):
        raise UsageError("--include-hidden lists the whole history; it does not go with --window, --max-bytes "
                         "or --measure (those read the visible history)")
    if ns.window is not None:
        if after is not None:
            raise UsageError("--after cannot be combined with --window (a window is the newest whole turns)")
        if ns.window <= 0:
            raise InvalidWindow(f"invalid --window {ns.window}: "
                                "the limit must be a positive number of messages")
        return _read_window(target, conversation, ns.window, ns.json, out)
    if ns.measure:
        if ns.unit is not None or ns.turn_sources:
            raise UsageError("--measure takes no --unit or --turn-sources (it counts every message after --after)")
        return _read_measure(target, conversation, after, ns.json, out)
    if ns.turn_sources and ns.max_bytes is None:
        raise UsageError("--turn-sources goes with --max-bytes B")
    unit: Unit = "message" if ns.unit == "message" else "turn"
    if ns.turn_sources:
        return _read_sources(target, conversation, ns.max_bytes, after, unit, ns.json, out)
    if ns.max_bytes is not None:
        return _read_budget(target, conversation, ns.max_bytes, after, unit, ns.json, out)
    with target.open() as engine:
        entries = engine.entries(conversation, after=after, include_hidden=ns.include_hidden)
    if ns.json:
        _print(out, _json_array(entry_json(e) for e in entries))
    else:
        _print(out, *(_entry_line(e) for e in entries))
    return OK


def _read_window(target: Target, conversation: ConversationID, limit: int, as_json: bool, out: Out) -> int:
    with target.open() as engine:
        window = engine.window(conversation, limit)
        labels = _window_labels(engine, conversation, window) if not as_json else []
    if as_json:
        _print(out, _json_array(m.model_dump_json() for m in window))
        return OK
    _print(out, *(f"[{label}] {render_message(m)}" for label, m in zip(labels, window, strict=True)))
    return OK


def _window_labels(engine: HistoryEngine, conversation: ConversationID, window: list[Message]) -> list[str]:
    """Positions of the window's messages: its non-system messages are the newest stored ones."""
    labels = ["-"] * len(window)
    stored = [e for e in engine.entries(conversation) if e.message.role is not Role.SYSTEM]
    tail = [i for i, m in enumerate(window) if m.role is not Role.SYSTEM]
    if tail and len(tail) <= len(stored):
        for i, entry in zip(tail, stored[len(stored) - len(tail):], strict=True):
            if entry.message == window[i]:
                labels[i] = str(entry.position)
    for i, m in enumerate(window):
        if m.role is Role.SYSTEM:
            labels[i] = "system"
    return labels


def _read_budget(target: Target, conversation: ConversationID, max_bytes: int, after: HistoryPosition | None,
                 unit: Unit, as_json: bool, out: Out) -> int:
    with target.open() as engine:
        load = engine.read_within_bytes(conversation, max_bytes, after=after or HistoryPosition.START, unit=unit)
    entries: list[StoredMessage] = list(load.messages)
    if as_json:
        _print(out, '{"entries":' + _json_array(entry_json(e) for e in entries)
               + f',"truncated":{json.dumps(bool(load.truncated))}' + "}")
        return OK
    if load.truncated:
        _print(out, "… older messages left out (over the byte budget)")
    _print(out, *(_entry_line(e) for e in entries))
    return OK


def _source_json(source: TurnSource) -> str:
    return (
        "{" + f'"content":{source.content.decode("utf-8")},'
        f'"created_at":{json.dumps(_iso(source.created_at))},'
        f'"id":{json.dumps(source.id, ensure_ascii=False)},'
        f'"interrupted":{json.dumps(source.interrupted)},'
        f'"role":{json.dumps(source.role.value)}' + "}"
    )


def _read_sources(target: Target, conversation: ConversationID, max_bytes: int, after: HistoryPosition | None,
                  unit: Unit, as_json: bool, out: Out) -> int:
    with target.open() as engine:
        load = engine.turn_sources(conversation, max_bytes, after=after or HistoryPosition.START, unit=unit)
    if as_json:
        _print(out, '{"sources":' + _json_array(_source_json(s) for s in load.messages)
               + f',"truncated":{json.dumps(load.truncated)}' + "}")
        return OK
    if load.truncated:
        _print(out, "… older messages left out (over the byte budget)")
    _print(out, *(f"[{s.id}] {s.role.value}{' (interrupted)' if s.interrupted else ''}: "
                  f"{s.content.decode('utf-8')}" for s in load.messages))
    return OK


def _read_measure(target: Target, conversation: ConversationID, after: HistoryPosition | None, as_json: bool,
                  out: Out) -> int:
    with target.open() as engine:
        m = engine.measure(conversation, after or HistoryPosition.START)
    if as_json:
        _print(out, json.dumps({"content_bytes": m.content_bytes, "messages": m.messages, "turns": m.turns},
                               sort_keys=True))
    else:
        _print(out, f"messages={m.messages} content_bytes={m.content_bytes} turns={m.turns}")
    return OK


def cmd_turns(ns: argparse.Namespace, target: Target, out: Out) -> int:
    conversation = ConversationID(ns.conversation)
    with target.open() as engine:
        entries = engine.entries(conversation)
        latest = engine.latest_turn(conversation)
        turns: list[HistoryTurn] = []
        for entry in entries:
            if entry.position.turn > 0 and (not turns or turns[-1].position != entry.position.turn):
                turns.append(engine.turn(conversation, entry.id))
    if ns.json:
        _print(out, json.dumps([{"id": t.id, "position": t.position, "request_message_id": t.request_message_id,
                                 "assistant_message_id": t.assistant_message_id, "messages": len(t.messages)}
                                for t in turns], ensure_ascii=False))
        return OK
    for t in turns:
        mark = "  (latest: replace-turn may replace it)" if latest is not None and t.id == latest.id else ""
        _print(out, f"[{t.position}] {t.id}: {len(t.messages)} messages, answer {t.assistant_message_id or '-'}{mark}")
    return OK


def cmd_replace_turn(ns: argparse.Namespace, target: Target, out: Out) -> int:
    from schemas.batch import Batch

    if not ns.old_turn_id:
        raise UsageError("OLD_TURN_ID is empty: give the id of the latest turn (see `histlog turns`)")
    if ns.file is not None:
        if ns.answer is not None:
            raise UsageError("--answer goes with --text; a --file holds the whole new turn")
        messages = _load_messages(ns.file)
    else:
        messages = [Message.user(ns.text)] + ([Message.assistant(ns.answer)] if ns.answer is not None else [])
    batch = Batch(ns.conversation, ns.append_id, messages)  # validates before any I/O
    with target.open() as engine:
        receipt = engine.replace_turn(batch, ns.old_turn_id, ns.reason)
    _print(out, _receipt_json(receipt))
    return OK


def cmd_list(ns: argparse.Namespace, target: Target, out: Out) -> int:
    with target.open() as engine:
        conversations = engine.conversations()
    if ns.json:
        _print(out, json.dumps([str(c) for c in conversations], ensure_ascii=False))
    else:
        _print(out, *conversations)
    return OK


def cmd_clear(ns: argparse.Namespace, target: Target, out: Out) -> int:
    conversation = ConversationID(ns.conversation)
    with target.open() as engine:
        engine.clear(conversation)
    _print(out, f"cleared {conversation} (closed forever: later appends to it are refused)")
    return OK


def stats_json(engine: HistoryEngine) -> dict[str, Any]:
    stats = asdict(engine.stats())
    stats["poison"] = [{"position": str(pos), "reason": reason} for pos, reason in engine.poison()]
    return stats


def stats_lines(stats: dict[str, Any]) -> list[str]:
    lines = [f"{'partition':>9}  {'end':>10}  {'applied':>10}  {'lag':>8}"]
    for p, (end, applied, lag) in enumerate(zip(stats["end_offsets"], stats["applied_offsets"], stats["lag"],
                                                 strict=True)):
        lines.append(f"{p:>9}  {end:>10}  {applied:>10}  {lag:>8}")
    lines.append("")
    for name in ("accepted", "duplicates", "conflicts", "rejected_closed", "corrupt"):
        lines.append(f"{name:<16} {stats[name]:>8}")
    for item in stats["poison"]:
        lines.append(f"poison at {item['position']}: {item['reason']}")
    return lines


def cmd_stats(ns: argparse.Namespace, target: Target, out: Out) -> int:
    with target.open() as engine:
        stats = stats_json(engine)
    if ns.json:
        _print(out, json.dumps(stats, ensure_ascii=False))
    else:
        _print(out, *stats_lines(stats))
    return OK


# ----- tail


def _record_line(record: Record) -> str:
    from schemas.events import BatchAppended, TurnReplaced, decode_event
    from schemas.times import MAX_TIME_MS, MIN_TIME_MS, time_of

    if MIN_TIME_MS <= record.timestamp_ms <= MAX_TIME_MS:  # a producer may stamp any 64-bit value
        when = time_of(record.timestamp_ms).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    else:
        when = f"(time {record.timestamp_ms} ms)"
    head = f"{record.partition}:{record.offset}  {when}"
    try:
        event = decode_event(record.value)
    except HistoryError as exc:
        return f"{head}  poison  {_one_line(str(exc))}"
    if isinstance(event, BatchAppended | TurnReplaced):
        n = event.message_count
        what = "append" if isinstance(event, BatchAppended) else "replace"
        extra = ""
        if isinstance(event, TurnReplaced):
            extra = f"  ({event.reason} of turn {event.old_turn_id})"
        elif event.expected_last is not None:
            extra = f"  (if last is {event.expected_last or 'none'})"
        return (f"{head}  {what}  {event.conversation_id}  {event.append_id}  "
                f"{n} message{'s' if n != 1 else ''}  {event.digest[:19]}…{extra}")
    return f"{head}  clear   {event.conversation_id}"


def _last_records(engine: HistoryEngine, n: int) -> list[Record]:
    records: list[Record] = []
    for partition, end in enumerate(engine.log.end_offsets()):
        offset = max(end - n, 0)
        while offset < end:
            chunk = engine.log.read(partition, offset, max_records=min(n, 1000))
            if not chunk:
                break
            records.extend(chunk)
            offset = chunk[-1].offset + 1
    records.sort(key=lambda r: (r.timestamp_ms, r.partition, r.offset))
    return records[-n:] if n else []


def cmd_tail(ns: argparse.Namespace, target: Target, out: Out) -> int:
    if ns.lines < 0:
        raise UsageError(f"invalid --lines {ns.lines}: expected a number >= 0")
    with target.open() as engine:
        if not ns.follow:
            _print(out, *(_record_line(r) for r in _last_records(engine, ns.lines)))
            return OK
        print(f"histlog: following {target.describe()} (Ctrl-C to stop)", file=sys.stderr, flush=True)
        return follow(engine, out)


def follow(engine: HistoryEngine, out: Out, *, stop: threading.Event | None = None) -> int:
    """Print accepted messages (and clears) as this instance applies them, one line each, until
    Ctrl-C, SIGTERM (when run on the main thread) or ``stop`` is set.

    A batch record is shown only if it was *accepted*: its messages are in the conversation
    with that append id and that record's creation time (duplicates, conflicts and refused
    appends add nothing). The facade has no subscription or receipt lookup yet, so this
    re-reads the conversation's entries for each accepted batch.
    """
    from schemas.events import ConversationCleared, TurnReplaced, decode_event

    stop = stop if stop is not None else threading.Event()
    cursor = engine.log.cursor(dict(enumerate(engine.log.end_offsets())))

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()
        cursor.wakeup()

    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, on_term)
    try:
        while not stop.is_set():
            records = cursor.poll(0.5)
            if not records:
                continue
            engine.catch_up(timeout=30.0)
            for record in records:
                try:
                    event = decode_event(record.value)
                except HistoryError as exc:
                    where = f"{record.partition}:{record.offset}"
                    _print(out, f"poison record at {where} skipped: {_one_line(str(exc))}")
                    continue
                if isinstance(event, ConversationCleared):
                    _print(out, f"{event.conversation_id}  cleared")
                    continue
                entries = engine.entries(event.conversation_id)
                if isinstance(event, TurnReplaced) and any(e.append_id == event.append_id for e in entries):
                    _print(out, f"{event.conversation_id}  turn {event.old_turn_id} replaced ({event.reason}):")
                for entry in entries:
                    created_ms = round(entry.created_at.timestamp() * 1000) if isinstance(
                        entry.created_at, datetime) else None
                    if entry.append_id == event.append_id and created_ms in (None, event.created_at_ms):
                        _print(out, f"{event.conversation_id}  {_entry_line(entry)}")
            out.flush()
    except KeyboardInterrupt:
        pass
    finally:
        cursor.close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return OK


# ----- rebuild, replay, verify, bench


def cmd_rebuild(ns: argparse.Namespace, target: Target, out: Out) -> int:
    state = target.state_dir
    bar = ProgressBar("rebuild")
    started = time.monotonic()
    try:
        engine = target.open(progress=bar, rebuild=True, accept_log_loss=ns.accept_log_loss)
    finally:
        bar.finish()
    with engine:
        elapsed = time.monotonic() - started
        stats = engine.stats()
    records = sum(stats.applied_offsets)
    rate = records / elapsed if elapsed > 0 else float("inf")
    _print(out, f"rebuild: replayed {records} records into {state} "
                f"in {elapsed:.2f} s ({rate:,.0f} records/s)",
           f"rebuild: accepted {stats.accepted}, duplicates {stats.duplicates}, conflicts {stats.conflicts}, "
           f"rejected (closed) {stats.rejected_closed}, poison {stats.corrupt}")
    return OK


def load_projection(spec: str) -> Projection:
    """``module.path:ClassName`` → an instance of that ``projections.Projection`` subclass."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"--projection {spec!r}: expected MODULE:CLASS, e.g. examples.projections:MessageCount")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # so projections in the current project import
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except Exception as exc:  # a missing module or class, or one that fails while importing
        raise UsageError(f"--projection {spec!r}: cannot import it ({type(exc).__name__}: "
                         f"{_one_line(str(exc))}); fix the module or the spec") from None
    if not (isinstance(cls, type) and issubclass(cls, Projection)):
        raise UsageError(f"--projection {spec!r} is not a projections.Projection subclass")
    return cls()


def cmd_replay(ns: argparse.Namespace, target: Target, out: Out) -> int:
    projection = load_projection(ns.projection)
    with target.open() as engine:
        bar = ProgressBar(f"replay {projection.name}")
        started = time.monotonic()
        try:
            engine.register(projection, progress=bar)
            engine.rebuild(projection.name, progress=bar)
        finally:
            bar.finish()
        elapsed = time.monotonic() - started
        rows = len(engine.view(projection.name).scan())
    _print(out, f"replay: projection {projection.name!r} rebuilt from offset 0 in {elapsed:.2f} s ({rows} rows)")
    return OK


def cmd_log_verify(ns: argparse.Namespace, target: Target, out: Out) -> int:
    if not target.embedded:
        raise UsageError("log verify checks the embedded file log only (--data DIR); "
                         "Kafka keeps its own checks")
    try:
        from engine.log.verify import verify
    except ImportError:
        raise Unsupported("log verify needs engine.log.verify, "
                          "which is not available in this version") from None
    assert target.data is not None  # Invariant: embedded targets have a data dir.
    log_dir = target.data / "log"
    if not log_dir.is_dir():
        raise UsageError(f"no file log at {log_dir}: is --data pointing at a histlog data dir?")
    from engine.state import read_evidence

    evidence, note = read_evidence(target.state_dir)
    report = verify(log_dir, evidence)
    if evidence is None:
        report.evidence_note = note
    _print(out, report.summary())
    if not report.clean:
        kinds = {p.kind for p in report.problems}
        hint = ("opening the log repairs it (a torn tail is cut: those records were never acknowledged; an "
                "interrupted creation is completed)" if report.ok
                else "acknowledged records are missing: restore the log from a backup, or accept the loss "
                     "with `histlog rebuild --accept-log-loss`" if kinds <= {"torn tail", "lost records"}
                else "the engine will refuse to open: restore the named files from a backup")
        print(f"histlog: log verify found damage: {hint}", file=sys.stderr)
    return OK if report.clean else FAILED


def cmd_bench(ns: argparse.Namespace, target: Target, out: Out) -> int:
    checkout = Path(__file__).resolve().parents[1]
    if (checkout / "bench" / "__init__.py").exists() and str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))  # the benchmarks live in the source checkout, not the wheel
    try:
        bench = importlib.import_module("bench")
    except ModuleNotFoundError:
        bench = None
    run_all = getattr(bench, "run_all", None)
    if run_all is None:
        raise Unsupported("histlog bench runs from a source checkout (pip install -e .); bench/ is not installed")
    args = ["--quick"] if ns.quick else []
    if ns.only:
        args += ["--only", ns.only]
    if ns.json:
        args += ["--json", ns.json]
    result: object = run_all(args)
    return result if isinstance(result, int) and not isinstance(result, bool) else OK


# --------------------------------------------------------------------------- parser


def _needs_subcommand(ns: argparse.Namespace, target: Target, out: Out) -> int:
    raise UsageError("this command needs a subcommand")  # argparse already requires one


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line (``UsageError``) instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


Handler = Callable[[argparse.Namespace, Target, Out], int]


def _global_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("where the history lives (also accepted before the command)")
    group.add_argument("--data", metavar="DIR", default=argparse.SUPPRESS,
                       help=f"embedded data dir: file log + state (env HISTLOG_DATA, default {DEFAULT_DATA})")
    group.add_argument("--kafka", metavar="HOST:PORT", default=argparse.SUPPRESS,
                       help="use Apache Kafka instead (env HISTLOG_KAFKA)")
    group.add_argument("--topic", metavar="T", default=argparse.SUPPRESS,
                       help=f"Kafka topic (env HISTLOG_TOPIC, default {DEFAULT_TOPIC})")
    group.add_argument("--state", metavar="DIR", default=argparse.SUPPRESS,
                       help="this instance's state dir with --kafka (env HISTLOG_STATE)")


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    """The ``histlog`` argument parser (docs/cli.md has one section per subcommand)."""
    parser = _Parser(
        prog="histlog",
        description="Event-sourced conversation history: an append-only log and its projections.",
        epilog="exit codes: 0 ok, 1 other failure, 2 bad input, 3 conflict or closed, 4 backend unavailable. "
               "HISTLOG_DEBUG=1 shows tracebacks of unexpected errors.",
    )
    _global_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser, required=True)

    def command(name: str, handler: Callable[..., int], help_: str, description: str = "",
                into: Any = sub) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = into.add_parser(name, help=help_, description=description or help_)
        _global_options(p)
        p.set_defaults(handler=handler)
        return p

    command("demo", cmd_demo, "run a scripted support-bot conversation and show what histlog does",
            "Run a scripted multi-turn support-bot conversation (with tool calls) on the embedded default: "
            "appends and receipts, an idempotent retry, a conflict, a window, a clear, stats and a rebuild "
            "from the log. It uses a fresh temporary directory (deleted at exit) unless --data DIR is "
            "given on the command line (HISTLOG_DATA is ignored here, so a demo never writes into your "
            "history by accident). With --kafka HOST:PORT [--topic T] [--state DIR] on the command line "
            "it runs against Kafka (state in a temporary directory unless --state is given). "
            "Exits non-zero if the rebuilt state differs.")

    p = command("append", cmd_append, "append one batch atomically and print its receipt as JSON",
                "Append one batch atomically and idempotently; prints the receipt as one JSON line. "
                'A --file holds a JSON list of messages or {"messages": [...]} (the message JSON of '
                "docs/cli.md). Re-running the same append prints the same receipt.")
    p.add_argument("conversation", metavar="CONVERSATION")
    p.add_argument("append_id", metavar="APPEND_ID")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--text", metavar="TEXT", help="one message with this text")
    what.add_argument("--file", metavar="BATCH.json", help='a JSON list of messages, or {"messages": [...]}')
    p.add_argument("--role", metavar="ROLE",
                   help="role of the --text message: user (default), assistant, system")

    p = command("read", cmd_read, "print a conversation, or a window of it",
                "Print a conversation: one line per message, [TURN:SEQ] role: text. "
                "--json prints a JSON array of entries (position, id, append_id, created_at, message); "
                "with --window, a JSON array of messages; with --max-bytes, "
                '{"entries": [...], "truncated": bool}; with --turn-sources, {"sources": [...], "truncated": bool}; '
                'with --measure, {"messages", "content_bytes", "turns"}.')
    p.add_argument("conversation", metavar="CONVERSATION")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--window", metavar="N", type=_integer,
                     help="only the newest whole turns within N messages (system messages merged first)")
    how.add_argument("--max-bytes", metavar="B", type=_integer,
                     help="only the newest units within a budget of B content bytes")
    how.add_argument("--measure", action="store_true",
                     help="print the messages, content bytes and turns after --after (no payload is read)")
    p.add_argument("--turn-sources", action="store_true",
                   help="with --max-bytes: print only id, role, content, created_at, interrupted of each message")
    p.add_argument("--unit", choices=("turn", "message"), help="with --max-bytes: keep whole turns (default) "
                   "or single messages")
    p.add_argument("--after", metavar="TURN:SEQ", help="only messages after this position (exclusive)")
    p.add_argument("--include-hidden", action="store_true",
                   help="also the messages of replaced turns, marked hidden (not with --window/--max-bytes/--measure)")
    p.add_argument("--json", action="store_true", help="JSON output")

    p = command("turns", cmd_turns, "list a conversation's visible turns",
                "List the visible user-led turns of a conversation: [POSITION] TURN_ID, its message count "
                "and the id of its answer; the latest one is marked (only it can be replaced). --json "
                "prints an array of {id, position, request_message_id, assistant_message_id, messages}.")
    p.add_argument("conversation", metavar="CONVERSATION")
    p.add_argument("--json", action="store_true", help="JSON output")

    p = command("replace-turn", cmd_replace_turn, "edit or retry the latest turn; print the receipt",
                "Replace the latest visible turn OLD_TURN_ID (see `histlog turns`) by a new turn, as one "
                "atomic event: --reason retry keeps the user message (same text) with a new answer, "
                "--reason edit changes the user message. The old turn is hidden from every read but kept "
                "in the log (`histlog read --include-hidden`). Exits 3 if OLD_TURN_ID is no longer the "
                "latest visible turn.")
    p.add_argument("conversation", metavar="CONVERSATION")
    p.add_argument("old_turn_id", metavar="OLD_TURN_ID")
    p.add_argument("append_id", metavar="APPEND_ID")
    p.add_argument("--reason", choices=("edit", "retry"), required=True, help="edit or retry")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--text", metavar="TEXT", help="the new turn's user message")
    what.add_argument("--file", metavar="TURN.json", help='the whole new turn: a JSON list of messages, '
                      'or {"messages": [...]}, starting with the user message')
    p.add_argument("--answer", metavar="TEXT", help="with --text: the new turn's assistant answer")

    p = command("list", cmd_list, "list open conversations in lexical order")
    p.add_argument("--json", action="store_true", help="a JSON array of ids")

    p = command("clear", cmd_clear, "close a conversation forever (idempotent)",
                "Close a conversation forever: its messages leave the projections and later appends are "
                "refused (exit 3). Clearing twice, or clearing an id never written, is fine.")
    p.add_argument("conversation", metavar="CONVERSATION")

    p = command("stats", cmd_stats, "log offsets, lag and admission counts")
    p.add_argument("--json", action="store_true", help="one JSON object")

    p = command("tail", cmd_tail, "follow accepted messages as they are applied",
                "Follow new accepted messages (and clears) as this instance applies them, one line each, "
                "until Ctrl-C or SIGTERM. --no-follow prints the last --lines records of the log and exits. "
                "The embedded log has one writer process, so following it is for a data dir nobody else "
                "holds; with Kafka, tail any number of instances.")
    p.add_argument("--no-follow", dest="follow", action="store_false",
                   help="print the last records of the log and exit")
    p.add_argument("-n", "--lines", metavar="N", type=_integer, default=10,
                   help="with --no-follow: how many records (default 10)")

    p = command("rebuild", cmd_rebuild, "rebuild the state from the log, with a progress bar",
                "Delete the state (DATA/state, or --state with Kafka) and replay the log into a new one, with a "
                "progress bar on stderr; prints the records replayed and the rate. Nothing else may use the "
                "data dir meanwhile. A damaged state is replaced without being read. A state that has applied "
                "records a durable log no longer holds is evidence of lost acknowledged data: rebuild refuses "
                "(exit 1, the state is kept) unless --accept-log-loss, which names what is lost and rebuilds "
                "from what the log still holds.")
    p.add_argument("--accept-log-loss", action="store_true",
                   help="rebuild even though the log lost records the state had applied (they are gone for good)")

    p = command("replay", cmd_replay, "rebuild one custom projection from offset 0",
                "Import the projection class MODULE:CLASS (from the current directory or the installed "
                "packages), delete its state and replay the log into it from offset 0, with a progress bar.")
    p.add_argument("--projection", metavar="MODULE:CLASS", required=True)

    p = command("log", _needs_subcommand, "tools for the log itself (log verify)")
    log_sub = p.add_subparsers(dest="log_command", metavar="LOG_COMMAND", parser_class=_Parser, required=True)
    command("verify", cmd_log_verify, "check every segment of the embedded file log without changing it",
            "Walk every segment of the embedded file log read-only and print the report: exit 0 when clean, "
            "1 when damage is found.", into=log_sub)

    p = command("bench", cmd_bench, "run the benchmarks (prints tables and writes a JSON)",
                "Run the benchmarks of bench/ (source checkout only): each prints ratios against a baseline "
                "measured in the same run. The kafka one uses HISTLOG_KAFKA or starts a broker with scripts/kafka.")
    p.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    p.add_argument("--only", metavar="NAMES",
                   help="comma-separated subset: schemas,codec,log,engine,reads,middleware,turns,kafka")
    p.add_argument("--json", metavar="PATH", help="where to write the results (default bench/results/latest.json)")
    return parser


def subcommands(parser: argparse.ArgumentParser | None = None) -> list[str]:
    """Every command path, e.g. ``["demo", "append", ..., "log verify", "bench"]`` (for docs checks)."""
    parser = parser or build_parser()
    names: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                nested = subcommands(child)
                names.extend([f"{name} {n}" for n in nested] if nested else [name])
    return names


# --------------------------------------------------------------------------- entry point


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``histlog``; returns the exit code (see the module docstring)."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        with _logging_to_stderr():
            try:
                ns = build_parser().parse_args(args)
            except SystemExit as exc:  # --help / --version
                return exc.code if isinstance(exc.code, int) else OK
            if ns.command == "demo":
                code = cmd_demo(ns, sys.stdout)  # the demo picks its own (temporary) data dir
            else:
                handler: Handler = ns.handler
                code = handler(ns, resolve(ns), sys.stdout)
            sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
            return code
    except BrokenPipeError:  # only stdout is written to a pipe; the backends translate their own errors
        return _stdout_closed()
    except KeyboardInterrupt:
        print("histlog: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        return _report(exc)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
