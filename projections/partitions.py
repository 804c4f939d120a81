"""Which partitions a projector applies and serves: owned ones, standbys, and how each one taken
on catches up (``Ownership``, half of ``projections.runtime.Projector``).

A member of a cluster owns a changing subset of the log's partitions (docs/design.md §9);
admission never crosses partitions, because a conversation lives in one, so a partition's state
is a unit (``projections.partition_state``) that can be applied, dropped, or copied from a peer
(``projections.snapshots``). No read key carries the partition, so the reads and their costs are
those of a full replica.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Literal, Protocol

from projections import snapshots
from projections.delivery import Deliveries
from projections.partition_state import CORE, drop_partition, partition_rows, scratch_prefix
from projections.rows import Stats
from projections.store import StateStore
from projections.waiting import Wake
from schemas.errors import NotFound, NotOwner
from schemas.records import partition_for_key

__all__ = ["Ownership", "PartitionState", "drop_partition", "partition_rows"]  # the last two: partition_state's

PartitionState = Literal["not_owned", "catching_up", "ready"]


class _Cursor(Protocol):
    def assign(self, start: Mapping[int, int]) -> None: ...
    def wakeup(self) -> None: ...


class Ownership:
    """The owned-partitions half of ``projections.runtime.Projector`` (its module says what is
    promised): which partitions the projector applies and serves, and how each one taken on
    catches up. ``_owned`` and ``_catching`` change under ``_cond`` (a reader's ``partition_state``
    is never torn); ``assign`` also holds the step lock, and ``revoke`` takes it right after, so a
    step applies one owned set and none runs past a revoke's return."""

    store: StateStore
    partitions: int
    deliveries: Deliveries
    _cond: threading.Condition
    _step_lock: threading.Lock
    _applied: list[int]
    _stats: list[Stats]
    _waiters: list[list[tuple[int, int, Wake]]]
    _cursor: _Cursor | None
    _owned: frozenset[int]
    _standby: frozenset[int]  # applied, not served (a standby replica); disjoint from ``_owned``
    _applying: frozenset[int]  # ``(_owned | _standby) - _restoring``: what a step applies and the cursor reads
    _restoring: frozenset[int]  # held (owned or standby), not applied yet: its state comes from a peer (``restore``)
    _catching: dict[int, int]  # taken on -> the log end seen then, until applied reaches it
    _unsynced: set[int]  # taken on; the cursor is not yet positioned at its checkpoint
    _replan: bool  # the cursor must follow ``_owned`` (done on the projector thread)

    def _follow(self, cursor: _Cursor) -> None:
        """Between two steps, on the projector thread: give the cursor the owned set, each
        partition at its applied offset (exact here: no step runs)."""
        with self._step_lock:
            if not self._replan:
                return
            cursor.assign({p: self._applied[p] for p in self._applying})
            self._replan = False
            self._unsynced.clear()

    @property
    def owned(self) -> frozenset[int]:
        with self._cond:
            return self._owned

    @property
    def standbys(self) -> frozenset[int]:
        """The partitions applied as a standby replica: kept current, never served."""
        with self._cond:
            return self._standby

    @property
    def applying(self) -> frozenset[int]:
        """What the projector applies: the owned partitions and the standbys."""
        with self._cond:
            return self._applying

    def partition_state(self, partition: int) -> PartitionState:
        with self._cond:
            if partition not in self._owned:
                return "not_owned"
            return "catching_up" if partition in self._catching else "ready"

    def serving_all(self) -> bool:
        """Every partition is owned and ready (a full replica: nothing to check per call)."""
        with self._cond:
            return not self._catching and len(self._owned) == self.partitions

    def assign(self, parts: Iterable[int], ends: Sequence[int], *, hold: bool = False) -> None:
        """Take ``parts`` on: each resumes from its checkpoint, ``catching_up`` until it has
        applied ``ends[p]`` (the log end seen now). Returns at once; the projector catches up.
        A standby taken on is promoted where it stands: only the tail it had not applied yet.
        ``hold``: the others are not applied yet either (still ``catching_up``) until ``release``,
        so that ``restore`` can first install a snapshot of them."""
        with self._step_lock:
            new = frozenset(parts) - self._owned
            if not new:
                return
            with self._cond:
                cold = new - self._standby
                for p in new:
                    if self._applied[p] < ends[p]:
                        self._catching[p] = ends[p]
                self._owned = self._owned | new
                self._standby = self._standby - new
                if hold:
                    self._restoring = self._restoring | cold
                self._applying = (self._owned | self._standby) - self._restoring
            if cold and not hold:
                self._unsynced |= cold
                self._replan = True
        if cold and not hold:
            self._wake_cursor()

    def release(self, parts: Iterable[int]) -> None:
        """Start applying the partitions held by ``assign`` or ``add_standbys`` (``hold=True``):
        from their checkpoints (a snapshot's, once ``restore`` installed it; else offset 0).
        Others are left alone."""
        with self._step_lock:
            with self._cond:
                gone = frozenset(parts) & self._restoring
                if not gone:
                    return
                self._restoring = self._restoring - gone
                self._applying = (self._owned | self._standby) - self._restoring
            self._unsynced |= gone
            self._replan = True
        self._wake_cursor()

    def restore(self, partition: int, chunks: Iterable[bytes], log_end: int) -> int:
        """Install a peer's snapshot of ``partition`` (``projections.snapshots``: verified in a
        scratch store first; ``SnapshotRejected`` leaves the state as it was), which must be held
        by ``assign(hold=True)`` or ``add_standbys(hold=True)``; returned: the snapshot's
        checkpoint, where ``release`` resumes. ``NotOwner`` when the partition was revoked (or
        the standby removed) meanwhile: nothing installed. ``log_end``: the partition's end in
        this log; a snapshot beyond it is of another log, refused."""
        with self._cond:
            if partition not in self._restoring:
                raise NotOwner(f"partition {partition} is not held for a restore here: take it on with "
                               "assign(..., hold=True) first")
        scratch_dir = Path(tempfile.mkdtemp(prefix=scratch_prefix(self.store.path), dir=self.store.path.parent))
        scratch = StateStore(scratch_dir)
        try:
            received = snapshots.receive(scratch, chunks, partition=partition, partitions=self.partitions, core=CORE)
            if received.offset > log_end:
                raise snapshots.SnapshotRejected(f"snapshot of partition {partition} is at offset {received.offset}, "
                                                 f"beyond this log's end {log_end}: it is not of this log")
            with self._step_lock:  # no step runs; it does not apply the partition anyway
                with self._cond:
                    if partition not in self._restoring:
                        raise self._not_owner(partition)
                stats = snapshots.install(self.store, scratch, received, self.partitions, CORE)
                with self._cond:
                    self._applied[partition] = received.offset
                    self._stats[partition] = stats
                    if self._catching.get(partition, received.offset + 1) <= received.offset:
                        del self._catching[partition]
                    self._cond.notify_all()
            return received.offset
        finally:
            scratch.close()
            StateStore.destroy(scratch_dir)

    def snapshot(self, partition: int) -> Iterator[bytes]:
        """The snapshot of what this state holds of ``partition`` (``projections.snapshots``),
        whether owned, a standby or only kept; ``NotFound`` when it holds nothing of it."""
        with self._cond:
            if self._applied[partition] == 0 or partition in self._restoring:
                raise NotFound(f"this member holds no state of partition {partition}: ask another member")
        return self._sending_one(snapshots.stream(self.store, partition, self.partitions, CORE))

    _sending = 0  # snapshots being read by peers now (from their first chunk until the last or a close)

    @property
    def snapshots_sending(self) -> int:
        """How many snapshots (``snapshot``) are being sent now."""
        with self._cond:
            return self._sending

    def _sending_one(self, chunks: Iterator[bytes]) -> Iterator[bytes]:
        with self._cond:
            self._sending += 1
        try:
            yield from chunks
        finally:
            with self._cond:
                self._sending -= 1

    def revoke(self, parts: Iterable[int], *, drop: bool = False, standby: bool = False) -> None:
        """Give ``parts`` up (see the module): not served from the start of this call, not applied
        once it returns; ``drop`` deletes their state too (a later ``assign`` rebuilds from 0).
        ``standby``: go on applying them as a standby replica instead (never with ``drop``)."""
        gone = frozenset(parts)
        with self._cond:
            self._owned = self._owned - gone
            held = gone & self._restoring  # a restore in flight installs nothing; as a standby: replayed
            self._restoring = self._restoring - gone
            if standby:
                self._standby = self._standby | gone
            self._applying = (self._owned | self._standby) - self._restoring
            for p in gone:
                self._catching.pop(p, None)
                for _, _, wake in self._waiters[p]:
                    wake()
                self._waiters[p].clear()
            self._cond.notify_all()  # ``wait_offsets`` stops waiting for them
        self.deliveries.abandon(lambda key: partition_for_key(key, self.partitions) in gone)
        with self._step_lock:  # the step in progress ends first; later steps skip ``gone``
            self._dropped(gone, drop)
            resumed = held if standby else frozenset()  # not read by the cursor yet: position it
            self._unsynced |= resumed
            self._replan = self._replan or not standby or bool(resumed)
        if not standby or resumed:
            self._wake_cursor()

    def add_standbys(self, parts: Iterable[int], *, hold: bool = False) -> None:
        """Apply ``parts`` as a standby replica: from their checkpoints (offset 0 without state),
        kept current with the log, never served (their calls stay ``NotOwner``). Owned partitions
        and standbys already are left alone. Returns at once. ``hold``: not applied until
        ``release``, so that ``restore`` can first install a snapshot of them (as ``assign``'s)."""
        with self._step_lock:
            with self._cond:
                new = frozenset(parts) - self._owned - self._standby
                if not new:
                    return
                self._standby = self._standby | new
                if hold:
                    self._restoring = self._restoring | new
                self._applying = (self._owned | self._standby) - self._restoring
            if hold:
                return
            self._unsynced |= new
            self._replan = True
        self._wake_cursor()

    def remove_standbys(self, parts: Iterable[int], *, drop: bool = False) -> None:
        """Stop applying the standbys ``parts`` (others are left alone); not applied once this
        returns. ``drop`` deletes their state too."""
        with self._cond:
            gone = frozenset(parts) & self._standby
            if not gone:
                return
            self._standby = self._standby - gone
            self._restoring = self._restoring - gone  # a restore in flight installs nothing
            self._applying = (self._owned | self._standby) - self._restoring
        with self._step_lock:
            self._dropped(gone, drop)
            self._replan = True
        self._wake_cursor()

    def _dropped(self, gone: frozenset[int], drop: bool) -> None:
        """Under the step lock: delete the state of ``gone`` when ``drop`` (one WriteBatch)."""
        if drop and gone:
            tx = self.store.tx()
            for p in sorted(gone):
                drop_partition(self.store, tx, p, self.partitions)
            tx.commit()
            with self._cond:
                for p in gone:
                    self._applied[p] = 0
                    self._stats[p] = Stats()

    def check_owned(self, key: bytes) -> None:
        """``NotOwner`` unless the partition of the record ``key`` is owned. A writer calls this
        after taking its ticket: a revoke either sees the ticket (and abandons it) or began
        before, and then this refuses the write."""
        owned = self._owned  # one read of an immutable set
        if len(owned) < self.partitions:
            p = partition_for_key(key, self.partitions)
            if p not in owned:
                raise self._not_owner(p)

    def _wake_cursor(self) -> None:
        cursor = self._cursor
        if cursor is not None:
            cursor.wakeup()

    def _not_owner(self, partition: int) -> NotOwner:
        return NotOwner(f"this engine does not own partition {partition} (owned: {sorted(self._owned)}); "
                        "ask its owner")
