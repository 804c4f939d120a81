"""``HistoryEngine.subscribe``: the accepted events, fed by the projector after each committed
step (issue 12, item 1: what ``tail --follow`` and the service's event stream use).

In log order per partition, from the first step after subscribing; the same objects custom
projections get; a bounded buffer that never makes the projector wait (an overflow loses the
subscription, which says so after its buffered events); ``close()`` and the engine's close end
the iteration. Real FileLog and RocksDB under ``tmp_path``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import HistoryEngine
from projections.custom import Projection, ProjectionTx
from projections.delivery import Subscription
from projections.events import BatchEvent, ClearEvent, ProjectedEvent, TurnReplacedEvent
from schemas.batch import Batch, Receipt
from schemas.errors import (
    AppendConflict,
    CommitUnconfirmed,
    HistoryError,
    InvalidConfiguration,
    PreconditionFailed,
    StateUnavailable,
    SubscriptionLost,
)
from schemas.ids import AppendID, ConversationID
from schemas.messages import Message


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[HistoryEngine]:
    with HistoryEngine.open(tmp_path / "data", partitions=3) as e:
        yield e


def _turn(conv: str, aid: str, text: str = "hello") -> Batch:
    return Batch(conv, aid, [Message.user(f"{text} {aid}"), Message.assistant(f"answer to {aid}")])


def _take(subscription: Subscription, n: int) -> list[ProjectedEvent]:
    out: list[ProjectedEvent] = []
    for _ in range(n):
        event = subscription.get(timeout=10)
        assert event is not None, f"only {len(out)} of {n} events arrived"
        out.append(event)
    return out


def test_events_arrive_in_log_order_per_partition_with_what_follow_prints(engine: HistoryEngine) -> None:
    with engine.subscribe() as events:
        receipts = [engine.append(_turn(f"c{i % 6}", f"a{i}")) for i in range(30)]
        edited = engine.replace_turn(_turn("c0", "e1", "edited"), "a24/0", "edit")
        engine.clear("c5")
        got = _take(events, 32)
    batches = [e for e in got if isinstance(e, BatchEvent)]
    assert [b.append_id for b in batches] == [f"a{i}" for i in range(30)]
    assert [b.position for b in batches] == [r.position for r in receipts]
    by_partition: dict[int, list[int]] = {}
    for e in got:
        by_partition.setdefault(e.position.partition, []).append(e.position.offset)
    assert all(offsets == sorted(set(offsets)) for offsets in by_partition.values()) and len(by_partition) > 1
    replaced = got[30]
    assert isinstance(replaced, TurnReplacedEvent) and replaced.position == edited.position
    assert replaced.old_turn_id == "a24/0" and replaced.reason == "edit"
    assert isinstance(got[31], ClearEvent) and got[31].conversation_id == "c5"
    # Each event carries the positions ``entries`` reports: enough to print tail --follow's lines.
    for event in (*batches[:6], replaced):
        assert isinstance(event, BatchEvent | TurnReplacedEvent)
        if event.conversation_id == "c5":
            continue  # cleared since
        stored = [e for e in engine.entries(event.conversation_id) if e.append_id == event.append_id]
        assert [e.position for e in stored] == list(event.positions)
        assert [e.message for e in stored] == list(event.messages)


def test_only_accepted_events_applied_after_subscribing_arrive(engine: HistoryEngine) -> None:
    first = engine.append(_turn("c", "before"))
    with engine.subscribe() as events:
        assert events.start == engine.stats().applied_offsets
        assert events.get(timeout=0) is None
        engine.append(_turn("c", "before"))  # a duplicate: no new record, nothing delivered
        with pytest.raises(AppendConflict):
            engine.append(_turn("c", "before", "other content"))
        with pytest.raises(PreconditionFailed):  # decided by the projector: a record, not an event
            engine.append(_turn("c", "stale"),
                          expected_last=Receipt(ConversationID("c"), AppendID("ghost"), first.digest, first.position))
        engine.append(_turn("c", "after"))
        (event,) = _take(events, 1)
        assert isinstance(event, BatchEvent) and event.append_id == "after"
        assert events.get(timeout=0) is None


def test_the_events_are_the_objects_custom_projections_get(engine: HistoryEngine) -> None:
    seen: list[ProjectedEvent] = []

    class Recorder(Projection):
        name = "recorder"

        def apply(self, event: ProjectedEvent, tx: ProjectionTx) -> None:
            seen.append(event)

    engine.register(Recorder())
    with engine.subscribe() as events:
        engine.append(_turn("c", "a"))
        engine.clear("c")
        got = _take(events, 2)
    assert len(seen) == 2 and all(a is b for a, b in zip(got, seen, strict=True))


def test_a_full_buffer_loses_the_subscription_after_the_buffered_events(engine: HistoryEngine) -> None:
    with engine.subscribe(buffer=3) as events:
        receipts = [engine.append(_turn("c", f"a{i}")) for i in range(5)]
        assert [e.position for e in _take(events, 3)] == [r.position for r in receipts[:3]]
        with pytest.raises(SubscriptionLost, match=r"fell more than 3 events behind.*subscribe again, then re-read"
                           ) as lost:
            events.get(timeout=10)
        assert lost.value.position == receipts[3].position
        with pytest.raises(SubscriptionLost):  # it stays lost
            next(events)
        assert isinstance(lost.value, HistoryError)


def test_a_stuck_consumer_never_stalls_the_projector(engine: HistoryEngine) -> None:
    stuck, healthy = engine.subscribe(buffer=2), engine.subscribe(buffer=1000)
    unblock, took_one = threading.Event(), threading.Event()
    outcome: list[object] = []

    def consume() -> None:
        try:
            for event in stuck:
                outcome.append(event)
                took_one.set()
                assert unblock.wait(60)  # the consumer is stuck in its own work
        except SubscriptionLost as e:
            outcome.append(e)

    consumer = threading.Thread(target=consume)
    consumer.start()
    try:
        engine.append(_turn("c", "first"))
        assert took_one.wait(10)
        receipts = [engine.append(_turn(f"c{i % 3}", f"a{i}"), timeout=10) for i in range(60)]  # never blocks
        assert engine.catch_up(timeout=10)
        assert [e.position for e in _take(healthy, 61)[1:]] == [r.position for r in receipts]
    finally:
        unblock.set()
        consumer.join(timeout=30)
    # The stuck one got the event it was working on, then its buffer (2), then the loss.
    assert len(outcome) == 4 and isinstance(outcome[-1], SubscriptionLost)
    healthy.close()


def test_close_ends_an_iteration_in_another_thread(engine: HistoryEngine) -> None:
    events = engine.subscribe()
    got: list[ProjectedEvent] = []
    arrived = threading.Event()

    def consume() -> None:
        for event in events:
            got.append(event)
            arrived.set()

    consumer = threading.Thread(target=consume)
    consumer.start()
    engine.append(_turn("c", "a"))
    assert arrived.wait(10)
    events.close()
    consumer.join(timeout=10)
    assert not consumer.is_alive() and len(got) == 1 and events.done
    engine.append(_turn("c", "b"))  # nothing is delivered to a closed subscription
    assert events.get(timeout=0) is None and len(got) == 1
    assert engine._projector.deliveries._subscriptions == []  # the next step forgot it


def test_closing_the_engine_ends_iterators_after_their_buffered_events(tmp_path: Path) -> None:
    engine = HistoryEngine.open(tmp_path / "data")
    events = engine.subscribe()
    blocked = engine.subscribe()
    ended = threading.Event()

    def wait_for_more() -> None:
        assert list(blocked)[-1].append_id == "b"  # type: ignore[union-attr]
        ended.set()

    waiter = threading.Thread(target=wait_for_more)
    waiter.start()
    engine.append(_turn("c", "a"))
    engine.append(_turn("c", "b"))
    engine.close()
    assert ended.wait(10)  # the blocked iteration ended with the close
    waiter.join(timeout=10)
    assert [e.append_id for e in events if isinstance(e, BatchEvent)] == ["a", "b"]
    assert events.done
    with pytest.raises(HistoryError, match="closed"):
        engine.subscribe()


@pytest.mark.parametrize("bad", [0, -1, True, "10", 2.5, None])
def test_a_bad_buffer_is_refused(engine: HistoryEngine, bad: object) -> None:
    with pytest.raises(InvalidConfiguration, match=r"invalid subscription buffer .*expected an int >= 1"):
        engine.subscribe(buffer=bad)  # type: ignore[arg-type]
    assert engine._projector.deliveries._subscriptions == []


def test_a_projector_failure_is_raised_after_the_buffered_events(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from projections.store import Tx

    with HistoryEngine.open(tmp_path / "data") as engine:
        events = engine.subscribe()
        engine.append(_turn("c", "a"))

        def broken(self: Tx) -> None:
            raise OSError("disk on fire")

        monkeypatch.setattr(Tx, "commit", broken)
        with pytest.raises(CommitUnconfirmed, match="the state store failed before deciding it"):
            engine.append(_turn("c", "b"))
        (first,) = _take(events, 1)
        assert isinstance(first, BatchEvent) and first.append_id == "a"
        with pytest.raises(StateUnavailable, match="projector stopped"):
            next(events)
        monkeypatch.undo()
