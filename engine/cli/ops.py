"""The commands that watch or rebuild the whole store: ``stats``, ``tail`` (the last records of
the log, or following what this instance applies) and ``rebuild``."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from dataclasses import asdict, fields
from datetime import datetime
from types import FrameType
from typing import Any, TextIO

from engine.cli.exits import OK, UsageError
from engine.cli.target import Target
from engine.facade import EngineStats, HistoryEngine
from engine.log.base import Record
from engine.render import ProgressBar, entry_line, one_line, print_lines, record_line
from schemas.errors import HistoryError
from schemas.events import ConversationCleared, TurnReplaced, decode_event

__all__ = ["cmd_rebuild", "cmd_stats", "cmd_tail", "follow"]

_OFFSETS = ("end_offsets", "applied_offsets", "lag")


def _stats_lines(stats: EngineStats, poison: list[dict[str, str]]) -> list[str]:
    """The offsets per partition, then every counter of ``EngineStats`` (numbers right-aligned
    in column 25), then each poison record."""
    lines = [f"{'partition':>9}  {'end':>10}  {'applied':>10}  {'lag':>8}"]
    for p, (end, applied, lag) in enumerate(zip(stats.end_offsets, stats.applied_offsets, stats.lag, strict=True)):
        lines.append(f"{p:>9}  {end:>10}  {applied:>10}  {lag:>8}")
    lines.append("")
    for name in (f.name for f in fields(stats) if f.name not in _OFFSETS):
        lines.append(f"{name} {getattr(stats, name):>{24 - len(name)}}")
    lines.extend(f"poison at {item['position']}: {item['reason']}" for item in poison)
    return lines


def cmd_stats(ns: argparse.Namespace, target: Target, out: TextIO) -> int:
    with target.open() as engine:
        stats = engine.stats()
        poison = [{"position": str(position), "reason": reason} for position, reason in engine.poison()]
    if ns.json:
        tree: dict[str, Any] = {**asdict(stats), "poison": poison}
        print_lines(out, json.dumps(tree, ensure_ascii=False))
    else:
        print_lines(out, *_stats_lines(stats, poison))
    return OK


def cmd_rebuild(ns: argparse.Namespace, target: Target, out: TextIO) -> int:
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
    print_lines(out, f"rebuild: replayed {records} records into {state} "
                     f"in {elapsed:.2f} s ({rate:,.0f} records/s)",
                f"rebuild: accepted {stats.accepted}, duplicates {stats.duplicates}, conflicts {stats.conflicts}, "
                f"rejected (closed) {stats.rejected_closed}, poison {stats.corrupt}")
    return OK


# ----- tail


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


def cmd_tail(ns: argparse.Namespace, target: Target, out: TextIO) -> int:
    if ns.lines < 0:
        raise UsageError(f"invalid --lines {ns.lines}: expected a number >= 0")
    with target.open() as engine:
        if not ns.follow:
            print_lines(out, *(record_line(r) for r in _last_records(engine, ns.lines)))
            return OK
        print(f"histlog: following {target.describe()} (Ctrl-C to stop)", file=sys.stderr, flush=True)
        return follow(engine, out)


def follow(engine: HistoryEngine, out: TextIO, *, stop: threading.Event | None = None) -> int:
    """Print accepted messages (and clears) as this instance applies them, one line each, until
    Ctrl-C, SIGTERM (when run on the main thread) or ``stop`` is set.

    A batch record is shown only if it was *accepted*: its messages are in the conversation
    with that append id and that record's creation time (duplicates, conflicts and refused
    appends add nothing). The facade has no subscription or receipt lookup yet, so this
    re-reads the conversation's entries for each accepted batch.
    """
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
                    print_lines(out, f"poison record at {where} skipped: {one_line(str(exc))}")
                    continue
                if isinstance(event, ConversationCleared):
                    print_lines(out, f"{event.conversation_id}  cleared")
                    continue
                entries = engine.entries(event.conversation_id)
                if isinstance(event, TurnReplaced) and any(e.append_id == event.append_id for e in entries):
                    print_lines(out, f"{event.conversation_id}  turn {event.old_turn_id} replaced ({event.reason}):")
                for entry in entries:
                    created_ms = round(entry.created_at.timestamp() * 1000) if isinstance(
                        entry.created_at, datetime) else None
                    if entry.append_id == event.append_id and created_ms in (None, event.created_at_ms):
                        print_lines(out, f"{event.conversation_id}  {entry_line(entry)}")
            out.flush()
    except KeyboardInterrupt:
        pass
    finally:
        cursor.close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return OK
