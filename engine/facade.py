"""``HistoryEngine``: the public facade over a log and the projector (docs/design.md §1, §4).
One method per row of the API contract, each with the docstring that states its promise: here
opening, owned partitions, writes, stats, custom projections, subscriptions and the lifecycle;
the reads and the guards every call passes are its base class ``engine.reading.EngineReads``.
Every method is a few lines of checks and one call; the argument rules, refusals, the write path
and the opening of the log and state live in ``engine.arguments``, ``engine.refusals``,
``engine.writes``, ``engine.state``.

Write path of ``append``: validate (before any I/O) → fast path from local state (admission's
own pre-check, ``projections.admission.precheck``: a known receipt, a closure or a refusal that
no later record can change answers without touching the log) → take a ticket for the record
key, append the event to the log → the ticket answers with the projector's decision for *that*
position (a racing writer elsewhere may have won: then it is a conflict) → ``engine.refusals``
turns the decision into the receipt or the exception, the same for both paths.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from engine.arguments import (
    EMPTY,
    Empty,
    check_clear_prefix,
    check_directory,
    check_partitions,
    check_timeout,
)
from engine.checkpoints import EngineCheckpoints
from engine.keys import KeyStore, master_key_from
from engine.log.base import Log
from engine.log.file import FsyncPolicy
from engine.ownership import EnginePartitions
from engine.runs import EngineRuns
from engine.state import open_file_parts, open_kafka_parts, open_key_store
from engine.writes import Writes, receipt_of
from projections.custom import Projection, ProjectionView
from projections.delivery import DEFAULT_BUFFER, Subscription
from projections.reads import Reads
from projections.runtime import PartitionState, Projector
from projections.store import DamagedState, StateStore
from schemas.batch import (
    Batch,
    Receipt,
)
from schemas.errors import (
    DuplicateProjection,
    HistoryError,
    InvalidConfiguration,
    InvalidProjection,
    LogUnavailable,
    NotFound,
    ProjectionError,
    StateUnavailable,
)
from schemas.runs import Fence
from schemas.slots import TurnSlot

__all__ = ["EMPTY", "EngineStats", "HistoryEngine", "PartitionState", "Progress"]

_Empty = Empty  # the name older code imported

log = logging.getLogger("histlog.engine")

Progress = Callable[[int, int], None]
"""Called with ``(applied, total)`` records while the state catches up with the log."""


@dataclass(frozen=True, slots=True)
class EngineStats:
    """Offsets per partition and admission outcome counts since the state was built.

    ``corrupt`` counts poison records skipped (undecodable, unknown schema, digest mismatch...);
    ``precondition_failed`` and ``not_replaceable`` count refused ``expected_last`` appends and
    turn replacements; ``cleared`` counts conversations cleared (erased) and ``erased`` the
    records met after their content was erased (a rebuild, or an instance behind a clear,
    applies them without effect). The counters and ``lag`` cover the partitions this engine owns
    (``owned_partitions``; a partition not owned shows lag 0); ``applied_since_open`` counts the
    records applied per partition since this engine opened (what a resume re-applied).
    """

    end_offsets: list[int]
    applied_offsets: list[int]
    lag: list[int]
    accepted: int
    duplicates: int
    conflicts: int
    rejected_closed: int
    corrupt: int
    precondition_failed: int = 0
    not_replaceable: int = 0
    owned_partitions: list[int] = field(default_factory=list)
    applied_since_open: list[int] = field(default_factory=list)
    cleared: int = 0
    erased: int = 0
    fenced: int = 0
    """Writes refused because a later ``begin_run`` of their conversation preceded them."""
    deleted: int = 0
    """Messages deleted (``delete_messages``), each once, visible or hidden then."""


class HistoryEngine(EngineRuns, EngineCheckpoints, EnginePartitions):
    """One history store: a log (file or Kafka) and this instance's RocksDB projections.

    Thread-safe: many threads may append and read at once. Use ``HistoryEngine.open``.
    """

    def __init__(self, log_: Log, store: StateStore, *, progress: Progress | None = None,
                 owned: Iterable[int] | None = None, keys: KeyStore | None = None, seal: bool = True) -> None:
        """Run the projector of ``store`` over ``log_`` (both already opened and checked, see
        ``engine.state``) for the ``owned`` partitions (None: all); the engine owns both (and
        ``keys``) from here and closes them if this raises.

        ``keys``: the key store sealed content is opened with and new content sealed under
        (``open`` gives one). Without one (an engine built by hand, e.g. over a ``MemoryLog``) the
        engine writes plain records and ``clear`` cannot erase what the log holds. ``seal=False``
        writes plain records even with a key store (see ``open``)."""
        self._log = log_
        self._store = store
        self._keys = keys
        self._projections: dict[str, Projection] = {}
        self._closed = False
        self._close_lock = threading.Lock()
        try:
            if owned is not None:
                owned = check_partitions(owned, log_.partitions)
            self._projector = Projector(store, log_.partitions, owned, keys)
            self._reads = Reads(store)
            self._writes = Writes(log_, store, self._projector, self._reads, self._check_open, lambda: self._closed,
                                  self._serve, keys if seal else None)
            self._projector.start(log_.cursor)
            self.catch_up(progress=progress)
            try:
                self._projector.complete_erasures()  # left pending by a crash or an error during a clear
            except HistoryError as e:
                log.warning("an erasure left pending by a previous run did not complete (%s); its conversations "
                            "stay closed, and the next clear of each completes it", e)
        except BaseException:
            self._release()
            raise

    # -- opening -------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path | None = None, *, partitions: int | None = None, fsync: FsyncPolicy = "always",
             kafka: str | None = None, topic: str = "histlog.events", state_dir: str | Path | None = None,
             replication_factor: int = 1, progress: Progress | None = None, rebuild: bool = False,
             accept_log_loss: bool = False, owned: Iterable[int] | None = None,
             master_key_file: str | Path | None = None, seal: bool = True) -> HistoryEngine:
        """Open the embedded default (``open(path)``: FileLog under ``path/log``, state under
        ``path/state``) or Kafka (``open(kafka="host:port", topic=..., state_dir=...)``).

        ``partitions``: the log's partition count when it is created (default 1); ``None`` opens
        an existing log with its own count, and a different number is refused (it would move
        conversations between partitions). Returns once the state has caught up with the log's end
        at open time (a first open of a long log replays it; ``progress`` reports how far).

        The state is opened first: its checkpoints are evidence of what the log acknowledged (see
        ``engine.state``). A damaged state is rebuilt from the log; a state ahead of a durable log
        (``fsync="always"``, Kafka) proves acknowledged records were lost and raises ``CorruptLog``,
        keeping the state, unless ``accept_log_loss=True``, which rebuilds from what the log still
        holds and logs what was lost. ``rebuild=True`` replaces the state by one replayed from the log.
        A ``path`` or ``state_dir`` that is (or lies under) a file is ``InvalidConfiguration``,
        before any I/O.

        ``owned``: the partitions this engine applies and serves (a cluster member; ``None``, the
        default: every partition). The others are ``NotOwner``; ``assign``/``revoke`` change the set.

        **Erasure** (docs/erasure.md): content is sealed under per-conversation data keys kept in
        a key store beside the log (``path/keys/``; on Kafka the compacted topic ``<topic>.keys``,
        created and checked), so ``clear`` erases it. ``master_key_file`` (default:
        ``$HISTLOG_MASTER_KEY_FILE``; ``histlog keygen FILE`` writes one) wraps the data keys at
        rest. ``seal=False`` writes plain records, which ``clear`` cannot erase from the log: for a
        fleet whose readers are not all upgraded yet (a reader before sealing reports sealed
        records as poison) and for benchmarks; every record, sealed or plain, is read either way.
        """
        for where in (path, state_dir):
            check_directory(where)
        if owned is not None:
            owned = check_partitions(owned, None)

        if kafka is None and path is None:
            raise InvalidConfiguration(
                "HistoryEngine.open needs a data directory (open('./data')) or kafka='host:port'")
        if kafka is not None and state_dir is None:
            raise InvalidConfiguration(
                "HistoryEngine.open(kafka=...) needs state_dir=DIR for this instance's RocksDB state")

        if not isinstance(seal, bool):
            raise InvalidConfiguration(f"open(seal=...) takes a bool, got {seal!r}")
        master = master_key_from(master_key_file)
        opened: list[KeyStore] = []  # the key store, opened once the log is (its errors are the clearer)

        def key_store() -> KeyStore:
            if not opened:
                opened.append(open_key_store(path, kafka, topic, replication_factor, master))
            return opened[0]

        def attempt() -> HistoryEngine:
            if kafka is not None:
                assert state_dir is not None  # Invariant: checked above.
                parts = open_kafka_parts(kafka, topic, Path(state_dir), partitions, replication_factor,
                                         rebuild=rebuild, accept_log_loss=accept_log_loss)
            else:
                assert path is not None  # Invariant: checked above.
                parts = open_file_parts(Path(path), partitions, fsync, rebuild=rebuild, accept_log_loss=accept_log_loss)
            try:
                keys = key_store()
            except BaseException:
                try:
                    parts[0].close()
                finally:
                    parts[1].close()
                raise
            return cls(*parts, progress=progress, owned=owned, keys=keys, seal=seal)

        try:
            try:
                return attempt()
            except DamagedState as e:
                # A damage met while opening (a read of the evidence, the catch-up) left its marker:
                # the second attempt rebuilds the state from the log, as a damage found by RocksDB's own
                # open already does (engine/state.py).
                log.warning("the state is damaged (%s): rebuilding it from the log", e.detail or e)
                opened.clear()  # the failed engine closed the key store with the rest
                return attempt()
        except BaseException:
            for store in opened:
                store.close()
            raise

    def catch_up(self, *, timeout: float | None = None, progress: Progress | None = None,
                 standbys: bool = False) -> bool:
        """Wait until the state has applied everything the log held when this was called, on
        the partitions this engine owns (and, with ``standbys=True``, on its standby replicas).

        ``timeout``: seconds (``None``, the default: until caught up); False when it ran out.
        """
        if timeout is not None:
            check_timeout(timeout)
        if not isinstance(standbys, bool):
            raise InvalidConfiguration(f"catch_up(standbys=...) takes a bool, got {standbys!r}")
        owned = self._projector.applying if standbys else self._projector.owned
        targets = [end if p in owned else 0 for p, end in enumerate(self._log.end_offsets())]
        if progress is None:
            return self._projector.wait_offsets(targets, timeout, standbys=standbys)
        def owned_applied() -> int:
            return sum(a for p, a in enumerate(self._projector.applied_offsets()) if p in owned)

        start = owned_applied()
        total = max(sum(targets) - start, 0)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            done = self._projector.wait_offsets(targets, 0.2, standbys=standbys)  # wake-ups to report progress
            applied = min(owned_applied() - start, total)
            progress(applied, total)
            if done:
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False

    @property
    def sealing(self) -> bool:
        """Whether this engine seals the content it writes, so that ``clear`` erases it from the
        log (``open``: unless ``seal=False``; an engine built without a key store: never). A
        replay (a rebuild, a custom projection's catch-up) gives nothing of a cleared
        conversation's sealed records but its ``ClearEvent``: their content is gone."""
        return self._writes.sealing

    # -- writes --------------------------------------------------------------------------------
    EMPTY = EMPTY

    def append(self, batch: Batch, timeout: float = 30.0, *, expected_last: Receipt | Empty | None = None,
               fence: Fence | None = None, turn: TurnSlot | None = None) -> Receipt:
        """Append a batch atomically and idempotently; docs/design.md §4 lists every outcome.

        ``expected_last``: a ``Receipt`` (the conversation's last accepted append must be that
        one) or ``EMPTY`` (it must have none), decided by admission in log order; otherwise
        ``PreconditionFailed``. An identical retry of an accepted batch returns its receipt.
        ``fence``: the ``Fence`` of ``begin_run``; ``Fenced`` once a later run of the
        conversation began before this record in the log (``InvalidRequest`` for another
        conversation's fence or anything but a Fence). ``turn``: a ``TurnSlot`` of
        ``allocate_turn`` the batch's user-led turn is filed under (``SlotUnavailable``).

        ``timeout``: seconds to wait for the write and its decision, a finite number >= 0
        (anything else is ``InvalidConfiguration``, before any I/O). ``0`` means "do not wait":
        a decision already known here (a retry of an accepted batch, a closed conversation)
        answers at once without I/O; otherwise the event is written and, unless this instance
        has already applied it, ``CommitUnconfirmed`` is raised (resend the same Batch to learn
        the outcome). The same rule holds for every timeout of this class.
        """
        return receipt_of(self._writes.settle(self._writes.submit_append(batch, timeout, expected_last, fence,
                                                                         turn)))

    def replace_turn(self, batch: Batch, old_turn_id: str, reason: str, timeout: float = 30.0, *,
                     fence: Fence | None = None) -> Receipt:
        """Edit (``"edit"``) or regenerate (``"retry"``) the latest visible turn, as one event.

        ``batch`` is the whole new turn, starting with its user message (for a retry, with the
        same content as the old one). Admission, in log order, hides turn ``old_turn_id`` in every
        read projection and appends ``batch`` as the next turn, or refuses with
        ``TurnNotReplaceable`` when ``old_turn_id`` is no longer the latest visible turn (so of
        two racing replacements one wins everywhere). Idempotent by append id, like ``append``
        (and the same ``timeout`` and ``fence`` rules).
        """
        return receipt_of(self._writes.settle(self._writes.submit_replace(batch, old_turn_id, reason, timeout,
                                                                          fence)))

    def clear(self, conversation_id: str, timeout: float = 30.0) -> None:
        """Close the conversation forever (also one never written). Idempotent.

        ``timeout``: as ``append`` (checked before any I/O; ``0`` writes and does not wait).
        """
        self._writes.settle(self._writes.submit_clear(conversation_id, timeout))

    def clear_prefix(self, prefix: str, timeout: float = 30.0) -> int:
        """Clear every open conversation whose id starts with ``prefix`` (non-empty, e.g.
        ``"bot-7/"``; the reference's ``DeleteByBot``), each erased as ``clear`` erases it, on the
        partitions this engine owns; returns how many were open when the call listed them.
        Those listed are the ones cleared: a conversation created after the listing is not
        touched. Idempotent and resumable: after a failure or a crash, the same call clears the
        rest (the ones cleared are no longer open). ``timeout``: as ``clear``, for each clear."""
        prefix = check_clear_prefix(prefix)
        check_timeout(timeout)
        ids = self.conversations(prefix)  # one snapshot, released before the erasures compact
        self._writes.clear_many(ids, timeout)
        return len(ids)

    # -- stats ---------------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        ends = self._log.end_offsets()
        applied = self._projector.applied_offsets()
        s = self._projector.stats()
        owned = self._projector.owned
        lag = [max(e - a, 0) if p in owned else 0 for p, (e, a) in enumerate(zip(ends, applied, strict=True))]
        return EngineStats(ends, applied, lag, s.accepted, s.duplicates, s.conflicts, s.rejected_closed, s.corrupt,
                           s.precondition_failed, s.not_replaceable, sorted(owned),
                           list(self._projector.applied_records), s.cleared, s.erased, s.fenced, s.deleted)

    def fail_stopped(self) -> LogUnavailable | StateUnavailable | None:
        """The error this engine now answers every write with because it fail-stopped, or None:
        its projector stopped on a state store failure (``StateUnavailable``: every read and write
        refused), or its log did (a FileLog after a failed write or fsync: ``LogUnavailable``,
        every append refused). Neither recovers while this engine is open; close and reopen it
        once the cause (a full disk...) is gone. No I/O: a readiness probe may ask it often."""
        state = self._projector.failed()
        return state if state is not None else self._log.failure()

    # -- custom projections ----------------------------------------------------------------------
    def register(self, projection: Projection, wait: bool = True, *, progress: Progress | None = None) -> None:
        """Catch ``projection`` up from its checkpoint (offset 0 the first time) and keep it live.

        ``wait=True`` returns once it has caught up with the log end; ``wait=False`` catches up on
        a background thread (``view`` then shows its progress; a failure is kept and reported).
        """
        self._check_open()
        if not isinstance(projection, Projection):
            raise InvalidProjection(f"register() takes a projections.Projection, not {type(projection).__name__}")
        if wait:
            self._register(projection, progress)
            return

        def run() -> None:
            try:
                self._register(projection, progress)
            except Exception:
                log.exception("background registration of projection %r failed", projection.name)

        threading.Thread(target=run, name=f"histlog-register-{projection.name}", daemon=True).start()

    def _register(self, projection: Projection, progress: Progress | None) -> None:
        """Register with the projector; a refused duplicate leaves the live projection in place
        (``rebuild(name)`` must replay the projection that owns the name, not the refused one)."""
        name = projection.name
        previous = self._projections.get(name)
        self._projections[name] = projection
        try:
            self._projector.register(projection, self._log.read, progress=progress)
        except DuplicateProjection:
            if previous is None:
                self._projections.pop(name, None)
            else:
                self._projections[name] = previous
            raise

    def rebuild(self, name: str, *, progress: Progress | None = None) -> None:
        """Delete a registered projection's state and replay it from offset 0; returns once caught up."""
        self._check_open()
        projection = self._projections.get(name)
        if projection is None:
            raise NotFound(f"no projection named {name!r} was registered with this engine; register() it first")
        self._projector.drop(name)
        self._projector.register(projection, self._log.read, progress=progress)

    def view(self, name: str) -> ProjectionView:
        """Read a projection's state (``get(key)``, ``scan(prefix)``) as of its last applied event."""
        self._check_open()
        error = self._projector.projection_errors.get(name)
        if error is not None:
            raise ProjectionError(f"projection {name!r} stopped after an error ({error!r}); "
                               "fix it and register() it again (it resumes from its checkpoint)")
        if name not in self._projections and not self._projector.has_checkpoint(name):
            raise NotFound(f"no projection named {name!r} in this state; register() it first")
        return ProjectionView(self._store, name, lambda: self._projector.owned)

    @property
    def log(self) -> Log:
        """The underlying log (for tools: tail, verify, benchmarks)."""
        return self._log

    @property
    def keys(self) -> KeyStore | None:
        """The key store sealed content is opened with (None: an engine built without one), for
        tools that show sealed records (``histlog tail``): read it, never create or destroy."""
        return self._keys

    # -- accepted events -------------------------------------------------------------------------
    def subscribe(self, *, buffer: int = DEFAULT_BUFFER) -> Subscription:
        """A thread-safe iterator of the events this instance accepts from now on: ``BatchEvent``,
        ``ClearEvent``, ``TurnReplacedEvent`` (``projections.events``, the objects custom
        projections get), in log order per partition, from the first step applied after this
        returns (``start``: the applied offsets then). Use it as a context manager; ``close()``
        (any thread, or a signal handler) ends the iteration.

        The projector never waits for a subscriber: at most ``buffer`` events (an int >= 1, else
        ``InvalidConfiguration``) wait to be read; past that the subscription is lost and, after
        the buffered events, raises ``SubscriptionLost`` (subscribe again, then re-read what you
        follow). ``close()`` of the engine ends every iteration after its buffered events; a
        projector that stops on a failure raises it (``StateUnavailable``) after them.
        Duplicates, conflicts, refusals and poison records are not events (``stats`` counts them).
        """
        self._check_open()
        return self._projector.subscribe(buffer)

    # -- lifecycle -----------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the projector and release the log and the state (each even if another fails; the
        first failure is raised once all are released, typed). Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._release()
        finally:
            self._writes.close()

    def _release(self) -> None:
        projector = getattr(self, "_projector", None)
        try:
            if projector is not None:
                projector.stop()
        finally:
            try:
                self._log.close()
            finally:
                try:
                    self._store.close()
                finally:
                    if self._keys is not None:
                        self._keys.close()

    def __enter__(self) -> HistoryEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
