"""FileLog's group commit gathers the records that are coming (``engine.log.file``, "Group
commit"): a lone writer never waits; a group waits for as many records as writers are in flight
(or as the previous group had), at most ``GATHER_S``; a close ends a gather at once. Real files,
fsync "always". ``GATHER_S`` is raised where a test needs the gather to wait for what it sends,
so no test depends on how fast the machine is."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import engine.log.file as file_log
from engine import HistoryEngine
from engine.log.file import FileLog
from schemas import Batch, Message

_BOUND = 30.0  # a bounded wait on a condition, never a synchronisation by sleep


def _until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + _BOUND
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.001)


def _visible(log: FileLog, n: int) -> None:
    with log._lock:  # woken once per group commit
        assert log._arrival.wait_for(lambda: log._visible[0] == n, _BOUND)


def _records(log: FileLog) -> list[bytes]:
    return [r.value for p in range(log.partitions) for r in log.read(p, 0)]


def test_a_lone_writer_never_gathers(tmp_path: Path) -> None:
    with FileLog(tmp_path / "log") as log:
        log.expect_writers(lambda: 1)
        for i in range(20):
            log.append(b"k", b"v%d" % i)
        stats = log.stats()
    assert stats.gathers == 0 and stats.group_sizes == {1: 20}


def test_a_group_waits_for_the_writers_in_flight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_log, "GATHER_S", 3600.0)  # only the fourth record can end this gather
    with FileLog(tmp_path / "log") as log:
        log.expect_writers(lambda: 4)
        produced = [log.produce(b"k", b"v%d" % i) for i in range(4)]  # lead=False: the flusher leads
        _visible(log, 4)
        stats = log.stats()
        assert [p.position.offset for p in produced if p.position] == [0, 1, 2, 3]
        assert _records(log) == [b"v0", b"v1", b"v2", b"v3"]
    # One group: without the gather the flusher may lead as soon as the first record is queued.
    assert stats.group_sizes == {4: 1} and stats.fsyncs == 1
    assert stats.gathers <= 1 and stats.gathers_short == 0  # 0: all four were queued when it led


def test_a_gather_that_does_not_fill_writes_what_it_has_in_time(tmp_path: Path) -> None:
    with FileLog(tmp_path / "log") as log:
        log.expect_writers(lambda: 8)  # eight said to be in flight; one comes
        position = log.append(b"k", b"only")
        stats = log.stats()
        assert position.offset == 0 and _records(log) == [b"only"]
    assert stats.gathers == 1 and stats.gathers_short == 1 and stats.group_sizes == {1: 1}


def test_the_previous_group_is_gathered_again_and_a_lone_writer_stops_it(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    with FileLog(tmp_path / "log") as log:
        monkeypatch.setattr(file_log, "GATHER_S", 3600.0)
        log.expect_writers(lambda: 3)
        for i in range(3):
            log.produce(b"k", b"a%d" % i)
        _visible(log, 3)
        log.expect_writers(lambda: 0)  # no writer in flight: the group before (3) is the target
        monkeypatch.setattr(file_log, "GATHER_S", 0.0)  # ... but gathering runs short at once
        log.append(b"k", b"b")
        log.append(b"k", b"c")  # the group before had 1 record: no gather
        stats = log.stats()
    assert stats.group_sizes == {3: 1, 1: 2}
    assert stats.gathers_short == 1  # b's: it waited for as many as the group before (c's did not wait)


def test_close_ends_a_gather_at_once_and_writes_its_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_log, "GATHER_S", 3600.0)
    log = FileLog(tmp_path / "log")
    log.expect_writers(lambda: 10)
    log.produce(b"k", b"pending")
    _until(lambda: log._gathering == 10)  # the flusher gathers
    closer = threading.Thread(target=log.close)
    closer.start()
    closer.join(_BOUND)
    assert not closer.is_alive()  # not an hour: close ended the gather
    with FileLog(tmp_path / "log") as again:
        assert _records(again) == [b"pending"]


@pytest.mark.parametrize("fsync", ["interval", "never"])
def test_without_an_fsync_per_group_nothing_gathers(tmp_path: Path, fsync: file_log.FsyncPolicy) -> None:
    with FileLog(tmp_path / "log", fsync=fsync) as log:
        log.expect_writers(lambda: 8)
        log.append(b"k", b"v")
        assert log.stats().gathers == 0


def test_the_engine_tells_its_log_the_writes_in_flight(tmp_path: Path) -> None:
    with HistoryEngine.open(tmp_path / "data") as engine:
        assert engine._log._writers_in_flight is not None  # type: ignore[attr-defined]
        for i in range(5):
            engine.append(Batch("c", f"a{i}", [Message.user(f"q{i}"), Message.assistant("a")]))
        assert engine._log.stats().gathers == 0  # type: ignore[attr-defined]  # one writer: never waits
        assert engine._log._writers_in_flight() == 0  # type: ignore[attr-defined]  # every ticket given back
