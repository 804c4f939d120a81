"""RocksDB access for projections: raw mode only (never pickle), one atomic WriteBatch per step.

``StateStore`` owns the ``Rdict``. ``Tx`` is one projector step: reads see the step's own
earlier writes (an overlay over the database), and ``commit()`` writes everything, including
the checkpoints, in one ``db.write(WriteBatch)`` so a crash can never leave a projection
ahead of or behind admission or its checkpoint.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

from rocksdict import BlockBasedOptions, Options, Rdict, WriteBatch, WriteOptions

from schemas.errors import HistoryError, InvalidConfiguration, StateUnavailable

__all__ = ["StateStore", "Tx"]


def _options() -> Options:
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.increase_parallelism(2)
    opts.set_write_buffer_size(64 << 20)  # replays write a lot at once: fewer, larger flushes
    table = BlockBasedOptions()
    table.set_bloom_filter(10, False)  # most receipt lookups miss: answer them from the filter
    opts.set_block_based_table_factory(table)
    return opts


class StateStore:
    """The RocksDB directory of one engine instance (``path/state`` or the Kafka ``state_dir``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        if path.exists() and not path.is_dir():
            raise InvalidConfiguration(f"the state directory {path} is a file; give a directory (it is created "
                                       "if missing)")
        path.mkdir(parents=True, exist_ok=True)
        try:
            self.db = Rdict(str(path), _options())
        except Exception as e:  # rocksdict raises a plain Exception with RocksDB's status text
            if "lock" in str(e).lower():
                raise StateUnavailable(f"the state in {path} is in use by another process (or another engine in "
                                       "this one); stop it, or give this instance its own state directory") from e
            raise
        self._write_opts = WriteOptions()  # no sync: the log is the durable truth (see docs)
        self.keys_read = 0
        """Keys that queries (``Snapshot``) have visited: what cost tests count instead of time.
        Exact for one thread; concurrent queries may lose an increment."""

    @staticmethod
    def destroy(path: Path) -> None:
        """Delete a state directory (it is rebuilt from the log on the next open)."""
        shutil.rmtree(path, ignore_errors=True)

    def get(self, key: bytes) -> bytes | None:
        value: bytes | None = self.db.get(key)
        return value

    def iterator(self) -> Snapshot:
        return Snapshot(self)

    def tx(self) -> Tx:
        return Tx(self)

    def close(self) -> None:
        self.db.close()


class Snapshot:
    """A point-in-time view: one RocksDB iterator (it pins the state at creation) used for
    every seek and point read of one query, so a query never mixes two projector steps.
    Because there is one iterator, a ``get`` (or another scan) moves it: never call one while a
    ``scan`` generator is still being consumed; collect the scan first, or stop after the get."""

    __slots__ = ("_it", "_store")

    def __init__(self, store: StateStore) -> None:
        self._store = store
        self._it = store.db.iter()

    def get(self, key: bytes) -> bytes | None:
        it = self._it
        it.seek(key)
        self._store.keys_read += 1
        if not it.valid():
            self._check()
            return None
        if it.key() == key:
            value: bytes = it.value()
            return value
        return None

    def _check(self) -> None:
        """An iterator that stops being valid has either reached the end or failed (an I/O error,
        an incomplete read): never let a failure pass for the end of the data."""
        try:
            self._it.status()
        except Exception as e:  # rocksdict raises a plain Exception with RocksDB's status text
            raise HistoryError(f"reading the state store failed ({e}); close and reopen the engine "
                               "(a damaged state is rebuilt from the log if you delete it)") from e

    def scan(self, lower: bytes, upper: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Keys in ``[lower, upper)`` in key order."""
        it, store = self._it, self._store
        it.seek(lower)
        while it.valid():
            store.keys_read += 1
            k: bytes = it.key()
            if k >= upper:
                return
            yield k, it.value()
            it.next()
        self._check()

    def scan_reverse(self, lower: bytes, upper: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Keys in ``[lower, upper)`` in reverse key order."""
        it, store = self._it, self._store
        it.seek_for_prev(upper)
        while it.valid():
            store.keys_read += 1
            k: bytes = it.key()
            if k < lower:
                return
            if k < upper:
                yield k, it.value()
            it.prev()
        self._check()


class Tx:
    """One projector step: an overlay of pending writes over the store, committed atomically."""

    __slots__ = ("_batch", "_deleted", "_pending", "_store")

    def __init__(self, store: StateStore) -> None:
        self._store = store
        self._batch = WriteBatch(raw_mode=True)
        self._pending: dict[bytes, bytes | None] = {}
        self._deleted: list[tuple[bytes, bytes]] = []

    def get(self, key: bytes) -> bytes | None:
        if key in self._pending:
            return self._pending[key]
        for lower, upper in self._deleted:
            if lower <= key < upper:
                return None
        return self._store.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        self._pending[key] = value
        self._batch.put(key, value)

    def delete(self, key: bytes) -> None:
        self._pending[key] = None
        self._batch.delete(key)

    def delete_range(self, lower: bytes, upper: bytes) -> None:
        """Delete ``[lower, upper)``, including this step's pending writes in it."""
        for k in [k for k in self._pending if lower <= k < upper]:
            del self._pending[k]
        self._deleted.append((lower, upper))
        self._batch.delete_range(lower, upper)

    def scan(self, lower: bytes, upper: bytes) -> list[tuple[bytes, bytes]]:
        """Committed keys in ``[lower, upper)`` merged with this step's pending writes."""
        merged: dict[bytes, bytes | None] = {
            k: v for k, v in self._store.iterator().scan(lower, upper)
            if not any(lo <= k < up for lo, up in self._deleted)
        }
        for k, v in self._pending.items():
            if lower <= k < upper:
                merged[k] = v
        return sorted((k, v) for k, v in merged.items() if v is not None)

    def commit(self) -> None:
        if not self._batch.is_empty():
            self._store.db.write(self._batch, self._store._write_opts)
        self._pending.clear()
        self._deleted.clear()
