"""FileLog-only behaviour: format example, lock, segments, partition count, fail-stop, group
commit, fsync policies, a kill -9 crash test. The shared contract is in LogContract."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from engine.log import format as fmt
from engine.log.base import Record, record_key
from engine.log.file import FileLog
from schemas.errors import LogUnavailable
from schemas.positions import LogPosition

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "tests" / "data" / "log" / "example-segment.hex"


def parse_hex_dump(text: str) -> bytes:
    """Hex bytes of a dump whose lines may carry ``# comments``."""
    return bytes.fromhex(" ".join(line.split("#", 1)[0] for line in text.splitlines()))


def _child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


# ---------------------------------------------------------------- format


def test_worked_example_hex_dump_matches_the_format(tmp_path: Path) -> None:
    data = parse_hex_dump(EXAMPLE.read_text())
    expected = (fmt.encode_record(0, 1767225600000, b"conv-1\x1fa1", b"hello", [("ct", b"avro")])
                + fmt.encode_record(1, 1767225600001, b"conv-1\x1f", b""))
    assert data == expected
    root = tmp_path / "log"
    FileLog(root, 1).close()
    fmt.segment_path(root, 0, 0).write_bytes(data)
    with FileLog(root, 1) as log:
        assert log.recovery == []
        assert log.read(0, 0, 10) == [
            Record(0, 0, 1767225600000, b"conv-1\x1fa1", b"hello", (("ct", b"avro"),)),
            Record(0, 1, 1767225600001, b"conv-1\x1f", b"", ()),
        ]


def test_segment_names_are_twenty_digit_base_offsets() -> None:
    assert fmt.segment_name(52817) == "00000000000000052817.log"
    assert fmt.parse_segment_name("00000000000000052817.log") == 52817
    assert fmt.parse_segment_name("52817.log") is None
    assert fmt.parse_segment_name("0000000000000005281x.log") is None


def test_layout_is_partition_directories_of_segments(tmp_path: Path) -> None:
    with FileLog(tmp_path, 3) as log:
        log.append(record_key("c"), b"v")
    names = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    assert names == ["0", "0/00000000000000000000.log", "0/tail.index", "1", "1/00000000000000000000.log",
                     "1/tail.index", "2", "2/00000000000000000000.log", "2/tail.index", "LOCK", "meta.json"]


# ---------------------------------------------------------------- lock


def test_second_open_in_the_same_process_fails_at_once(tmp_path: Path) -> None:
    with FileLog(tmp_path, 1), pytest.raises(LogUnavailable, match="locked by another process"):
        FileLog(tmp_path, 1)


def test_lock_is_released_on_close(tmp_path: Path) -> None:
    FileLog(tmp_path, 1).close()
    FileLog(tmp_path, 1).close()


def test_lock_held_by_another_process_until_it_is_killed(tmp_path: Path) -> None:
    code = ("import sys; from engine.log.file import FileLog\n"
            f"log = FileLog({str(tmp_path)!r}, 1)\nprint('ready', flush=True)\nsys.stdin.read()\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             env=_child_env(), cwd=REPO)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == b"ready"
        with pytest.raises(LogUnavailable, match="stop it or use another path"):
            FileLog(tmp_path, 1)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    FileLog(tmp_path, 1).close()  # kill -9 released the lock


# ---------------------------------------------------------------- segments and reopen


def test_segments_roll_and_reads_cross_them_and_survive_reopen(tmp_path: Path) -> None:
    values = [bytes([i % 256]) * (100 + i) for i in range(200)]
    with FileLog(tmp_path, 1, segment_bytes=2048) as log:
        positions = [log.append(record_key("c", str(i)), v) for i in range(200) for v in [values[i]]]
        assert [p.offset for p in positions] == list(range(200))
        assert log.stats().segments_created > 5
        assert [r.value for r in log.read(0, 0, 1000)] == values
    segments = fmt.list_segments(fmt.partition_dir(tmp_path, 0))
    assert len(segments) > 5
    assert all(path.stat().st_size <= 2048 for _, path in segments)
    with FileLog(tmp_path, 1, segment_bytes=2048) as log:
        assert log.end_offsets() == [200]
        assert [r.value for r in log.read(0, 0, 1000)] == values
        assert [r.offset for r in log.read(0, 57, 30)] == list(range(57, 87))
        assert log.append(record_key("c", "more"), b"more").offset == 200


def test_a_record_larger_than_a_segment_gets_a_segment_of_its_own(tmp_path: Path) -> None:
    with FileLog(tmp_path, 1, segment_bytes=1024) as log:
        log.append(record_key("c", "a"), b"small")
        log.append(record_key("c", "b"), b"L" * 5000)
        log.append(record_key("c", "c"), b"small")
        assert [len(r.value) for r in log.read(0, 0, 10)] == [5, 5000, 5]
    assert [base for base, _ in fmt.list_segments(fmt.partition_dir(tmp_path, 0))] == [0, 1, 2]


def test_partition_count_mismatch_is_refused(tmp_path: Path) -> None:
    FileLog(tmp_path, 3).close()
    with pytest.raises(LogUnavailable, match="created with 3 partitions"):
        FileLog(tmp_path, 2)
    FileLog(tmp_path, 3).close()


def test_read_of_an_unknown_partition_is_a_value_error(tmp_path: Path) -> None:
    with FileLog(tmp_path, 2) as log, pytest.raises(ValueError):
        log.read(2, 0, 10)


# ---------------------------------------------------------------- fail-stop


def test_failed_fsync_fail_stops_until_reopened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = FileLog(tmp_path, 1)
    assert log.append(record_key("c", "0"), b"ok").offset == 0
    real_fsync = os.fsync
    calls = {"n": 0}

    def failing_fsync(fd: int) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError(5, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(LogUnavailable, match="fail-stopped"):
        log.append(record_key("c", "1"), b"fate unknown")
    for i in range(3):  # fsync works again, but the log never retries or reports success
        with pytest.raises(LogUnavailable, match="fail-stopped"):
            log.append(record_key("c", f"later-{i}"), b"refused")
    assert calls["n"] == 1
    log.close()
    monkeypatch.undo()
    with FileLog(tmp_path, 1) as reopened:  # recovery decides from the bytes on disk
        values = [r.value for r in reopened.read(0, 0, 10)]
        assert values[0] == b"ok" and b"refused" not in values
        assert reopened.append(record_key("c", "2"), b"after").offset == len(values)


def test_failed_write_fail_stops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = FileLog(tmp_path, 1)

    def failing_write(fd: int, data: bytes) -> int:
        raise OSError(28, "No space left on device")

    assert log.failure() is None
    monkeypatch.setattr(os, "write", failing_write)
    with pytest.raises(LogUnavailable):
        log.append(record_key("c"), b"v")
    monkeypatch.undo()
    with pytest.raises(LogUnavailable):
        log.append(record_key("c"), b"v")
    failure = log.failure()  # what a readiness probe asks, without I/O
    assert isinstance(failure, LogUnavailable) and "fail-stopped" in str(failure)
    assert failure.retryable is False  # only a reopen recovers it
    log.close()


# ---------------------------------------------------------------- group commit and fsync policies


def test_64_threads_share_fsyncs(tmp_path: Path) -> None:
    per_thread = 20
    barrier = threading.Barrier(64)
    errors: list[BaseException] = []
    with FileLog(tmp_path, 1) as log:

        def writer(t: int) -> None:
            try:
                barrier.wait(timeout=30)
                for i in range(per_thread):
                    log.append(record_key(f"c{t}", str(i)), b"x" * 400)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(t,)) for t in range(64)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=120)
        stats = log.stats()
        assert not errors
        assert stats.appends == 64 * per_thread
        assert sum(size * n for size, n in stats.group_sizes.items()) == stats.appends
        assert stats.fsyncs < stats.appends / 4, stats
        assert stats.max_group > 8
        assert len(log.read(0, 0, 10_000)) == 64 * per_thread


def test_single_appends_each_get_one_fsync_with_always(tmp_path: Path) -> None:
    with FileLog(tmp_path, 1) as log:
        for i in range(5):
            log.append(record_key("c", str(i)), b"v")
        assert (log.stats().writes, log.stats().fsyncs) == (5, 5)


def test_never_policy_does_not_fsync(tmp_path: Path) -> None:
    with FileLog(tmp_path, 1, fsync="never") as log:
        for i in range(5):
            log.append(record_key("c", str(i)), b"v")
        assert log.stats().fsyncs == 0
    with FileLog(tmp_path, 1) as log:
        assert log.end_offsets() == [5]


def test_interval_policy_fsyncs_in_the_background_and_on_close(tmp_path: Path) -> None:
    log = FileLog(tmp_path, 1, fsync="interval", fsync_interval_ms=10)
    for i in range(50):
        log.append(record_key("c", str(i)), b"v")
    assert log.stats().fsyncs < 50
    log.close()
    with FileLog(tmp_path, 1) as reopened:
        assert reopened.end_offsets() == [50]


# ---------------------------------------------------------------- cursor specifics


def test_cursor_poll_spreads_max_records_over_partitions(tmp_path: Path) -> None:
    with FileLog(tmp_path, 2) as log:
        for i in range(200):
            log.append(record_key(f"conversation-{i}"), b"v")
        cursor = log.cursor({})
        got = cursor.poll(timeout=1.0, max_records=10)
        assert len(got) == 10
        assert {r.partition for r in got} == {0, 1}
        cursor.close()


def test_closing_the_log_ends_a_waiting_poll(tmp_path: Path) -> None:
    log = FileLog(tmp_path, 1)
    cursor = log.cursor({})
    polling = threading.Event()
    outcome: list[object] = []

    def poller() -> None:
        polling.set()
        try:
            outcome.append(cursor.poll(timeout=60.0))
        except LogUnavailable as exc:
            outcome.append(exc)

    th = threading.Thread(target=poller)
    th.start()
    assert polling.wait(10)
    log.close()
    th.join(timeout=10)
    assert not th.is_alive() and len(outcome) == 1


# ---------------------------------------------------------------- crash


CRASH_CHILD = """
import sys, threading
from engine.log.base import record_key
from engine.log.file import FileLog
log = FileLog(sys.argv[1], 2, fsync="always", segment_bytes=16384)
lock = threading.Lock()
def loop(t):
    i = 0
    while True:
        pos = log.append(record_key(f"conv-{t}-{i % 5}", f"{t}-{i}"), f"value-{t}-{i}".encode() * 7)
        with lock:
            sys.stdout.write(f"{pos.partition} {pos.offset} {t} {i}\\n")
            sys.stdout.flush()
        i += 1
threads = [threading.Thread(target=loop, args=(t,), daemon=True) for t in range(4)]
for th in threads:
    th.start()
threads[0].join()
"""


def test_every_returned_append_survives_kill_9(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", CRASH_CHILD, str(tmp_path)], stdout=subprocess.PIPE,
                             env=_child_env(), cwd=REPO)
    assert child.stdout is not None
    lines: list[bytes] = []
    try:
        while len(lines) < 300:
            line = child.stdout.readline()
            assert line, f"child ended early with {child.wait(timeout=30)}"
            lines.append(line)
    finally:
        child.send_signal(signal.SIGKILL)
        lines.extend(child.stdout.read().splitlines(keepends=True))  # printed before the kill
        child.wait(timeout=30)
    printed: dict[LogPosition, bytes] = {}
    for line in lines:
        if not line.endswith(b"\n"):
            continue
        part, off, t, i = line.split()
        printed[LogPosition(int(part), int(off))] = f"value-{int(t)}-{int(i)}".encode() * 7
    assert len(printed) >= 300
    with FileLog(tmp_path, 2) as log:
        stored = {r.position: r.value for p in range(2) for r in log.read(p, 0, 1_000_000)}
        for position, value in printed.items():
            assert stored.get(position) == value, position
        for p, end in enumerate(log.end_offsets()):
            assert sorted(pos.offset for pos in stored if pos.partition == p) == list(range(end))
