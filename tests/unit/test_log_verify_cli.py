"""``histlog log verify`` on a real data dir: the state's checkpoints are the evidence.

The state is written by the real engine (RocksDB); the log is damaged by byte surgery or by
removing files. Verify must report what the log alone cannot show (acknowledged records
removed at a record boundary, a removed partition), and must never write: neither to the
log nor to the state (rocksdict rewrites a sidecar file even on a read-only open).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from engine.cli import main
from engine.log import format as fmt
from tests.unit.test_filelog_recovery import frame_positions, snapshot, truncate

Capsys = pytest.CaptureFixture[str]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HISTLOG_DATA", "HISTLOG_KAFKA", "HISTLOG_TOPIC", "HISTLOG_STATE", "HISTLOG_DEBUG"):
        monkeypatch.delenv(name, raising=False)


def run(capsys: Capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def data(tmp_path: Path, capsys: Capsys) -> Path:
    """A data dir whose log holds 3 acknowledged appends, applied by the state."""
    root = tmp_path / "data"
    for i in range(3):
        code, _, err = run(capsys, "--data", str(root), "append", "c", f"a{i}", "--text", f"message {i}")
        assert code == 0, err
    return root


def newest_segment(data: Path, partition: int = 0) -> Path:
    return fmt.list_segments(fmt.partition_dir(data / "log", partition))[-1][1]


def mtimes(root: Path) -> dict[str, int]:
    return {str(f.relative_to(root)): f.stat().st_mtime_ns for f in root.rglob("*") if f.is_file()}


def test_a_consistent_log_and_state_is_clean(capsys: Capsys, data: Path) -> None:
    before, touched = snapshot(data), mtimes(data)
    code, out, _ = run(capsys, "--data", str(data), "log", "verify")
    assert code == 0 and "clean" in out
    assert "acknowledged [3], log ends [3]: consistent" in out
    assert snapshot(data) == before, "verify wrote to the log or the state"
    assert mtimes(data) == touched, "verify rewrote a file (rocksdict's sidecar?) with the same bytes"


def test_records_removed_at_a_boundary_are_reported_as_lost(capsys: Capsys, data: Path) -> None:
    seg = newest_segment(data)
    truncate(seg, frame_positions(seg)[-1])
    before = snapshot(data)
    code, out, err = run(capsys, "--data", str(data), "log", "verify")
    assert code == 1
    assert "lost records: partition 0" in out and "expected end offset 3, found 2" in out
    assert "LOST ACKNOWLEDGED RECORDS" in out and "RECORDS MISSING" in out
    assert "restore" in err and "--accept-log-loss" in err
    assert snapshot(data) == before


def test_a_bit_flip_in_the_last_acknowledged_record_is_reported_as_lost(capsys: Capsys, data: Path) -> None:
    seg = newest_segment(data)
    raw = bytearray(seg.read_bytes())
    raw[frame_positions(seg)[-1] + 30] ^= 0x01
    seg.write_bytes(bytes(raw))
    code, out, _ = run(capsys, "--data", str(data), "log", "verify")
    assert code == 1
    assert "torn tail: partition 0" in out and "lost records: partition 0" in out


def test_a_missing_partition_directory_is_reported(capsys: Capsys, data: Path) -> None:
    shutil.rmtree(fmt.partition_dir(data / "log", 0))
    code, out, err = run(capsys, "--data", str(data), "log", "verify")
    assert code == 1 and "refuse to open" in err
    assert "corruption: partition 0 0/: the partition directory is missing" in out
    assert "found 0" in out and "CORRUPT" in out
    assert not fmt.partition_dir(data / "log", 0).exists()


def test_removed_segments_are_reported(capsys: Capsys, data: Path) -> None:
    newest_segment(data).unlink()
    code, out, _ = run(capsys, "--data", str(data), "log", "verify")
    assert code == 1 and "no segment files" in out


def test_without_a_state_there_is_no_evidence_and_none_is_created(capsys: Capsys, data: Path) -> None:
    shutil.rmtree(data / "state")
    seg = newest_segment(data)
    truncate(seg, frame_positions(seg)[-1])
    code, out, _ = run(capsys, "--data", str(data), "log", "verify")
    assert code == 0 and "clean" in out  # undetectable without the state's checkpoints
    assert "evidence: no state" in out
    assert not (data / "state").exists()
