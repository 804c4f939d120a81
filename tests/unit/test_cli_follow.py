"""``histlog tail`` (follow) on the engine's subscription: what it shows, exactly once, and how a
follower that fell behind goes on (real FileLog and RocksDB; no sleeps: readiness and output are
waited on as conditions)."""

from __future__ import annotations

import io
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from engine.cli import follow
from engine.facade import HistoryEngine
from schemas.batch import Batch
from schemas.messages import Message


class Gate(io.StringIO):
    """An output the test can hold shut: a follower writing to it blocks, as on a stalled pipe."""

    def __init__(self) -> None:
        super().__init__()
        self.open = threading.Event()
        self.open.set()
        self.blocked = threading.Event()

    def write(self, text: str) -> int:
        if not self.open.is_set():
            self.blocked.set()
            assert self.open.wait(timeout=30), "the test never reopened the gate"
        return super().write(text)


def wait_for(out: io.StringIO, text: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in out.getvalue():
        assert time.monotonic() < deadline, f"{text!r} never printed; last: {out.getvalue()[-300:]!r}"
        time.sleep(0.01)


@contextmanager
def following(engine: HistoryEngine, out: io.StringIO) -> Iterator[None]:
    stop, ready = threading.Event(), threading.Event()
    thread = threading.Thread(target=follow, args=(engine, out), kwargs={"stop": stop, "ready": ready.set})
    thread.start()
    try:
        assert ready.wait(timeout=10), "follow never became ready"
        yield
    finally:
        stop.set()
        thread.join(timeout=10)
        assert not thread.is_alive(), "follow did not stop"


def test_a_replacement_is_announced_then_its_turn_shown(tmp_path: Path) -> None:
    out = io.StringIO()
    with HistoryEngine.open(tmp_path / "d") as engine, following(engine, out):
        engine.append(Batch("c", "a1", [Message.user("hi"), Message.assistant("hello")]))
        engine.replace_turn(Batch("c", "a2", [Message.user("hi"), Message.assistant("hello again")]), "a1/0", "retry")
        engine.clear("c")
        engine.clear("c")  # a second clear changes nothing: no second line
        engine.append(Batch("d", "x", [Message.user("last")]))
        wait_for(out, "last")
    assert out.getvalue().splitlines() == [
        "c  [1:1] user: hi",
        "c  [1:2] assistant: hello",
        "c  turn a1/0 replaced (retry):",
        "c  [2:3] user: hi",
        "c  [2:4] assistant: hello again",
        "c  cleared",
        "d  [1:1] user: last",
    ]


def test_a_follower_that_falls_behind_says_so_and_follows_on(tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """The projector never waits for a stalled follower: past the subscription's buffer the
    follower loses events, warns once, and shows what is applied after it resubscribed."""
    out = Gate()
    with HistoryEngine.open(tmp_path / "d", fsync="never") as engine, following(engine, out):
        out.open.clear()
        engine.append(Batch("c", "first", [Message.user("m")]))
        assert out.blocked.wait(timeout=10)
        for i in range(1100):  # more than the default buffer of 1000; each append returns
            engine.append(Batch("c", f"a{i}", [Message.user(f"m{i}")]))
        with caplog.at_level(logging.WARNING, logger="engine.cli.ops"):
            out.open.set()
            wait_for(out, "m999\n")  # "m" (being written), then the buffered 1000 (m0..m999)
            deadline = time.monotonic() + 10  # the warning is logged once it has resubscribed
            while not any("following on from now" in r.getMessage() for r in caplog.records):
                assert time.monotonic() < deadline, f"no warning: {caplog.text!r}"
                time.sleep(0.01)
            engine.append(Batch("c", "after", [Message.user("after the loss")]))
            wait_for(out, "after the loss")
    lines = out.getvalue().splitlines()
    assert lines[-1] == "c  [1102:1102] user: after the loss"
    assert len(lines) == 1002  # "m", the buffer, then what came after the loss: m1000..m1099 dropped
    assert len(lines) == len(set(lines))  # and nothing shown twice
