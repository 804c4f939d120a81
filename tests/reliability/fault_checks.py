"""What the fault harness compares after each step: an engine process's observation
(fault_worker.observe, JSON) against the reference model (tests/conformance/turns_model.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from schemas import HistoryPosition, Receipt, WindowTooSmall
from tests.conformance.turns_model import RefConversation, RefRow
from tests.erased_counts import ERASABLE, comparable_counts
from tests.reliability.fault_worker import WINDOWS

COUNTERS = ("conflicts", "rejected_closed", "precondition_failed", "not_replaceable")
"""Refusal counters of ``stats()``: each refused write reaches the log at most once (twice when
it was in flight at a kill and resent); fast paths answer many without touching the log."""


@dataclass
class Bounds:
    """What the model knows of ``stats()``: ``accepted`` exactly, refusals within bounds."""

    at_most: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    at_least: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))


def row_key(raw: list[Any]) -> tuple[object, ...]:
    """A worker's stored row as ``RefRow.key()`` shows it."""
    mid, turn, seq, append_id, canonical, superseded_by, reason, _created = raw
    return (mid, HistoryPosition(turn, seq), append_id, canonical.encode(), superseded_by, reason)


def keys_of(rows: list[RefRow]) -> list[tuple[object, ...]]:
    return [r.key() for r in rows]


def check_conversation(m: RefConversation, got: dict[str, Any], created: dict[tuple[str, str], str]) -> None:
    """Every read of one conversation equals the model; ``created_at`` is one per append id and
    never changes (not across kills, not across rebuilds)."""
    c = m.cid
    assert [row_key(r) for r in got["all"]] == keys_of(m.entries(include_hidden=True)), f"{c}: entries(hidden)"
    assert [row_key(r) for r in got["visible"]] == keys_of(m.visible_rows()), f"{c}: entries()"
    assert got["read"] == [r.message.canonical_json().decode() for r in m.visible_rows()], f"{c}: read()"
    for raw in got["all"]:
        first = created.setdefault((c, raw[3]), raw[7])
        assert raw[7] == first, f"{c}/{raw[0]}: created_at moved from {first} to {raw[7]}"
    for n in WINDOWS:
        try:
            want: Any = [x.canonical_json().decode() for x in m.window(n)]
        except WindowTooSmall:
            want = "WindowTooSmall"
        assert got["window"][str(n)] == want, f"{c}: window({n})"
    latest = got["latest_turn"]
    mine = None if latest is None else (latest[0], latest[1], latest[2], latest[3], [row_key(r) for r in latest[4]])
    assert mine == m.latest_turn(), f"{c}: latest_turn()"
    assert got["mirror"] == [[r.position.seq, r.message.canonical_json().decode()] for r in m.visible_rows()], \
        f"{c}: the custom projection's mirror"
    replacements, deliveries = {r.append_id: 1 for r in m.replacements}, dict.fromkeys(m.order, 1)
    # A cleared conversation replayed by a rebuild gives the projection only its ClearEvent: its
    # content is erased. Before any rebuild the projection had each event once.
    accepted = ({}, replacements) if m.closed else (replacements,)
    assert got["mirror_replacements"] in accepted, \
        f"{c}: the custom projection was not given each accepted replacement exactly once"
    assert got["mirror_deliveries"] in (({}, deliveries) if m.closed else (deliveries,)), \
        f"{c}: the custom projection was not given each accepted batch exactly once"
    assert got["mirror_clears"] == int(m.closed), f"{c}: the custom projection was not given the clear exactly once"


def check_observation(convs: list[RefConversation], got: dict[str, Any], created: dict[tuple[str, str], str],
                      bounds: Bounds, receipts: list[Receipt]) -> None:
    for m in convs:
        check_conversation(m, got["convs"][m.cid], created)
    assert got["conversations"] == sorted(m.cid for m in convs if not m.closed and m.order)
    stats = got["stats"]
    # A rebuild (state deletion, damage) counts a cleared conversation's sealed records as erased.
    open_accepted = sum(len(m.order) for m in convs if not m.closed)
    all_accepted = sum(len(m.order) for m in convs)
    assert open_accepted <= stats["accepted"] <= all_accepted <= stats["accepted"] + stats["erased"], \
        "stats().accepted"
    assert stats["corrupt"] == 0 and stats["duplicates"] >= 0
    assert stats["lag"] == [0] * len(stats["lag"]), "reads were answered before the state caught up"
    for name in COUNTERS:
        least = bounds.at_least[name] - (stats["erased"] if name in ERASABLE else 0)
        assert least <= stats[name] <= bounds.at_most[name], (name, stats[name], bounds)
    ends = stats["end_offsets"]
    for r in receipts:
        assert r.position.offset < ends[r.position.partition], f"a receipt beyond the log's end: {r}"


def comparable(observation: dict[str, Any]) -> dict[str, Any]:
    """An observation without what legitimately differs between two opens: lag (which must be
    zero anyway), and what a rebuild cannot give again of a cleared conversation (the counters it
    counts as erased: ``tests.erased_counts``; the events a custom projection had of it)."""
    stats = {k: v for k, v in observation["stats"].items() if k != "lag"}
    convs = {c: {k: v for k, v in got.items() if not (got["mirror_clears"] and k in _ERASED_BY_A_REBUILD)}
             for c, got in observation["convs"].items()}
    return {**observation, "convs": convs, "stats": comparable_counts(stats)}


_ERASED_BY_A_REBUILD = ("mirror_replacements", "mirror_deliveries")
"""What a custom projection kept of a cleared conversation's events, which a rebuild does not
deliver again (their content is erased)."""
