"""schemas.entropy: blocks of os.urandom handed out once, per thread, and never across a fork."""

from __future__ import annotations

import os
import threading

import pytest

from schemas.entropy import BLOCK, random_bytes


def test_every_draw_is_new_and_of_the_asked_length() -> None:
    draws = [random_bytes(12) for _ in range(3 * BLOCK // 12)]  # crosses several blocks
    assert all(len(d) == 12 for d in draws)
    assert len(set(draws)) == len(draws)
    assert random_bytes(0) == b""
    assert len(random_bytes(BLOCK)) == BLOCK  # past the block size: straight from the OS


def test_threads_never_share_bytes() -> None:
    seen: list[list[bytes]] = [[] for _ in range(8)]
    start = threading.Barrier(8)

    def draw(i: int) -> None:
        start.wait()
        seen[i].extend(random_bytes(16) for _ in range(1000))

    threads = [threading.Thread(target=draw, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [d for s in seen for d in s]
    assert len(set(every)) == len(every) == 8000


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_never_repeats_its_parents_bytes() -> None:
    random_bytes(12)  # this thread holds a block, most of it not handed out yet
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: what it draws next must not be what the parent draws next
        os.close(read_end)
        os.write(write_end, random_bytes(64))
        os._exit(0)
    os.close(write_end)
    try:
        child = b""
        while len(child) < 64:
            chunk = os.read(read_end, 64 - len(child))
            assert chunk, "the child exited without writing"
            child += chunk
    finally:
        os.close(read_end)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert random_bytes(64) != child
