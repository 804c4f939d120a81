"""``Pools``: a client's connections as a few small httpx pools instead of one large one.

httpcore (httpx's transport, 1.0.x) assigns each request to a connection by scanning every
connection of the pool for every queued request, with a ``poll`` and a ``getpeername`` system
call per idle connection (encode/httpx#3215): the cost of one request grows with the square of
the requests in flight on one pool. Measured on the development VM, 64 coroutines sharing one
``httpx.AsyncClient`` made 83 ``window(20)`` calls/s where 64 clients made 280/s.

So a histlog client leases a small pool per request: the first pool with fewer than
``PER_POOL`` requests in flight, a new one when all are that busy (at most ``MAX_POOLS``), else
the least busy. A caller that sends one request at a time only ever has one pool (one
connection, kept alive); ``MAX_POOLS * PER_POOL`` requests in flight each have a connection of
their own. Pools are made on demand and closed together.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

__all__ = ["MAX_POOLS", "PER_POOL", "Pools"]

PER_POOL = 8
"""Requests in flight on one pool before another pool is used (each pool keeps this many connections)."""
MAX_POOLS = 16
"""At most this many pools: ``MAX_POOLS * PER_POOL`` connections in all."""

C = TypeVar("C")


class Pools(Generic[C]):
    """Pools made by ``make()`` on demand; ``lease()`` one per request. Thread-safe."""

    def __init__(self, make: Callable[[], C], *, per_pool: int = PER_POOL, max_pools: int = MAX_POOLS) -> None:
        self._make = make
        self._per_pool, self._max_pools = per_pool, max_pools
        self._pools: list[C] = []
        self._busy: list[int] = []
        self._lock = threading.Lock()
        self._closed = False

    @contextmanager
    def lease(self) -> Iterator[C]:
        """A pool for one request (see the module for which)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("this histlog client is closed: make a new one")
            i = next((i for i, n in enumerate(self._busy) if n < self._per_pool), None)
            if i is None and len(self._pools) < self._max_pools:
                self._pools.append(self._make())
                self._busy.append(0)
                i = len(self._pools) - 1
            elif i is None:
                i = min(range(len(self._busy)), key=self._busy.__getitem__)
            self._busy[i] += 1
            pool = self._pools[i]
        try:
            yield pool
        finally:
            with self._lock:
                self._busy[i] -= 1

    def close(self) -> list[C]:
        """Refuse further leases; every pool made so far (for the caller to close). Idempotent."""
        with self._lock:
            self._closed = True
            pools, self._pools, self._busy = self._pools, [], []
        return pools
