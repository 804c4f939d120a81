"""The projector's steps skip RocksDB's write-ahead log (``Tx.commit(derived=True)``): the log
already holds what they derive. So the open state keeps no second copy of the log on disk, and a
process killed without closing loses nothing: the state reopens at its last flush and the
projector replays the rest, ending equal to a rebuild."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

from engine import HistoryEngine
from schemas import Batch, Message
from tests.conformance.facade_contract import snapshot

REPO = Path(__file__).resolve().parents[2]
BATCHES = 300


def _batch(i: int) -> Batch:
    return Batch(f"conv-{i % 7}", f"a-{i}", [Message.user(f"question {i} " + "x" * 200),
                                              Message.assistant(f"answer {i} " + "y" * 200)])


def _wal_bytes(state: Path) -> int:
    return sum(p.stat().st_size for p in state.glob("*.log"))


def test_steps_leave_the_state_write_ahead_log_empty(tmp_path: Path) -> None:
    with HistoryEngine.open(tmp_path / "d", fsync="never") as engine:
        for i in range(BATCHES):
            engine.append(_batch(i))
        log_bytes = sum(p.stat().st_size for p in (tmp_path / "d" / "log").rglob("*") if p.is_file())
        wal = _wal_bytes(tmp_path / "d" / "state")
        assert log_bytes > BATCHES * 400  # the content is on the log...
        assert wal < 4096, wal  # ...and not a second time in the state's WAL (only its format rows)


_CHILD = """
import os, signal, sys
sys.path.insert(0, sys.argv[2])
from engine import HistoryEngine
from tests.unit.test_state_wal import BATCHES, _batch
engine = HistoryEngine.open(sys.argv[1], fsync="always")
for i in range(BATCHES):
    engine.append(_batch(i))
print("appended", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_process_loses_nothing_and_its_state_equals_a_rebuild(tmp_path: Path) -> None:
    data = tmp_path / "d"
    done = subprocess.run([sys.executable, "-c", _CHILD, str(data), str(REPO)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == -signal.SIGKILL and done.stdout.strip() == "appended", done.stderr[-2000:]
    with HistoryEngine.open(data) as engine:
        for i in range(BATCHES):
            assert engine.append(_batch(i)).position.offset == i  # each one was there: a duplicate, same receipt
        after_kill = snapshot(engine)
        assert engine.stats().accepted == BATCHES
    shutil.rmtree(data / "state")
    with HistoryEngine.open(data) as engine:
        assert snapshot(engine) == after_kill

