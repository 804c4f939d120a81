"""The RocksDB state under real faults: damaged files, a full disk, lost log data, failed opens,
killed replays. The state is derived from the log, so it is rebuilt when in doubt; but it is also
evidence of what a durable log acknowledged, so a log that lost records is refused, not believed.
Every error is typed; nothing keeps the database open after an error."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from engine import HistoryEngine
from projections.store import DAMAGED_MARKER, DamagedState, StateStore
from schemas import (
    CommitUnconfirmed,
    CorruptLog,
    Receipt,
    StateUnavailable,
)
from tests.conformance.facade_contract import snapshot, turn
from tests.reliability.state_worker import batch

REPO = Path(__file__).resolve().parents[2]


def filled(path: Path, n: int = 40, *, flush: bool = True) -> dict[str, object]:
    """A data dir with ``n`` appends whose state is in ``.sst`` files; returns its snapshot."""
    with HistoryEngine.open(path) as eng:
        for i in range(n):
            eng.append(turn(f"c{i % 5}", f"a{i}", f"message {i}"))
        if flush:
            eng._store.db.flush()
        return snapshot(eng)


def state_items(state: Path, scratch: Path) -> list[tuple[bytes, bytes]]:
    """Every key and value of a state, read from a copy (opening RocksDB rewrites its files)."""
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(state, scratch)
    store = StateStore(scratch)
    try:
        return list(store.iterator().scan(b"", b"\xff" * 8))
    finally:
        store.close()


def _truncate_sst(state: Path) -> None:
    sst = sorted(state.glob("*.sst"))[0]
    os.truncate(sst, sst.stat().st_size // 2)


def _remove(name: str) -> Callable[[Path], None]:
    def damage(state: Path) -> None:
        for f in state.glob(name):
            f.unlink()
    return damage


def _garbage_current(state: Path) -> None:
    (state / "CURRENT").write_text("garbage\n")


DAMAGES = {
    "truncated sst": _truncate_sst,
    "no CURRENT": _remove("CURRENT"),
    "no MANIFEST": _remove("MANIFEST-*"),
    "garbage CURRENT": _garbage_current,
}


# -- defect 5: a damaged state is rebuilt, never an untyped error -----------------------------------
@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_state_is_rebuilt_from_the_log_on_open(tmp_path: Path, damage: str,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    expected = filled(tmp_path)
    DAMAGES[damage](tmp_path / "state")
    shutil.copytree(tmp_path / "state", tmp_path / "copy")  # a failed RocksDB open may write: try a copy
    with pytest.raises(DamagedState):
        StateStore(tmp_path / "copy")  # what the engine meets: a typed error
    with caplog.at_level(logging.WARNING, logger="histlog.engine"), HistoryEngine.open(tmp_path) as eng:
        assert snapshot(eng) == expected
        assert eng.stats().accepted == 40
    assert "is damaged" in caplog.text and "rebuilding it from the log" in caplog.text


@pytest.mark.parametrize("damage", DAMAGES)
def test_histlog_rebuild_replaces_a_damaged_state_without_reading_it(tmp_path: Path, damage: str) -> None:
    expected = filled(tmp_path)
    DAMAGES[damage](tmp_path / "state")
    proc = subprocess.run([sys.executable, "-m", "engine", "--data", str(tmp_path), "rebuild"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "replayed 40 records" in proc.stdout
    with HistoryEngine.open(tmp_path) as eng:
        assert snapshot(eng) == expected


def test_a_damage_found_by_a_read_is_typed_and_the_next_open_rebuilds(tmp_path: Path) -> None:
    with HistoryEngine.open(tmp_path, fsync="never") as eng:
        for i in range(3000):
            eng.append(turn(f"c{i % 10}", f"a{i}", "x" * 200))
        eng._store.db.flush()
        expected = snapshot(eng)
    eng = HistoryEngine.open(tmp_path, fsync="never")  # a cold block cache: reads go to the file
    sst = sorted((tmp_path / "state").glob("*.sst"))[0]
    with open(sst, "r+b") as f:  # damage data blocks under the running engine
        f.seek(sst.stat().st_size // 3)
        f.write(os.urandom(64))
    with pytest.raises(DamagedState, match="damaged") as info:
        for i in range(10):
            eng.read(f"c{i}")
    held = info.value  # its traceback holds the frames of the failed read, and their snapshot
    assert (tmp_path / "state" / DAMAGED_MARKER).exists()
    eng.close()
    # defect 6: the held traceback does not keep RocksDB's lock; the marker makes the open rebuild.
    with HistoryEngine.open(tmp_path, fsync="never") as again:
        assert snapshot(again) == expected
    assert held.__traceback__ is not None


# -- defect 6: nothing stays open after a failed open (and see test_engine_state.py) ----------------
def test_a_log_that_fails_to_open_releases_the_state(tmp_path: Path) -> None:
    filled(tmp_path, 3, flush=False)
    first = tmp_path / "log" / "0" / f"{0:020d}.log"
    first.rename(first.with_name(f"{5:020d}.log"))  # the segments before it are missing
    for _ in range(2):
        with pytest.raises(CorruptLog, match="missing"):
            HistoryEngine.open(tmp_path)
    StateStore(tmp_path / "state").close()


def test_a_state_in_use_by_another_engine_is_a_typed_error_and_changes_nothing(tmp_path: Path) -> None:
    filled(tmp_path / "d", 3, flush=False)
    holder = StateStore(tmp_path / "d" / "state")
    try:
        with pytest.raises(StateUnavailable, match="in use"):
            HistoryEngine.open(tmp_path / "d")
    finally:
        holder.close()
    with HistoryEngine.open(tmp_path / "d") as eng:
        assert eng.stats().accepted == 3


# -- defect 2: a state ahead of a durable log is evidence of lost acknowledged records --------------
def _state_ahead(tmp_path: Path, fsync: str) -> dict[str, object]:
    with HistoryEngine.open(tmp_path / "long", fsync=fsync) as eng:  # type: ignore[arg-type]
        for i in range(5):
            eng.append(turn("c", f"a{i}", f"m{i}"))
    with HistoryEngine.open(tmp_path / "short", fsync=fsync) as eng:  # type: ignore[arg-type]
        for i in range(2):
            eng.append(turn("c", f"a{i}", f"m{i}"))
        expected = snapshot(eng)
    shutil.rmtree(tmp_path / "short" / "state")
    shutil.copytree(tmp_path / "long" / "state", tmp_path / "short" / "state")
    return expected


def test_a_state_ahead_of_a_durable_log_is_refused_and_kept(tmp_path: Path) -> None:
    _state_ahead(tmp_path, "always")
    state = tmp_path / "short" / "state"
    before = state_items(state, tmp_path / "copy")
    with pytest.raises(CorruptLog, match="acknowledged") as info:
        HistoryEngine.open(tmp_path / "short")
    message = str(info.value)
    assert "partition 0" in message and "expected end offset 5, found 2" in message
    assert "--accept-log-loss" in message
    assert info.value.reason == "acknowledged records missing"
    assert state_items(state, tmp_path / "copy") == before  # the evidence is kept, untouched


def test_a_state_ahead_of_a_log_without_a_tail_to_check_names_the_lost_appends(tmp_path: Path) -> None:
    """The decision itself, for a log that takes no evidence (Kafka): the same refusal, naming
    the accepted appends that are gone."""
    from engine.log.memory import MemoryLog
    from engine.state import open_state
    from projections.store import StateStore

    def identity(_log: MemoryLog) -> dict[str, object]:
        return {"backend": "memory", "partitions": 1}

    longer = MemoryLog()
    log_, store = open_state(tmp_path / "state", lambda _e: longer, identity, durable=True)
    with HistoryEngine(log_, store) as eng:
        for i in range(5):
            eng.append(turn("c", f"a{i}", f"m{i}"))
        kept = longer.read(0, 0, 2)

    def shorter(_evidence: object) -> MemoryLog:  # as if the log had lost its last 3 records
        log = MemoryLog()
        for record in kept:
            log.append(record.key, record.value)
        return log

    with pytest.raises(CorruptLog, match="lost acknowledged records") as info:
        open_state(tmp_path / "state", shorter, identity, durable=True)
    message = str(info.value)
    assert "partition 0: state at offset 5, log ends at 2" in message
    assert "3 accepted append(s)" in message and "c/a2 at 0:2" in message and "c/a4 at 0:4" in message
    StateStore(tmp_path / "state").close()  # refused, and released
    log_, store = open_state(tmp_path / "state", shorter, identity, durable=False)
    with HistoryEngine(log_, store) as eng:  # a log that may lose its tail: rebuilt instead
        assert [e.append_id for e in eng.entries("c")] == ["a0", "a0", "a1", "a1"]


def test_accepting_the_log_loss_rebuilds_from_what_the_log_holds(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    expected = _state_ahead(tmp_path, "always")
    with (caplog.at_level(logging.WARNING, logger="histlog.engine"),
          HistoryEngine.open(tmp_path / "short", accept_log_loss=True) as eng):
        assert snapshot(eng) == expected
    assert "3 accepted append(s)" in caplog.text and "c/a3" in caplog.text
    with HistoryEngine.open(tmp_path / "short") as eng:  # the rebuilt state agrees with the log
        assert snapshot(eng) == expected


def test_histlog_rebuild_refuses_a_log_loss_unless_accepted(tmp_path: Path) -> None:
    expected = _state_ahead(tmp_path, "always")
    base = [sys.executable, "-m", "engine", "--data", str(tmp_path / "short"), "rebuild"]
    refused = subprocess.run(base, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1 and "accept-log-loss" in refused.stderr
    assert "Traceback" not in refused.stderr
    accepted = subprocess.run([*base, "--accept-log-loss"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert accepted.returncode == 0, accepted.stderr
    with HistoryEngine.open(tmp_path / "short") as eng:
        assert snapshot(eng) == expected


# -- defect 4: a full disk under the state never turns a written append into a plain failure -------
def test_a_full_disk_under_the_state_gives_unconfirmed_or_refused_appends_never_lost_ones(tmp_path: Path) -> None:
    data = tmp_path / "d"
    proc = subprocess.run([sys.executable, "-m", "tests.reliability.state_worker", "fill", str(data), "400000"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    outcomes = [line for line in lines if "append_id" in line]
    receipts = {o["append_id"]: Receipt.from_json(o["receipt"]) for o in outcomes if "receipt" in o}
    errors = [o for o in outcomes if "error" in o]
    assert len(receipts) > 10 and len(errors) == 3
    # The first failure happened after the record was written: its outcome is unknown to the caller.
    assert errors[0]["error"] == "CommitUnconfirmed"
    # Once the projector stopped, the engine refuses before writing anything.
    assert [e["error"] for e in errors[1:]] == ["StateUnavailable", "StateUnavailable"]
    assert errors[1]["end"] == errors[2]["end"] == errors[0]["end"]
    assert lines[-2]["close"] in (None, "StateUnavailable")  # never a raw rocksdict Exception
    assert lines[-1]["reopen"] in (None, "StateUnavailable", "LogUnavailable")
    with HistoryEngine.open(data) as eng:  # the disk has room again
        for append_id, receipt in receipts.items():
            i = int(append_id[1:])
            assert eng.append(batch(i)) == receipt  # every acknowledged append is there, once
            assert receipt.validate_for(batch(i)) is None
        unconfirmed = int(errors[0]["append_id"][1:])
        assert eng.append(batch(unconfirmed)).position.offset < errors[0]["end"][0]  # it was written
        for refused in errors[1:]:
            i = int(refused["append_id"][1:])
            assert all(e.append_id != f"a{i}" for e in eng.entries(f"c{i % 4}"))  # never written
        total = sum(len(eng.entries(f"c{k}")) for k in range(4))
        assert total == 2 * (len(receipts) + 2)  # + the unconfirmed one and the warm-up append


def test_an_append_after_the_projector_stopped_is_refused_before_any_io(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from projections.store import Tx

    with HistoryEngine.open(tmp_path) as eng:
        def broken(self: Tx) -> None:
            raise OSError("disk on fire")

        monkeypatch.setattr(Tx, "commit", broken)
        with pytest.raises(CommitUnconfirmed, match="resend the same Batch"):
            eng.append(turn("c", "a", "x"))
        end = eng.stats().end_offsets
        with pytest.raises(StateUnavailable, match="projector stopped"):
            eng.append(turn("c", "b", "y"))
        with pytest.raises(StateUnavailable, match="projector stopped"):
            eng.read("c")
        assert eng.stats().end_offsets == end
    monkeypatch.undo()
    with HistoryEngine.open(tmp_path) as eng:
        assert [e.append_id for e in eng.entries("c")] == ["a", "a"]


# -- defect 8: a killed register() leaves no scratch state behind ---------------------------------
def test_scratch_states_of_a_killed_register_are_removed_on_open(tmp_path: Path) -> None:
    filled(tmp_path, 5, flush=False)
    proc = subprocess.Popen([sys.executable, "-m", "tests.reliability.state_worker", "register", str(tmp_path)],
                            cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "inside"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    assert list(tmp_path.glob(".replay-state-*")), "the killed replay left its scratch state"
    with HistoryEngine.open(tmp_path) as eng:
        assert eng.stats().accepted == 5
    assert list(tmp_path.glob(".replay-state-*")) == []


def test_unrelated_files_beside_the_state_are_left_alone(tmp_path: Path) -> None:
    filled(tmp_path, 1, flush=False)
    (tmp_path / ".replay-notes").write_text("mine")
    (tmp_path / ".replay-statex-1").mkdir()  # another state's scratch prefix ("statex")
    HistoryEngine.open(tmp_path).close()
    assert (tmp_path / ".replay-notes").exists() and (tmp_path / ".replay-statex-1").exists()
