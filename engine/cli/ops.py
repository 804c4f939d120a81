"""The commands that watch or rebuild the whole store: ``stats``, ``tail`` (the last records of
the log, or following what this instance applies) and ``rebuild``.

``tail --no-follow`` shows sealed records by key id and sizes, erased ones as ``erased``, never
their content (``engine.render.record_line`` with the engine's key store)."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import fields
from types import FrameType
from typing import TextIO

from engine.cli.exits import OK, UsageError
from engine.cli.target import Target
from engine.facade import EngineStats, HistoryEngine
from engine.render import ProgressBar, one_line, print_lines, record_line, render_message
from engine.service.wire import stats_json
from projections.events import ClearEvent, MessagesDeleted, ProjectedEvent, TurnReplacedEvent
from schemas.errors import SubscriptionLost

__all__ = ["cmd_rebuild", "cmd_stats", "cmd_tail", "event_lines", "follow"]

log = logging.getLogger(__name__)

_OFFSETS = ("end_offsets", "applied_offsets", "lag")


def _stats_lines(stats: EngineStats, poison: list[dict[str, str]]) -> list[str]:
    """The offsets per partition, then every counter of ``EngineStats`` (numbers right-aligned
    in column 25; a list, such as the owned partitions, comma-separated), then each poison record."""
    lines = [f"{'partition':>9}  {'end':>10}  {'applied':>10}  {'lag':>8}"]
    for p, (end, applied, lag) in enumerate(zip(stats.end_offsets, stats.applied_offsets, stats.lag, strict=True)):
        lines.append(f"{p:>9}  {end:>10}  {applied:>10}  {lag:>8}")
    lines.append("")
    for name in (f.name for f in fields(stats) if f.name not in _OFFSETS):
        value = getattr(stats, name)
        shown = ",".join(map(str, value)) if isinstance(value, list) else value  # per partition: in order
        lines.append(f"{name} {shown:>{24 - len(name)}}")
    lines.extend(f"poison at {item['position']}: {item['reason']}" for item in poison)
    return lines


def cmd_stats(ns: argparse.Namespace, target: Target, out: TextIO) -> int:
    with target.open() as engine:
        stats = engine.stats()
        tree = stats_json(stats, engine.poison())  # the one form, the service's /v1/stats too
    if ns.json:
        print_lines(out, json.dumps(tree, ensure_ascii=False))
    else:
        print_lines(out, *_stats_lines(stats, tree["poison"]))
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


def cmd_tail(ns: argparse.Namespace, target: Target, out: TextIO) -> int:
    if ns.lines < 0:
        raise UsageError(f"invalid --lines {ns.lines}: expected a number >= 0")
    with target.open() as engine:
        if not ns.follow:
            print_lines(out, *(record_line(r, engine.keys) for r in engine.log.last_records(ns.lines)))
            return OK
        def following() -> None:
            print(f"histlog: following {target.describe()} (Ctrl-C to stop)", file=sys.stderr, flush=True)

        return follow(engine, out, ready=following)


def follow(engine: HistoryEngine, out: TextIO, *, stop: threading.Event | None = None,
           ready: Callable[[], None] | None = None) -> int:
    """Print accepted messages (and clears) as this instance applies them, one line each
    (``CONVERSATION [TURN:SEQ] role: text``; a replacement is announced first), until Ctrl-C,
    SIGTERM (when run on the main thread) or ``stop`` is set. ``ready`` is called once the
    subscription and the SIGTERM handler are in place: nothing applied after it is missed.

    Lines come from ``engine.subscribe()``, so only accepted events show (duplicates, conflicts,
    refused appends and poison records are not events; ``histlog stats`` counts them), each
    exactly once and with no read of the conversation. A follower too slow for the projector
    loses its subscription: it says so on stderr and follows on from there.
    """
    stop = stop if stop is not None else threading.Event()
    events = engine.subscribe()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()
        events.close()

    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, on_term)
    try:
        if ready is not None:
            ready()
        while not stop.is_set():
            try:
                event = events.get(timeout=0.5)  # the timeout only re-checks ``stop``
            except SubscriptionLost as lost:
                events.close()
                events = engine.subscribe()
                log.warning("tail fell behind: %s; following on from now", one_line(str(lost)))
                continue
            if event is None:
                if events.done:
                    break
                continue
            print_lines(out, *event_lines(event))
            out.flush()
    except KeyboardInterrupt:
        pass
    finally:
        events.close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return OK


def event_lines(event: ProjectedEvent) -> list[str]:
    """What ``follow`` prints for one accepted event."""
    c = event.conversation_id
    if isinstance(event, ClearEvent):
        return [f"{c}  cleared"]
    if isinstance(event, MessagesDeleted):
        return [f"{c}  deleted {' '.join(event.message_ids)}"]
    head = [f"{c}  turn {event.old_turn_id} replaced ({event.reason}):"] if isinstance(event, TurnReplacedEvent) else []
    return head + [f"{c}  [{position}] {render_message(message)}"
                   for message, position in zip(event.messages, event.positions, strict=True)]
