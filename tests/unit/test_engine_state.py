"""The state directory is derived: when it cannot belong to the log it is refused or rebuilt."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from engine import HistoryEngine
from projections.store import StateStore
from schemas import HistoryError, InvalidConfiguration
from schemas.errors import StateUnavailable
from tests.conformance.facade_contract import snapshot, turn


def test_a_state_ahead_of_its_log_is_rebuilt_from_the_log(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with HistoryEngine.open(tmp_path / "long", fsync="never") as eng:
        for i in range(5):
            eng.append(turn("c", f"a{i}", f"m{i}"))
    with HistoryEngine.open(tmp_path / "short", fsync="never") as eng:
        for i in range(2):
            eng.append(turn("c", f"a{i}", f"m{i}"))
        expected = snapshot(eng)
    # As if the log lost its tail (power loss under fsync="never") while the state kept it.
    shutil.rmtree(tmp_path / "short" / "state")
    shutil.copytree(tmp_path / "long" / "state", tmp_path / "short" / "state")
    with (caplog.at_level(logging.WARNING, logger="histlog.engine"),
          HistoryEngine.open(tmp_path / "short", fsync="never") as eng):
        assert snapshot(eng) == expected
        assert eng.stats().accepted == 2
    assert "ahead of the log" in caplog.text


def test_a_state_built_from_another_log_is_refused(tmp_path: Path) -> None:
    with HistoryEngine.open(tmp_path / "one", partitions=1) as eng:
        eng.append(turn("c", "a", "x"))
    with HistoryEngine.open(tmp_path / "four", partitions=4):
        pass
    shutil.rmtree(tmp_path / "four" / "state")
    shutil.copytree(tmp_path / "one" / "state", tmp_path / "four" / "state")
    with pytest.raises(HistoryError, match="another log"):
        HistoryEngine.open(tmp_path / "four")
    StateStore(tmp_path / "four" / "state").close()  # released: not "lock hold by current process"
    with pytest.raises(InvalidConfiguration, match="another log"):
        HistoryEngine.open(tmp_path / "four")  # the same typed answer again, not a lock error


def test_reopening_with_another_partition_count_is_refused(tmp_path: Path) -> None:
    with HistoryEngine.open(tmp_path / "d", partitions=2):
        pass
    with pytest.raises(HistoryError, match="partitions"):
        HistoryEngine.open(tmp_path / "d", partitions=3)
    with HistoryEngine.open(tmp_path / "d") as eng:  # None: the log's own count
        assert len(eng.stats().end_offsets) == 2


def test_a_second_engine_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    from schemas import LogUnavailable

    with HistoryEngine.open(tmp_path / "d"), pytest.raises(LogUnavailable, match="locked"):
        HistoryEngine.open(tmp_path / "d")


def test_a_closed_engine_refuses_calls(tmp_path: Path) -> None:
    eng = HistoryEngine.open(tmp_path / "d")
    eng.close()
    eng.close()  # idempotent
    with pytest.raises(HistoryError, match="closed"):
        eng.read("c")


def test_a_failing_state_store_stops_the_projector_with_a_history_error(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from projections.store import Tx

    with HistoryEngine.open(tmp_path / "d") as eng:
        assert eng.fail_stopped() is None

        def broken(self: Tx) -> None:
            raise OSError("disk on fire")

        monkeypatch.setattr(Tx, "commit", broken)
        with pytest.raises(HistoryError, match="projector stopped") as info:
            eng.append(turn("c", "a", "x"))
        assert isinstance(info.value.__cause__, OSError)
        stopped = eng.fail_stopped()  # what /readyz answers with
        assert isinstance(stopped, StateUnavailable) and "disk on fire" in str(stopped)
    monkeypatch.undo()
    with HistoryEngine.open(tmp_path / "d") as eng:  # the log kept the event: reopening applies it
        assert len(eng.read("c")) == 2


def test_a_state_of_another_layout_version_is_rebuilt(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from projections.keys import meta_key
    from projections.store import StateStore

    with HistoryEngine.open(tmp_path) as eng:
        for i in range(3):
            eng.append(turn("c", f"a{i}", f"m{i}"))
        expected = snapshot(eng)
    store = StateStore(tmp_path / "state")
    store.db.put(meta_key("format"), b"1")  # as a histlog with an older RocksDB layout left it
    store.db.put(b"Mc\x1f" + bytes(8), b"garbage of the old layout")
    store.close()
    with caplog.at_level(logging.WARNING, logger="histlog.engine"), HistoryEngine.open(tmp_path) as eng:
        assert snapshot(eng) == expected
        assert eng.stats().accepted == 3
    assert "another layout" in caplog.text


def test_a_state_of_layout_5_is_rebuilt_into_this_layout(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Layout 5 kept the counters in ``X`` rows and running sums in one ``A`` row per message;
    this one keeps the counters in ``core``'s checkpoint and one ``A`` row per batch. A state
    left by 5 is rebuilt from the log, never read with this layout's rules."""
    from projections import keys

    with HistoryEngine.open(tmp_path, partitions=1) as eng:
        for i in range(3):
            eng.append(turn("c", f"a{i}", f"m{i}"))
        expected, measure = snapshot(eng), eng.measure("c")
    store = StateStore(tmp_path / "state")
    rows = dict(store.db.items())
    core = rows[keys.checkpoint_key("core", 0)]
    store.db.put(keys.checkpoint_key("core", 0), core[:8])  # 5: the offset alone
    store.db.put(b"X" + bytes(4), core[8:])  # 5: the counters in a row of their own
    lower, upper = keys.conv_range(keys.AGGREGATE, b"c")
    for k in [k for k in rows if lower <= k < upper]:
        store.db.delete(k)
    for ord_ in range(measure.messages):  # 5: (messages, content bytes, turns) before each message
        store.db.put(keys.aggregate_key(b"c", ord_), bytes(24))
    store.db.put(keys.FORMAT_KEY, b"5")
    store.close()
    with caplog.at_level(logging.WARNING, logger="histlog.engine"), HistoryEngine.open(tmp_path) as eng:
        assert snapshot(eng) == expected
        assert eng.measure("c") == measure
        assert eng.stats().accepted == 3
        assert dict(eng._store.db.items()) == rows  # exactly what this layout builds
    assert "another layout" in caplog.text


def test_a_state_of_layout_5_is_still_evidence_of_acknowledged_records(tmp_path: Path) -> None:
    """The first open after an upgrade rebuilds a layout-5 state, but its checkpoints (the offset
    alone, in 5) still say which records the log acknowledged: a log that lost one is refused
    before anything is rebuilt, as with a state of this layout."""
    from engine.log import format as fmt
    from projections import keys
    from schemas import CorruptLog
    from tests.unit.test_filelog_recovery import frame_positions, truncate

    with HistoryEngine.open(tmp_path, partitions=1) as eng:
        for i in range(3):
            eng.append(turn("c", f"a{i}", f"m{i}"))
    store = StateStore(tmp_path / "state")
    core = store.db.get(keys.checkpoint_key("core", 0))
    store.db.put(keys.checkpoint_key("core", 0), core[:8])  # 5: the offset alone
    store.db.put(keys.FORMAT_KEY, b"5")
    store.close()
    seg = fmt.list_segments(fmt.partition_dir(tmp_path / "log", 0))[-1][1]
    truncate(seg, frame_positions(seg)[-1])  # the log loses its last acknowledged record
    with pytest.raises(CorruptLog, match="expected end offset 3, found 2"):
        HistoryEngine.open(tmp_path)
