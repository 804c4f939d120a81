"""The ``Log`` contract (engine/log/base.py) as a reusable test suite.

Subclass ``LogContract`` and override the ``make_log`` fixture: it returns a factory
``make_log(partitions: int = 1) -> Log`` giving a fresh, empty log; the subclass closes and
cleans up what it made. Nothing here assumes a backend: offsets are only assumed to grow
(continue from ``record.offset + 1``; Kafka may leave gaps), and waits are bounded
(threads + events + ``join(timeout)``; no sleep is used as synchronisation).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from engine.log.base import Log, LogCursor, Record, partition_for_key, record_key
from schemas.errors import LogUnavailable
from schemas.positions import LogPosition

MakeLog = Callable[..., Log]
WAIT = 20.0  # generous upper bound for anything that should happen "soon"


def _conv() -> str:
    return f"conv-{uuid.uuid4().hex[:12]}"


def _key(conversation: str, append_id: str = "") -> bytes:
    return record_key(conversation, append_id or uuid.uuid4().hex[:8])


def _read_all(log: Log, partition: int, start: int = 0) -> list[Record]:
    out: list[Record] = []
    offset = start
    while True:
        batch = log.read(partition, offset, 500)
        if not batch:
            return out
        out.extend(batch)
        offset = batch[-1].offset + 1


def _poll_until(cursor: LogCursor, count: int) -> list[Record]:
    got: list[Record] = []
    deadline = time.monotonic() + WAIT
    while len(got) < count and time.monotonic() < deadline:
        got.extend(cursor.poll(timeout=1.0))
    return got


class LogContract:
    """Every promise of ``Log`` / ``LogCursor``; one behaviour per test."""

    @pytest.fixture
    def make_log(self) -> Iterator[MakeLog]:
        raise NotImplementedError("subclasses override the make_log fixture")

    # ---------------------------------------------------------------- append

    def test_partitions_reports_the_count_the_log_was_made_with(self, make_log: MakeLog) -> None:
        assert make_log(1).partitions == 1
        assert make_log(3).partitions == 3

    def test_append_returns_strictly_increasing_positions_per_partition(self, make_log: MakeLog) -> None:
        log = make_log(1)
        conv = _conv()
        positions = [log.append(_key(conv), f"v{i}".encode()) for i in range(20)]
        assert all(isinstance(p, LogPosition) for p in positions)
        assert {p.partition for p in positions} == {0}
        offsets = [p.offset for p in positions]
        assert offsets == sorted(set(offsets))

    def test_read_back_is_byte_identical(self, make_log: MakeLog) -> None:
        log = make_log(1)
        key = record_key("conversation ünïcode", "append-1")
        value = bytes(range(256)) * 3
        headers = (("content-type", b"avro/binary"), ("ü-name", b"\x00\xff\x1f"), ("empty", b""))
        pos = log.append(key, value, headers)
        [record] = log.read(pos.partition, pos.offset, 1)
        assert (record.key, record.value, record.headers) == (key, value, headers)
        assert record.partition == pos.partition and record.offset == pos.offset
        assert record.position == pos

    def test_headers_default_to_empty(self, make_log: MakeLog) -> None:
        log = make_log(1)
        pos = log.append(_key(_conv()), b"v")
        [record] = log.read(pos.partition, pos.offset, 1)
        assert record.headers == ()

    def test_records_carry_a_timestamp(self, make_log: MakeLog) -> None:
        log = make_log(1)
        before = time.time() * 1000 - 60_000
        pos = log.append(_key(_conv()), b"v")
        [record] = log.read(pos.partition, pos.offset, 1)
        assert before <= record.timestamp_ms <= time.time() * 1000 + 60_000

    def test_records_of_one_partition_read_back_in_append_order(self, make_log: MakeLog) -> None:
        log = make_log(1)
        conv = _conv()
        values = [f"value-{i}".encode() for i in range(50)]
        positions = [log.append(_key(conv), v) for v in values]
        records = _read_all(log, 0, positions[0].offset)
        assert [r.value for r in records] == values
        assert [r.position for r in records] == positions

    def test_empty_value_round_trips(self, make_log: MakeLog) -> None:
        log = make_log(1)
        pos = log.append(_key(_conv()), b"")
        [record] = log.read(pos.partition, pos.offset, 1)
        assert record.value == b""

    def test_large_value_of_one_mib_round_trips(self, make_log: MakeLog) -> None:
        log = make_log(1)
        value = bytes(i % 251 for i in range(1 << 20))
        pos = log.append(_key(_conv()), value)
        [record] = log.read(pos.partition, pos.offset, 1)
        assert record.value == value

    # ---------------------------------------------------------------- partitioning

    def test_partition_is_partition_for_key(self, make_log: MakeLog) -> None:
        log = make_log(4)
        for i in range(40):
            key = _key(f"conversation-{i}")
            assert log.append(key, b"v").partition == partition_for_key(key, 4)

    def test_one_conversation_lands_in_one_partition(self, make_log: MakeLog) -> None:
        log = make_log(4)
        for i in range(8):
            conv = f"conversation-{i}"
            parts = {log.append(record_key(conv, f"a{j}"), b"v").partition for j in range(5)}
            parts.add(log.append(record_key(conv), b"clear").partition)  # empty append id
            assert len(parts) == 1

    def test_conversations_spread_over_partitions(self, make_log: MakeLog) -> None:
        log = make_log(4)
        parts = {log.append(_key(f"conversation-{i}"), b"v").partition for i in range(64)}
        assert parts == {0, 1, 2, 3}

    # ---------------------------------------------------------------- offsets and reads

    def test_end_offsets_is_the_offset_after_the_last_record(self, make_log: MakeLog) -> None:
        log = make_log(3)
        last: dict[int, int] = {}
        for i in range(30):
            pos = log.append(_key(f"conversation-{i}"), b"v")
            last[pos.partition] = pos.offset
        ends = log.end_offsets()
        assert len(ends) == 3
        for p, offset in last.items():
            assert ends[p] == offset + 1

    def test_end_offsets_grow_with_appends(self, make_log: MakeLog) -> None:
        log = make_log(1)
        before = log.end_offsets()[0]
        pos = log.append(_key(_conv()), b"v")
        assert pos.offset >= before
        assert log.end_offsets()[0] == pos.offset + 1

    def test_read_from_a_middle_offset(self, make_log: MakeLog) -> None:
        log = make_log(1)
        conv = _conv()
        positions = [log.append(_key(conv), str(i).encode()) for i in range(10)]
        records = _read_all(log, 0, positions[4].offset)
        assert [r.value for r in records] == [str(i).encode() for i in range(4, 10)]

    def test_read_returns_at_most_max_records(self, make_log: MakeLog) -> None:
        log = make_log(1)
        conv = _conv()
        positions = [log.append(_key(conv), str(i).encode()) for i in range(10)]
        records = log.read(0, positions[0].offset, 3)
        assert 1 <= len(records) <= 3
        assert records[0].position == positions[0]

    def test_reading_on_from_offset_plus_one_visits_every_record_once(self, make_log: MakeLog) -> None:
        log = make_log(1)
        conv = _conv()
        positions = [log.append(_key(conv), str(i).encode()) for i in range(7)]
        seen: list[LogPosition] = []
        offset = positions[0].offset
        while True:
            batch = log.read(0, offset, 1)
            if not batch:
                break
            seen.append(batch[0].position)
            assert batch[0].offset >= offset
            offset = batch[0].offset + 1
        assert seen == positions

    def test_read_at_the_end_returns_nothing(self, make_log: MakeLog) -> None:
        log = make_log(1)
        log.append(_key(_conv()), b"v")
        assert log.read(0, log.end_offsets()[0], 10) == []

    def test_read_of_an_empty_partition_returns_nothing(self, make_log: MakeLog) -> None:
        log = make_log(2)
        assert log.read(0, 0, 10) == [] and log.read(1, 0, 10) == []

    # ---------------------------------------------------------------- concurrency

    def test_16_threads_appending_get_unique_readable_positions(self, make_log: MakeLog) -> None:
        log = make_log(2)
        results: dict[LogPosition, bytes] = {}
        errors: list[BaseException] = []
        lock = threading.Lock()
        start = threading.Barrier(16)

        def writer(t: int) -> None:
            try:
                start.wait(timeout=WAIT)
                for i in range(25):
                    value = f"t{t}-{i}".encode()
                    pos = log.append(_key(f"conversation-{t}-{i % 3}"), value)
                    with lock:
                        assert pos not in results
                        results[pos] = value
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(t,)) for t in range(16)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=WAIT * 3)
        assert not errors
        assert len(results) == 16 * 25
        for p in range(2):
            for record in _read_all(log, p):
                if record.position in results:
                    assert results.pop(record.position) == record.value
        assert results == {}

    # ---------------------------------------------------------------- produce

    def test_produce_gives_the_position_once_known_and_the_record_there_once_readable(
            self, make_log: MakeLog) -> None:
        """``produce`` returns at once; each handle names the key's partition, settles (or has
        its position at once) with the position where the record is read back byte-identical."""
        log = make_log(3)
        sent = [(_key(f"conversation-{i % 5}"), f"v{i}".encode()) for i in range(30)]
        handles = [log.produce(key, value, [("h", b"1")]) for key, value in sent]
        told = threading.Semaphore(0)
        for handle in handles:
            handle.notify(lambda _h: told.release())
        for i, handle in enumerate(handles):
            assert handle.partition == partition_for_key(sent[i][0], 3)
            if handle.position is None:  # told by the acknowledgement (Kafka)
                assert told.acquire(timeout=WAIT)
        deadline = time.monotonic() + WAIT
        positions = []
        for handle in handles:
            while handle.position is None:
                assert time.monotonic() < deadline, "a produced record was never acknowledged"
                time.sleep(0.005)
            assert handle.error is None
            positions.append(handle.position)
        assert len(set(positions)) == 30
        for (key, value), position in zip(sent, positions, strict=True):
            while not log.read(position.partition, position.offset, 1):  # readable once durable
                assert time.monotonic() < deadline, f"{position} never became readable"
                time.sleep(0.005)
            (record,) = log.read(position.partition, position.offset, 1)
            assert (record.key, record.value, record.headers) == (key, value, (("h", b"1"),))
        assert sorted(p.offset for p in positions if p.partition == positions[0].partition) == [
            p.offset for p in positions if p.partition == positions[0].partition]  # in produce order

    # ---------------------------------------------------------------- cursor

    def test_cursor_returns_appended_records_in_order_per_partition(self, make_log: MakeLog) -> None:
        log = make_log(3)
        appended: dict[int, list[LogPosition]] = {0: [], 1: [], 2: []}
        for i in range(30):
            pos = log.append(_key(f"conversation-{i % 7}"), str(i).encode())
            appended[pos.partition].append(pos)
        cursor = log.cursor({})
        try:
            got = _poll_until(cursor, 30)
        finally:
            cursor.close()
        assert len(got) == 30
        for p in range(3):
            assert [r.position for r in got if r.partition == p] == appended[p]

    def test_cursor_starts_at_the_given_offsets(self, make_log: MakeLog) -> None:
        log = make_log(1)
        conv = _conv()
        positions = [log.append(_key(conv), str(i).encode()) for i in range(6)]
        cursor = log.cursor({0: positions[3].offset})
        try:
            got = _poll_until(cursor, 3)
        finally:
            cursor.close()
        assert [r.position for r in got] == positions[3:]

    def test_cursor_poll_respects_max_records(self, make_log: MakeLog) -> None:
        log = make_log(1)
        conv = _conv()
        for i in range(10):
            log.append(_key(conv), str(i).encode())
        cursor = log.cursor({})
        try:
            got: list[Record] = []
            deadline = time.monotonic() + WAIT
            while not got and time.monotonic() < deadline:
                got = cursor.poll(timeout=1.0, max_records=4)
            assert 1 <= len(got) <= 4
        finally:
            cursor.close()

    def test_cursor_seek_moves_a_partition(self, make_log: MakeLog) -> None:
        log = make_log(1)
        conv = _conv()
        positions = [log.append(_key(conv), str(i).encode()) for i in range(5)]
        cursor = log.cursor({})
        try:
            assert len(_poll_until(cursor, 5)) == 5
            cursor.seek(0, positions[1].offset)
            assert [r.position for r in _poll_until(cursor, 4)] == positions[1:]
        finally:
            cursor.close()

    def test_cursor_assign_reads_exactly_the_given_partitions_from_the_given_offsets(self, make_log: MakeLog) -> None:
        log = make_log(3)
        appended: dict[int, list[LogPosition]] = {0: [], 1: [], 2: []}
        for i in range(30):
            pos = log.append(_key(f"conversation-{i % 7}"), str(i).encode())
            appended[pos.partition].append(pos)
        assert all(len(v) >= 2 for v in appended.values())
        cursor = log.cursor({})
        try:
            assert len(_poll_until(cursor, 30)) == 30
            cursor.assign({0: appended[0][1].offset, 2: 0})
            want = appended[0][1:] + appended[2]
            got = _poll_until(cursor, len(want))
            assert sorted(r.position for r in got) == sorted(want)  # nothing of partition 1
            late = log.append(_key(next(f"c{i}" for i in range(99) if partition_for_key(_key(f"c{i}"), 3) == 1)),
                              b"late")
            cursor.assign({1: late.offset})
            assert [r.position for r in _poll_until(cursor, 1)] == [late]
        finally:
            cursor.close()

    def test_cursor_with_no_partition_polls_nothing_and_wakes(self, make_log: MakeLog) -> None:
        log = make_log(1)
        pos = log.append(_key(_conv()), b"x")
        cursor = log.cursor({})
        result: list[list[Record]] = []
        try:
            cursor.assign({})
            assert cursor.poll(timeout=0.05) == []
            th = threading.Thread(target=lambda: result.append(cursor.poll(timeout=60.0)))
            th.start()
            cursor.wakeup()
            th.join(timeout=WAIT)
            assert not th.is_alive() and result == [[]]
            cursor.assign({0: 0})
            assert [r.position for r in _poll_until(cursor, 1)] == [pos]
        finally:
            cursor.close()

    def test_cursor_poll_times_out_with_an_empty_list(self, make_log: MakeLog) -> None:
        log = make_log(1)
        cursor = log.cursor({})
        try:
            assert cursor.poll(timeout=0.05) == []
        finally:
            cursor.close()

    def test_cursor_waiting_poll_wakes_when_a_record_arrives(self, make_log: MakeLog) -> None:
        log = make_log(1)
        cursor = log.cursor({})
        polling = threading.Event()
        result: list[Record] = []

        def poller() -> None:
            polling.set()
            deadline = time.monotonic() + WAIT
            while not result and time.monotonic() < deadline:
                result.extend(cursor.poll(timeout=WAIT))

        try:
            assert cursor.poll(timeout=0.05) == []  # nothing yet
            th = threading.Thread(target=poller)
            th.start()
            assert polling.wait(WAIT)
            pos = log.append(_key(_conv()), b"late")
            th.join(timeout=WAIT)
            assert not th.is_alive()
            assert [r.position for r in result] == [pos]
        finally:
            cursor.close()

    def test_wakeup_ends_a_waiting_poll(self, make_log: MakeLog) -> None:
        log = make_log(1)
        cursor = log.cursor({})
        polling = threading.Event()
        result: list[list[Record]] = []

        def poller() -> None:
            polling.set()
            result.append(cursor.poll(timeout=60.0))

        try:
            th = threading.Thread(target=poller)
            th.start()
            assert polling.wait(WAIT)
            cursor.wakeup()
            th.join(timeout=WAIT)
            assert not th.is_alive(), "wakeup() did not end the poll"
            assert result == [[]]
        finally:
            cursor.close()

    # ---------------------------------------------------------------- close

    def test_close_is_idempotent(self, make_log: MakeLog) -> None:
        log = make_log(1)
        log.append(_key(_conv()), b"v")
        log.close()
        log.close()

    def test_append_after_close_raises_log_unavailable(self, make_log: MakeLog) -> None:
        log = make_log(1)
        log.close()
        with pytest.raises(LogUnavailable):
            log.append(_key(_conv()), b"v")

    def test_log_is_a_context_manager_that_closes(self, make_log: MakeLog) -> None:
        log = make_log(1)
        with log as entered:
            assert entered is log
            entered.append(_key(_conv()), b"v")
        with pytest.raises(LogUnavailable):
            log.append(_key(_conv()), b"v")
