"""Every public timeout is checked before any I/O (issue 11, defect 9).

A negative, NaN or infinite timeout, or one that is not a number, raises
``InvalidConfiguration`` and nothing reaches the log: ``engine.log.end_offsets()`` is the same
before and after. ``timeout=0`` means "do not wait" (see ``HistoryEngine.append``).
Real FileLog and RocksDB under ``tmp_path``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.facade import HistoryEngine
from schemas.batch import Batch
from schemas.errors import InvalidConfiguration
from schemas.messages import Message

BAD_TIMEOUTS: list[Any] = [-1, -0.001, float("nan"), float("inf"), float("-inf"), "1", None, True, [1], b"30"]


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[HistoryEngine]:
    with HistoryEngine.open(tmp_path / "data") as e:
        e.append(Batch("c", "first", [Message.user("hello")]))
        yield e


def _batch(append_id: str) -> Batch:
    return Batch("c", append_id, [Message.user(f"message {append_id}")])


CALLS: dict[str, Callable[[HistoryEngine, Any], object]] = {
    "append": lambda e, t: e.append(_batch("new"), timeout=t),
    "append_positional": lambda e, t: e.append(_batch("new"), t),
    "replace_turn": lambda e, t: e.replace_turn(_batch("edit"), "first/0", "edit", timeout=t),
    "clear": lambda e, t: e.clear("c", timeout=t),
    "clear_unknown": lambda e, t: e.clear("never-written", timeout=t),
    "read": lambda e, t: e.read("c", timeout=t),
    "read_at_least": lambda e, t: e.read("c", at_least=e.append(Batch("c", "first", [Message.user("hello")])),
                                          timeout=t),
    "catch_up": lambda e, t: e.catch_up(timeout=t),
    "catch_up_progress": lambda e, t: e.catch_up(timeout=t, progress=lambda done, total: None),
}


# catch_up(timeout=None) is valid: it waits until caught up (documented).
CASES = [(call, t) for call in sorted(CALLS) for t in BAD_TIMEOUTS if not (t is None and call.startswith("catch_up"))]


@pytest.mark.parametrize(("call", "timeout"), CASES, ids=[f"{c}-{t!r}" for c, t in CASES])
def test_a_bad_timeout_is_refused_before_anything_is_written(engine: HistoryEngine, call: str,
                                                             timeout: Any) -> None:
    before = engine.log.end_offsets()
    with pytest.raises(InvalidConfiguration, match=r"timeout must be a finite number of seconds >= 0, got "):
        CALLS[call](engine, timeout)
    assert engine.log.end_offsets() == before
    assert [m.text() for m in engine.read("c")] == ["hello"]


def test_the_error_names_the_bad_value_and_is_a_value_error(engine: HistoryEngine) -> None:
    with pytest.raises(ValueError, match=r"got -1\b"):
        engine.append(_batch("new"), timeout=-1)


def test_catch_up_without_a_timeout_waits_until_caught_up(engine: HistoryEngine) -> None:
    assert engine.catch_up(timeout=None) is True
    assert engine.catch_up() is True


def test_timeout_zero_answers_a_known_decision_without_writing(engine: HistoryEngine) -> None:
    before = engine.log.end_offsets()
    receipt = engine.append(Batch("c", "first", [Message.user("hello")]), timeout=0)
    assert str(receipt.append_id) == "first"
    assert engine.log.end_offsets() == before
    assert engine.read("c", at_least=receipt, timeout=0) == engine.read("c")
    assert engine.catch_up(timeout=0) is True


def test_timeout_zero_writes_and_does_not_wait_for_more_than_it_knows(engine: HistoryEngine) -> None:
    """0 means "do not wait": the event is handed to the log (written by its flusher, not waited
    for); the answer is the receipt if this instance has already applied it, else
    ``CommitUnconfirmed`` (resend to learn the outcome)."""
    from schemas.errors import CommitUnconfirmed

    before = engine.log.end_offsets()
    try:
        engine.append(_batch("zero"), timeout=0)
    except CommitUnconfirmed:
        pass
    deadline = time.monotonic() + 10  # a bounded wait for the flusher's write, not a sleep
    while engine.log.end_offsets() == before and time.monotonic() < deadline:
        time.sleep(0.002)
    assert engine.log.end_offsets() == [before[0] + 1]
    assert engine.catch_up(timeout=10)
    assert str(engine.append(_batch("zero")).append_id) == "zero"  # the resend learns the outcome


def test_integer_and_float_timeouts_are_accepted(engine: HistoryEngine) -> None:
    assert str(engine.append(_batch("int"), timeout=5).append_id) == "int"
    assert str(engine.append(_batch("float"), timeout=2.5).append_id) == "float"
