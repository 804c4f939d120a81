"""``HistoryEngine``: the public facade over a log and the projector (docs/design.md §1, §4).
One method per row of the API contract, each with the docstring that states its promise (long,
≈720 lines, because the whole public contract is one class: every method here is a few lines of
checks and one call, and the rules they call live elsewhere);
argument rules, refusals, the write path and the opening of the log and state live in
``engine.arguments``, ``engine.refusals``, ``engine.writes``, ``engine.state``.

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
from datetime import datetime
from pathlib import Path

from engine.arguments import (
    EMPTY,
    Empty,
    check_budget,
    check_context,
    check_cursors,
    check_directory,
    check_limit,
    check_order,
    check_partitions,
    check_prefix,
    check_timeout,
    check_window,
    time_bound,
)
from engine.keys import KeyStore, master_key_from
from engine.log.base import Log
from engine.log.file import FsyncPolicy
from engine.state import open_file_parts, open_kafka_parts, open_key_store
from engine.writes import Writes, receipt_of
from projections.custom import Projection, ProjectionView
from projections.delivery import DEFAULT_BUFFER, Subscription
from projections.navigation import Order
from projections.reads import Reads, Unit
from projections.runtime import PartitionState, Projector
from projections.store import DamagedState, StateStore
from schemas.batch import (
    Batch,
    HistoryLoad,
    HistoryTurn,
    Located,
    Measure,
    Receipt,
    StoredMessage,
    StoredWindow,
    TurnSource,
)
from schemas.errors import (
    DuplicateProjection,
    EngineClosed,
    HistoryError,
    InvalidConfiguration,
    InvalidProjection,
    InvalidReceipt,
    InvalidWindow,
    LogUnavailable,
    NotFound,
    NotOwner,
    NotReady,
    ProjectionError,
)
from schemas.ids import ConversationID, MessageID
from schemas.messages import Message
from schemas.positions import HistoryPosition, LogPosition
from schemas.records import partition_for_key

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


class HistoryEngine:
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

    def catch_up(self, *, timeout: float | None = None, progress: Progress | None = None) -> bool:
        """Wait until the state has applied everything the log held when this was called, on
        the partitions this engine owns.

        ``timeout``: seconds (``None``, the default: until caught up); False when it ran out.
        """
        if timeout is not None:
            check_timeout(timeout)
        owned = self._projector.owned
        targets = [end if p in owned else 0 for p, end in enumerate(self._log.end_offsets())]
        if progress is None:
            return self._projector.wait_offsets(targets, timeout)
        def owned_applied() -> int:
            return sum(a for p, a in enumerate(self._projector.applied_offsets()) if p in owned)

        start = owned_applied()
        total = max(sum(targets) - start, 0)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            done = self._projector.wait_offsets(targets, 0.2)  # wake-ups to report progress
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

    # -- owned partitions (a cluster member, docs/design.md §9) ----------------------------------
    @property
    def owned(self) -> frozenset[int]:
        """The partitions this engine applies and serves (all of them unless opened with ``owned``)."""
        return self._projector.owned

    def partition_state(self, partition: int) -> PartitionState:
        """``"not_owned"``, ``"catching_up"`` (taken on, not yet at the log end seen at ``assign``:
        its calls raise ``NotReady``) or ``"ready"``."""
        (p,) = check_partitions([partition], self._log.partitions)
        return self._projector.partition_state(p)

    def assign(self, parts: Iterable[int]) -> None:
        """Take partitions on: each resumes from its own checkpoint (offset 0 without state) and is
        ``catching_up`` until it has applied the log end seen now, then ``ready``. Returns at once
        (the projector catches up in the background); partitions owned already are left alone."""
        owned = check_partitions(parts, self._log.partitions)
        self._check_open()
        self._projector.assign(owned, self._log.end_offsets())

    def revoke(self, parts: Iterable[int], drop: bool = False) -> None:
        """Give partitions up. Their calls raise ``NotOwner`` from the moment this begins; it
        returns once the projector no longer applies them. A write of this engine still waiting
        for its decision on one raises ``CommitUnconfirmed`` (its record is in the log; the new
        owner decides it: resend the same batch there). ``drop=True`` also deletes their state
        (one WriteBatch), so a later ``assign`` rebuilds them from offset 0; otherwise it stays
        and a later ``assign`` resumes from its checkpoint."""
        gone = check_partitions(parts, self._log.partitions)
        if not isinstance(drop, bool):
            raise InvalidConfiguration(f"revoke(drop=...) takes a bool, got {drop!r}")
        self._check_open()
        self._projector.revoke(gone, drop=drop)

    def _serve(self, c: ConversationID) -> None:
        """``NotOwner`` or ``NotReady`` unless this engine serves the partition of ``c`` now."""
        if self._projector.serving_all():
            return
        p = partition_for_key(str(c).encode("utf-8"), self._log.partitions)
        state = self._projector.partition_state(p)
        if state == "not_owned":
            raise NotOwner(f"this engine does not own partition {p} (conversation {str(c)!r}); ask its owner")
        if state == "catching_up":
            raise NotReady(f"this engine is still catching up on partition {p} (conversation {str(c)!r}); "
                           "retry shortly")

    # -- writes --------------------------------------------------------------------------------
    EMPTY = EMPTY

    def append(self, batch: Batch, timeout: float = 30.0, *, expected_last: Receipt | Empty | None = None) -> Receipt:
        """Append a batch atomically and idempotently; docs/design.md §4 lists every outcome.

        ``expected_last``: a ``Receipt`` (the conversation's last accepted append must be that
        one) or ``EMPTY`` (it must have none), decided by admission in log order; otherwise
        ``PreconditionFailed``. An identical retry of an accepted batch returns its receipt.

        ``timeout``: seconds to wait for the write and its decision, a finite number >= 0
        (anything else is ``InvalidConfiguration``, before any I/O). ``0`` means "do not wait":
        a decision already known here (a retry of an accepted batch, a closed conversation)
        answers at once without I/O; otherwise the event is written and, unless this instance
        has already applied it, ``CommitUnconfirmed`` is raised (resend the same Batch to learn
        the outcome). The same rule holds for every timeout of this class.
        """
        return receipt_of(self._writes.settle(self._writes.submit_append(batch, timeout, expected_last)))

    def replace_turn(self, batch: Batch, old_turn_id: str, reason: str, timeout: float = 30.0) -> Receipt:
        """Edit (``"edit"``) or regenerate (``"retry"``) the latest visible turn, as one event.

        ``batch`` is the whole new turn, starting with its user message (for a retry, with the
        same content as the old one). Admission, in log order, hides turn ``old_turn_id`` in every
        read projection and appends ``batch`` as the next turn, or refuses with
        ``TurnNotReplaceable`` when ``old_turn_id`` is no longer the latest visible turn (so of
        two racing replacements one wins everywhere). Idempotent by append id, like ``append``
        (and the same ``timeout`` rule).
        """
        return receipt_of(self._writes.settle(self._writes.submit_replace(batch, old_turn_id, reason, timeout)))

    def clear(self, conversation_id: str, timeout: float = 30.0) -> None:
        """Close the conversation forever (also one never written). Idempotent.

        ``timeout``: as ``append`` (checked before any I/O; ``0`` writes and does not wait).
        """
        self._writes.settle(self._writes.submit_clear(conversation_id, timeout))

    # -- reads ---------------------------------------------------------------------------------
    def read(self, conversation_id: str, at_least: Receipt | None = None, timeout: float = 30.0) -> list[Message]:
        """Detached messages in stored order; ``[]`` for unknown or closed conversations.

        ``at_least=receipt`` first waits until this instance has applied that receipt, at most
        ``timeout`` seconds (a finite number >= 0, checked even without ``at_least``; ``0``
        answers only if it is applied already), else ``LogUnavailable``.
        """
        check_timeout(timeout)
        c = ConversationID(conversation_id)
        self._check_open()
        self._serve(c)
        if at_least is not None:
            self._wait_for(at_least, timeout)
        return self._reads.messages(c)

    def _wait_for(self, receipt: Receipt, timeout: float) -> None:
        if not isinstance(receipt, Receipt):
            raise TypeError(f"at_least must be a Receipt, got {type(receipt).__name__}")
        self.wait_applied(receipt.position, timeout)

    def wait_applied(self, position: LogPosition, timeout: float = 30.0) -> None:
        """Return once this instance has applied the log ``position`` (read-your-writes with a
        position from anywhere, e.g. a ``Receipt``'s), at most ``timeout`` seconds, else
        ``LogUnavailable``."""
        check_timeout(timeout)
        if not isinstance(position, LogPosition):
            raise TypeError(f"a log position must be a LogPosition, got {type(position).__name__}")
        if position.partition >= self._log.partitions:
            raise InvalidReceipt(f"log position {position} names partition {position.partition}, but this log "
                                 f"has {self._log.partitions} (0..{self._log.partitions - 1}): use a position it gave")
        self._check_open()
        if not self._projector.wait_applied(position, timeout):
            raise LogUnavailable(
                f"this instance has not applied {position} within {timeout}s; "
                "check `histlog stats` (lag) and that the log is reachable, then retry")

    def _has_applied(self, position: LogPosition) -> bool:
        """Whether ``position`` is applied already (no wait; False for anything ``wait_applied``
        would refuse, so that it refuses it)."""
        return (isinstance(position, LogPosition) and position.partition < self._log.partitions
                and not self._closed and self._projector.failure is None
                and (self._projector.serving_all() or position.partition in self._projector.owned)
                and self._projector.applied_offsets()[position.partition] > position.offset)

    def conversations(self, prefix: str | None = None, after: str | None = None,
                      limit: int | None = None) -> list[ConversationID]:
        """Open conversations, unique, in lexical order: those of the partitions this engine owns
        (a partition still catching up lists what it has applied so far). A page: ids starting
        with ``prefix`` (an id convention such as ``bot-7/...`` groups a bot's or a tenant's),
        after ``after`` (exclusive), at most ``limit``; O(page) through the open-conversation index."""
        prefix = check_prefix(prefix)
        if after is not None:
            after = ConversationID(after)
        check_limit(limit)
        self._check_open()
        if self._projector.serving_all():
            return self._reads.conversation_page(prefix, after, limit)
        owned, n = self._projector.owned, self._log.partitions
        return self._reads.conversation_page(prefix, after, limit, lambda c: partition_for_key(c, n) in owned)

    def entries(self, conversation_id: str, after: HistoryPosition | None = None,
                before: HistoryPosition | None = None, limit: int | None = None,
                include_hidden: bool = False, order: Order = "asc", since: datetime | None = None,
                until: datetime | None = None) -> list[StoredMessage]:
        """Stored messages with ``after < position < before`` (both exclusive) and ``since <=
        created_at < until``, at most ``limit``: the oldest first (``order="asc"``) or the newest
        first (``"desc"``: ``limit`` keeps the newest, and ``before=page[-1].position`` is the
        page before). ``created_at`` never decreases within a conversation, so a time range is one
        run of messages, found by two seeks: O(result), never O(history)."""
        c = ConversationID(conversation_id)
        check_cursors(after, before)
        check_limit(limit)
        check_order(order)
        since_ms, until_ms = time_bound(since, "since"), time_bound(until, "until")
        self._check_open()
        self._serve(c)
        return self._reads.entries(c, after, before, limit, include_hidden, order,
                                   since_ms, until_ms)

    def position_of(self, conversation_id: str, message_id: str) -> HistoryPosition:
        """The ``HistoryPosition`` of the visible message ``message_id`` (an id from ``entries``,
        e.g. to page from it); ``NotFound`` for an unknown or hidden message. Two point reads."""
        c = ConversationID(conversation_id)
        MessageID.parse(message_id)  # NotFound for what spells no message id, before any I/O
        self._check_open()
        self._serve(c)
        return self._reads.position_of(c, message_id)

    def locate(self, conversation_id: str, external_id: str, before: int = 0, after: int = 0) -> Located:
        """The newest visible message whose metadata ``external_id`` is the JSON string
        ``external_id`` (a platform's own message id), with up to ``before`` visible messages
        before it and ``after`` after it, each list in stored order; ``NotFound`` when none.
        One index seek plus the result: O(result)."""
        c = ConversationID(conversation_id)
        if not isinstance(external_id, str):
            raise InvalidWindow(f"invalid external_id: expected a str, got {type(external_id).__name__}")
        check_context(before, "before")
        check_context(after, "after")
        self._check_open()
        self._serve(c)
        return self._reads.locate(c, external_id, before, after)

    def _is_closed(self, conversation_id: str) -> bool:
        """Whether the conversation was cleared (for the service's event streams, which end with
        ``closed``; one point read). The checks of every read first."""
        c = ConversationID(conversation_id)
        self._check_open()
        self._serve(c)
        return self._reads.closed(c)

    def turn(self, conversation_id: str, message_id: str) -> HistoryTurn:
        """The visible user-led turn holding ``message_id`` (an id from ``entries``); ``NotFound``
        for an unknown message, a hidden one, or one before the first user message."""
        c = ConversationID(conversation_id)
        MessageID.parse(message_id)  # NotFound for what spells no message id, before any I/O
        self._check_open()
        self._serve(c)
        return self._reads.turn(c, message_id)

    def latest_turn(self, conversation_id: str) -> HistoryTurn | None:
        """The latest visible user-led turn (the one ``replace_turn`` may replace), or None."""
        c = ConversationID(conversation_id)
        self._check_open()
        self._serve(c)
        return self._reads.latest_turn(c)

    def latest_interrupted_checkpoint(self, conversation_id: str) -> StoredMessage | None:
        """The newest assistant message with metadata ``interrupted: true`` that no later
        assistant message follows (later user or tool messages do not cancel it), or None."""
        c = ConversationID(conversation_id)
        self._check_open()
        self._serve(c)
        return self._reads.latest_interrupted_checkpoint(c)

    def window(self, conversation_id: str, limit: int, before: HistoryPosition | None = None) -> list[Message]:
        """The same result as ``WindowReader(engine, limit).read(...)``, in O(limit). With
        ``before``, the window of the messages before that position (exclusive): what the
        middleware's ``retry``/``edit`` show the model, still O(limit)."""
        return self._reads.window(self._window_checked(conversation_id, limit, before), limit, before)

    def _window_checked(self, conversation_id: str, limit: int, before: HistoryPosition | None) -> ConversationID:
        """The checks of ``window`` and its canonical form, before any I/O: the conversation id."""
        c: ConversationID = ConversationID(conversation_id)
        check_window(limit)
        check_cursors(None, before)
        self._check_open()
        self._serve(c)
        return c

    def _window_canonical(self, conversation_id: str, limit: int, before: HistoryPosition | None = None
                          ) -> list[bytes]:
        """``window``'s messages as canonical JSON bytes, the same checks first (for the service,
        which sends them as stored instead of rebuilding each message to serialise it again)."""
        return self._reads.window_canonical(self._window_checked(conversation_id, limit, before), limit, before)

    def window_entries(self, conversation_id: str, limit: int) -> StoredWindow:
        """``window``'s messages with where they are stored: the merged system message, then the
        window's turns as ``StoredMessage`` (positions, ids); ``.messages`` equals ``window()``.
        The same rows, the same O(limit) cost, the same errors."""
        c = ConversationID(conversation_id)
        check_window(limit)
        self._check_open()
        self._serve(c)
        return self._reads.window_entries(c, limit)

    def turns(self, conversation_id: str) -> list[HistoryTurn]:
        """Every visible user-led turn, in order, each equal to ``turn(conversation_id, t.id)``;
        the last one is ``latest_turn``. One pass over the conversation's visible messages, so
        O(what it returns); ``[]`` for an unknown or closed conversation."""
        c = ConversationID(conversation_id)
        self._check_open()
        self._serve(c)
        return self._reads.turns(c)

    def read_within_bytes(self, conversation_id: str, max_bytes: int, after: HistoryPosition = HistoryPosition.START,
                          before: HistoryPosition | None = None, unit: Unit = "turn") -> HistoryLoad[StoredMessage]:
        """The newest messages of ``after < position < before`` within ``max_bytes`` of content.

        Newest first, a unit (a whole turn position by default, one message with
        ``unit="message"``) is kept while the content bytes of the strictly newer kept units are
        below ``max_bytes``: the unit that crosses the budget is kept, ``max_bytes <= 0`` loads
        nothing. A turn cut by ``after``/``before`` is one unit (its part inside the window);
        system messages count like any other message of their turn. ``truncated`` is true when
        older messages of the window were left out. Reads the kept rows plus one: O(window).
        """
        c = ConversationID(conversation_id)
        check_budget(max_bytes, unit)
        check_cursors(after, before)
        self._check_open()
        self._serve(c)
        return self._reads.within_bytes(c, max_bytes, after, before, unit)

    def turn_sources(self, conversation_id: str, max_bytes: int, after: HistoryPosition = HistoryPosition.START,
                     before: HistoryPosition | None = None, unit: Unit = "turn") -> HistoryLoad[TurnSource]:
        """``read_within_bytes``'s window narrowed to ``TurnSource(id, role, content, created_at,
        interrupted)``, read from a keyspace of its own: no message row or metadata is loaded."""
        c = ConversationID(conversation_id)
        check_budget(max_bytes, unit)
        check_cursors(after, before)
        self._check_open()
        self._serve(c)
        return self._reads.turn_sources(c, max_bytes, after, before, unit)

    def measure(self, conversation_id: str, after: HistoryPosition = HistoryPosition.START) -> Measure:
        """``Measure(messages, content_bytes, turns)`` of the messages after ``after``, from
        running sums (two point reads, no payload). ``turns`` counts the distinct turn positions
        those messages belong to: the units of ``read_within_bytes(unit="turn")``."""
        c = ConversationID(conversation_id)
        check_cursors(after, None)
        self._check_open()
        self._serve(c)
        return self._reads.measure(c, after)

    def stats(self) -> EngineStats:
        ends = self._log.end_offsets()
        applied = self._projector.applied_offsets()
        s = self._projector.stats()
        owned = self._projector.owned
        lag = [max(e - a, 0) if p in owned else 0 for p, (e, a) in enumerate(zip(ends, applied, strict=True))]
        return EngineStats(ends, applied, lag, s.accepted, s.duplicates, s.conflicts, s.rejected_closed, s.corrupt,
                           s.precondition_failed, s.not_replaceable, sorted(owned),
                           list(self._projector.applied_records), s.cleared, s.erased)

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

    def poison(self) -> list[tuple[LogPosition, str]]:
        """Quarantined poison records: their position and why they were skipped."""
        return self._reads.poison()

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
    def _check_open(self) -> None:
        """Refuse calls on a closed engine, and on one whose projector stopped (its state no longer
        follows the log: fail-stop, so nothing is written that could not be decided, and nothing
        stale is served). ``stats``, ``poison`` and ``close`` still work."""
        if self._closed:
            raise EngineClosed("this HistoryEngine is closed; open a new one (HistoryEngine.open)")
        failed = self._projector.failed()
        if failed is not None:
            raise failed

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
