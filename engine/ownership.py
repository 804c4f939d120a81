"""The partitions a ``HistoryEngine`` owns, and the ones it keeps as standby replicas (a cluster
member, docs/design.md §9, docs/cluster.md "Standby replicas"). A mixin of the facade: each
call checks its arguments, then hands the change to the projector (``projections.partitions``),
which says what is promised.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from engine.arguments import check_partitions
from projections.runtime import PartitionState
from schemas.errors import InvalidConfiguration

if TYPE_CHECKING:
    from engine.log.base import Log
    from projections.runtime import Projector

__all__ = ["EnginePartitions"]


class EnginePartitions:
    """``owned``, ``assign``, ``revoke`` and the standbys (``HistoryEngine``'s)."""

    _log: Log
    _projector: Projector

    _check_open: Callable[[], None]  # HistoryEngine's (engine.reading)

    @property
    def owned(self) -> frozenset[int]:
        """The partitions this engine applies and serves (all of them unless opened with ``owned``)."""
        return self._projector.owned

    def partition_state(self, partition: int) -> PartitionState:
        """``"not_owned"``, ``"catching_up"`` (taken on, not yet at the log end seen at ``assign``:
        its calls raise ``NotReady``) or ``"ready"``."""
        (p,) = check_partitions([partition], self._log.partitions)
        return self._projector.partition_state(p)

    def assign(self, parts: Iterable[int], *, hold: bool = False) -> None:
        """Take partitions on: each resumes from its own checkpoint (offset 0 without state) and is
        ``catching_up`` until it has applied the log end seen now, then ``ready``. Returns at once
        (the projector catches up in the background); partitions owned already are left alone.
        ``hold=True``: those that are not standbys are not applied until ``release`` (still
        ``catching_up``), so a snapshot can be restored into them first (``restore_partition``)."""
        owned = check_partitions(parts, self._log.partitions)
        if not isinstance(hold, bool):
            raise InvalidConfiguration(f"assign(hold=...) takes a bool, got {hold!r}")
        self._check_open()
        self._projector.assign(owned, self._log.end_offsets(), hold=hold)

    def release(self, parts: Iterable[int]) -> None:
        """Start applying partitions held by ``assign`` or ``add_standbys`` (``hold=True``), from
        their checkpoints (a restored snapshot's, or offset 0). Others are left alone."""
        held = check_partitions(parts, self._log.partitions)
        self._check_open()
        self._projector.release(held)

    # -- state snapshots (docs/cluster.md "State snapshots") --------------------------------------
    def partition_snapshot(self, partition: int) -> Iterator[bytes]:
        """What this state holds of ``partition`` as a snapshot stream (``projections.snapshots``:
        one point in time, its rows and its checkpoint), owned, standby or only kept; ``NotFound``
        when it holds nothing of it. For another member's ``restore_partition``."""
        (p,) = check_partitions([partition], self._log.partitions)
        self._check_open()
        return self._projector.snapshot(p)

    @property
    def snapshots_sending(self) -> int:
        """How many ``partition_snapshot`` streams are being read now (from their first chunk
        until their last, or until they are closed)."""
        return self._projector.snapshots_sending

    def restore_partition(self, partition: int, chunks: Iterable[bytes]) -> int:
        """Install a peer's snapshot of a partition held by ``assign`` or ``add_standbys``
        (``hold=True``), verified first (``SnapshotRejected`` naming the check that failed:
        nothing installed); returned: its checkpoint offset, where ``release`` resumes. The tail
        after it comes from the log, so the state equals a rebuild; ``NotOwner`` if the
        partition was revoked (the standby removed) meanwhile."""
        (p,) = check_partitions([partition], self._log.partitions)
        self._check_open()
        return self._projector.restore(p, chunks, self._log.end_offsets()[p])

    def revoke(self, parts: Iterable[int], drop: bool = False, *, standby: bool = False) -> None:
        """Give partitions up. Their calls raise ``NotOwner`` from the moment this begins; it
        returns once the projector no longer applies them. A write of this engine still waiting
        for its decision on one raises ``CommitUnconfirmed`` (its record is in the log; the new
        owner decides it: resend the same batch there). ``drop=True`` also deletes their state
        (one WriteBatch), so a later ``assign`` rebuilds them from offset 0; otherwise it stays
        and a later ``assign`` resumes from its checkpoint. ``standby=True``: keep applying them
        as a standby replica (``add_standbys``) instead of stopping."""
        gone = check_partitions(parts, self._log.partitions)
        if not isinstance(drop, bool) or not isinstance(standby, bool):
            raise InvalidConfiguration(f"revoke(drop=..., standby=...) take bools, got {drop!r}, {standby!r}")
        if drop and standby:
            raise InvalidConfiguration("revoke(drop=True, standby=True): a standby keeps its state; choose one")
        self._check_open()
        self._projector.revoke(gone, drop=drop, standby=standby)

    # -- standby replicas (a cluster member with --standbys, docs/cluster.md) ---------------------
    @property
    def standbys(self) -> frozenset[int]:
        """The partitions this engine applies as a standby replica: kept current with the log,
        never served (their calls raise ``NotOwner``; their events reach no subscription)."""
        return self._projector.standbys

    def add_standbys(self, parts: Iterable[int], *, hold: bool = False) -> None:
        """Apply ``parts`` as standbys, each from its own checkpoint (offset 0 without state).
        Returns at once. An ``assign`` of a standby later costs only the tail it had not applied.
        Partitions owned or standby already are left alone. ``hold=True``: not applied until
        ``release``, so a snapshot can be restored into them first (``restore_partition``)."""
        new = check_partitions(parts, self._log.partitions)
        if not isinstance(hold, bool):
            raise InvalidConfiguration(f"add_standbys(hold=...) takes a bool, got {hold!r}")
        self._check_open()
        self._projector.add_standbys(new, hold=hold)

    def remove_standbys(self, parts: Iterable[int], drop: bool = False) -> None:
        """Stop applying the standbys ``parts`` (others are left alone); returns once no step
        applies them. ``drop=True`` also deletes their state (one WriteBatch)."""
        gone = check_partitions(parts, self._log.partitions)
        if not isinstance(drop, bool):
            raise InvalidConfiguration(f"remove_standbys(drop=...) takes a bool, got {drop!r}")
        self._check_open()
        self._projector.remove_standbys(gone, drop=drop)

    def applied_offsets(self) -> list[int]:
        """The next offset the state applies, per partition (owned, standby or kept): read from
        memory, never a call to the log (``stats()`` asks the log for its ends)."""
        return self._projector.applied_offsets()
