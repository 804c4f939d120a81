"""A writer's decision is handed to it, never looked up in a cache (issue 12, item 3).

The writer takes a ticket for its record key before producing the record; the projector hands
the ticket the decision of every record under that key it applies. So a writer that looks only
after the projector applied its position (and thousands of others) still gets its real
decision, a valid batch is never answered ``CORRUPT``, a timed-out or finished writer leaves
nothing behind, and a closing engine answers a waiting writer ``CommitUnconfirmed``.

The fast path and the projector share admission's rules (``precheck``): the same state gives
the same refusal, worded once (``engine.refusals``). Real FileLog and RocksDB under ``tmp_path``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engine import HistoryEngine
from engine.log.base import Produced, record_key
from projections.admission import Outcome, conversation_row, precheck
from projections.custom import Projection, ProjectionTx
from projections.events import ProjectedEvent
from schemas.batch import Batch, Receipt
from schemas.errors import AppendConflict, CommitUnconfirmed, PreconditionFailed, TurnNotReplaceable
from schemas.events import BatchAppended, TurnReplaced, encode_event
from schemas.ids import AppendID, ConversationID
from schemas.messages import Message
from schemas.positions import LogPosition


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[HistoryEngine]:
    with HistoryEngine.open(tmp_path / "data", partitions=3) as e:
        yield e


def _batch(conv: str, aid: str, text: str = "hi") -> Batch:
    return Batch(conv, aid, [Message.user(f"{text} {aid}")])


def _until(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    """A bounded wait on a condition (not a sleep as synchronisation)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def _late(engine: HistoryEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every produce return only once the projector has applied its record (and everything
    before): the writer then learns its position after the projector published its decision."""
    real = engine.log.produce

    def produce(key: bytes, value: bytes, *, timeout: float = 30.0, lead: bool = False) -> Produced:
        produced = real(key, value, timeout=timeout, lead=lead)
        assert engine.catch_up(timeout=30)
        return produced

    monkeypatch.setattr(engine.log, "produce", produce)


def test_a_writer_that_looks_after_the_projector_applied_its_position_gets_its_decision(
        engine: HistoryEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    _late(engine, monkeypatch)
    receipt = engine.append(_batch("c", "a1"))
    assert receipt.position.offset == 0
    receipt.validate_for(_batch("c", "a1"))  # raises unless it names that batch
    # Refusals that only the log order decides (the fast path cannot see them): the real ones.
    with pytest.raises(PreconditionFailed, match=r"expected last append 'ghost', found 'a1'; read the conversation"):
        ghost = Receipt(ConversationID("c"), AppendID("ghost"), receipt.digest, receipt.position)
        engine.append(_batch("c", "a2"), expected_last=ghost)
    with pytest.raises(TurnNotReplaceable, match=r"turn 'ghost/0' is not the latest visible turn \('a1/0' is\)"):
        engine.replace_turn(_batch("c", "e1"), "ghost/0", "edit")
    assert engine.stats().precondition_failed == 1 and engine.stats().not_replaceable == 1
    assert engine.stats().corrupt == 0


def test_a_decision_is_not_forgotten_behind_many_later_ones(engine: HistoryEngine) -> None:
    """The writer registers, the record is written and applied, then 1000 other records are
    applied before the writer looks: its decision is still the real one."""
    batch = _batch("c", "first")
    key = record_key("c", "first")
    with engine._projector.expecting(key) as ticket:
        position = engine.log.append(key, encode_event(BatchAppended.of(batch, 1_700_000_000_000)))
        for i in range(1000):
            other = _batch(f"o{i % 7}", f"x{i}")
            engine.log.append(record_key(other.conversation_id, other.append_id),
                              encode_event(BatchAppended.of(other, 1_700_000_000_000)))
        assert engine.catch_up(timeout=60)
        decision = ticket.wait(position, 0)
    assert decision is not None and decision.outcome is Outcome.ACCEPTED
    assert decision.receipt_position == position
    assert engine._projector.deliveries._tickets == {}  # nothing is kept once the writer is done


def test_a_ticket_holds_only_the_decisions_under_its_key(engine: HistoryEngine) -> None:
    batch = _batch("c", "a")
    key = record_key("c", "a")
    with engine._projector.expecting(key) as ticket:
        for i in range(50):
            engine.append(_batch("c", f"b{i}"))
        position = engine.log.append(key, encode_event(BatchAppended.of(batch, 1_700_000_000_000)))
        retry = engine.log.append(key, encode_event(BatchAppended.of(batch, 1_700_000_000_001)))
        assert engine.catch_up(timeout=30)
        assert set(ticket._decisions) == {position, retry}
        decided = ticket.wait(retry, 0)
        assert decided is not None and decided.outcome is Outcome.DUPLICATE and decided.receipt_position == position


def test_many_concurrent_writers_get_their_own_real_decisions(engine: HistoryEngine) -> None:
    """Unique appends, identical retries racing each other and conflicting batches racing for one
    append id, from 12 threads at once: every answer is the real one, never CORRUPT."""
    results: dict[tuple[int, int], object] = {}
    start = threading.Barrier(12)

    def writer(t: int) -> None:
        start.wait()
        for i in range(60):
            kind = i % 3
            try:
                if kind == 0:
                    results[t, i] = engine.append(_batch(f"c{t % 5}", f"t{t}-{i}"))
                elif kind == 1:  # every thread sends the same batch: one record wins, all get its receipt
                    results[t, i] = engine.append(_batch("shared", f"same-{i}"))
                else:  # every thread sends its own content under one append id: exactly one wins
                    results[t, i] = engine.append(_batch("race", f"race-{i}", text=f"thread {t}"))
            except AppendConflict as e:
                results[t, i] = e
            except Exception as e:  # anything else (CorruptLog, CommitUnconfirmed) fails the test below
                results[t, i] = e

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(results) == 12 * 60
    unexpected = [r for r in results.values() if not isinstance(r, Receipt | AppendConflict)]
    assert unexpected == []
    for i in range(60):
        answers = [results[t, i] for t in range(12)]
        if i % 3 == 0:
            assert all(isinstance(a, Receipt) for a in answers)
            assert len({a.position for a in answers if isinstance(a, Receipt)}) == 12
        elif i % 3 == 1:
            assert len({a for a in answers}) == 1  # the identical receipt for everyone
        else:
            winners = [a for a in answers if isinstance(a, Receipt)]
            assert len({w.digest for w in winners}) == 1 and len(winners) >= 1
            assert all(isinstance(a, AppendConflict) and a.existing_digest == winners[0].digest
                       for a in answers if not isinstance(a, Receipt))
    assert engine.stats().corrupt == 0
    assert engine._projector.deliveries._tickets == {}


class _Gate(Projection):
    """A custom projection that holds the projector inside a step until released."""

    name = "gate"

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def apply(self, event: ProjectedEvent, tx: ProjectionTx) -> None:
        self.entered.set()
        assert self.release.wait(60)


def test_a_timed_out_writer_leaves_no_ticket_and_a_resend_learns_the_outcome(engine: HistoryEngine) -> None:
    gate = _Gate()
    engine.register(gate)
    blocker = threading.Thread(target=engine.append, args=(_batch("g", "block"),))
    blocker.start()
    try:
        assert gate.entered.wait(10)
        with pytest.raises(CommitUnconfirmed, match=r"was written at \d+:\d+ but not decided within 0.2s; resend"):
            engine.append(_batch("c", "slow"), timeout=0.2)
        assert engine._projector.deliveries._tickets.keys() == {record_key("g", "block")}
    finally:
        gate.release.set()
        blocker.join(timeout=30)
    assert engine.append(_batch("c", "slow")).append_id == "slow"
    assert engine._projector.deliveries._tickets == {}


def test_a_writer_waiting_when_the_engine_closes_gets_commit_unconfirmed(tmp_path: Path) -> None:
    engine = HistoryEngine.open(tmp_path / "data")
    gate = _Gate()
    engine.register(gate)
    outcome: list[BaseException | Receipt] = []

    def write(batch: Batch) -> None:
        try:
            outcome.append(engine.append(batch, timeout=60))
        except BaseException as e:
            outcome.append(e)

    first = threading.Thread(target=write, args=(_batch("c", "first"),))
    first.start()
    assert gate.entered.wait(10)  # the projector is inside the step that decides "first"
    second = threading.Thread(target=write, args=(_batch("c", "second"),))
    second.start()
    assert _until(lambda: engine.log.end_offsets() == [2])  # "second" is written, after that step began
    closer = threading.Thread(target=engine.close)
    closer.start()
    assert _until(lambda: engine._projector._stopping)
    gate.release.set()
    for thread in (first, second, closer):
        thread.join(timeout=30)
    receipts = [o for o in outcome if isinstance(o, Receipt)]
    unconfirmed = [o for o in outcome if isinstance(o, CommitUnconfirmed)]
    assert [r.append_id for r in receipts] == ["first"]  # decided before the stop: its real answer
    assert len(unconfirmed) == 1
    assert "append 'second' to 'c' was written at 0:1, but this engine was closed before deciding it" in str(
        unconfirmed[0])
    with HistoryEngine.open(tmp_path / "data") as reopened:
        assert reopened.append(_batch("c", "second")).position == LogPosition(0, 1)


# -- one rule, two readers -------------------------------------------------------------------------
def _decide(engine: HistoryEngine, event: BatchAppended | TurnReplaced, batch: Batch,
            in_log_order: bool) -> Any:
    rows = engine._store.iterator()
    return precheck(rows, conversation_row(rows, batch.conversation_id), event, batch, in_log_order=in_log_order)


def test_the_fast_path_answers_only_what_no_later_record_can_change(engine: HistoryEngine) -> None:
    first = engine.append(_batch("c", "a1"))
    engine.append(_batch("c", "a2"))
    now = 1_700_000_000_000

    def both(event: BatchAppended | TurnReplaced, batch: Batch) -> tuple[Any, Any]:
        return _decide(engine, event, batch, True), _decide(engine, event, batch, False)

    # Permanent facts: both answer the same.
    dup, fast_dup = both(BatchAppended.of(_batch("c", "a1"), now), _batch("c", "a1"))
    assert dup == fast_dup and dup.outcome is Outcome.DUPLICATE and dup.receipt_position == first.position
    other = _batch("c", "a1", text="other")
    conflict, fast_conflict = both(BatchAppended.of(other, now), other)
    assert conflict == fast_conflict and conflict.outcome is Outcome.CONFLICT
    # A known append that is not the last can never be the last again: both refuse, in the same words.
    stale = BatchAppended.of(_batch("c", "a3"), now, "a1")
    refused, fast_refused = both(stale, _batch("c", "a3"))
    assert refused == fast_refused and refused.reason == "expected last append 'a1', found 'a2'"
    # An unknown expected append may still be written and become the last: only the log decides.
    ghost, fast_ghost = both(BatchAppended.of(_batch("c", "a3"), now, "ghost"), _batch("c", "a3"))
    assert ghost.outcome is Outcome.PRECONDITION_FAILED and fast_ghost is None
    # A new batch: accepted in log order, undecided on the fast path.
    assert both(BatchAppended.of(_batch("c", "a3"), now), _batch("c", "a3")) == (None, None)
    # Replacements: a known older turn is refused by both, an unknown one only in log order.
    edit = _batch("c", "e1")
    old, fast_old = both(TurnReplaced.of(edit, now, "a1/0", "edit"), edit)
    assert old == fast_old and old.reason == "turn 'a1/0' is not the latest visible turn ('a2/0' is)"
    unknown, fast_unknown = both(TurnReplaced.of(edit, now, "zz/0", "edit"), edit)
    assert unknown.outcome is Outcome.NOT_REPLACEABLE and fast_unknown is None
    retry = _batch("c", "r1", text="different")
    changed, fast_changed = both(TurnReplaced.of(retry, now, "a2/0", "retry"), retry)
    assert changed.reason.startswith("a retry keeps the user message") and fast_changed is None
