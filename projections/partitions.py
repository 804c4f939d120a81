"""What a partition's records wrote to the state, found and deleted as one unit.

A member of a cluster owns a changing subset of the log's partitions (docs/design.md §9);
admission never crosses partitions, because a conversation lives in one. So the state of a
partition is: the rows of its conversations (the partition of a conversation is
``schemas.records.partition_for_key``, as the log's), and the rows keyed by the partition
itself (``projections.keys``: checkpoints with admission's counters, poison, custom projection rows). No read
key carries the partition, so the reads and their costs are those of a full replica.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal, Protocol

from projections import feature_keys, keys
from projections.delivery import Deliveries
from projections.rows import Stats
from projections.store import StateStore, Tx
from projections.waiting import Wake
from schemas.errors import NotOwner
from schemas.records import partition_for_key

__all__ = ["Ownership", "PartitionState", "drop_partition"]

PartitionState = Literal["not_owned", "catching_up", "ready"]


def drop_partition(store: StateStore, tx: Tx, partition: int, partitions: int) -> None:
    """Add to ``tx`` the deletion of everything the records of ``partition`` wrote: its
    conversations' rows, its poison, checkpoints (of admission, with its counters, and of every
    custom projection) and the custom rows of its events. Committed in one WriteBatch, so a crash
    leaves the partition either whole or gone (and then rebuilt from offset 0 when taken again).
    Reads every conversation summary row once: a drop is rare, a read never pays for it."""
    snap = store.iterator()
    convs = [keys.read_conv_key(k) for k, _ in snap.scan(*keys.conversations_range())]
    for conv in convs:
        if partition_for_key(conv, partitions) == partition:
            tx.delete(keys.conv_key(conv))
            tx.delete(keys.open_key(conv))
            tx.delete(keys.erasing_key(conv))
            for lower, upper in [*keys.conversation_ranges(conv), keys.key_id_range(conv)]:
                tx.delete_range(lower, upper)
    tx.delete_range(*keys.poison_partition_range(partition))
    tx.delete_range(*feature_keys.graph_run_range(partition))
    checkpoints = [k for k, _ in snap.scan(keys.CHECKPOINT, keys.prefix_end(keys.CHECKPOINT))]
    for k in checkpoints:
        name, p = keys.read_checkpoint_key(k)
        if p == partition:
            tx.delete(k)
            tx.delete_range(*keys.custom_partition_keyspace(name, p))  # none for admission's own


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
    _applying: frozenset[int]  # ``_owned | _standby``: what a step applies and the cursor reads
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

    def assign(self, parts: Iterable[int], ends: Sequence[int]) -> None:
        """Take ``parts`` on: each resumes from its checkpoint, ``catching_up`` until it has
        applied ``ends[p]`` (the log end seen now). Returns at once; the projector catches up.
        A standby taken on is promoted where it stands: only the tail it had not applied yet."""
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
                self._applying = self._owned | self._standby
            if cold:
                self._unsynced |= cold
                self._replan = True
        if cold:
            self._wake_cursor()

    def revoke(self, parts: Iterable[int], *, drop: bool = False, standby: bool = False) -> None:
        """Give ``parts`` up (see the module): not served from the start of this call, not applied
        once it returns; ``drop`` deletes their state too (a later ``assign`` rebuilds from 0).
        ``standby``: go on applying them as a standby replica instead (never with ``drop``)."""
        gone = frozenset(parts)
        with self._cond:
            self._owned = self._owned - gone
            if standby:
                self._standby = self._standby | gone
            self._applying = self._owned | self._standby
            for p in gone:
                self._catching.pop(p, None)
                for _, _, wake in self._waiters[p]:
                    wake()
                self._waiters[p].clear()
            self._cond.notify_all()  # ``wait_offsets`` stops waiting for them
        self.deliveries.abandon(lambda key: partition_for_key(key, self.partitions) in gone)
        with self._step_lock:  # the step in progress ends first; later steps skip ``gone``
            self._dropped(gone, drop)
            self._replan = self._replan or not standby
        if not standby:
            self._wake_cursor()

    def add_standbys(self, parts: Iterable[int]) -> None:
        """Apply ``parts`` as a standby replica: from their checkpoints (offset 0 without state),
        kept current with the log, never served (their calls stay ``NotOwner``). Owned partitions
        and standbys already are left alone. Returns at once."""
        with self._step_lock:
            with self._cond:
                new = frozenset(parts) - self._applying
                if not new:
                    return
                self._standby = self._standby | new
                self._applying = self._owned | self._standby
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
            self._applying = self._owned | self._standby
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
