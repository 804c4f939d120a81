"""A state that must be deleted (damaged, another layout, a scratch replay) but cannot be is
refused with ``StateUnavailable`` naming the directory and what to do: never ignored, never
retried in a loop. The failures are real: a file where the directory should be, and a directory
whose entries the file system will not unlink (read-only permissions for a normal user; the
immutable attribute for root, whom permissions do not stop)."""

from __future__ import annotations

import array
import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import HistoryEngine
from projections.store import DAMAGED_MARKER, DamagedState, StateStore
from schemas.errors import StateUnavailable
from tests.conformance.facade_contract import turn

_FS_IOC_GETFLAGS, _FS_IOC_SETFLAGS, _FS_IMMUTABLE_FL = 0x80086601, 0x40086602, 0x10


def _set_immutable(directory: Path, on: bool) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        flags = array.array("i", [0])
        fcntl.ioctl(fd, _FS_IOC_GETFLAGS, flags, True)
        flags[0] = flags[0] | _FS_IMMUTABLE_FL if on else flags[0] & ~_FS_IMMUTABLE_FL
        fcntl.ioctl(fd, _FS_IOC_SETFLAGS, flags, True)
    finally:
        os.close(fd)


@contextlib.contextmanager
def undeletable(directory: Path) -> Iterator[None]:
    """While inside, nothing in ``directory`` can be unlinked (so ``rmtree`` fails on its first entry)."""
    if os.geteuid() != 0:
        mode = directory.stat().st_mode
        directory.chmod(0o555)
        try:
            yield
        finally:
            directory.chmod(mode)
        return
    try:
        _set_immutable(directory, True)
    except OSError as e:  # a file system without the attribute, or no CAP_LINUX_IMMUTABLE
        pytest.skip(f"cannot make {directory} undeletable as root here ({e.strerror})")
    try:
        yield
    finally:
        _set_immutable(directory, False)


def _damaged_state(root: Path) -> Path:
    """An engine directory whose state carries the damage marker (the next open must rebuild it)."""
    with HistoryEngine.open(root, fsync="never") as eng:
        eng.append(turn("c", "a", "x"))
    state = root / "state"
    (state / DAMAGED_MARKER).write_text("Corruption: block checksum mismatch\n")
    return state


def test_destroying_a_missing_directory_is_nothing_to_do(tmp_path: Path) -> None:
    StateStore.destroy(tmp_path / "never-made")


def test_destroying_a_file_in_place_of_the_state_directory_raises(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.write_text("not a state")
    with pytest.raises(StateUnavailable, match=rf"cannot delete the state directory {state} .*delete it by hand"):
        StateStore.destroy(state)
    assert state.read_text() == "not a state"


def test_destroying_a_directory_that_cannot_be_emptied_raises(tmp_path: Path) -> None:
    state = tmp_path / "state"
    StateStore(state).close()
    with undeletable(state), pytest.raises(StateUnavailable) as info:
        StateStore.destroy(state)
    assert type(info.value) is StateUnavailable
    assert f"cannot delete the state directory {state}" in str(info.value)
    assert "delete it by hand, then reopen" in str(info.value)
    assert isinstance(info.value.__cause__, OSError)


def test_a_damaged_state_that_cannot_be_deleted_is_refused_once(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    state = _damaged_state(tmp_path / "d")
    with (caplog.at_level(logging.WARNING, logger="histlog.engine"), undeletable(state),
          pytest.raises(StateUnavailable) as info):
        HistoryEngine.open(tmp_path / "d", fsync="never")
    assert not isinstance(info.value, DamagedState)  # not a damage to rebuild again: a refusal
    assert f"cannot delete the state directory {state}" in str(info.value)
    assert "delete it by hand, then reopen" in str(info.value)
    assert caplog.text.count("rebuilding it from the log") == 1  # one attempt, no retry, no recursion
    assert (state / DAMAGED_MARKER).exists()  # nothing was half-deleted
    # Once the directory can be deleted, the same open rebuilds it from the log.
    with HistoryEngine.open(tmp_path / "d", fsync="never") as eng:
        assert [m.text() for m in eng.read("c")] == ["x", "answer to x"]
