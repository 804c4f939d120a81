"""Runs and fences on a real Apache Kafka broker: two instances on one topic, the second taking
the conversation over with ``begin_run`` while the first run's appends are in flight. Admission
in log order decides: what the first run wrote before the second run began is kept, everything
after is ``Fenced`` on every instance, and a fresh instance replaying the topic agrees. (The
contract itself runs on Kafka with ``TestKafkaReads``.)"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from engine import HistoryEngine
from schemas import Batch, Fenced, Message, Receipt
from schemas.events import BatchAppended, encode_event
from schemas.records import record_key
from tests.conformance.backends import KafkaBackend

pytestmark = pytest.mark.kafka
WRITERS = 3
PER_WRITER = 40


@pytest.fixture
def backend(kafka_bootstrap: str, kafka_topic: str, tmp_path: Path) -> KafkaBackend:
    return KafkaBackend(kafka_bootstrap, kafka_topic, tmp_path / "state-0", partitions=2)


@pytest.fixture
def pair(backend: KafkaBackend, tmp_path: Path) -> Iterator[list[HistoryEngine]]:
    engines = [backend.open(tmp_path / f"state-{i}") for i in range(2)]
    yield engines
    for e in engines:
        e.close()


def test_a_run_that_lost_the_conversation_writes_nothing_after_its_successor_began(
        pair: list[HistoryEngine], backend: KafkaBackend, tmp_path: Path) -> None:
    a, b = pair
    conv = "takeover"
    old = a.begin_run(conv, "run-a")
    assert old.epoch == 1
    began = threading.Event()  # set once B's begin_run has returned
    halfway = threading.Barrier(WRITERS + 1)
    outcomes: list[list[tuple[bool, Receipt | Fenced]]] = [[] for _ in range(WRITERS)]

    def write(k: int) -> None:
        for i in range(PER_WRITER):
            if i == PER_WRITER // 4:
                halfway.wait(timeout=30)  # B takes over while every writer has appends still to send
            after = began.is_set()  # B's RunBegun is in the log before this append's record
            try:
                got: Receipt | Fenced = a.append(Batch(conv, f"w{k}-{i}", [Message.user(f"{k}:{i}")]), fence=old)
            except Fenced as e:
                got = e
            outcomes[k].append((after, got))

    with ThreadPoolExecutor(WRITERS) as pool:
        jobs = [pool.submit(write, k) for k in range(WRITERS)]
        halfway.wait(timeout=30)
        new = b.begin_run(conv, "run-b")
        began.set()
        for job in jobs:
            job.result(timeout=120)
    assert new.epoch == 2
    # A record of the old run sent after the takeover, straight to the log (no pre-check): fenced there.
    late = BatchAppended.of(Batch(conv, "late", [Message.user("late")]), 1_767_225_600_000, None, old)
    b.wait_applied(a.log.append(record_key(conv, "late"), encode_event(late)), timeout=30)

    for k, results in enumerate(outcomes):
        refused = [isinstance(got, Fenced) for _, got in results]
        assert all(isinstance(got, Fenced) for after, got in results if after), k  # all after the takeover
        assert refused == sorted(refused), k  # each writer's appends: accepted, then only refused
        assert not refused[0], k  # its first quarter was written before the takeover began
    kept = sorted(str(got.append_id) for results in outcomes for _, got in results if isinstance(got, Receipt))
    receipt = b.append(Batch(conv, "from-b", [Message.assistant("the new run writes")]), fence=new)
    for e in pair:
        e.read(conv, at_least=receipt)
    with backend.open(tmp_path / "fresh") as fresh:
        fresh.read(conv, at_least=receipt)
        for e in (a, b, fresh):
            assert sorted(str(m.append_id) for m in e.entries(conv) if m.append_id != "from-b") == kept
            assert [m.append_id for m in e.entries(conv)][-1] == "from-b"
        counts = {(e.stats().fenced, e.stats().accepted) for e in (a, b, fresh)}
        assert len(counts) == 1, counts  # every instance decided the same records the same way
        fenced, _ = counts.pop()
        assert fenced >= 1  # at least the late record was refused in log order
