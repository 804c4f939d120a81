"""``AsyncHistoryEngine``'s writes wait for their decision on an asyncio future, not a thread
(issue 13, "No thread per waiting request").

A write is the facade's short submit (on the loop itself over FileLog, whose ``produce`` never
blocks; on the engine's bounded submit pool when the log's may: Kafka) and then an await of
``Ticket.watch``, resolved by the projector through ``call_soon_threadsafe``. So 1,000 appends
waiting at once hold no thread at all on FileLog; every outcome (receipts, identical retries, conflicts,
refusals, ``CommitUnconfirmed`` on timeout, a closing engine, a failing state store) is the thread
face's, word for word; a timed-out or cancelled write leaves no ticket behind. Real FileLog and
RocksDB under ``tmp_path``; the projector is held inside a step by a gate projection where a test
needs writes to wait.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest

from engine import HistoryEngine, aio
from engine.aio import AsyncHistoryEngine
from engine.log.base import Produced, record_key
from projections.custom import Projection, ProjectionTx
from projections.events import ProjectedEvent
from projections.store import Tx
from schemas.batch import Batch, Receipt
from schemas.errors import CommitUnconfirmed, EngineClosed, HistoryError
from schemas.ids import AppendID, ConversationID
from schemas.messages import Message
from schemas.positions import LogPosition

T = TypeVar("T")
_BOUND = 60.0  # every await of a test is bounded by this


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[HistoryEngine]:
    with HistoryEngine.open(tmp_path / "data", partitions=3) as e:
        yield e


def _batch(conv: str, aid: str, text: str = "hi") -> Batch:
    return Batch(conv, aid, [Message.user(f"{text} {aid}"), Message.assistant(f"re {aid}")])


def _run(main: Callable[[], Awaitable[T]], executor_threads: int = 4) -> T:
    """Run ``main`` on a fresh loop whose default executor has ``executor_threads`` threads."""
    async def bounded() -> T:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(executor_threads))
        return await asyncio.wait_for(main(), _BOUND)
    return asyncio.run(bounded())


async def _until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """A bounded wait on a condition (not a sleep as synchronisation)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.002)


def _tickets(engine: HistoryEngine) -> int:
    return engine._projector.deliveries.tickets


def _all_released(engine: HistoryEngine, timeout: float = 10.0) -> bool:
    """Whether every ticket is given back within a bounded wait: the blocker's writer thread
    releases its own once its wait returns, concurrently with the test's thread."""
    deadline = time.monotonic() + timeout
    while _tickets(engine):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


class _Gate(Projection):
    """A custom projection that holds the projector inside a step until released."""

    name = "gate"

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def apply(self, event: ProjectedEvent, tx: ProjectionTx) -> None:
        if event.conversation_id != "g":  # only the blocker's own append holds it (not a catch-up)
            return
        self.entered.set()
        assert self.release.wait(_BOUND)


def _held(engine: HistoryEngine) -> _Gate:
    """Hold the projector inside the step of a first append (the "blocker", on its own thread)."""
    gate = _Gate()
    engine.register(gate)
    threading.Thread(target=engine.append, args=(_batch("g", "block"),), daemon=True).start()
    assert gate.entered.wait(10)
    return gate


# -- no thread per waiter -----------------------------------------------------------------------
def test_a_thousand_appends_in_flight_at_once_hold_no_thread_on_a_file_log(engine: HistoryEngine) -> None:
    aengine = AsyncHistoryEngine(engine)
    for i in range(50):  # each conversation's data key exists (a first append creates it, on the pool)
        engine.append(_batch(f"c{i}", "first"))
    gate = _held(engine)
    base = threading.active_count()
    batches = [_batch(f"c{i % 50}", f"a{i}") for i in range(1000)]
    peak_threads = [0]

    async def main() -> list[Receipt]:
        tasks = [asyncio.create_task(aengine.append(b)) for b in batches]
        # All 1,000 are written and waiting for their decision, the projector held: each holds a
        # ticket, none a thread.
        def all_waiting() -> bool:
            peak_threads[0] = max(peak_threads[0], threading.active_count())
            return sum(engine.log.end_offsets()) == 1051 and _tickets(engine) == 1001
        await _until(all_waiting, 30)
        assert not any(t.done() for t in tasks)
        gate.release.set()
        receipts = await asyncio.gather(*tasks)
        peak_threads[0] = max(peak_threads[0], threading.active_count())
        return receipts

    receipts = _run(main, executor_threads=4)
    # The submits ran on the loop (FileLog's produce only enqueues): no pool, not one more thread.
    assert engine._writes._submitters is None
    assert peak_threads[0] <= base, (base, peak_threads[0])
    assert [(r.conversation_id, r.append_id) for r in receipts] == [(b.conversation_id, b.append_id) for b in batches]
    assert all(r.digest == b.digest for r, b in zip(receipts, batches, strict=True))
    assert len({r.position for r in receipts}) == 1000
    stored = {e.append_id for i in range(50) for e in engine.entries(f"c{i}")}
    assert stored == {b.append_id for b in batches} | {"first"}
    assert _all_released(engine)
    assert engine.stats().accepted == 1051 and engine.stats().corrupt == 0


# -- the same outcomes as the thread face ---------------------------------------------------------
def _script(engine: HistoryEngine, write: Callable[[str, tuple[Any, ...], dict[str, Any]], Any]) -> list[str]:
    """One sequence of writes covering every outcome; each result or error as text."""
    outcomes: list[str] = []

    def step(method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            result = write(method, args, kwargs)
        except HistoryError as e:
            outcomes.append(f"{type(e).__name__}: {e}")
            return None
        outcomes.append(repr(result))
        return result

    first = step("append", _batch("c", "a1"))
    step("append", _batch("c", "a1"))  # identical retry
    step("append", _batch("c", "a1", "other"))  # conflict
    step("append", _batch("c", "a2"), expected_last=Receipt(ConversationID("c"), AppendID("ghost"), first.digest,
                                                          LogPosition(0, 0)))
    step("append", _batch("c", "a2"), expected_last=first)
    step("append", _batch("c", "a1"), timeout=0)  # a known decision answers without I/O
    step("replace_turn", _batch("c", "r1"), "not-a-turn/0", "edit")
    latest = engine.latest_turn("c")
    assert latest is not None
    step("replace_turn", _batch("c", "r2", "again"), latest.id, "edit")
    step("replace_turn", _batch("c", "r3"), latest.id, "retry")  # no longer the latest
    step("clear", "c")
    step("clear", "c")  # idempotent
    step("append", _batch("c", "a9"))  # closed
    step("append", "not a batch")
    return outcomes


def test_every_outcome_is_the_thread_faces(tmp_path: Path) -> None:
    with HistoryEngine.open(tmp_path / "sync") as sync_engine:
        expected = _script(sync_engine, lambda m, a, k: getattr(sync_engine, m)(*a, **k))
    with HistoryEngine.open(tmp_path / "async") as engine:
        aengine = AsyncHistoryEngine(engine)
        loop = asyncio.new_event_loop()
        try:
            got = _script(engine, lambda m, a, k: loop.run_until_complete(
                asyncio.wait_for(getattr(aengine, m)(*a, **k), _BOUND)))
        finally:
            loop.close()
        assert _tickets(engine) == 0
    assert got == expected
    assert any("PreconditionFailed" in o for o in got) and any("TurnNotReplaceable" in o for o in got)
    assert any("AppendConflict" in o for o in got) and any("ConversationClosed" in o for o in got)


def test_a_decided_write_leaves_no_live_timer_on_the_loop(engine: HistoryEngine) -> None:
    """The wait's timeout is one timer on the loop, cancelled by the answer: a long timeout does
    not keep a handle per write alive (the loop drops cancelled ones)."""
    aengine = AsyncHistoryEngine(engine)

    async def main() -> list[asyncio.TimerHandle]:
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(aengine.append(_batch("c", f"t{i}"), timeout=3600) for i in range(20)))
        scheduled: list[asyncio.TimerHandle] = loop._scheduled  # type: ignore[attr-defined]
        return [h for h in scheduled if not h.cancelled() and h._callback is aio._expire]  # type: ignore[attr-defined]

    assert _run(main) == []
    assert _all_released(engine)


def test_a_timed_out_wait_is_commit_unconfirmed_and_leaves_no_ticket(engine: HistoryEngine) -> None:
    aengine = AsyncHistoryEngine(engine)
    gate = _held(engine)
    try:
        with pytest.raises(CommitUnconfirmed, match=r"was written at \d+:\d+ but not decided within 0.2s; resend"):
            _run(lambda: aengine.append(_batch("c", "slow"), timeout=0.2))
        assert engine._projector.deliveries._tickets.keys() == {record_key("g", "block")}
    finally:
        gate.release.set()
    assert _run(lambda: aengine.append(_batch("c", "slow"))).append_id == "slow"
    assert _all_released(engine)


def test_a_write_cancelled_while_it_waits_releases_its_ticket(engine: HistoryEngine) -> None:
    aengine = AsyncHistoryEngine(engine)
    gate = _held(engine)

    async def main() -> None:
        task = asyncio.create_task(aengine.append(_batch("c", "cancelled"), timeout=60))
        await _until(lambda: _tickets(engine) == 2 and sum(engine.log.end_offsets()) == 2)  # written, waiting
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert engine._projector.deliveries._tickets.keys() == {record_key("g", "block")}
        gate.release.set()
        assert await asyncio.to_thread(engine.catch_up, timeout=10)
        receipt = await aengine.append(_batch("c", "cancelled"))  # a resend learns the outcome
        assert receipt.append_id == "cancelled" and sum(engine.log.end_offsets()) == 2  # written once
        assert [e.append_id for e in engine.entries("c")] == ["cancelled"] * 2

    try:
        _run(main)
    finally:
        gate.release.set()
    assert _all_released(engine)


def test_a_write_cancelled_during_its_submit_releases_its_ticket_once_the_submit_ends(
        engine: HistoryEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A log whose produce may block (Kafka's send, on metadata or a full buffer): the submit runs
    on the pool, so the caller can be cancelled while it runs."""
    aengine = AsyncHistoryEngine(engine)
    real, entered, proceed = engine.log.produce, threading.Event(), threading.Event()

    def slow_produce(key: bytes, value: bytes, *, timeout: float = 30.0, lead: bool = False) -> Produced:
        entered.set()
        assert proceed.wait(_BOUND)
        return real(key, value, timeout=timeout, lead=lead)

    monkeypatch.setattr(engine.log, "produce", slow_produce)
    monkeypatch.setattr(engine.log, "produce_may_block", True)

    async def main() -> None:
        task = asyncio.create_task(aengine.append(_batch("c", "a1")))
        await _until(entered.is_set)
        assert _tickets(engine) == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        proceed.set()
        await _until(lambda: _tickets(engine) == 0)
        await _until(lambda: sum(engine.log.end_offsets()) == 1)  # produced, then written by the flusher

    _run(main)
    assert engine._writes._submitters is not None  # it ran on the pool
    assert engine.catch_up(timeout=10)
    receipt = engine.append(_batch("c", "a1"))
    assert receipt.position.offset == 0 and sum(engine.log.end_offsets()) == 1  # it was written once


def test_a_write_waiting_when_the_engine_closes_is_commit_unconfirmed(tmp_path: Path) -> None:
    engine = HistoryEngine.open(tmp_path / "data")
    aengine = AsyncHistoryEngine(engine)
    gate = _held(engine)
    closer = threading.Thread(target=engine.close)

    async def main() -> None:
        task = asyncio.create_task(aengine.append(_batch("c", "second"), timeout=60))
        await _until(lambda: engine.log.end_offsets() == [2])  # written after the held step began
        closer.start()
        await _until(lambda: engine._projector._stopping)
        gate.release.set()
        with pytest.raises(CommitUnconfirmed, match="append 'second' to 'c' was written at 0:1, but this engine "
                                                    "was closed before deciding it"):
            await task
        with pytest.raises(EngineClosed):
            await aengine.append(_batch("c", "third"))

    try:
        _run(main)
    finally:
        gate.release.set()
        closer.join(_BOUND)
    with HistoryEngine.open(tmp_path / "data") as reopened:
        assert reopened.append(_batch("c", "second")).position == LogPosition(0, 1)


def test_a_state_store_failure_while_waiting_is_commit_unconfirmed(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    with HistoryEngine.open(tmp_path / "data") as engine:
        aengine = AsyncHistoryEngine(engine)
        _run(lambda: aengine.append(_batch("c", "a")))

        def broken(self: Tx) -> None:
            raise OSError("disk on fire")

        monkeypatch.setattr(Tx, "commit", broken)
        with pytest.raises(CommitUnconfirmed, match="the state store failed before deciding it"):
            _run(lambda: aengine.append(_batch("c", "b")))
        assert _tickets(engine) == 0
        monkeypatch.undo()
