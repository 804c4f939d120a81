"""``histlog --kafka`` on a real broker: a ``--state`` another process holds exits 4 with one line
(issue 11, defect 9), and the holder's state is left intact."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.facade import HistoryEngine
from schemas.batch import Batch
from schemas.messages import Message
from tests.unit.test_cli_input import _one_error_line

pytestmark = pytest.mark.kafka
ROOT = Path(__file__).resolve().parents[2]


def _histlog(bootstrap: str, topic: str, state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HISTLOG_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "engine", "--kafka", bootstrap, "--topic", topic,
                           "--state", str(state), *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=120, check=False)


def test_a_kafka_state_held_by_another_process_exits_4(kafka_bootstrap: str, kafka_topic: str,
                                                       tmp_path: Path) -> None:
    state = tmp_path / "state"
    with HistoryEngine.open(kafka=kafka_bootstrap, topic=kafka_topic, state_dir=state) as engine:
        engine.append(Batch("c", "a", [Message.user("held")]))
        for args in (["list"], ["append", "c", "b", "--text", "y"], ["rebuild"]):
            proc = _histlog(kafka_bootstrap, kafka_topic, state, *args)
            assert (proc.returncode, proc.stdout) == (4, ""), proc.stderr
            assert "state" in _one_error_line(proc.stderr)
        assert engine.log.end_offsets() == [1]  # the refused append wrote nothing
    proc = _histlog(kafka_bootstrap, kafka_topic, state, "list")
    assert (proc.returncode, proc.stdout) == (0, "c\n"), proc.stderr


def test_a_kafka_state_that_is_a_file_exits_2_before_connecting(tmp_path: Path) -> None:
    """No broker needed: the state is checked before the Kafka client is created (port 9 is
    the discard port; a connection attempt would take the client's whole bootstrap timeout)."""
    state = tmp_path / "state"
    state.write_text("a file")
    proc = _histlog("127.0.0.1:9", "t", state, "list")
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    assert "is a file" in _one_error_line(proc.stderr)
