"""``engine.client.pools.Pools``: which pool a request leases (see the module's rule)."""

from __future__ import annotations

import contextlib
import itertools
import threading

import pytest

from engine.client.pools import Pools


def made() -> tuple[Pools[int], list[int]]:
    counter = itertools.count()
    made: list[int] = []

    def make() -> int:
        made.append(next(counter))
        return made[-1]

    return Pools(make, per_pool=2, max_pools=3), made


def test_one_request_at_a_time_uses_one_pool() -> None:
    pools, made_ = made()
    for _ in range(10):
        with pools.lease() as p:
            assert p == 0
    assert made_ == [0]


def test_a_pool_is_added_when_every_pool_is_busy_then_the_least_busy_is_shared() -> None:
    pools, made_ = made()
    with contextlib.ExitStack() as held:
        got = [held.enter_context(pools.lease()) for _ in range(6)]
        assert got == [0, 0, 1, 1, 2, 2] and made_ == [0, 1, 2]
        assert held.enter_context(pools.lease()) == 0  # at the limit: the least busy (ties: the first)
    with pools.lease() as p:  # all released: the first pool again
        assert p == 0
    assert made_ == [0, 1, 2]


def test_a_released_lease_frees_its_place() -> None:
    pools, _ = made()
    with pools.lease(), pools.lease():
        pass
    with pools.lease() as a, pools.lease() as b:
        assert (a, b) == (0, 0)


def test_close_hands_back_every_pool_and_refuses_more() -> None:
    pools, _ = made()
    with pools.lease(), pools.lease(), pools.lease():
        pass
    assert pools.close() == [0, 1]
    assert pools.close() == []
    with pytest.raises(RuntimeError, match="closed"), pools.lease():
        pass


def test_threads_never_overfill_a_pool() -> None:
    pools, _ = made()
    inside: dict[int, int] = {}
    worst: dict[int, int] = {}
    lock = threading.Lock()
    gate = threading.Barrier(6)

    def one() -> None:
        with pools.lease() as p:
            with lock:
                inside[p] = inside.get(p, 0) + 1
                worst[p] = max(worst.get(p, 0), inside[p])
            gate.wait(timeout=10)  # all six hold a lease at once
            with lock:
                inside[p] -= 1

    threads = [threading.Thread(target=one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert worst == {0: 2, 1: 2, 2: 2}
