"""The projector runtime: consume the log in order, decide, project, checkpoint, wake writers.

One thread per engine consumes the partitions it owns (every partition unless told otherwise)
through a cursor. For each step (the records
one ``poll`` returned) it applies admission, the read projections and the new checkpoints in
**one RocksDB WriteBatch**; only after that write returns does it publish the applied offsets,
wake the readers waiting on those positions, hand each writer's ticket its decision and each
subscription the step's accepted events (``projections.delivery``). A waiter checks under the
same lock the projector publishes under, so no wake-up is lost.

A step that applies clears destroys their keys, then hands their compaction to the eraser
(``projections.eraser``), which publishes their decisions, and the positions from theirs on
(``projections.waiting``), once it is done; the step's other decisions are published at once.

Poison records are decided as ``corrupt`` by admission: counted, quarantined, skipped; the
checkpoint moves past them, so they never cause a crash loop. A failure of the state store
itself stops the projector (``failure``): waiters are woken and get the error.

**Owned partitions** (a cluster member, docs/design.md §9). ``assign`` takes partitions on: each
resumes from its own checkpoint and is ``catching_up`` until it has applied the log end seen at
``assign``, then ``ready``. ``revoke`` stops serving them at once (``partition_state`` says
``not_owned``, waiters on them raise ``NotOwner``, writers waiting for a decision on them get
none: ``CommitUnconfirmed``, since their record is in the log and its new owner decides it), then
waits for the step in progress, after which no step applies them; ``drop=True`` deletes their
state in one WriteBatch. ``add_standbys`` applies partitions without serving them (a standby
replica: their calls stay ``NotOwner``, their events go to no subscription); ``assign`` promotes
a standby where it stands, so taking it on costs only the tail it had not applied. The cursor
follows the owned and standby sets on the projector thread (a Kafka consumer is not
thread-safe): records of a partition not applied, or taken on but not yet re-positioned at its
checkpoint, are skipped, never applied out of order.

About 500 lines on purpose: the step, the custom projections' catch-up and the lifecycle share
one lock and one set of offsets; the owned-partition and waiting halves already live apart
(``projections.partitions``, ``projections.waiting``).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from projections import erasure, keys, snapshots
from projections.admission import Decision, Known, Outcome, Own, admit
from projections.custom import Projection, ProjectionTx, check_name, keyspace
from projections.delivery import Deliveries, Subscription, Ticket
from projections.eraser import Eraser, incomplete
from projections.erasure import DataKeys
from projections.events import ClearEvent, ProjectedEvent
from projections.partition_state import CORE, scratch_prefix
from projections.partitions import Ownership, PartitionState
from projections.rows import Stats, checkpoint_value, read_checkpoint_stats
from projections.store import DamagedState, StateStore, Tx
from projections.waiting import Positions, Wake
from schemas.errors import DuplicateProjection, LogUnavailable, ProjectionError, StateUnavailable
from schemas.positions import LogPosition
from schemas.records import KEY_SEPARATOR, read_record_conv

__all__ = ["CORE", "CursorLike", "PartitionState", "Projector", "RecordLike", "checkpoints", "scratch_prefix"]

log = logging.getLogger("histlog.projector")

_POLL_TIMEOUT = 0.5
_MAX_RECORDS = 2000
_EMPTY_READS = 100  # catch-up retries of an empty read before giving up (about 10 s)


class RecordLike(Protocol):
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes: ...
    @property
    def value(self) -> bytes: ...


class CursorLike(Protocol):
    def poll(self, timeout: float, max_records: int = ...) -> Sequence[RecordLike]: ...
    def assign(self, start: Mapping[int, int]) -> None: ...
    def wakeup(self) -> None: ...
    def close(self) -> None: ...


def checkpoints(store: StateStore, partitions: int, name: str = CORE) -> list[int]:
    """The next offset to apply, per partition, of the named checkpoint (0 when new)."""
    out = []
    for p in range(partitions):
        raw = store.get(keys.checkpoint_key(name, p))
        out.append(keys.read_u64(raw) if raw else 0)
    return out


ReadFn = Callable[[int, int, int], Sequence[RecordLike]]
"""``read(partition, from_offset, max_records)``: records of one partition (the log's ``read``)."""
ProgressFn = Callable[[int, int], None]


class Projector(Ownership, Positions):
    """Applies log records to a ``StateStore``; thread-safe to wait on and to read stats from."""

    def __init__(self, store: StateStore, partitions: int, owned: Iterable[int] | None = None,
                 keys_: DataKeys | None = None) -> None:
        """``keys_`` opens sealed content and destroys a cleared conversation's keys
        (``projections.erasure``); None: an engine of plain records only (a sealed one stops the
        projector with ``KeyStoreDamaged``)."""
        self.store = store
        self.keys = keys_
        self.partitions = partitions
        self._owned = frozenset(range(partitions)) if owned is None else frozenset(owned)
        self._standby: frozenset[int] = frozenset()
        self._restoring: frozenset[int] = frozenset()
        self._applying = self._owned
        self._catching: dict[int, int] = {}  # taken on -> the log end seen then, until applied reaches it
        self._unsynced: set[int] = set()  # taken on; the cursor is not yet positioned at its checkpoint
        self._replan = False  # the cursor must follow ``_applying`` (done on the projector thread)
        self.applied_records = [0] * partitions
        """Records applied per partition since this projector started (what a resume re-applied)."""
        self._cond = threading.Condition()
        # Readers waiting on one position each: (offset, seq, wake) heaps per partition, so a step
        # wakes exactly the waiters it applied instead of every waiting thread.
        self._waiters: list[list[tuple[int, int, Wake]]] = [[] for _ in range(partitions)]
        self._waiter_seq = 0
        snapshots.recover(store, partitions)  # a restore cut short by a kill: dropped, never half-installed
        self._applied = checkpoints(store, partitions)
        self._stats = [read_checkpoint_stats(store.get(keys.checkpoint_key(CORE, p))) for p in range(partitions)]
        self.deliveries = Deliveries()
        self._eraser = Eraser(store)
        self._erasing: list[dict[int, int]] = [{} for _ in range(partitions)]
        self._erase_jobs = itertools.count()
        self._thread: threading.Thread | None = None
        self._cursor: CursorLike | None = None
        self._stopping = False
        self._known: Known = {}
        self._step_lock = threading.Lock()  # one step at a time; custom projections go live under it
        self._live: dict[str, Projection] = {}
        self._registering: collections.Counter[str] = collections.Counter()  # names being caught up
        self.projection_errors: dict[str, BaseException] = {}
        self.failure: BaseException | None = None
        self.poll_error: BaseException | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, open_cursor: Callable[[Mapping[int, int]], CursorLike]) -> None:
        """Open a cursor at the checkpoints and consume on a daemon thread until ``stop()``."""
        offsets = self.applied_offsets()
        self._cursor = open_cursor(dict(enumerate(offsets)))
        if self._applying != frozenset(range(self.partitions)):
            self._cursor.assign({p: offsets[p] for p in self._applying})
        self._thread = threading.Thread(target=self._run, name="histlog-projector", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        cursor = self._cursor
        if cursor is not None:
            cursor.wakeup()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._eraser.stop()  # the erasures queued are finished (their clears answered) first
        self.deliveries.stop()
        if cursor is not None:
            cursor.close()
            self._cursor = None

    def _run(self) -> None:
        cursor = self._cursor
        assert cursor is not None  # Invariant: start() sets the cursor before the thread runs.
        while not self._stopping:
            try:
                self._follow(cursor)
                records = cursor.poll(_POLL_TIMEOUT, _MAX_RECORDS)
            except Exception as e:  # the log is unavailable: keep the error visible, retry
                if self.poll_error is None:
                    log.warning("projector cannot read the log (will retry): %s", e)
                self.poll_error = e
                with self._cond:
                    self._cond.wait(1.0)  # back-off before the next poll, not synchronisation
                continue
            self.poll_error = None
            if records:
                try:
                    self.apply(records)
                except BaseException as e:
                    log.exception("projector stopped: the state store failed")
                    with self._cond:
                        self.failure = e
                        self._cond.notify_all()
                        for heap in self._waiters:
                            for _, _, wake in heap:
                                wake()
                            heap.clear()
                    self.deliveries.fail(self._failed_now)
                    return

    # -- the step ----------------------------------------------------------------------------
    def apply(self, records: Sequence[RecordLike]) -> None:
        """Apply one step atomically and publish it. Records already applied are ignored."""
        with self._step_lock:
            self._apply(records)

    def _apply(self, records: Sequence[RecordLike]) -> None:
        tx = self.store.tx()
        live = dict(self._live)
        step_txs: dict[tuple[str, int], ProjectionTx] = {}
        stats = list(self._stats)
        applied = list(self._applied)
        counted = [0] * self.partitions
        applying, unsynced, standby = self._applying, self._unsynced, self._standby
        decided: list[tuple[LogPosition, bytes, Decision]] = []
        events: list[ProjectedEvent] = []
        want_events = bool(live) or self.deliveries.wants_events
        for r in records:
            p, o = r.partition, r.offset
            if o < applied[p] or p not in applying or p in unsynced:
                continue  # Invariant: replays after a seek never apply a record twice, nor skip one.
            if not counted[p]:
                stats[p] = stats[p].copy()
            counted[p] += 1
            position = LogPosition(p, o)
            decision, event = admit(tx, stats[p], position, r.key, r.value, known=self._known,
                                    want_event=want_events, keys_=self.keys)
            if event is not None:
                self._feed(live, step_txs, tx, event)
                events.append(event)
            applied[p] = o + 1
            decided.append((position, r.key, decision))
        if not decided:
            return
        for (name, _), ptx in step_txs.items():
            if name in live:
                ptx.commit()
        for p in range(self.partitions):
            if applied[p] != self._applied[p]:
                tx.put(keys.checkpoint_key(CORE, p), checkpoint_value(applied[p], stats[p]))
                for name in live:
                    tx.put(keys.checkpoint_key(name, p), checkpoint_value(applied[p]))
        cleared = {position.partition for position, _, d in decided if d.outcome is Outcome.CLEARED}
        unseen = erasure.forget_unseen(self.store, tx, cleared, {CORE, *live, *self._registering}) if cleared else []
        tx.commit()
        decided = self._erase(decided, live, unseen)
        for name in set(self._live) - set(live):  # failed in this step
            del self._live[name]
        with self._cond:
            self._applied = applied
            self._stats = stats
            self.applied_records = [a + n for a, n in zip(self.applied_records, counted, strict=True)]
            for p in [p for p, end in self._catching.items() if applied[p] >= end]:
                del self._catching[p]
            self._wake_locked()
        if standby and events:  # a standby's events are its owner's to deliver
            events = [e for e in events if e.position.partition not in standby]
        self.deliveries.publish(decided, events)

    def _erase(self, decided: list[tuple[LogPosition, bytes, Decision]], live: Mapping[str, Projection],
               unseen: Sequence[tuple[bytes, bytes]]) -> list[tuple[LogPosition, bytes, Decision]]:
        """Begin the erasure of the conversations this step cleared (and of those whose erasure
        is still pending, cleared again: that clear too returns once it is done): their keys are destroyed
        here, between steps (``erasure.destroy_keys``), and the rest (the compaction) is handed to
        the eraser (``projections.eraser``), which publishes their decisions once it is done
        (``clear`` returns once its conversation is forgotten); returned: the step's other
        decisions, to publish now. ``unseen``: the rows of projections that did not see the step,
        deleted by it (``erasure.forget_unseen``). A failure leaves them closed and pending: their
        decisions say why, and the next ``clear`` or open retries."""
        cleared = [i for i, (_, key, d) in enumerate(decided) if d.outcome is Outcome.CLEARED or (
            d.outcome is Outcome.DUPLICATE and key.endswith(KEY_SEPARATOR)  # a clear of a closed conversation
            and self.store.get(keys.erasing_key(read_record_conv(key))) is not None)]  # while its erasure is pending
        # Deletes that removed messages: their rows' files are compacted too, before their writers hear.
        deleted = [i for i, (_, _, d) in enumerate(decided) if d.outcome is Outcome.DELETED and d.removed]
        if not cleared and not deleted:
            return decided
        out = list(decided)
        convs: list[bytes] = []
        used: dict[bytes, list[str]] = {}
        extra: list[tuple[bytes, bytes]] = []
        if cleared:
            convs = list(dict.fromkeys(read_record_conv(decided[i][1]) for i in cleared))
            parts = {decided[i][0].partition for i in cleared}
            extra = [*(keys.custom_partition_keyspace(name, p) for name in live for p in parts), *unseen]
            try:
                used = erasure.destroy_keys(self.store, self.keys, convs)
            except Exception as e:
                log.warning("the erasure of %d cleared conversation(s) did not complete (%s); they are closed, and "
                            "the next clear of each, or the next open, completes it", len(cleared), e)
                for i, failed in zip(cleared, incomplete([decided[i] for i in cleared], e), strict=True):
                    out[i] = failed
                convs, extra, cleared = [], [], []
                if not deleted:
                    return out
        held = [*cleared, *deleted]
        compacted = list(dict.fromkeys(read_record_conv(decided[i][1]) for i in deleted))
        job = next(self._erase_jobs)
        with self._cond:
            self._hold_locked(job, [decided[i][0] for i in held])
        self._eraser.submit(convs, used, extra, [out[i] for i in held], lambda done: self._erased(job, done),
                            compacted)
        kept = set(held)
        return [d for i, d in enumerate(out) if i not in kept]

    def _erased(self, job: int, decided: Sequence[tuple[LogPosition, bytes, Decision]]) -> None:
        """The eraser finished ``job``: its clears are applied now, and their writers answered."""
        self._release(job)
        self.deliveries.publish(decided, ())

    def complete_erasures(self, convs: Sequence[bytes] | None = None) -> None:
        """Complete the erasures left pending (all of them, or those of ``convs``) by a crash or
        an error; raises what the key store or RocksDB raised. Waits for the eraser's erasure in
        progress; the keys are destroyed between steps, like a step's."""
        if convs is not None and not any(self.store.get(keys.erasing_key(c)) is not None for c in convs):
            return  # nothing pending: a point read each, no lock (a repeated clear)
        with self._eraser.lock:
            with self._step_lock:
                waiting = erasure.pending(self.store) if convs is None else [
                    c for c in convs if self.store.get(keys.erasing_key(c)) is not None]
                if not waiting:
                    return
                used = erasure.destroy_keys(self.store, self.keys, waiting)
            # every custom projection's rows, with a checkpoint or not (forget_unseen deletes both)
            erasure.finish(self.store, waiting, used, [(keys.CUSTOM, keys.prefix_end(keys.CUSTOM))])

    def _feed(self, live: dict[str, Projection], step_txs: dict[tuple[str, int], ProjectionTx], tx: Tx,
              event: ProjectedEvent) -> None:
        """Give one accepted event to every live custom projection; a projection that raises is
        dropped from this step (its writes with it) and stops until it is registered again."""
        for name, projection in list(live.items()):
            at = (name, event.position.partition)
            ptx = step_txs.get(at)
            if ptx is None:
                ptx = step_txs[at] = ProjectionTx(tx, *at)
            try:
                projection.apply(event, ptx)
            except Exception as e:
                log.exception("custom projection %r failed at %s; it is stopped until registered again",
                              name, event.position)
                self.projection_errors[name] = e
                del live[name]

    # -- custom projections --------------------------------------------------------------------
    def register(self, projection: Projection, read: ReadFn, *, progress: ProgressFn | None = None) -> None:
        """Catch ``projection`` up from its checkpoint and make it live (applied in every step).

        Catch-up replays the log from offset 0 through a scratch admission state (only admission
        knows which records were accepted), delivering accepted events at or after the
        projection's checkpoint; each catch-up step writes the projection's rows and checkpoint in
        one WriteBatch. It goes live under the step lock once it has reached the core checkpoint.
        """
        name = check_name(getattr(projection, "name", None))
        with self._step_lock:
            if name in self._live:
                if self._live[name] is projection:
                    return
                raise DuplicateProjection(f"a projection named {name!r} is already registered; choose another name")
            self._registering[name] += 1  # a clear meanwhile leaves its rows: the catch-up delivers the ClearEvent
        try:
            self.projection_errors.pop(name, None)
            scratch_dir = Path(tempfile.mkdtemp(prefix=scratch_prefix(self.store.path), dir=self.store.path.parent))
            scratch = StateStore(scratch_dir)
            try:
                cleared = self._catch_up(projection, name, scratch, read, progress)
            finally:
                scratch.close()
                StateStore.destroy(scratch_dir)
        finally:
            with self._step_lock:
                self._registering -= collections.Counter([name])
        if cleared:  # what it deleted of cleared conversations leaves the files too (erasure)
            self.store.compact([keys.custom_keyspace(name)])

    def _catch_up(self, projection: Projection, name: str, scratch: StateStore, read: ReadFn,
                  progress: ProgressFn | None) -> bool:
        """Replay into ``projection`` until it is live; True when it was given a ``ClearEvent``."""
        start = checkpoints(self.store, self.partitions, name)
        cleared = False
        done = [0] * self.partitions  # next offset of the scratch admission, per partition
        while True:
            targets = self.applied_offsets()
            owned = self.applying  # a standby's custom rows are kept current too
            total = sum(targets[p] for p in owned)
            for p in sorted(owned):
                empty_reads = 0
                while done[p] < targets[p]:
                    records = [r for r in read(p, done[p], _MAX_RECORDS) if r.offset < targets[p]]
                    if not records:
                        # A broker may answer empty for a moment (leader change): retry, bounded.
                        empty_reads += 1
                        if empty_reads > _EMPTY_READS:
                            raise LogUnavailable(f"the log has no records at {p}:{done[p]} although they "
                                               "were applied; is the log reachable, and is this state "
                                               "from this log?")
                        with self._cond:
                            self._cond.wait(0.1)  # back-off between retries, not synchronisation
                        continue
                    empty_reads = 0
                    cleared |= self._catch_up_step(projection, name, scratch, records, start[p])
                    done[p] = records[-1].offset + 1
                    if progress is not None:
                        progress(sum(done), total)
            with self._step_lock:
                applied = self.applied_offsets()
                if any(done[p] > applied[p] for p in self._applying):
                    raise ProjectionError(f"a partition was dropped while projection {name!r} caught up; "
                                          "register it again")
                if all(done[p] == applied[p] for p in self._applying):
                    self._live[name] = projection
                    return cleared

    def _catch_up_step(self, projection: Projection, name: str, scratch: StateStore,
                       records: Sequence[RecordLike], start: int) -> bool:
        admission_tx, tx = scratch.tx(), self.store.tx()
        cleared = False
        ptx = ProjectionTx(tx, name, records[-1].partition)
        for r in records:
            deliver = r.offset >= start
            _, event = admit(admission_tx, Stats(), LogPosition(r.partition, r.offset), r.key, r.value,
                             want_event=deliver, keys_=self.keys)
            if event is not None:
                cleared |= isinstance(event, ClearEvent)
                try:
                    projection.apply(event, ptx)
                except Exception as e:
                    self.projection_errors[name] = e
                    raise ProjectionError(f"custom projection {name!r} failed at {event.position}: {e!r}; "
                                       "fix it and register it again (it resumes from its checkpoint)") from e
        last = records[-1]
        if last.offset + 1 > start:
            ptx.commit()
            tx.put(keys.checkpoint_key(name, last.partition), checkpoint_value(last.offset + 1))
            tx.commit()
        admission_tx.commit()
        return cleared

    def drop(self, name: str) -> None:
        """Stop ``name`` and delete its state and checkpoints (``rebuild`` starts from here)."""
        with self._step_lock:
            self._live.pop(name, None)
            tx = self.store.tx()
            tx.delete_range(*keyspace(name))
            for p in range(self.partitions):
                tx.delete(keys.checkpoint_key(name, p))
            tx.commit()

    def has_checkpoint(self, name: str) -> bool:
        return any(True for _ in self.store.iterator().scan(*keys.checkpoint_range(name)))

    # -- waiting and reading -----------------------------------------------------------------
    def expect(self, key: bytes, value: bytes | None = None, own: Own | None = None) -> Ticket:
        """Tell the projector that this process is about to append a record under ``key`` (take
        this before producing it): the ticket answers the decision for the position the append
        returns (``Ticket.wait``, or ``Ticket.watch`` from an event loop) until it is released.
        With ``own`` (the event, plain form and validated batch that ``value`` encodes), a record
        of exactly these bytes under ``key`` is admitted without decoding, opening or parsing them
        again (``admission.Known``); the entry is dropped when the ticket is released, so the
        memory held is bounded by the appends in flight."""
        if value is None or own is None:
            return self.deliveries.take(key)
        entry = (key, value)
        self._known[entry] = own
        try:
            return self.deliveries.take(key, lambda: self._known.pop(entry, None))
        except BaseException:
            self._known.pop(entry, None)
            raise

    @contextlib.contextmanager
    def expecting(self, key: bytes, value: bytes | None = None, own: Own | None = None) -> Iterator[Ticket]:
        """``expect`` for the duration of a ``with`` block."""
        ticket = self.expect(key, value, own)
        try:
            yield ticket
        finally:
            ticket.release()

    def subscribe(self, capacity: int) -> Subscription:
        """A subscription to the accepted events of every step committed from now on
        (``projections.delivery.Subscription``)."""
        with self._step_lock:  # between two steps: ``start`` is exact
            return self.deliveries.subscribe(capacity, self.applied_offsets())

    def failed(self) -> StateUnavailable | None:
        """Why the projector stopped (a ``StateUnavailable`` to raise), or None while it runs."""
        if self.failure is None:
            return None
        kind = type(self.failure) if isinstance(self.failure, StateUnavailable) else StateUnavailable  # DamagedState
        err = kind(f"the projector stopped because the state store failed ({self.failure}); "
                   "close and reopen the engine (a damaged state is rebuilt from the log)")
        if isinstance(err, DamagedState) and isinstance(self.failure, DamagedState):
            err.detail = self.failure.detail
        err.__cause__ = self.failure
        return err

    def stats(self) -> Stats:
        with self._cond:
            return Stats.total([self._stats[p] for p in sorted(self._owned)])

    def _failed_now(self) -> StateUnavailable:
        err = self.failed()
        assert err is not None  # Invariant: called only once ``failure`` is set.
        return err
