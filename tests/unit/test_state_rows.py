"""The rows a batch writes (``projections.keys``): how many keys per kind, the per-batch running
sums (``A``) through turn replacements that start inside a batch or span several, and a state
equal to its rebuild from the log, byte for byte."""

from __future__ import annotations

import shutil
from collections import Counter
from datetime import timedelta
from pathlib import Path

from engine import HistoryEngine
from projections import keys
from projections.rows import Stats, read_checkpoint_stats
from schemas.batch import Batch, StoredMessage
from schemas.events import BatchAppended, encode_event
from schemas.messages import Message
from schemas.positions import HistoryPosition
from schemas.records import record_key
from schemas.times import time_of
from tests.conformance.reads_contract import reference_measure


def _rows(engine: HistoryEngine) -> dict[bytes, bytes]:
    return dict(engine._store.db.items())


def test_a_two_message_batch_writes_one_row_per_message_kind_and_one_per_batch_kind(tmp_path: Path) -> None:
    with HistoryEngine.open(tmp_path, partitions=1, fsync="never") as eng:
        for i in range(3):
            eng.append(Batch("c", f"a{i}", [Message.user(f"q{i}"), Message.assistant(f"r{i}")]))
        kinds = Counter(k[:1] for k in _rows(eng) if not k.startswith(keys.META))
    # Per message M and N; per batch R, A and W (its time); per turn T; one summary row and one
    # open-conversation row, one checkpoint (with the counters: there is no other row of them);
    # one K row per data key the conversation's records were sealed under (one engine: one key).
    assert kinds == {b"M": 6, b"N": 6, b"R": 3, b"A": 3, b"W": 3, b"T": 3, b"C": 1, b"O": 1, b"P": 1, b"K": 1}


def _say(aid: str, *roles: str) -> Batch:
    makers = {"user": Message.user, "assistant": Message.assistant, "system": Message.system}
    size = 1 + int(aid[1:])  # every append's messages have other sizes: stale sums would show
    return Batch("c", aid, [makers[r](f"{aid} {i} " * (i + size), metadata={"n": str(i)} if i % 2 else None)
                            for i, r in enumerate(roles)])


def _check_sums(eng: HistoryEngine) -> None:
    """``measure`` after every position is the reference (every append's sizes differ, so a sum
    read from a hidden batch's row shows), and no row of a hidden batch is left."""
    entries = eng.entries("c")
    for after in [HistoryPosition.START, *(e.position for e in entries), HistoryPosition(10**6, 0)]:
        assert eng.measure("c", after) == reference_measure(entries, after), after
    _no_stale_sums(eng, entries)


def _no_stale_sums(eng: HistoryEngine, entries: list[StoredMessage]) -> None:
    """``A`` and ``W`` rows are exactly at the first ordinal of every batch with a visible message
    (``W`` with that message's time): no time seek can land on a hidden batch."""
    lower, upper = keys.conv_range(keys.AGGREGATE, b"c")
    starts = {keys.read_key_u64(k) for k in _rows(eng) if lower <= k < upper}
    assert starts == {o for o, e in enumerate(entries) if e.id.endswith("/0")}
    lower, upper = keys.conv_range(keys.TIME, b"c")
    times = {keys.read_time_key(k) for k in _rows(eng) if lower <= k < upper}
    assert times == {((e.created_at - time_of(0)) // timedelta(milliseconds=1), o) for o, e in enumerate(entries)
                     if e.id.endswith("/0")}


def test_running_sums_survive_replacements_inside_and_across_batches(tmp_path: Path) -> None:
    with HistoryEngine.open(tmp_path, partitions=2, fsync="never") as eng:
        eng.append(_say("a0", "system", "user", "assistant"))
        eng.append(_say("a1", "user", "assistant", "user", "assistant"))  # the 2nd turn starts inside
        _check_sums(eng)
        eng.replace_turn(_say("r1", "user"), "a1/2", "edit")  # shorter, from the middle of a1
        _check_sums(eng)
        eng.replace_turn(_say("r2", "user", "assistant", "assistant"), "r1/0", "edit")  # longer
        _check_sums(eng)
        eng.append(_say("a2", "user"))
        eng.append(_say("a3", "assistant", "assistant"))  # one turn over two batches
        eng.append(_say("a4", "assistant"))
        _check_sums(eng)
        eng.replace_turn(_say("r3", "user", "assistant"), "a2/0", "edit")  # hides a2..a4: a3, a4 rows go
        _check_sums(eng)
        eng.append(_say("a5", "user", "assistant", "user", "assistant"))
        eng.replace_turn(_say("r4", "user", "assistant", "user", "assistant", "assistant"), "a5/2", "edit")
        _check_sums(eng)
        built = _rows(eng)
        assert [k for k in built if k.startswith(keys.KEY_ID)]  # the rebuild must list the same keys
        stats = eng.stats()
    shutil.rmtree(tmp_path / "state")
    with HistoryEngine.open(tmp_path, fsync="never") as eng:  # a rebuild from the log
        assert _rows(eng) == built
        assert (eng.stats().accepted, eng.stats().not_replaceable) == (stats.accepted, stats.not_replaceable)
        _check_sums(eng)


def test_counters_live_in_the_checkpoint_row_and_survive_a_reopen(tmp_path: Path) -> None:
    first, other = _say("a0", "user"), _say("a0", "assistant")
    with HistoryEngine.open(tmp_path, partitions=1, fsync="never") as eng:
        key = record_key("c", "a0")
        for value in (encode_event(BatchAppended.of(first, 1)), encode_event(BatchAppended.of(first, 1)),
                      encode_event(BatchAppended.of(other, 2)), b"not an event"):
            eng.log.append(key, value)  # through the log: no writer's fast path answers these
        assert eng.catch_up(timeout=30)
    with HistoryEngine.open(tmp_path, fsync="never") as eng:
        got = eng.stats()
        assert (got.accepted, got.duplicates, got.conflicts, got.corrupt) == (1, 1, 1, 1)
        raw = eng._store.get(keys.checkpoint_key("core", 0))
        assert raw is not None and keys.read_u64(raw) == 4
        assert read_checkpoint_stats(raw) == Stats(accepted=1, duplicates=1, conflicts=1, corrupt=1)
