"""One wait per write (issue 15): a writer produces its record without waiting for it and waits
only for its decision; the log's failure of the write answers that wait at once.

* A FileLog flush that fail-stops answers every writer waiting for a decision (threads and
  event-loop writes alike) with ``LogUnavailable`` at once, never by their timeouts (the same
  injected I/O error as the FileLog fail-stop tests: ``os.fsync`` raising EIO).
* A decision that arrives before the writer knows its position (Kafka: the broker's
  acknowledgement comes on the client's I/O thread, possibly after the projector applied the
  record) is kept and answered once the position is known; a send that fails answers at once.
  The Kafka-shaped cases here use a ``MemoryLog`` whose acknowledgements the test releases; the
  real broker case is in ``tests/integration/test_kafka_engine.py``.

Real FileLog and RocksDB under ``tmp_path`` except where a memory log is named.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from engine import HistoryEngine
from engine.aio import AsyncHistoryEngine
from engine.log.base import Produced, record_key
from engine.log.file import FileLog
from engine.log.memory import MemoryLog
from engine.state import open_state
from projections.admission import Decision, Outcome
from projections.delivery import Deliveries
from schemas.batch import Batch
from schemas.errors import LogUnavailable
from schemas.messages import Message
from schemas.positions import LogPosition

_BOUND = 30.0  # every wait of a test is bounded by this; the writers' own timeout is far longer
_WRITER_TIMEOUT = 600.0


def _batch(conv: str, aid: str) -> Batch:
    return Batch(conv, aid, [Message.user(f"hi {aid}")])


def _until(condition: Callable[[], bool], timeout: float = _BOUND) -> bool:
    """A bounded wait on a condition (not a sleep as synchronisation)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


class _HeldFsync:
    """``os.fsync`` that holds the first data fsync until released, then raises EIO (once)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self._real = os.fsync
        self._failed = False

    def __call__(self, fd: int) -> None:
        if not self._failed:
            self._failed = True
            self.entered.set()
            assert self.release.wait(_BOUND)
            raise OSError(5, "Input/output error")
        self._real(fd)


# -- FileLog: a fail-stop answers every waiting writer at once ----------------------------------
def test_a_failed_flush_answers_every_writer_waiting_for_a_decision_with_log_unavailable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = HistoryEngine.open(tmp_path / "data", partitions=2)
    aengine = AsyncHistoryEngine(engine)
    for name in [f"thread-{i}" for i in range(8)] + [f"async-{i}" for i in range(8)]:
        # Each conversation's data key exists before the fsync is held: the key store fsyncs a
        # new key, and the fsync under test is the log's.
        engine.append(_batch(f"c-{name}", "first"))
    fsync = _HeldFsync()
    monkeypatch.setattr(os, "fsync", fsync)
    outcomes: dict[str, BaseException | object] = {}

    def thread_writer(name: str) -> None:
        try:
            outcomes[name] = engine.append(_batch(f"c-{name}", name), timeout=_WRITER_TIMEOUT)
        except BaseException as e:
            outcomes[name] = e

    async def loop_writers() -> None:
        async def one(name: str) -> None:
            try:
                outcomes[name] = await aengine.append(_batch(f"c-{name}", name), timeout=_WRITER_TIMEOUT)
            except BaseException as e:
                outcomes[name] = e
        await asyncio.wait_for(asyncio.gather(*(one(f"async-{i}") for i in range(8))), _BOUND)

    threads = [threading.Thread(target=thread_writer, args=(f"thread-{i}",)) for i in range(8)]
    threads.append(threading.Thread(target=asyncio.run, args=(loop_writers(),)))
    try:
        for thread in threads:
            thread.start()
        # Every record is queued (one in the held flush, the rest waiting behind it), every
        # writer waits for its decision.
        assert fsync.entered.wait(_BOUND)
        assert _until(lambda: engine.log.stats().appends == 32)  # 16 first appends, then these 16
        assert engine._projector.deliveries.tickets == 16
        fsync.release.set()
        for thread in threads:
            thread.join(_BOUND)  # far below the writers' timeout: answered by the fail-stop
            assert not thread.is_alive()
    finally:
        fsync.release.set()
    assert len(outcomes) == 16
    for name, outcome in outcomes.items():
        assert isinstance(outcome, LogUnavailable), (name, outcome)
        assert "fail-stopped after an I/O error" in str(outcome)
    assert engine._projector.deliveries.tickets == 0
    with pytest.raises(LogUnavailable, match="fail-stopped"):  # and later writes are refused before I/O
        engine.append(_batch("c", "later"))
    engine.close()
    monkeypatch.undo()
    with HistoryEngine.open(tmp_path / "data") as reopened:  # recovery decides from the bytes on disk
        assert reopened.stats().corrupt == 0


def test_produced_records_not_yet_written_get_the_fail_stop_error_on_their_handles(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = FileLog(tmp_path, 1)
    fsync = _HeldFsync()
    monkeypatch.setattr(os, "fsync", fsync)
    told: list[Produced] = []
    first = log.produce(record_key("c", "0"), b"in the failing flush")
    first.notify(told.append)
    assert fsync.entered.wait(_BOUND)
    later = [log.produce(record_key("c", str(i)), b"queued behind it") for i in range(1, 4)]
    for produced in later:
        produced.notify(told.append)
    assert [p.position for p in [first, *later]] == [LogPosition(0, i) for i in range(4)]  # known at enqueue
    assert told == [] and first.error is None  # nothing settled while the flush runs
    fsync.release.set()
    assert _until(lambda: len(told) == 4)
    assert all(isinstance(p.error, LogUnavailable) for p in [first, *later])
    assert log.end_offsets() == [0]  # none of them became visible
    late: list[Produced] = []
    first.notify(late.append)  # a callback after the fact runs at once
    assert late == [first]
    with pytest.raises(LogUnavailable, match="fail-stopped"):
        log.produce(record_key("c", "x"), b"refused")
    log.close()


def test_a_file_log_position_is_known_at_produce_and_the_record_visible_once_flushed(tmp_path: Path) -> None:
    with FileLog(tmp_path, 2) as log:
        produced = [log.produce(record_key(f"c{i}", "a"), f"v{i}".encode()) for i in range(20)]
        assert all(p.position is not None and p.error is None for p in produced)
        assert _until(lambda: sum(log.end_offsets()) == 20)
        for p in produced:
            assert p.position is not None
            (record,) = log.read(p.position.partition, p.position.offset, 1)
            assert record.key == record_key(f"c{produced.index(p)}", "a")


def test_produce_never_writes_on_the_callers_thread_unless_it_may_lead(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An event loop's produce (``lead=False``) only enqueues: the flusher fsyncs; a thread that
    waits for its record anyway (``lead=True``) fsyncs itself when no group commit runs."""
    real = os.fsync
    fsyncs: list[str] = []

    def recording_fsync(fd: int) -> None:
        fsyncs.append(threading.current_thread().name)
        real(fd)

    with FileLog(tmp_path, 1) as log:
        monkeypatch.setattr(os, "fsync", recording_fsync)
        log.produce(record_key("c", "0"), b"by the flusher")
        assert _until(lambda: log.end_offsets() == [1] and log._idle)  # written; the flusher waits for work
        log.produce(record_key("c", "1"), b"still by the flusher", lead=False)
        assert _until(lambda: log.end_offsets() == [2] and log._idle)
        assert fsyncs == ["filelog-flush", "filelog-flush"]
        log.produce(record_key("c", "2"), b"by this thread", lead=True)
        assert log.end_offsets() == [3]  # visible on return: this thread wrote it
        assert fsyncs[2:] == [threading.current_thread().name]


# -- a decision before the position (Kafka-shaped) ----------------------------------------------
def _decision(position: LogPosition) -> Decision:
    return Decision(Outcome.ACCEPTED, "d", position)


def test_a_ticket_keeps_a_decision_that_arrives_before_its_position() -> None:
    deliveries = Deliveries()
    key = record_key("c", "a")
    ticket = deliveries.take(key)
    produced = Produced(0)  # a Kafka send not yet acknowledged
    ticket.follow(produced)
    position = LogPosition(0, 7)
    deliveries.publish([(LogPosition(0, 6), key, _decision(LogPosition(0, 6))),  # another record, same key
                        (position, key, _decision(position))], [])
    assert ticket.position is None and ticket.wait(None, 0) is None  # decided, but whose is unknown yet
    acknowledge = threading.Thread(target=produced.settle, args=(position,))  # the client's I/O thread
    acknowledge.start()
    decision = ticket.wait(None, _BOUND)
    acknowledge.join(_BOUND)
    assert decision is not None and decision.receipt_position == position
    assert ticket.position == position
    ticket.release()
    assert deliveries.tickets == 0


def test_a_watched_ticket_gets_a_decision_that_arrived_before_its_position() -> None:
    deliveries = Deliveries()
    key = record_key("c", "a")
    position = LogPosition(1, 3)

    async def main() -> Decision | None:
        ticket = deliveries.take(key)
        produced = Produced(1)
        ticket.follow(produced)
        future = ticket.watch()
        deliveries.publish([(position, key, _decision(position))], [])
        await asyncio.sleep(0)
        assert not future.done()
        threading.Thread(target=produced.settle, args=(position,)).start()
        try:
            return await asyncio.wait_for(future, _BOUND)
        finally:
            ticket.release()

    decision = asyncio.run(main())
    assert decision is not None and decision.receipt_position == position


def test_a_send_that_fails_answers_its_ticket_at_once_with_the_log_error() -> None:
    deliveries = Deliveries()
    ticket = deliveries.take(record_key("c", "a"))
    produced = Produced(0)
    ticket.follow(produced)
    error = LogUnavailable("append to partition 0: no answer from the broker within 30 s")
    threading.Thread(target=produced.settle, kwargs={"error": error}).start()
    with pytest.raises(LogUnavailable, match="no answer from the broker"):
        ticket.wait(None, _BOUND)
    ticket.release()


class _LateAcks(MemoryLog):
    """A memory log whose acknowledgements (positions) come only when the test releases them,
    like Kafka's on the client's I/O thread: the record is readable (and decided) before."""

    produce_may_block = True  # as Kafka's: the asyncio face submits on its pool

    def __init__(self) -> None:
        super().__init__(1)
        self.unacknowledged: list[tuple[Produced, LogPosition]] = []

    def produce(self, key: bytes, value: bytes, headers: Sequence[tuple[str, bytes]] = (),
                *, timeout: float = 30.0, lead: bool = False) -> Produced:
        stored = super().produce(key, value, headers)
        assert stored.position is not None
        late = Produced(stored.partition)
        self.unacknowledged.append((late, stored.position))
        return late

    def acknowledge(self) -> None:
        pending, self.unacknowledged = self.unacknowledged, []
        for produced, position in pending:
            produced.settle(position)


def _late_engine(tmp_path: Path) -> tuple[HistoryEngine, _LateAcks]:
    log = _LateAcks()
    log_, store = open_state(tmp_path / "state", lambda _e: log, lambda _l: {"backend": "memory", "partitions": 1},
                             durable=True)
    return HistoryEngine(log_, store), log


def test_a_writer_whose_decision_comes_before_its_acknowledgement_gets_it(tmp_path: Path) -> None:
    engine, log = _late_engine(tmp_path)
    with engine:
        results: list[object] = []
        writer = threading.Thread(target=lambda: results.append(engine.append(_batch("c", "a1"))))
        writer.start()
        assert _until(lambda: len(log.unacknowledged) == 1)
        assert engine.catch_up(timeout=_BOUND)  # decided and published: the writer cannot know it is its own
        assert engine.stats().accepted == 1 and writer.is_alive()
        log.acknowledge()
        writer.join(_BOUND)
        (receipt,) = results
        assert getattr(receipt, "position", None) == LogPosition(0, 0)
        assert engine._projector.deliveries.tickets == 0


def test_an_unacknowledged_write_is_log_unavailable_at_its_timeout(tmp_path: Path) -> None:
    """The blocking append raised ``LogUnavailable`` when the broker did not acknowledge in time;
    the one wait keeps that answer (the record may still be written: resend)."""
    engine, log = _late_engine(tmp_path)
    with engine:
        with pytest.raises(LogUnavailable, match=r"not acknowledge it within 0.2s; its outcome is unknown"):
            engine.append(_batch("c", "a1"), timeout=0.2)
        log.acknowledge()
        assert engine.catch_up(timeout=_BOUND)
        assert engine.append(_batch("c", "a1")).position == LogPosition(0, 0)  # the resend learns it
