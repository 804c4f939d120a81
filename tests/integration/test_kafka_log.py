"""``KafkaLog`` against a real Apache Kafka broker: the shared ``LogContract`` plus Kafka specifics."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from engine.log.base import Log, Record, partition_for_key, record_key
from engine.log.kafka import KafkaLog
from schemas.errors import LogUnavailable
from tests.conformance.backends import KafkaLogs, delete_topics, kafka_logs_made
from tests.conformance.log_contract import LogContract, MakeLog

pytestmark = pytest.mark.kafka


@pytest.fixture
def kafka_logs(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[MakeLog]:
    with kafka_logs_made(kafka_bootstrap, request.node.name) as make_log:
        yield make_log


class TestKafkaLogContract(KafkaLogs, LogContract):
    pass


def _read_all(log: Log, partition: int, start: int = 0) -> list[Record]:
    out: list[Record] = []
    offset = start
    while batch := log.read(partition, offset, 500):
        out.extend(batch)
        offset = batch[-1].offset + 1
    return out


def test_position_is_what_the_broker_assigned(kafka_logs: MakeLog) -> None:
    log = kafka_logs(3)
    key = record_key("conversation-x", "a1")
    pos = log.append(key, b"payload", (("h", b"1"),))
    assert pos.partition == partition_for_key(key, 3)
    assert log.end_offsets()[pos.partition] == pos.offset + 1
    [rec] = log.read(pos.partition, pos.offset, 10)
    assert (rec.key, rec.value, rec.headers) == (key, b"payload", (("h", b"1"),))


def test_reopening_an_existing_topic_sees_its_records(kafka_bootstrap: str, kafka_topic: str) -> None:
    with KafkaLog(kafka_bootstrap, kafka_topic, partitions=2) as first:
        positions = [first.append(record_key(f"c{i}", "a"), f"v{i}".encode()) for i in range(10)]
    with KafkaLog(kafka_bootstrap, kafka_topic, partitions=2, create=False) as again:
        assert again.partitions == 2
        got = {r.position: r.value for p in range(2) for r in _read_all(again, p)}
        assert got == {pos: f"v{i}".encode() for i, pos in enumerate(positions)}
    with KafkaLog(kafka_bootstrap, kafka_topic, partitions=None) as adopted:
        assert adopted.partitions == 2
    delete_topics(kafka_bootstrap, [kafka_topic])


def test_concurrent_appends_share_requests_and_stay_ordered(kafka_logs: MakeLog) -> None:
    """Many threads on one conversation: offsets unique, read-back order == offset order."""
    log = kafka_logs(1)
    positions: list[tuple[int, bytes]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def writer(t: int) -> None:
        try:
            for i in range(50):
                value = f"{t}-{i}".encode()
                pos = log.append(record_key("one-conversation", f"{t}-{i}"), value)
                with lock:
                    positions.append((pos.offset, value))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(8)]
    t0 = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    elapsed = time.monotonic() - t0
    assert not errors
    assert len({o for o, _ in positions}) == 400
    assert [r.value for r in _read_all(log, 0)] == [v for _, v in sorted(positions)]
    assert elapsed < 60


def test_cursor_continues_across_new_appends(kafka_logs: MakeLog) -> None:
    log = kafka_logs(2)
    cursor = log.cursor({})
    try:
        seen: list[Record] = []
        for round_ in range(3):
            expected = [log.append(record_key(f"c{round_}-{i}", "a"), b"x") for i in range(5)]
            deadline = time.monotonic() + 20
            while len(seen) < 5 * (round_ + 1) and time.monotonic() < deadline:
                seen.extend(cursor.poll(timeout=1.0))
            assert {r.position for r in seen[-5:]} == set(expected)
    finally:
        cursor.close()


def test_cursor_close_is_idempotent_and_poll_after_close_raises(kafka_logs: MakeLog) -> None:
    log = kafka_logs(1)
    cursor = log.cursor({0: 0})
    cursor.close()
    cursor.close()
    with pytest.raises(LogUnavailable):
        cursor.poll(timeout=0.01)


def test_unreachable_bootstrap_raises_log_unavailable_quickly() -> None:
    t0 = time.monotonic()
    with pytest.raises(LogUnavailable) as info:
        KafkaLog("127.0.0.1:1", "histlog-nowhere", request_timeout_s=2)
    assert time.monotonic() - t0 < 15
    assert "127.0.0.1:1" in str(info.value)
