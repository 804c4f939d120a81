"""Spare data keys: made durable ahead of need, in batches, and handed out one per new conversation.

A conversation's first sealed append needs a data key that is durable before any log byte sealed
under it can be (page writeback may persist an un-fsynced log record, so the key's fsync cannot
ride on the log's group commit). Creating that key on demand put one key-store fsync (or one
Kafka round trip) in front of every new conversation's log append: measured x0.41 of a plain
append at 16 writers (bench/bench_erasure.py, ``new``). A ``SparePool`` moves that wait off the
write path: a background thread makes ``batch`` keys durable at once (one framed append + one
fsync of the file store, one flushed batch of sends on Kafka) whenever fewer than ``low`` are
left, and ``take(c)`` hands the next one out and binds it to ``c`` **in memory only**.

Why a binding kept in memory is enough: every sealed event names its key id in plain text, so
the log itself records which keys a conversation used; the projector keeps that as the state's
``K`` rows (``projections.keys.key_id_key``), rebuilt from the log like every other row, and a
``clear`` destroys exactly those (``KeyStore.destroy(c, key_ids)``). A spare a crash left unused
holds no content. Rules that keep it exact:

* A spare is handed out at most once: only keys this pool made in this process's lifetime are
  ever taken. Spares found in a store at open were made by an earlier lifetime (or another
  instance) and may already seal some conversation's records: they are served by ``get`` but
  never bound again. So each lifetime leaves at most ``batch`` unused spares (about 100 bytes
  each) behind.
* ``take(c)`` returns ``c``'s binding while it has one, so one process seals a conversation
  under one key; another instance, or this one after a restart, binds another (a conversation
  may have several keys: admission compares content by its plaintext digest, not by key).
* ``unbind(c)`` (a ``destroy``) drops the binding; a record sealed under it that reaches the log
  after the clear is erased and its key destroyed by the projector (``projections.admission``).

Thread-safe. The refill thread starts on the first ``take`` (a store opened to read never starts
one) and stops at ``close``. A failed refill is raised to the takers waiting for it; the next
``take`` tries again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Final

from schemas.errors import KeyErased, StateUnavailable
from schemas.sealed import DataKey

__all__ = ["BATCH", "LOW", "SparePool"]

BATCH: Final = 256
"""Keys made durable per refill (one append of ~25 KB and one fsync; ~5 ms, mostly deriving keys)."""
LOW: Final = 192
"""A refill starts when fewer spares than this are left, so a burst of up to ``LOW`` new
conversations never waits (64 writers each starting a conversation at once take 64)."""


class SparePool:
    """This process's spare keys for ``make(n)`` (which returns ``n`` new keys once they are
    durable) and its conversations' in-memory bindings; see the module docstring."""

    def __init__(self, make: Callable[[int], list[DataKey]], *, name: str, batch: int = BATCH, low: int = LOW,
                 timeout: float = 30.0) -> None:
        if not 0 < low <= batch:
            raise ValueError(f"need 0 < low <= batch, not low={low} batch={batch}")
        self._make = make
        self._name = name
        self._batch = batch
        self._low = low
        self._timeout = timeout
        lock = threading.Lock()  # guards the state below; two conditions on it, so a take never wakes takers
        self._cond = threading.Condition(lock)  # takers wait here for spares
        self._need = threading.Condition(lock)  # the refiller waits here for a request
        self._spares: list[DataKey] = []
        self._bound: dict[str, DataKey] = {}
        self._wanted = False  # a taker asks for a refill (after a failed one: only then is it retried)
        self._error: BaseException | None = None  # the last refill's failure, until the next one succeeds
        self._closed = False
        self._thread: threading.Thread | None = None

    def bound(self, conversation_id: str) -> DataKey | None:
        with self._cond:
            return self._bound.get(conversation_id)

    def peek(self, conversation_id: str) -> DataKey | None:
        """``bound`` without the lock, for a store's fast path (one atomic dict lookup: a binding
        made or dropped concurrently may or may not be seen, as with the lock just before or after)."""
        return self._bound.get(conversation_id)

    def ready(self, conversation_id: str) -> bool:
        """Whether ``take(conversation_id)`` would answer now, without waiting for a refill."""
        with self._cond:
            return conversation_id in self._bound or bool(self._spares)

    def bindings(self) -> dict[str, DataKey]:
        with self._cond:
            return dict(self._bound)

    def take(self, conversation_id: str) -> DataKey:
        """``conversation_id``'s key: its binding, else the next spare, bound to it from now on.
        Waits (at most ``timeout``) only when no spare is left; raises what a failed refill
        raised, or ``StateUnavailable`` when closed or out of time."""
        with self._cond:
            key = self._bound.get(conversation_id)
            if key is not None:
                return key
            self._start()
            deadline = time.monotonic() + self._timeout
            while not self._spares:
                if self._closed:
                    raise StateUnavailable(f"the key store {self._name} is closed")
                if self._error is not None:
                    error, self._error = self._error, None
                    self._wanted = True  # the next taker's wait retries the refill
                    self._need.notify()
                    raise error
                self._wanted = True
                self._need.notify()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StateUnavailable(f"the key store {self._name} made no new data key within "
                                           f"{self._timeout:g} s; check its disk or broker, then retry")
                self._cond.wait(left)
                key = self._bound.get(conversation_id)
                if key is not None:  # a racing taker of the same conversation bound one meanwhile
                    return key
            key = self._spares.pop()
            self._bound[conversation_id] = key
            if len(self._spares) < self._low:
                self._need.notify()
            return key

    def create(self, conversation_id: str, *, erased: bool, own: list[DataKey] | None) -> DataKey:
        """Both stores' ``create`` rule, given what the store knows of the conversation (read
        under its lock): ``KeyErased`` once erased; its own key (a key record under its id, what
        releases before spares wrote: its records need it), else ``take``."""
        if erased:
            raise KeyErased(f"conversation {conversation_id!r} was erased: it never gets a key again",
                            conversation_id=conversation_id)
        if own:
            return own[0]
        return self.take(conversation_id)

    def listing(self, own: dict[str, list[DataKey]], spares: list[str],
                conversation_id: str | None) -> list[tuple[str, str]]:
        """Both stores' ``list_keys``, given what the store holds (copied under its lock): its
        conversations' own keys and its live spares' ids, each spare shown with the conversation
        this process bound it to, or ``""``."""
        bindings = {key.key_id: c for c, key in self.bindings().items()}
        pairs = [(c, k.key_id) for c, keys in own.items() for k in keys] + [(bindings.get(k, ""), k) for k in spares]
        return sorted(p for p in pairs if conversation_id is None or p[0] == conversation_id)

    def unbind(self, conversation_id: str) -> DataKey | None:
        with self._cond:
            return self._bound.pop(conversation_id, None)

    def _start(self) -> None:
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._refill, name=f"histlog-keys-{self._name}", daemon=True)
            self._thread.start()

    def _needed(self) -> bool:
        return self._wanted or (self._error is None and len(self._spares) < self._low)

    def _refill(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._needed():
                    self._need.wait()
                if self._closed:
                    return
                self._wanted = False
            try:
                made = self._make(self._batch)
                for key in made:
                    key.prepare()  # derived here, in one run: not by the first write under each key
            except BaseException as exc:  # raised to the takers waiting; never kills the thread
                with self._cond:
                    self._error = exc
                    self._cond.notify_all()
                continue
            with self._cond:
                self._error = None
                self._spares.extend(made)
                self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            self._need.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
