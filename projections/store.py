"""RocksDB access for projections: raw mode only (never pickle), one atomic WriteBatch per step.

``StateStore`` owns the ``Rdict``. ``Tx`` is one projector step: reads see the step's own
earlier writes (an overlay over the database), and ``commit()`` writes everything, including
the checkpoints, in one ``db.write(WriteBatch)`` so a crash can never leave a projection
ahead of or behind admission or its checkpoint.

RocksDB reports every failure as a plain ``Exception`` with its status text; this module is the
one place that translates them (``_translate``):

* the environment refuses (another process holds the lock, the disk is full, a file is too
  large, permission denied, a read-only file system): ``StateUnavailable``; the state is kept,
  fix the cause and reopen;
* anything else (``Corruption: ...``, a missing ``CURRENT``/``MANIFEST``, a truncated ``.sst``):
  ``DamagedState`` (a ``StateUnavailable``). A damage found after opening is remembered in a
  marker file, so the next open rebuilds the state from the log instead of failing again.

A store that is closed releases the database even while a ``Snapshot`` (say, one held by an
exception's traceback) is still referenced: ``close`` detaches every live snapshot's iterator,
the last thing that would keep RocksDB's lock.
"""

from __future__ import annotations

import shutil
import weakref
from bisect import bisect_left, bisect_right
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

from rocksdict import (
    BlockBasedOptions,
    BottommostLevelCompaction,
    CompactOptions,
    Options,
    Rdict,
    WriteBatch,
    WriteOptions,
)

from schemas.errors import InvalidConfiguration, StateUnavailable

__all__ = ["DAMAGED_MARKER", "DamagedState", "StateStore", "Tx"]

DAMAGED_MARKER = "HISTLOG-DAMAGED"
"""A file in the state directory: a damage was found after opening; rebuild on the next open."""

_ENVIRONMENT = ("no space left", "file too large", "permission denied", "read-only file system",
                "too many open files", "disk quota")
"""RocksDB status texts of an environment that refuses, not of a damaged state."""


class DamagedState(StateUnavailable):
    """The state's files are damaged or incomplete (``Corruption``, missing ``CURRENT`` or
    ``MANIFEST``, a truncated table file). It is derived from the log: reopening the engine
    rebuilds it (``HistoryEngine.open`` does so by itself). ``detail`` is RocksDB's own words."""

    def __init__(self, message: str, *, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


def _translate(e: Exception, path: Path, doing: str) -> StateUnavailable:
    """The typed error for a RocksDB failure while ``doing`` something with the state at ``path``."""
    text = " ".join(str(e).split())
    low = text.lower()
    if "lock" in low and ("hold" in low or "lock file" in low or "resource temporarily" in low):
        err = StateUnavailable(f"the state in {path} is in use by another process (or another engine in "
                               "this one); stop it, or give this instance its own state directory")
    elif any(word in low for word in _ENVIRONMENT):
        err = StateUnavailable(f"{doing} the state in {path} failed ({text}); free disk space or fix the "
                               "permissions, then reopen the engine (the log is unaffected)")
    else:
        err = DamagedState(f"{doing} the state in {path} failed: it is damaged ({text}); reopen the engine "
                           "and the state is rebuilt from the log (or run `histlog rebuild`)", detail=text)
    err.__cause__ = e
    return err


def _options() -> Options:
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.increase_parallelism(2)
    opts.set_write_buffer_size(64 << 20)  # replays write a lot at once: fewer, larger flushes
    # Roll the MANIFEST at every change of the file set: it names each table file with its first
    # and last key, which may hold erased content (an external id) until it is rewritten; rolled,
    # it keeps only the live files' (a few hundred bytes per flush or compaction).
    opts.set_max_manifest_file_size(1)
    table = BlockBasedOptions()
    table.set_bloom_filter(10, False)  # most receipt lookups miss: answer them from the filter
    opts.set_block_based_table_factory(table)
    return opts


class StateStore:
    """The RocksDB directory of one engine instance (``path/state`` or the Kafka ``state_dir``).

    Opening raises ``InvalidConfiguration`` (the path is a file), ``StateUnavailable`` (in use,
    disk full, permissions) or ``DamagedState`` (the files are damaged, or a damage was found
    while it was last used); nothing is left open when it raises.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        if path.exists() and not path.is_dir():
            raise InvalidConfiguration(f"the state directory {path} is a file; give a directory (it is created "
                                       "if missing)")
        if (path / DAMAGED_MARKER).exists():
            found = (path / DAMAGED_MARKER).read_text(errors="replace").strip()
            raise DamagedState(f"the state in {path} was found damaged while it was last used ({found}); "
                               "reopen the engine and the state is rebuilt from the log", detail=found)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StateUnavailable(f"cannot create the state directory {path} ({e.strerror or e}); "
                                   "fix the path or its permissions") from e
        try:
            self.db = Rdict(str(path), _options())
        except Exception as e:  # rocksdict raises a plain Exception with RocksDB's status text
            raise _translate(e, path, "opening") from e
        self._write_opts = WriteOptions()  # no sync: the log is the durable truth (see docs)
        self._snapshots: weakref.WeakSet[Snapshot] = weakref.WeakSet()
        self._closed = False
        self.keys_read = 0
        """Keys that queries (``Snapshot``) have visited: what cost tests count instead of time.
        Exact for one thread; concurrent queries may lose an increment."""

    @staticmethod
    def destroy(path: Path) -> None:
        """Delete a state directory (it is rebuilt from the log on the next open). Raises
        ``StateUnavailable`` when it cannot be deleted whole: a half-deleted state is never reused."""
        try:
            shutil.rmtree(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise StateUnavailable(f"cannot delete the state directory {path} ({e.strerror or e}: "
                                   f"{e.filename}); delete it by hand, then reopen") from e

    def failed(self, e: Exception, doing: str) -> StateUnavailable:
        """The typed error for a RocksDB failure of this open store; a damage is remembered so the
        next open rebuilds the state instead of meeting it again."""
        err = _translate(e, self.path, doing)
        if isinstance(err, DamagedState):
            try:
                (self.path / DAMAGED_MARKER).write_text(" ".join(str(e).split()) + "\n")
            except OSError:
                pass  # the error below is raised anyway; the next open meets the damage itself
        return err

    def get(self, key: bytes) -> bytes | None:
        try:
            value: bytes | None = self.db.get(key)
        except Exception as e:
            raise self.failed(e, "reading") from e
        return value

    def put(self, key: bytes, value: bytes) -> None:
        """One write outside a projector step (metadata at open)."""
        try:
            self.db.put(key, value, self._write_opts)
        except Exception as e:
            raise self.failed(e, "writing") from e

    def compact(self, ranges: list[tuple[bytes, bytes]]) -> None:
        """Make the deletions already committed in ``ranges`` physical (erasure,
        ``projections.erasure``): flush the memtable to a table file, which retires the WAL that
        held the deleted rows (RocksDB deletes a WAL once every row of it is in a table file; it
        never recycles or archives one here), then compact each ``[lower, upper)`` to the last
        level, where deleted rows and their tombstones are dropped, so no file of the state
        holds them any more. Files a live ``Snapshot`` still pins stay until it is released
        (queries hold one only while they run)."""
        try:
            self.db.flush(True)
            options = CompactOptions()
            options.set_bottommost_level_compaction(BottommostLevelCompaction.force())
            options.set_exclusive_manual_compaction(False)
            for lower, upper in self._joined(ranges):
                self.db.compact_range(lower, upper, options)
            self.db.flush_wal(True)
        except Exception as e:
            raise self.failed(e, "compacting") from e

    def _joined(self, ranges: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """``ranges`` sorted, with neighbours joined when no live key lies between them: one
        manual compaction per run of adjacent ranges instead of one per range (each rewrites
        every file its range overlaps, so the erasure of many conversations whose rows sit side
        by side, a ``clear_prefix``, rewrote the same files once per conversation and keyspace:
        8.1 s for 1,000 conversations). A gap is checked with one seek; joining never changes
        what the compaction keeps, only what it reads."""
        it = self.db.iter()
        try:
            out: list[tuple[bytes, bytes]] = []
            for lower, upper in sorted(ranges):
                if out and lower <= out[-1][1]:
                    out[-1] = (out[-1][0], max(out[-1][1], upper))
                    continue
                if out:
                    it.seek(out[-1][1])
                    if not it.valid() or it.key() >= lower:  # nothing live between the two
                        out[-1] = (out[-1][0], max(out[-1][1], upper))
                        continue
                out.append((lower, upper))
            return out
        finally:
            del it

    def iterator(self) -> Snapshot:
        snap = Snapshot(self)
        self._snapshots.add(snap)
        return snap

    def tx(self) -> Tx:
        return Tx(self)

    def close(self) -> None:
        """Release the database (idempotent). Live snapshots are detached first, so no iterator
        keeps RocksDB's lock; a failure to flush raises ``StateUnavailable`` after the release
        (the log is the truth: nothing acknowledged depends on the flush)."""
        if self._closed:
            return
        self._closed = True
        for snap in list(self._snapshots):
            snap.detach()
        try:
            self.db.close()
        except Exception as e:
            raise _translate(e, self.path, "closing") from e
        finally:
            del self.db  # the last reference: RocksDB releases its lock now, not at garbage collection


class Snapshot:
    """A point-in-time view: one RocksDB iterator (it pins the state at creation) used for
    every seek and point read of one query, so a query never mixes two projector steps.
    Because there is one iterator, a ``get`` (or another scan) moves it: never call one while a
    ``scan`` generator is still being consumed; collect the scan first, or stop after the get."""

    __slots__ = ("__weakref__", "_it", "_store")

    def __init__(self, store: StateStore) -> None:
        self._store = store
        self._it: Any = store.db.iter()  # an RdictIter, or a _Detached once the store closed

    def detach(self) -> None:
        """Drop the iterator (the store is closing); a later use raises ``StateUnavailable``."""
        self._it = _Detached()

    def get(self, key: bytes) -> bytes | None:
        it = self._it
        try:
            it.seek(key)
            self._store.keys_read += 1
            if not it.valid():
                self._check()
                return None
            if it.key() == key:
                value: bytes = it.value()
                return value
            return None
        finally:
            del it  # Invariant: no frame of a traceback keeps the iterator (and so RocksDB's lock).

    def floor(self, lower: bytes, key: bytes) -> tuple[bytes, bytes] | None:
        """The greatest key ``<= key`` and ``>= lower`` with its value, or None; visits one key."""
        it = self._it
        try:
            it.seek_for_prev(key)
            self._store.keys_read += 1
            if not it.valid():
                self._check()
                return None
            k: bytes = it.key()
            return (k, it.value()) if k >= lower else None
        finally:
            del it  # Invariant: no frame of a traceback keeps the iterator (and so RocksDB's lock).

    def _check(self) -> None:
        """An iterator that stops being valid has either reached the end or failed (an I/O error,
        an incomplete read): never let a failure pass for the end of the data."""
        try:
            self._it.status()
        except Exception as e:  # rocksdict raises a plain Exception with RocksDB's status text
            if "incomplete" in str(e).lower():  # a bounded read gave up: the query's failure, not damage
                raise StateUnavailable(f"reading the state store failed ({e}); retry the read") from e
            raise self._store.failed(e, "reading") from e

    def scan(self, lower: bytes, upper: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Keys in ``[lower, upper)`` in key order."""
        it, store = self._it, self._store
        try:
            it.seek(lower)
            while it.valid():
                store.keys_read += 1
                k: bytes = it.key()
                if k >= upper:
                    return
                yield k, it.value()
                it.next()
            self._check()
        finally:
            del it  # Invariant: no frame of a traceback keeps the iterator (and so RocksDB's lock).

    def scan_reverse(self, lower: bytes, upper: bytes) -> Generator[tuple[bytes, bytes], None, None]:
        """Keys in ``[lower, upper)`` in reverse key order."""
        it, store = self._it, self._store
        try:
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
        finally:
            del it  # Invariant: no frame of a traceback keeps the iterator (and so RocksDB's lock).


class _Detached:
    """The iterator of a snapshot whose store was closed: every use says so."""

    def __getattr__(self, name: str) -> Any:
        raise StateUnavailable("this engine's state store is closed; open a new engine")


_UNSET = object()


class Tx:
    """One projector step: an overlay of pending writes over the store, committed atomically.

    Writes reach the WriteBatch at ``commit`` (or before a ``delete_range``, which must follow
    them), one per key: a key written twice in a step (a conversation's summary row, once per
    batch of it in the step) costs the batch one entry, not two."""

    __slots__ = ("_batch", "_fresh", "_hi", "_lo", "_order", "_pending", "_store", "_unwritten")

    def __init__(self, store: StateStore) -> None:
        self._store = store
        self._batch = WriteBatch(raw_mode=True)
        self._pending: dict[bytes, bytes | None] = {}  # what reads see: None is deleted
        self._unwritten: dict[bytes, bytes | None] = {}  # not in the batch yet
        # The ranges deleted in this step, joined: sorted, disjoint ``[_lo[i], _hi[i])``, so a read
        # checks one with a bisection (a step of N clears deletes 9 N ranges).
        self._lo: list[bytes] = []
        self._hi: list[bytes] = []
        # The pending keys in order, made at the step's first range delete and kept from then on
        # (``_fresh``: those written since, sorted in at the next one), so a range delete finds
        # the pending keys it covers by bisection, not by a walk over every pending key.
        self._order: list[bytes] | None = None
        self._fresh: list[bytes] = []

    def _covered(self, key: bytes) -> bool:
        """Whether a range deleted in this step holds ``key``."""
        i = bisect_right(self._lo, key) - 1
        return i >= 0 and key < self._hi[i]

    def get(self, key: bytes) -> bytes | None:
        value = self._pending.get(key, _UNSET)
        if value is not _UNSET:
            return value  # type: ignore[return-value]
        if self._lo and self._covered(key):
            return None
        return self._store.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        self._pending[key] = self._unwritten[key] = value
        if self._order is not None:
            self._fresh.append(key)

    def delete(self, key: bytes) -> None:
        self._pending[key] = self._unwritten[key] = None
        if self._order is not None:
            self._fresh.append(key)

    def _write(self) -> None:
        """Move the unwritten writes into the batch (their order is free: one entry per key)."""
        batch = self._batch
        for k, v in self._unwritten.items():
            if v is None:
                batch.delete(k)
            else:
                batch.put(k, v)
        self._unwritten.clear()

    def delete_range(self, lower: bytes, upper: bytes) -> None:
        """Delete ``[lower, upper)``, including this step's pending writes in it."""
        self._write()  # the writes before the range delete stay before it
        order = self._order
        if order is None:
            order = self._order = sorted(self._pending)
        elif self._fresh:
            order += self._fresh  # sorted runs: the sort merges them in linear time
            order.sort()
            self._fresh = []
        i, j = bisect_left(order, lower), bisect_left(order, upper)
        for k in order[i:j]:  # a key written twice since the last range delete is listed twice
            self._pending.pop(k, None)
        del order[i:j]
        self._batch.delete_range(lower, upper)
        lo, hi = self._lo, self._hi
        a, b = bisect_left(hi, lower), bisect_right(lo, upper)  # the joined ranges it meets or touches
        if a < b:
            lower, upper = min(lower, lo[a]), max(upper, hi[b - 1])
        lo[a:b], hi[a:b] = [lower], [upper]

    def scan(self, lower: bytes, upper: bytes) -> list[tuple[bytes, bytes]]:
        """Committed keys in ``[lower, upper)`` merged with this step's pending writes."""
        merged: dict[bytes, bytes | None] = {
            k: v for k, v in self._store.iterator().scan(lower, upper)
            if not self._covered(k)
        }
        for k, v in self._pending.items():
            if lower <= k < upper:
                merged[k] = v
        return sorted((k, v) for k, v in merged.items() if v is not None)

    def commit(self) -> None:
        """Write the step atomically; a RocksDB failure raises ``StateUnavailable`` (or
        ``DamagedState``), with nothing of the step applied."""
        self._write()
        if not self._batch.is_empty():
            try:
                self._store.db.write(self._batch, self._store._write_opts)
            except Exception as e:
                raise self._store.failed(e, "writing") from e
        self._pending.clear()
        self._lo.clear()
        self._hi.clear()
        self._order = None
        self._fresh = []
