"""A clear's compaction runs beside the projector (projections/eraser.py): other conversations'
appends are decided meanwhile, while the clear itself, a second clear of the same conversation
and every reader waiting past the clear's position wait until the erasure is done. The
compaction is held on a gate here (``StateStore.compact`` wrapped), so every ordering is
deterministic: nothing is timed."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine import HistoryEngine
from projections.store import StateStore
from schemas.batch import Batch
from schemas.errors import LogUnavailable
from schemas.messages import Message

WAIT_S = 30.0


class Gate:
    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls = 0


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    held = Gate()
    real = StateStore.compact

    def compact(self: StateStore, ranges: Any) -> None:
        held.calls += 1
        held.entered.set()
        assert held.release.wait(WAIT_S)  # Invariant: every test opens the gate
        real(self, ranges)

    monkeypatch.setattr(StateStore, "compact", compact)
    yield held
    held.release.set()  # a failed test never leaves a thread blocked


def _in_thread(fn: Any) -> tuple[threading.Thread, threading.Event, list[BaseException]]:
    done, errors = threading.Event(), []

    def run() -> None:
        try:
            fn()
        except BaseException as e:  # reported by the test
            errors.append(e)
        finally:
            done.set()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, done, errors


def _turn(conv: str, aid: str) -> Batch:
    return Batch(conv, aid, [Message.user(f"{conv} {aid}")])


def test_appends_are_decided_while_a_clear_compacts_and_the_clear_returns_after(tmp_path: Path, gate: Gate) -> None:
    with HistoryEngine.open(tmp_path, partitions=1, fsync="never") as eng:
        eng.append(_turn("gone", "a0"))
        thread, cleared, errors = _in_thread(lambda: eng.clear("gone"))
        assert gate.entered.wait(WAIT_S)  # the clear's compaction is running (held)
        receipt = eng.append(_turn("other", "a0"), timeout=WAIT_S)  # decided meanwhile
        assert eng.read("other") == list(_turn("other", "a0").messages)
        assert not cleared.is_set()  # the clear answers only once its files are clean
        with pytest.raises(LogUnavailable):  # a position past the clear is not applied before it
            eng.read("other", at_least=receipt, timeout=0)
        thread2, cleared2, errors2 = _in_thread(lambda: eng.clear("gone"))  # a second clear waits too
        gate.release.set()
        thread.join(WAIT_S)
        thread2.join(WAIT_S)
        assert cleared.is_set() and cleared2.is_set() and errors == errors2 == []
        assert eng.read("other", at_least=receipt, timeout=0) == list(_turn("other", "a0").messages)
        assert eng.read("gone") == []
        assert eng.stats().cleared == 1


def test_clears_queued_behind_a_compaction_share_the_next_one(tmp_path: Path, gate: Gate) -> None:
    with HistoryEngine.open(tmp_path, partitions=1, fsync="never") as eng:
        for c in ("first", "b", "c", "d"):
            eng.append(_turn(c, "a0"))
        first_run = _in_thread(lambda: eng.clear("first"))
        assert gate.entered.wait(WAIT_S)
        rest = [_in_thread(lambda c=c: eng.clear(c)) for c in ("b", "c", "d")]
        projector = eng._projector
        with projector._cond:  # the step's own progress moves on: 4 appends and 4 clears applied
            assert projector._cond.wait_for(lambda: projector.applied_offsets()[0] == 8, WAIT_S)
        assert eng.catch_up(timeout=0) is False  # but no position past the first clear is applied yet
        assert not any(done.is_set() for _, done, _ in rest)
        gate.release.set()
        for thread, done, errors in [first_run, *rest]:
            thread.join(WAIT_S)
            assert done.is_set() and errors == []
        assert gate.calls == 2  # one compaction for the first clear, one for the three queued behind it
        assert [eng.read(c) for c in ("first", "b", "c", "d")] == [[], [], [], []]
