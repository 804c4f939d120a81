"""A record on the log whose time cannot be represented is poison, never a crash (issue 11, defect 1).

Records are written the way a foreign producer (or a host with a broken clock) would write them:
straight onto the real FileLog with fastavro, past every check of the histlog writer. The
projector must keep running, count and quarantine each such record, skip it on every instance
(with or without a custom projection live), and every read must keep working.
"""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from engine import HistoryEngine
from schemas import Batch, ConversationClosed, Message
from schemas.times import MAX_TIME_MS
from tests.poison_support import Tape, batch_record, clear_record, frame, key_of, replaced_record, snapshot

YEAR_10000_MS = 253_402_300_800_000  # 10000-01-01T00:00:00Z: one millisecond past the representable range


def _bad_time_records() -> list[tuple[bytes, bytes]]:
    records = [
        ("BatchAppended", batch_record("c", "neg", "before 1970", -1)),
        ("BatchAppended", batch_record("c", "y10k", "year 10000", YEAR_10000_MS)),
        ("BatchAppended", batch_record("c", "min", "long min", -(2**63))),
        ("BatchAppended", batch_record("c", "max", "long max", 2**63 - 1)),
        ("TurnReplaced", replaced_record("c", "r-neg", "edit before 1970", -1, "a1/0")),
        ("TurnReplaced", replaced_record("c", "r-y10k", "edit in 10000", YEAR_10000_MS, "a1/0")),
        ("ConversationCleared", clear_record("c-neg", -1)),
        ("ConversationCleared", clear_record("c-y10k", YEAR_10000_MS)),
    ]
    return [(key_of(r), frame(name, r)) for name, r in records]


def _fine_records() -> list[tuple[bytes, bytes]]:
    records = [
        ("BatchAppended", batch_record("c", "epoch", "at the epoch", 0)),
        ("BatchAppended", batch_record("c", "last-ms", "the last ms of 9999", MAX_TIME_MS)),
        ("ConversationCleared", clear_record("c-last", MAX_TIME_MS)),
    ]
    return [(key_of(r), frame(name, r)) for name, r in records]


@pytest.mark.parametrize("live_projection", [False, True], ids=["no-projection", "live-projection"])
def test_a_record_with_an_unrepresentable_time_is_poison_everywhere(tmp_path: Path, live_projection: bool) -> None:
    data = tmp_path / "d"
    bad = _bad_time_records()
    with HistoryEngine.open(data) as eng:
        if live_projection:
            eng.register(Tape())
        first = eng.append(Batch("c", "a1", [Message.user("hello")]))
        positions = [eng.log.append(k, v) for k, v in bad]
        fine = [eng.log.append(k, v) for k, v in _fine_records()]
        after = eng.append(Batch("c", "a2", [Message.user("still writable")]))
        assert eng.catch_up(timeout=30)
        stats = eng.stats()
        assert stats.corrupt == len(bad)
        assert stats.accepted == 4  # a1, epoch, last-ms, a2
        assert [p for p, _ in eng.poison()] == positions
        assert all("created_at_ms" in why for _, why in eng.poison())
        assert [m.text() for m in eng.read("c")] == ["hello", "at the epoch", "the last ms of 9999", "still writable"]
        times = [e.created_at for e in eng.entries("c")]
        # created_at never decreases in a conversation: the epoch record is stored at the time of
        # the message before it, and everything after the last ms of 9999 at that ms.
        last = datetime(9999, 12, 31, 23, 59, 59, 999_000, tzinfo=UTC)
        assert times[1] == times[0] > datetime(1970, 1, 1, tzinfo=UTC) and times[2:] == [last, last]
        with pytest.raises(ConversationClosed):  # the clear with the last representable time was applied
            eng.append(Batch("c-last", "late", [Message.user("too late")]))
        assert after.position.offset > first.position.offset and fine
        if live_projection:
            tape = eng.view(Tape.name).scan(b"")
            assert len(tape) == 5  # the four batches and the clear with a fine time, nothing else
            assert not any(b"neg" in v or b"y10k" in v for _, v in tape)
        else:
            eng.register(Tape())  # catching a projection up over the poison works too
            tape = eng.view(Tape.name).scan(b"")
            assert len(tape) == 5
        expected = snapshot(eng)
    # Reopen, rebuild from scratch, and a second instance on a copy: all decide the same.
    with HistoryEngine.open(data) as eng:
        assert snapshot(eng) == expected
    shutil.copytree(data / "log", tmp_path / "copy" / "log")
    shutil.copytree(data / "keys", tmp_path / "copy" / "keys")  # the log's content is sealed under these
    with HistoryEngine.open(tmp_path / "copy") as eng:
        eng.register(Tape())
        assert snapshot(eng) == expected
        assert len(eng.view(Tape.name).scan(b"")) == 5
    shutil.rmtree(data / "state")
    with HistoryEngine.open(data) as eng:
        assert snapshot(eng) == expected


@pytest.mark.parametrize("ns", [-1_000_000, YEAR_10000_MS * 1_000_000], ids=["before-1970", "year-10000"])
def test_a_host_clock_that_cannot_be_recorded_refuses_every_write_before_io(
        tmp_path: Path, ns: int, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from schemas import InvalidConfiguration

    with HistoryEngine.open(tmp_path / "d") as eng:
        receipt = eng.append(Batch("c", "a1", [Message.user("hello")]))
        before = eng.stats().end_offsets
        monkeypatch.setattr(time, "time_ns", lambda: ns)
        with pytest.raises(InvalidConfiguration, match="host clock"):
            eng.append(Batch("c", "a2", [Message.user("x")]))
        with pytest.raises(InvalidConfiguration, match="host clock"):
            eng.replace_turn(Batch("c", "r1", [Message.user("y")]), f"{receipt.append_id}/0", "edit")
        with pytest.raises(InvalidConfiguration, match="host clock"):
            eng.clear("c")
        monkeypatch.undo()
        assert eng.stats().end_offsets == before  # nothing was written
        assert [m.text() for m in eng.read("c")] == ["hello"]


@pytest.mark.parametrize("old_turn_id", ["nonsense", "a1/", "a1/01", "/0", " a1/0"])
def test_replacing_a_malformed_turn_id_is_refused_before_io(tmp_path: Path, old_turn_id: str) -> None:
    """Such a TurnReplaced would be poison (docs/events.md §5): the writer never sends it."""
    from schemas import InvalidBatch, TurnNotReplaceable

    with HistoryEngine.open(tmp_path / "d") as eng:
        eng.append(Batch("c", "a1", [Message.user("hello")]))
        before = eng.stats().end_offsets
        with pytest.raises(InvalidBatch, match="turn id"):  # a conversation without turns: no fast refusal
            eng.replace_turn(Batch("fresh", "r1", [Message.user("y")]), old_turn_id, "edit")
        with pytest.raises((InvalidBatch, TurnNotReplaceable)):  # local state may already prove it
            eng.replace_turn(Batch("c", "r1", [Message.user("y")]), old_turn_id, "edit")
        assert eng.stats().end_offsets == before
