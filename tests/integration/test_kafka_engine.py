"""``HistoryEngine`` on a real Apache Kafka broker: the facade conformance suite, several
instances on one topic (threads and processes), replay into a fresh state, poison records,
broker restarts and the loss of one broker of three."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer

from engine import HistoryEngine
from engine.log.base import Produced, record_key
from schemas import (
    AppendConflict,
    Batch,
    CommitUnconfirmed,
    ConversationClosed,
    LogUnavailable,
    Message,
    Receipt,
)
from tests.conformance.backends import KafkaBackend, OnKafka
from tests.conformance.facade_contract import FacadeContract, ProjectionContract, snapshot, turn
from tests.erased_counts import assert_rebuilt_counts
from tests.kafka_broker import KafkaCluster, unique_topic

pytestmark = pytest.mark.kafka
REPO = Path(__file__).resolve().parents[2]
#: Longest a long-lived engine may take to append again once a restarted broker serves: a bound
#: of the reconnect backoff setting, generous for a loaded 2-core machine.
RESUME_BOUND_S = 10.0


class TestKafkaFacade(OnKafka, FacadeContract):
    pass


class TestKafkaFacadeThreePartitions(OnKafka, FacadeContract):
    partitions = 3


class TestKafkaProjections(OnKafka, ProjectionContract):
    partitions = 2


@pytest.fixture
def backend(kafka_bootstrap: str, kafka_topic: str, tmp_path: Path) -> KafkaBackend:
    return KafkaBackend(kafka_bootstrap, kafka_topic, tmp_path / "state-a", partitions=2)


@pytest.fixture
def instances(backend: KafkaBackend, tmp_path: Path) -> Iterator[list[HistoryEngine]]:
    engines = [backend.open(tmp_path / f"state-{i}") for i in range(3)]
    yield engines
    for e in engines:
        e.close()


# -- one wait per append ------------------------------------------------------------------------
def test_a_decision_that_comes_before_the_brokers_acknowledgement_is_answered(
        backend: KafkaBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer produces and waits only for its decision; its position comes from the broker's
    acknowledgement on kafka-python's I/O thread, which may come after the projector read and
    decided the record. Forced here: the real send is acknowledged, but the writer's handle is
    told only after the decision was published."""
    engine = backend.open(tmp_path / "late")
    real = engine.log.produce
    held: list[tuple[Produced, Produced]] = []

    def produce(key: bytes, value: bytes, headers: Any = (), *, timeout: float = 30.0,
                lead: bool = False) -> Produced:
        sent = real(key, value, headers, timeout=timeout, lead=lead)
        late = Produced(sent.partition)
        held.append((sent, late))
        return late

    monkeypatch.setattr(engine.log, "produce", produce)
    results: list[Any] = []
    try:
        writer = threading.Thread(target=lambda: results.append(engine.append(turn("late", "a1", "q"))))
        writer.start()
        deadline = time.monotonic() + 60
        while not (held and held[0][0].position is not None and engine.stats().accepted == 1):
            assert time.monotonic() < deadline, "the record was not acknowledged and decided in time"
            time.sleep(0.01)
        assert writer.is_alive() and not results  # decided, but the writer does not know its position yet
        sent, late = held[0]
        assert sent.position is not None
        threading.Thread(target=late.settle, args=(sent.position,)).start()
        writer.join(60)
        (receipt,) = results
        assert receipt.position == sent.position
        assert engine._projector.deliveries.tickets == 0
    finally:
        engine.close()


# -- several instances --------------------------------------------------------------------------
def test_instances_racing_the_same_append_ids_agree(instances: list[HistoryEngine]) -> None:
    rounds = 12
    results: dict[tuple[int, int], Any] = {}
    barrier = threading.Barrier(len(instances))

    def race(k: int, engine: HistoryEngine) -> None:
        for i in range(rounds):
            barrier.wait()
            b = Batch(f"conv-{i % 2}", f"shared-{i}", [Message.user(f"q{i} from instance {k}"),
                                                        Message.assistant("ok")])
            try:
                results[(k, i)] = engine.append(b)
            except AppendConflict as e:
                results[(k, i)] = e

    threads = [threading.Thread(target=race, args=(k, e)) for k, e in enumerate(instances)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(rounds):
        outcomes = [results[(k, i)] for k in range(len(instances))]
        receipts = {r for r in outcomes if isinstance(r, Receipt)}
        assert len(receipts) == 1, outcomes  # exactly one content won, every winner agrees
        receipt = receipts.pop()
        conflicts = [r for r in outcomes if isinstance(r, AppendConflict)]
        assert len(conflicts) == len(instances) - 1
        assert all(c.existing_digest == receipt.digest for c in conflicts)
        for engine in instances:  # read-your-writes on every instance
            history = engine.read(receipt.conversation_id, at_least=receipt)
            winners = [m.text() for m in history if m.text().startswith(f"q{i} ")]
            assert len(winners) == 1
            assert engine.append(Batch(receipt.conversation_id, receipt.append_id, history[
                [m.text() for m in history].index(winners[0]):][:2])) == receipt
    for engine in instances:
        engine.catch_up()
    snaps = [snapshot(e) for e in instances]
    assert snaps[0] == snaps[1] == snaps[2]


def test_separate_processes_racing_agree(backend: KafkaBackend, tmp_path: Path) -> None:
    with backend.open():
        pass  # create the topic once, so the processes do not race to create it
    count = 20
    procs = [subprocess.Popen(
        [sys.executable, "-m", "tests.integration.kafka_writer", backend.bootstrap, backend.topic,
         str(tmp_path / f"proc-{k}"), f"p{k}", str(count)],
        cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for k in range(2)]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        outputs = [p.communicate(timeout=180)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs)
    per_proc = [{r["append_id"]: r for r in map(json.loads, out.splitlines())} for out in outputs]
    with backend.open(tmp_path / "checker") as checker:
        for i in range(count):
            a, b = (per[f"shared-{i}"] for per in per_proc)
            won = [x for x in (a, b) if "receipt" in x]
            assert len(won) == 1 and len([x for x in (a, b) if "conflict" in x]) == 1, (a, b)
            receipt = Receipt.from_dict(won[0]["receipt"])
            lost = a if "conflict" in a else b
            assert lost["conflict"] == receipt.digest
            texts = [m.text() for m in checker.read(receipt.conversation_id, at_least=receipt)]
            assert len([t for t in texts if t.startswith(f"q{i} from")]) == 1


def test_a_fresh_state_dir_replays_identical_state(backend: KafkaBackend, tmp_path: Path) -> None:
    with backend.open() as first:
        receipts = [first.append(turn(f"c{i % 4}", f"a{i}", f"m{i}", tool=i % 3 == 0)) for i in range(24)]
        first.clear("c1")
        closed = turn("c1", "a1", "m1")
        before, stats = snapshot(first), first.stats()
    with backend.open(tmp_path / "fresh") as second:
        assert snapshot(second) == before
        s = second.stats()
        assert_rebuilt_counts(stats, s)
        assert (s.erased, s.corrupt) == (6, 0)  # c1's six sealed batches: their keys were destroyed
        with pytest.raises(ConversationClosed):
            second.append(closed)
        for r in receipts:
            if r.conversation_id != "c1":
                assert second.append(turn(r.conversation_id, r.append_id, f"m{r.append_id[1:]}",
                                          tool=int(r.append_id[1:]) % 3 == 0)) == r


def test_garbage_records_are_poison_on_every_instance(backend: KafkaBackend, tmp_path: Path) -> None:
    with backend.open() as a:
        a.append(turn("c", "a1", "before"))
        producer = KafkaProducer(bootstrap_servers=backend.bootstrap, acks="all")
        garbage = [b"", b"\xc3\x01" + b"\x00" * 8, b"not avro at all", b"\xc3\x01\xff" * 20]
        for i, value in enumerate(garbage):
            producer.send(backend.topic, key=record_key("c", f"g{i}"), value=value, partition=i % 2).get(30)
        producer.close()
        a.append(turn("c", "a2", "after"))
        b = backend.open(tmp_path / "other")
        try:
            for engine in (a, b):
                engine.catch_up()
                assert engine.stats().corrupt == len(garbage)
                assert [m.text() for m in engine.read("c")][::2] == ["before", "after"]
                assert len(engine.poison()) == len(garbage)
            assert a.poison() == b.poison()
        finally:
            b.close()


# -- broker faults ------------------------------------------------------------------------------
def _append_until_confirmed(engine: HistoryEngine, batch: Batch, attempts: int = 60,
                            failures: list[BaseException] | None = None) -> Receipt:
    """What a bot does when the log is down: resend the same Batch until it has a receipt."""
    for _ in range(attempts):
        try:
            return engine.append(batch, timeout=5)
        except (LogUnavailable, CommitUnconfirmed) as exc:
            if failures is not None:
                failures.append(exc)
            continue
    raise AssertionError(f"no receipt for {batch.append_id} after {attempts} attempts")


def _write_loop(engine: HistoryEngine, stop: threading.Event, receipts: list[Receipt], prefix: str,
                failures: list[BaseException] | None = None) -> None:
    i = 0
    while not stop.is_set():
        receipts.append(_append_until_confirmed(
            engine, Batch(f"conv-{i % 3}", f"{prefix}-{i}", [Message.user(f"q {prefix}-{i}"), Message.assistant("a")]),
            failures=failures))
        i += 1


def _check_receipts(engine: HistoryEngine, receipts: list[Receipt]) -> None:
    engine.catch_up()
    for conv in {r.conversation_id for r in receipts}:
        entries = engine.entries(conv)
        ids = [e.append_id for e in entries[0::2]]
        assert len(ids) == len(set(ids)), "a batch was stored twice"
    for r in receipts:
        assert f"q {r.append_id}" in [m.text() for m in engine.read(r.conversation_id, at_least=r)]


def _wait_for_receipts(receipts: list[Any], n: int, stop: threading.Event) -> None:
    """Bounded wait until ``receipts`` (or any list the write loop grows) has ``n`` items."""
    done = threading.Event()

    def watch() -> None:
        while len(receipts) < n and not stop.is_set():
            stop.wait(0.05)
        done.set()

    threading.Thread(target=watch, daemon=True).start()
    assert done.wait(120), "the write loop made no progress"


def test_broker_kill_9_and_restart_loses_and_duplicates_nothing(kafka_broker1: KafkaCluster,
                                                                  tmp_path: Path) -> None:
    topic = unique_topic("histlog-restart")
    engine = HistoryEngine.open(kafka=kafka_broker1.bootstrap, topic=topic, state_dir=tmp_path / "s")
    stop, receipts, failures = threading.Event(), [], []  # type: ignore[var-annotated]
    writer = threading.Thread(target=_write_loop, args=(engine, stop, receipts, "w", failures))
    writer.start()
    try:
        _wait_for_receipts(receipts, 20, stop)
        kafka_broker1.kill_node(1)
        with pytest.raises((LogUnavailable, CommitUnconfirmed)):
            engine.append(turn("down", "x", "while down"), timeout=3)
        # Keep the broker down while the writer fails a few 5 s attempts: long enough for the
        # clients' exponential reconnect backoff to reach its maximum.
        _wait_for_receipts(failures, 3, stop)
        before = len(receipts)
        kafka_broker1.start_node(1)  # returns once the broker serves
        ready = time.monotonic()
        _wait_for_receipts(receipts, before + 1, stop)
        resumed = time.monotonic() - ready
        print(f"appends resumed {resumed:.2f} s after the broker was ready "
              f"({len(failures)} failed attempts while it was down)")
        # A correctness bound of the reconnect backoff (reconnect_backoff_max_ms=1000 for the
        # producer and the projector's cursor), not a performance assertion: with kafka-python's
        # default 30 s maximum a long-lived engine resumed 10-32 s after the broker returned.
        assert resumed < RESUME_BOUND_S, f"appends resumed {resumed:.1f} s after the broker was ready"
        _wait_for_receipts(receipts, before + 20, stop)
    finally:
        stop.set()
        writer.join(timeout=300)
    try:
        _check_receipts(engine, receipts)
    finally:
        engine.close()
    with HistoryEngine.open(kafka=kafka_broker1.bootstrap, topic=topic, state_dir=tmp_path / "fresh") as fresh:
        _check_receipts(fresh, receipts)


@pytest.mark.slow
def test_losing_one_of_three_brokers_loses_nothing_acknowledged(kafka_cluster3: KafkaCluster,
                                                                 tmp_path: Path) -> None:
    topic = unique_topic("histlog-rf3")
    engine = HistoryEngine.open(kafka=kafka_cluster3.bootstrap, topic=topic, state_dir=tmp_path / "s",
                                partitions=3, replication_factor=3)
    stop, receipts = threading.Event(), []
    writers = [threading.Thread(target=_write_loop, args=(engine, stop, receipts, f"w{k}")) for k in range(4)]
    for w in writers:
        w.start()
    try:
        _wait_for_receipts(receipts, 40, stop)
        kafka_cluster3.kill_node(2)
        before = len(receipts)
        _wait_for_receipts(receipts, before + 60, stop)  # writes continue with 2 of 3 brokers
    finally:
        stop.set()
        for w in writers:
            w.join(timeout=300)
    try:
        _check_receipts(engine, receipts)
    finally:
        engine.close()
        kafka_cluster3.start_node(2)


def test_a_state_built_from_a_deleted_and_recreated_topic_is_refused(backend: KafkaBackend) -> None:
    from kafka import KafkaAdminClient

    from schemas import HistoryError

    with backend.open() as eng:
        eng.append(turn("c", "a1", "x"))
    admin = KafkaAdminClient(bootstrap_servers=backend.bootstrap)
    try:
        admin.delete_topics([backend.topic])
        deleted = threading.Event()
        for _ in range(300):  # bounded: deletion is asynchronous in KRaft
            if backend.topic not in admin.list_topics():
                deleted.set()
                break
            deleted.wait(0.1)
        assert deleted.is_set(), "the broker did not delete the topic"
    finally:
        admin.close()
    with pytest.raises(HistoryError, match="another log"):
        backend.open()  # the new topic starts at offset 0: the old state must not be trusted
