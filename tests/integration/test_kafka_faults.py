"""Kafka faults against a long-lived engine: a node of a 3-node cluster killed with ``kill -9`` and
restarted (defect 3 of issue 11: the shared reader consumer used to stay wedged for minutes), and
records too large for the topic (defect 9: refused before sending, with ``InvalidBatch``).

Every wait here is bounded and waits on a condition; each read answers within ``READ_BOUND_S``,
measured and printed (``pytest -s`` shows the numbers).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from kafka import KafkaAdminClient

from engine import HistoryEngine
from engine.log.kafka import KafkaLog
from engine.log.kafka_topic import CLIENT_TUNING
from projections.custom import Projection, ProjectionTx
from projections.events import ProjectedEvent
from schemas import Batch, InvalidBatch, Message
from tests.conformance.facade_contract import turn
from tests.kafka_broker import KafkaCluster, unique_topic

pytestmark = pytest.mark.kafka

T = TypeVar("T")

#: How long one read API call may take after the killed node is back (or while it is down): the
#: engine's request timeout (30 s). Before the fix, a reader that had not read while the node was
#: down raised LogUnavailable after 30 s, call after call, for minutes.
READ_BOUND_S = 30.0


def counter(label: str) -> Projection:
    """A new custom projection (a name of its own, so it replays from offset 0) counting events."""

    class Counter(Projection):
        name = f"count_{label}"

        def apply(self, event: ProjectedEvent, tx: ProjectionTx) -> None:
            tx.put(b"n", str(int(tx.get(b"n") or b"0") + 1).encode())

    return Counter()


def timed(what: str, fn: Callable[[], T], bound: float = READ_BOUND_S) -> T:
    """Call ``fn`` once; it must answer (not raise) within ``bound`` seconds. Prints the time."""
    t0 = time.monotonic()
    try:
        result = fn()
    except Exception as exc:
        raise AssertionError(f"{what} failed after {time.monotonic() - t0:.2f} s: {exc!r}") from exc
    took = time.monotonic() - t0
    print(f"  {what}: {took:.2f} s")
    assert took < bound, f"{what} took {took:.1f} s (bound {bound:g} s)"
    return result


def leaders(bootstrap: str, topic: str) -> dict[int, int]:
    """partition -> leader node id (scripts/kafka's node ids are 1-based, like kill_node's)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15_000,
                             bootstrap_timeout_ms=15_000)
    try:
        [info] = admin.describe_topics([topic])
    finally:
        admin.close()
    return {int(p["partition_index"]): int(p["leader_id"]) for p in info["partitions"]}


@pytest.fixture
def engine3(kafka_cluster3: KafkaCluster, tmp_path: Path, request: pytest.FixtureRequest,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[HistoryEngine, str]]:
    metadata_max_age_ms = getattr(request, "param", None)
    if metadata_max_age_ms is not None:  # e.g. kafka-python's default: only the reader's
        monkeypatch.setitem(CLIENT_TUNING, "metadata_max_age_ms", metadata_max_age_ms)  # recreation helps
    topic = unique_topic("histlog-faults")
    engine = HistoryEngine.open(kafka=kafka_cluster3.bootstrap, topic=topic, state_dir=tmp_path / "s",
                                partitions=3, replication_factor=3)
    try:
        yield engine, topic
    finally:
        engine.close()
        for node in sorted(kafka_cluster3.stopped):  # leave the module's cluster whole
            kafka_cluster3.start_node(node)


def check_every_read(engine: HistoryEngine, expected: dict[str, list[str]], label: str) -> None:
    """Every read API of the engine and of its log answers, with the expected history."""
    print(f"{label}:")
    klog = engine._log
    assert isinstance(klog, KafkaLog)
    ends = timed("log.end_offsets", klog.end_offsets)
    assert sum(ends) >= sum(len(v) for v in expected.values())
    stats = timed("stats", engine.stats)
    assert stats.accepted >= sum(len(v) for v in expected.values())
    assert timed("catch_up", lambda: engine.catch_up(timeout=READ_BOUND_S)) is True
    for conv, texts in expected.items():
        got = timed(f"read {conv}", lambda c=conv: engine.read(c))  # type: ignore[misc]
        assert [m.text() for m in got][::2] == texts
        assert len(timed(f"entries {conv}", lambda c=conv: engine.entries(c))) == 2 * len(texts)  # type: ignore[misc]
    for p, end in enumerate(ends):
        records = timed(f"log.read p{p}", lambda p=p: klog.read(p, 0))  # type: ignore[misc]
        assert len(records) == end
    projection = counter(label.replace(" ", "_"))
    timed("register", lambda: engine.register(projection))
    counts = engine.view(projection.name).rows(b"n")  # a count per partition (its state is per partition)
    assert sum(int(v) for v in counts.values()) == sum(map(len, expected.values()))


@pytest.mark.slow
@pytest.mark.parametrize(("victim", "read_while_down", "engine3"),
                         [("leader", False, None), ("follower", False, None), ("leader", True, None),
                          ("leader", False, 300_000)],
                         ids=["leader", "follower", "leader-read-while-down", "leader-stale-metadata"],
                         indirect=["engine3"])
def test_reads_answer_after_a_node_is_killed_and_restarted(
        kafka_cluster3: KafkaCluster, engine3: tuple[HistoryEngine, str], victim: str,
        read_while_down: bool) -> None:
    engine, topic = engine3
    expected: dict[str, list[str]] = {f"c{i}": [] for i in range(6)}
    for i in range(18):
        conv = f"c{i % 6}"
        engine.append(turn(conv, f"a{i}", f"m{i}"))
        expected[conv].append(f"m{i}")
    check_every_read(engine, expected, "before")  # the reader is connected to every node now
    lead = leaders(kafka_cluster3.bootstrap, topic)
    node = lead[0] if victim == "leader" else next(n for n in (1, 2, 3) if n != lead[0])
    print(f"leaders {lead}; killing node {node} ({victim} of partition 0)")
    kafka_cluster3.kill_node(node)
    engine.append(turn("c0", "down", "while down"), timeout=READ_BOUND_S)  # 2 of 3 take writes
    expected["c0"].append("while down")
    if read_while_down:
        check_every_read(engine, expected, "node down")
    t0 = time.monotonic()
    kafka_cluster3.start_node(node)
    print(f"node {node} restarted in {time.monotonic() - t0:.1f} s")
    check_every_read(engine, expected, "restarted")
    engine.append(turn("c1", "back", "after restart"), timeout=READ_BOUND_S)
    expected["c1"].append("after restart")
    check_every_read(engine, expected, "after append")


# ---------------------------------------------------------------- records too large


def test_a_batch_larger_than_the_topic_takes_is_refused_before_sending(
        kafka_bootstrap: str, kafka_topic: str, tmp_path: Path) -> None:
    with HistoryEngine.open(kafka=kafka_bootstrap, topic=kafka_topic, state_dir=tmp_path / "s") as engine:
        engine.append(turn("c", "a1", "small"))
        ends = engine._log.end_offsets()
        big = Batch("c", "big", [Message.user("x" * (9 * 1024 * 1024)), Message.assistant("ok")])
        with pytest.raises(InvalidBatch, match=r"the encoded event is \d+ bytes; this topic takes "
                                               r"at most \d+; split the batch"):
            engine.append(big)
        assert engine._log.end_offsets() == ends  # nothing was written
        engine.append(turn("c", "a2", "after"))  # the engine still works
        assert [m.text() for m in engine.read("c")][::2] == ["small", "after"]
