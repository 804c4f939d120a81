"""The crash test's stdout reader keeps every byte a child wrote, in order, and never hangs.

The defect it replaces: ``readline()`` on a text-mode pipe, then ``communicate(timeout=...)``,
lost what ``readline()`` had read ahead (8 KiB) and returned the rest from mid-line."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.reliability.pipe_lines import PipeLines

LINES = 2000  # 12 bytes each: 24 000 bytes, well past any read-ahead buffer


@pytest.fixture
def spawn() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)
        for f in (p.stdin, p.stdout):
            if f is not None:
                f.close()


def child(procs: list[subprocess.Popen[bytes]], code: str) -> PipeLines:
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         bufsize=0)
    procs.append(p)
    assert p.stdout is not None
    return PipeLines(p.stdout.fileno())


def test_every_line_after_a_partial_read_is_kept_in_order(spawn: list[subprocess.Popen[bytes]]) -> None:
    out = child(spawn, f"import sys; sys.stdout.write(''.join(f'{{i:010d}}\\n' for i in range({LINES})))")
    deadline = time.monotonic() + 30
    first = out.line(deadline)
    spawn[0].wait(timeout=30)  # everything is written (in the pipe or already read) before the rest
    got = [first, *out.rest(deadline)]
    assert got == [b"%010d\n" % i for i in range(LINES)]
    assert out.tail == b""


def test_a_cut_last_line_is_not_a_line_but_the_tail(spawn: list[subprocess.Popen[bytes]]) -> None:
    out = child(spawn, "import sys; sys.stdout.write('one\\ntwo\\nthr')")
    assert out.rest(time.monotonic() + 30) == [b"one\n", b"two\n"]
    assert out.tail == b"thr"


def test_a_silent_child_is_a_timeout_not_a_hang(spawn: list[subprocess.Popen[bytes]]) -> None:
    out = child(spawn, "import sys; print('hello', flush=True); sys.stdin.read()")
    assert out.line(time.monotonic() + 30) == b"hello\n"
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="hung"):
        out.line(start + 0.2)
    assert time.monotonic() - start < 10
