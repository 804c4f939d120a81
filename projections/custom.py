"""Custom projections: your own read models, built from the same accepted events.

Subclass ``Projection``, give it a stable ``name`` and an ``apply(event, tx)``::

    class MessageCount(Projection):
        name = "message-count"

        def apply(self, event: ProjectedEvent, tx: ProjectionTx) -> None:
            key = event.conversation_id.encode()
            if isinstance(event, ClearEvent):
                tx.delete(key)
                return
            if isinstance(event, MessagesDeleted):  # stored messages deleted (delete_messages)
                return
            n = int(tx.get(key) or b"0") + len(event.messages)
            if isinstance(event, TurnReplacedEvent):  # an edit or retry hid a turn
                n -= len(event.hidden_seqs)
            tx.put(key, str(n).encode())

Promises (docs/design.md §5.4; the README's "Writing a custom projection"):

* ``apply`` sees only accepted events (``BatchEvent``, ``ClearEvent``, ``TurnReplacedEvent``,
  ``MessagesDeleted``: the ids of the stored messages a delete removed, visible or hidden),
  each once, in log order per partition; duplicates, conflicts, rejected appends, refused
  preconditions and replacements, and poison are never delivered.
* ``tx`` writes go into the projection's own keyspace, in the **same RocksDB WriteBatch** as the
  projection's checkpoint (and, once it is live, as admission's), so a crash can never leave
  the projection ahead of or behind its checkpoint.
* ``engine.register(p)`` catches it up from its checkpoint (offset 0 the first time) and keeps
  it live; ``engine.rebuild(name)`` replays it from offset 0; ``engine.view(name)`` reads it.
* A projection's state is split by partition, as the history's is: ``tx`` reads and writes the
  rows of the event's own partition, so a partition taken away from this engine is dropped with
  its rows (``engine.revoke(p, drop=True)``). Key your rows by conversation (a conversation lives
  in one partition) and nothing changes; a key that events of several partitions write (a count
  over every conversation) is one row per partition (``view.rows(key)``; ``view.get`` refuses it).
  ``view`` reads the partitions this engine owns.
* If ``apply`` raises, the projection stops (its writes for that step are dropped and its
  checkpoint stays before the event), the error is kept (``view`` and ``register`` report it),
  and the engine goes on: one buggy read model never blocks the history.
* A ``clear`` forgets in a projection that does not see it (not registered, or stopped): its
  rows and checkpoint in the conversation's partition are deleted with the clear, so registering
  it again replays that partition from the log's start (``projections.erasure.forget_unseen``).
"""

from __future__ import annotations

import abc
import heapq
from collections.abc import Callable, Iterable
from typing import ClassVar

from projections import keys
from projections.events import ProjectedEvent
from projections.store import StateStore, Tx
from schemas.errors import InvalidProjection, ProjectionError

__all__ = ["Projection", "ProjectionTx", "ProjectionView", "check_name", "keyspace"]

_MAX_NAME_BYTES = 200
RESERVED = {"core"}


def check_name(name: object) -> str:
    """A projection name: a non-empty str without NUL/control characters, at most 200 bytes."""
    if not isinstance(name, str) or not name:
        raise InvalidProjection(f"a projection needs a non-empty str `name` class attribute, got {name!r}")
    if any(ord(ch) < 0x20 for ch in name) or len(name.encode("utf-8")) > _MAX_NAME_BYTES:
        raise InvalidProjection(f"projection name {name!r} must have no control characters and at most "
                           f"{_MAX_NAME_BYTES} UTF-8 bytes")
    if name in RESERVED:
        raise InvalidProjection(f"projection name {name!r} is reserved; choose another")
    return name


keyspace = keys.custom_keyspace
"""``[lower, upper)`` of every state key of the projection ``name`` (the layout is ``keys``')."""


class Projection(abc.ABC):
    """Base class of custom projections (no required ``__init__`` arguments)."""

    name: ClassVar[str]

    @abc.abstractmethod
    def apply(self, event: ProjectedEvent, tx: ProjectionTx) -> None:
        """Fold one accepted event into the projection's state (through ``tx`` only)."""


class ProjectionTx:
    """A projection's view of one step on one partition's rows: reads see its own writes; writes
    commit atomically with its checkpoint. Keys and values are bytes; ``scan`` returns
    ``(key, value)`` in key order."""

    __slots__ = ("_lower", "_pending", "_tx", "_upper")

    def __init__(self, tx: Tx, name: str, partition: int) -> None:
        self._tx = tx
        self._lower, self._upper = keys.custom_partition_keyspace(name, partition)
        self._pending: dict[bytes, bytes | None] = {}

    def _key(self, key: bytes) -> bytes:
        if not isinstance(key, bytes | bytearray):
            raise TypeError(f"projection keys are bytes, got {type(key).__name__}")
        return self._lower + bytes(key)

    def get(self, key: bytes) -> bytes | None:
        k = self._key(key)
        if k in self._pending:
            return self._pending[k]
        return self._tx.get(k)

    def put(self, key: bytes, value: bytes) -> None:
        if not isinstance(value, bytes | bytearray):
            raise TypeError(f"projection values are bytes, got {type(value).__name__}")
        self._pending[self._key(key)] = bytes(value)

    def delete(self, key: bytes) -> None:
        self._pending[self._key(key)] = None

    def scan(self, prefix: bytes = b"") -> list[tuple[bytes, bytes]]:
        lower = self._key(prefix)
        upper = keys.prefix_end(lower)
        merged = dict(self._tx.scan(lower, upper))
        for k, v in self._pending.items():
            if lower <= k < upper:
                if v is None:
                    merged.pop(k, None)
                else:
                    merged[k] = v
        cut = len(self._lower)
        return [(k[cut:], v) for k, v in sorted(merged.items())]

    def commit(self) -> None:
        """Move this step's writes into the shared transaction (after ``apply`` succeeded)."""
        for k, v in self._pending.items():
            if v is None:
                self._tx.delete(k)
            else:
                self._tx.put(k, v)
        self._pending.clear()


class ProjectionView:
    """Read-only access to a projection's state as of the last applied event, over the rows of
    the partitions ``partitions()`` names (those the engine owns)."""

    def __init__(self, store: StateStore, name: str, partitions: Callable[[], Iterable[int]]) -> None:
        self._store = store
        self._name = name
        self._partitions = partitions

    def _lowers(self) -> list[bytes]:
        return [keys.custom_partition_keyspace(self._name, p)[0] for p in sorted(self._partitions())]

    def rows(self, key: bytes) -> dict[int, bytes]:
        """``{partition: value}`` of the row ``key`` in each owned partition that holds it: what a
        key written by the events of several partitions (a count over every conversation) is."""
        snap = self._store.iterator()
        out = {}
        for p in sorted(self._partitions()):
            value = snap.get(keys.custom_partition_keyspace(self._name, p)[0] + key)
            if value is not None:
                out[p] = value
        return out

    def get(self, key: bytes) -> bytes | None:
        """The row ``key``, or None. A key held by several partitions has no one value: that is
        ``ProjectionError`` (read ``rows(key)`` and combine them); a row keyed by conversation is
        always in one partition."""
        found = self.rows(key)
        if len(found) > 1:
            raise ProjectionError(f"projection {self._name!r} holds key {key!r} in partitions {sorted(found)}: "
                                  "its state is split by partition; read view.rows(key) and combine the values")
        return next(iter(found.values()), None)

    def scan(self, prefix: bytes = b"") -> list[tuple[bytes, bytes]]:
        """``(key, value)`` pairs whose key starts with ``prefix``, in key order (a detached list;
        a key written by events of two partitions appears once per partition)."""
        snap = self._store.iterator()
        runs = []
        for lower in self._lowers():
            cut = len(lower)
            runs.append([(k[cut:], v) for k, v in snap.scan(lower + prefix, keys.prefix_end(lower + prefix))])
        return list(heapq.merge(*runs, key=lambda kv: kv[0]))
