"""The commands that read: ``read`` (the history or a page of it, a window, a byte budget, turn
sources, a measure, the messages named by ``--id``), ``turns``, ``locate`` and ``list``. Each
checks its flags, makes one engine call and prints the result: text lines from
``engine.render``, JSON as the schemas serialise their values."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import TextIO

from engine.cli.exits import OK, UsageError
from engine.cli.target import Target
from engine.render import entry_line, json_text, print_lines, render_message
from projections.reads import Unit
from schemas.batch import TurnSource
from schemas.errors import InvalidWindow
from schemas.ids import ConversationID
from schemas.positions import HistoryPosition

__all__ = ["cmd_list", "cmd_locate", "cmd_read", "cmd_turns"]

_LEFT_OUT = "… older messages left out (over the byte budget)"


def _parse_after(text: str | None) -> HistoryPosition:
    if text is None:
        return HistoryPosition.START
    return _parse_position(text, "--after")


def _parse_position(text: str, flag: str) -> HistoryPosition:
    try:
        return HistoryPosition.parse(text)
    except ValueError as exc:
        raise UsageError(f"invalid {flag}: {exc}") from None


def _parse_time(text: str | None, flag: str) -> datetime | None:
    """An ISO 8601 time; one without a zone is UTC (what the CLI prints: ``...Z``)."""
    if text is None:
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"invalid {flag} {text!r}: expected an ISO 8601 time, e.g. 2025-03-13T10:04:11.402Z") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def cmd_read(ns: argparse.Namespace, target: Target, out: TextIO) -> int:
    """Check the flags that go together, then run the one read they ask for."""
    conversation = ConversationID(ns.conversation)
    after = _parse_after(ns.after)
    if ns.unit is not None and ns.max_bytes is None:
        raise UsageError("--unit goes with --max-bytes")
    if ns.include_hidden and (ns.window is not None or ns.max_bytes is not None or ns.measure):
        raise UsageError("--include-hidden lists the whole history; it does not go with --window, --max-bytes "
                         "or --measure (those read the visible history)")
    paging = [f for f, v in (("--before", ns.before), ("--order", ns.order), ("--limit", ns.limit),
                             ("--since", ns.since), ("--until", ns.until)) if v is not None]
    if ns.ids is not None:
        return _read_ids(ns, target, conversation, paging, out)
    if paging and (ns.window is not None or ns.max_bytes is not None or ns.measure):
        raise UsageError(f"{paging[0]} pages the stored messages; it does not go with --window, --max-bytes "
                         "or --measure")
    if ns.window is not None:
        if ns.after is not None:
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
    before = None if ns.before is None else _parse_position(ns.before, "--before")
    since, until = _parse_time(ns.since, "--since"), _parse_time(ns.until, "--until")
    with target.open() as engine:
        entries = engine.entries(conversation, after=None if ns.after is None else after, before=before,
                                 limit=ns.limit, include_hidden=ns.include_hidden, order=ns.order or "asc",
                                 since=since, until=until)
    if ns.json:
        print_lines(out, json_text([e.to_json() for e in entries]))
    else:
        print_lines(out, *(entry_line(e) for e in entries))
    return OK


def _read_ids(ns: argparse.Namespace, target: Target, conversation: ConversationID, paging: list[str],
              out: TextIO) -> int:
    """``--id``: the named messages (``entries_by_ids``), or with ``--turn-sources`` their sources."""
    other = [f for f, v in (("--window", ns.window), ("--max-bytes", ns.max_bytes), ("--after", ns.after),
                            ("--unit", ns.unit)) if v is not None] + paging
    other += [f for f, v in (("--measure", ns.measure), ("--include-hidden", ns.include_hidden)) if v]
    if other:
        raise UsageError(f"--id reads the messages it names; it does not go with {other[0]}")
    with target.open() as engine:
        if ns.turn_sources:
            sources = engine.turn_sources_by_ids(conversation, ns.ids)
            if ns.json:
                print_lines(out, json_text({"sources": [s.to_json() for s in sources]}))
            else:
                print_lines(out, *(_source_line(s) for s in sources))
            return OK
        entries = engine.entries_by_ids(conversation, ns.ids)
    if ns.json:
        print_lines(out, json_text([e.to_json() for e in entries]))
    else:
        print_lines(out, *(entry_line(e) for e in entries))
    return OK


def _source_line(s: TurnSource) -> str:
    return f"[{s.id}] {s.role.value}{' (interrupted)' if s.interrupted else ''}: {s.content.decode('utf-8')}"


def _read_window(target: Target, conversation: ConversationID, limit: int, as_json: bool, out: TextIO) -> int:
    with target.open() as engine:
        window = engine.window_entries(conversation, limit)
    if as_json:
        print_lines(out, json_text([m.canonical_json() for m in window.messages]))
        return OK
    if window.system is not None:
        print_lines(out, f"[system] {render_message(window.system)}")
    print_lines(out, *(entry_line(e) for e in window.entries))
    return OK


def _read_budget(target: Target, conversation: ConversationID, max_bytes: int, after: HistoryPosition,
                 unit: Unit, as_json: bool, out: TextIO) -> int:
    with target.open() as engine:
        load = engine.read_within_bytes(conversation, max_bytes, after=after, unit=unit)
    if as_json:
        print_lines(out, json_text({"entries": [e.to_json() for e in load.messages], "truncated": load.truncated}))
        return OK
    if load.truncated:
        print_lines(out, _LEFT_OUT)
    print_lines(out, *(entry_line(e) for e in load.messages))
    return OK


def _read_sources(target: Target, conversation: ConversationID, max_bytes: int, after: HistoryPosition,
                  unit: Unit, as_json: bool, out: TextIO) -> int:
    with target.open() as engine:
        load = engine.turn_sources(conversation, max_bytes, after=after, unit=unit)
    if as_json:
        print_lines(out, json_text({"sources": [s.to_json() for s in load.messages], "truncated": load.truncated}))
        return OK
    if load.truncated:
        print_lines(out, _LEFT_OUT)
    print_lines(out, *(_source_line(s) for s in load.messages))
    return OK


def _read_measure(target: Target, conversation: ConversationID, after: HistoryPosition, as_json: bool,
                  out: TextIO) -> int:
    with target.open() as engine:
        m = engine.measure(conversation, after)
    if as_json:
        print_lines(out, json.dumps({"content_bytes": m.content_bytes, "messages": m.messages, "turns": m.turns},
                                    sort_keys=True))
    else:
        print_lines(out, f"messages={m.messages} content_bytes={m.content_bytes} turns={m.turns}")
    return OK


def cmd_turns(ns: argparse.Namespace, target: Target, out: TextIO) -> int:
    conversation = ConversationID(ns.conversation)
    with target.open() as engine:
        turns = engine.turns(conversation)
    if ns.json:
        print_lines(out, json.dumps([{"id": t.id, "position": t.position, "request_message_id": t.request_message_id,
                                      "assistant_message_id": t.assistant_message_id, "messages": len(t.messages)}
                                     for t in turns], ensure_ascii=False))
        return OK
    for i, t in enumerate(turns, 1):
        mark = "  (latest: replace-turn may replace it)" if i == len(turns) else ""  # turns() ends with the latest
        print_lines(out, f"[{t.position}] {t.id}: {len(t.messages)} messages, "
                         f"answer {t.assistant_message_id or '-'}{mark}")
    return OK


def cmd_locate(ns: argparse.Namespace, target: Target, out: TextIO) -> int:
    """The message a platform refers to by its id, with its neighbours; exit 2 when none has it."""
    conversation = ConversationID(ns.conversation)
    with target.open() as engine:
        found = engine.locate(conversation, ns.external_id, ns.context, ns.context)
    if ns.json:
        print_lines(out, json_text({"message": found.message.to_json(), "before": [e.to_json() for e in found.before],
                                    "after": [e.to_json() for e in found.after]}))
        return OK
    print_lines(out, *(f"  {entry_line(e)}" for e in found.before), f"> {entry_line(found.message)}",
                *(f"  {entry_line(e)}" for e in found.after))
    return OK


def cmd_list(ns: argparse.Namespace, target: Target, out: TextIO) -> int:
    with target.open() as engine:
        conversations = engine.conversations(prefix=ns.prefix, after=ns.after, limit=ns.limit)
    if ns.json:
        print_lines(out, json.dumps([str(c) for c in conversations], ensure_ascii=False))
    else:
        print_lines(out, *conversations)
    return OK

