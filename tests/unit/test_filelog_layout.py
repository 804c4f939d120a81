"""FileLog directory layout: crash-safe creation and missing partitions / segments.

One test per row of the layout table in docs/log-format.md §5 (same order). The intermediate
states of a creation killed part-way are built by hand (what kill -9 leaves after each phase),
and a real kill -9 of a child process in the middle of creating a large log checks that every
state it leaves behind either opens or is refused, never half-accepted. Then ``verify``
(read-only) on each case, with and without the state's checkpoints as evidence.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.log import format as fmt
from engine.log.base import record_key
from engine.log.file import FileLog
from engine.log.verify import verify
from schemas.errors import CorruptLog
from tests.unit.test_filelog_recovery import VALUES, frame_positions, snapshot, truncate, write_log


def partition_dirs(root: Path, partitions: int, *, segments: bool = True) -> None:
    """What creation leaves after its first phase: empty partitions, no meta.json."""
    for p in range(partitions):
        fmt.partition_dir(root, p).mkdir(parents=True, exist_ok=True)
        if segments:
            fmt.segment_path(root, p, 0).touch()


def meta_partitions(root: Path) -> int:
    return int(json.loads(fmt.meta_path(root).read_bytes())["partitions"])


# ---------------------------------------------------------------- the layout table, in order


def test_layout1_a_new_directory_is_created_with_every_partition_and_meta_last(tmp_path: Path) -> None:
    root = tmp_path / "log"
    FileLog(root, 3).close()
    assert meta_partitions(root) == 3
    for p in range(3):
        assert [s.name for _, s in fmt.list_segments(fmt.partition_dir(root, p))] == [fmt.segment_name(0)]
    assert not fmt.meta_path(root).with_suffix(".tmp").exists()


@pytest.mark.parametrize("made", [0, 1, 2])
def test_layout2_an_interrupted_creation_is_completed(tmp_path: Path, made: int) -> None:
    # Killed after creating ``made`` of the 3 partitions (the last one maybe without its segment).
    partition_dirs(tmp_path, made)
    fmt.partition_dir(tmp_path, made).mkdir()
    fmt.meta_path(tmp_path).with_suffix(".tmp").write_bytes(b'{"partiti')  # a meta never renamed
    with FileLog(tmp_path, 3) as log:
        assert log.end_offsets() == [0, 0, 0]
        log.append(record_key("c", "a"), b"v")
    assert meta_partitions(tmp_path) == 3


def test_layout2_an_interrupted_creation_reopened_with_fewer_partitions_drops_the_extra_empty_ones(
        tmp_path: Path) -> None:
    partition_dirs(tmp_path, 4)
    with FileLog(tmp_path, None) as log:  # nothing was ever appended: the count is not fixed yet
        assert log.partitions == 1
    assert sorted(e.name for e in tmp_path.iterdir() if e.name.isdigit()) == ["0"]
    assert verify(tmp_path).clean


def test_layout3_partition_directories_with_records_but_no_meta_is_corruption(tmp_path: Path) -> None:
    write_log(tmp_path)
    fmt.meta_path(tmp_path).unlink()
    before = snapshot(tmp_path)
    with pytest.raises(CorruptLog, match=r"no meta\.json"):
        FileLog(tmp_path, 1)
    assert snapshot(tmp_path) == before


def test_layout4_a_missing_partition_directory_is_corruption(tmp_path: Path) -> None:
    with FileLog(tmp_path, 2) as log:
        for i in range(10):
            log.append(record_key(f"conv-{i}", "a"), b"v")
    for seg in fmt.partition_dir(tmp_path, 1).iterdir():
        seg.unlink()
    fmt.partition_dir(tmp_path, 1).rmdir()
    before = snapshot(tmp_path)
    with pytest.raises(CorruptLog) as info:
        FileLog(tmp_path, 2)
    message = str(info.value).lower()
    assert "partition 1" in message and "directory" in message and "missing" in message
    assert "restore" in message and "backup" in message
    assert info.value.reason == "missing partition"
    assert snapshot(tmp_path) == before and not fmt.partition_dir(tmp_path, 1).exists()


def test_layout5_a_partition_without_segment_files_is_corruption(tmp_path: Path) -> None:
    write_log(tmp_path, [b"x" * 300] * 8, segment_bytes=700)
    for _, seg in fmt.list_segments(fmt.partition_dir(tmp_path, 0)):
        seg.unlink()
    with pytest.raises(CorruptLog, match=r"partition 0 .*no segment files") as info:
        FileLog(tmp_path, 1)
    assert "restore" in str(info.value).lower() and info.value.reason == "missing segments"
    assert fmt.list_segments(fmt.partition_dir(tmp_path, 0)) == []


def test_layout6_a_missing_log_with_evidence_is_lost_data(tmp_path: Path) -> None:
    with pytest.raises(CorruptLog, match="expected end offset 5, found 0"):
        FileLog(tmp_path / "log", 1, acknowledged=[5])
    assert not fmt.meta_path(tmp_path / "log").exists()
    with FileLog(tmp_path / "log", 1, acknowledged=[0]) as log:  # no evidence of any record: create
        assert log.end_offsets() == [0]


def test_layout6_without_fsync_always_a_missing_log_is_created_and_the_loss_reported(tmp_path: Path) -> None:
    with FileLog(tmp_path / "log", 2, fsync="interval", acknowledged=[3, 0]) as log:
        assert [(x.partition, x.expected_end, x.found_end) for x in log.lost] == [(0, 3, 0)]


def test_kill_9_during_creation_leaves_directories_that_open(tmp_path: Path) -> None:
    # A child creates 32-partition logs one after another; kill -9 lands inside one creation.
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from engine.log.file import FileLog\n"
        "print('ready', flush=True)\n"
        "for i in range(10_000):\n"
        "    FileLog(Path(sys.argv[1]) / str(i), 32, fsync='never').close()\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    child = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], env=env, stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        deadline = time.monotonic() + 20
        while not (tmp_path / "3").exists() and time.monotonic() < deadline:
            time.sleep(0.001)  # polling a condition with a bound, not synchronising by sleep
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    made = sorted(int(d.name) for d in tmp_path.iterdir())
    assert len(made) >= 4, "the child did not get far enough to be killed inside a creation"
    for i in made:  # whatever phase it died in, no record was ever appended
        with FileLog(tmp_path / str(i), 32) as log:
            assert log.end_offsets() == [0] * 32
        assert meta_partitions(tmp_path / str(i)) == 32


# ---------------------------------------------------------------- verify (read-only)


def test_verify_reports_a_missing_partition_directory(tmp_path: Path) -> None:
    FileLog(tmp_path, 2).close()
    for seg in fmt.partition_dir(tmp_path, 1).iterdir():
        seg.unlink()
    fmt.partition_dir(tmp_path, 1).rmdir()
    report = verify(tmp_path)
    [problem] = report.problems
    assert (problem.kind, problem.partition) == ("corruption", 1)
    assert "partition directory is missing" in problem.reason
    assert not report.ok and "CORRUPT" in report.summary()


def test_verify_reports_a_partition_without_segments(tmp_path: Path) -> None:
    write_log(tmp_path)
    for _, seg in fmt.list_segments(fmt.partition_dir(tmp_path, 0)):
        seg.unlink()
    [problem] = verify(tmp_path).problems
    assert (problem.kind, problem.partition) == ("corruption", 0) and "no segment files" in problem.reason


def test_verify_reports_an_interrupted_creation_as_completed_on_open(tmp_path: Path) -> None:
    partition_dirs(tmp_path, 2)
    report = verify(tmp_path)
    assert [p.kind for p in report.problems] == ["interrupted creation"] and report.ok


def test_verify_compares_the_ends_with_the_evidence(tmp_path: Path) -> None:
    write_log(tmp_path)
    report = verify(tmp_path, acknowledged=[5])
    assert report.clean and report.end_offsets == [5]
    assert "acknowledged [5], log ends [5]: consistent" in report.summary()


def test_verify_reports_records_removed_below_the_evidence(tmp_path: Path) -> None:
    seg = write_log(tmp_path)
    truncate(seg, frame_positions(seg)[-1])
    before = snapshot(tmp_path)
    assert verify(tmp_path).clean  # undetectable without evidence
    report = verify(tmp_path, acknowledged=[5])
    [problem] = report.problems
    assert (problem.kind, problem.partition) == ("lost records", 0)
    assert "expected end offset 5, found 4" in problem.reason
    assert not report.ok and "LOST" in report.summary()
    assert snapshot(tmp_path) == before


def test_verify_reports_a_damaged_last_acknowledged_record_as_lost(tmp_path: Path) -> None:
    seg = write_log(tmp_path)
    last = frame_positions(seg)[-1]
    truncate(seg, last + 20)
    assert [p.kind for p in verify(tmp_path, acknowledged=[4]).problems] == ["torn tail"]
    kinds = [p.kind for p in verify(tmp_path, acknowledged=[5]).problems]
    assert kinds == ["torn tail", "lost records"]


def test_verify_with_evidence_of_another_partition_count_says_so(tmp_path: Path) -> None:
    write_log(tmp_path)
    report = verify(tmp_path, acknowledged=[5, 5])
    assert report.clean and report.acknowledged is None
    assert "evidence ignored" in report.summary()


def test_verify_reads_records_written_by_a_reopened_log(tmp_path: Path) -> None:
    write_log(tmp_path)
    with FileLog(tmp_path, 1, acknowledged=[5]) as log:
        log.append(record_key("conv", "late"), b"late")
    assert verify(tmp_path, acknowledged=[6]).clean
    with FileLog(tmp_path, 1, acknowledged=[6]) as log:
        assert [r.value for r in log.read(0, 0, 100)] == [*VALUES, b"late"]
