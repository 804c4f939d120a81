"""The evidence as the engine will pass it: a real engine's RocksDB checkpoints, then FileLog.

The engine (facade) opens the state first, reads the core checkpoints (``checkpoints(store,
partitions)``) and opens the log with ``FileLog(..., acknowledged=those)``. These tests run that
sequence on a data dir the real engine wrote, after removing acknowledged records for real.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.facade import HistoryEngine
from engine.log import format as fmt
from engine.log.file import FileLog
from projections.keys import meta_key
from projections.runtime import checkpoints
from projections.store import StateStore
from schemas.batch import Batch
from schemas.errors import CorruptLog
from schemas.messages import Message
from tests.unit.test_filelog_recovery import frame_positions, snapshot, truncate


def state_evidence(state: Path) -> list[int]:
    store = StateStore(state)
    try:
        identity = store.get(meta_key("identity"))
        assert identity is not None
        return checkpoints(store, int(json.loads(identity)["partitions"]))
    finally:
        store.close()


@pytest.fixture
def data(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    with HistoryEngine.open(root, partitions=2) as engine:
        for i in range(12):
            engine.append(Batch(conversation_id=f"conv-{i}", append_id="a",
                                messages=[Message.user(f"message {i}")]))
        assert engine.catch_up(timeout=10)
    return root


def test_the_state_checkpoints_match_a_whole_log(data: Path) -> None:
    evidence = state_evidence(data / "state")
    with FileLog(data / "log", None, acknowledged=evidence) as log:
        assert log.end_offsets() == evidence and sum(evidence) == 12
        assert log.lost == [] and log.recovery == []


def test_the_state_checkpoints_refuse_a_log_that_lost_an_acknowledged_record(data: Path) -> None:
    evidence = state_evidence(data / "state")
    p = 0 if evidence[0] else 1
    seg = fmt.list_segments(fmt.partition_dir(data / "log", p))[-1][1]
    truncate(seg, frame_positions(seg)[-1])
    before = snapshot(data / "log")
    with pytest.raises(CorruptLog, match=f"partition {p}: .*expected end offset {evidence[p]}, "
                                         f"found {evidence[p] - 1}"):
        FileLog(data / "log", None, acknowledged=evidence)
    assert snapshot(data / "log") == before
    with FileLog(data / "log", None, fsync="interval", acknowledged=evidence) as log:
        [lost] = log.lost
        assert (lost.partition, lost.expected_end, lost.found_end) == (p, evidence[p], evidence[p] - 1)


def _busiest(evidence: list[int]) -> int:
    return max(range(len(evidence)), key=lambda p: evidence[p])


@pytest.mark.parametrize("deleted", ["partition directory", "segment files"])
def test_an_engine_whose_partition_lost_every_file_says_how_much_is_gone(data: Path, deleted: str) -> None:
    """The open is refused, the state kept, and the message gives both numbers a restore needs:
    the records the state's checkpoint had applied, and where the log now ends (0)."""
    evidence = state_evidence(data / "state")
    p = _busiest(evidence)
    pdir = fmt.partition_dir(data / "log", p)
    for _, seg in fmt.list_segments(pdir):
        seg.unlink()
    if deleted == "partition directory":
        for leftover in pdir.iterdir():  # the tail index, if a clean close saved one
            leftover.unlink()
        pdir.rmdir()
    with pytest.raises(CorruptLog) as info:
        HistoryEngine.open(data, partitions=2)
    message = str(info.value)
    assert f"partition {p}" in message and f"{evidence[p]} record(s) of this partition applied" in message
    assert f"expected end offset {evidence[p]}, found 0" in message and "restore" in message.lower()
    assert info.value.reason == ("missing partition" if deleted == "partition directory" else "missing segments")
    assert state_evidence(data / "state") == evidence  # the state is kept as evidence


def test_a_log_without_evidence_says_it_cannot_tell_how_much_is_gone(data: Path) -> None:
    pdir = fmt.partition_dir(data / "log", 0)
    for _, seg in fmt.list_segments(pdir):
        seg.unlink()
    with pytest.raises(CorruptLog, match="no state's checkpoint to tell how many; the log now ends at offset 0"):
        FileLog(data / "log", None)
