"""The write path of ``HistoryEngine``: a write is a short synchronous *submit* (validate, the
admission pre-check on local state, take a ticket, produce the record to the log without waiting
for it: ``Log.produce``) and then the one wait of the write, for the projector's decision (a
decision implies the record was visible, which implies it is durable). The thread face waits
on the ticket (``settle``); the asyncio face (``engine.aio``) awaits ``Ticket.watch``; both end
in ``conclude``, so each rule has one home, and the facade keeps only the documented methods.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass

from engine.arguments import Empty, check_ids, check_message_id, check_timeout, expected_of
from engine.keys import KeyStore
from engine.log.base import Log
from engine.outcomes import (
    checkpointed,
    closed,
    deleted_count,
    fence_outcome,
    link_conflict,
    linked_outcome,
    slot_outcome,
)
from engine.refusals import answer
from engine.uuid7 import uuid7
from projections.admission import Decision, Outcome, Own, Rows, conversation_row, fence_refusal, precheck
from projections.delivery import Ticket
from projections.reads import Reads
from projections.runtime import Projector
from projections.store import StateStore
from schemas.assets import AssetRef, assets_json, check_assets
from schemas.batch import Batch, Receipt
from schemas.errors import (
    CommitUnconfirmed,
    CorruptLog,
    InvalidBatch,
    KeyErased,
    LogUnavailable,
    StateUnavailable,
)
from schemas.event_content import seal_assets, seal_checkpointed, seal_event
from schemas.events import (
    REPLACE_REASONS,
    AssetsLinked,
    BatchAppended,
    Checkpointed,
    ConversationCleared,
    MessagesDeleted,
    RunBegun,
    TurnAllocated,
    TurnReplaced,
    encode_event,
)
from schemas.ids import ConversationID, MessageID, RunID
from schemas.messages import starts_turn
from schemas.positions import LogPosition
from schemas.records import record_key
from schemas.runs import Fence, check_fence
from schemas.slots import TurnSlot, check_slot
from schemas.times import now_ms

__all__ = [
    "SUBMIT_THREADS",
    "Concluded",
    "Submitted",
    "Writes",
    "Written",
    "assets_of",
    "count_of",
    "fence_of",
    "receipt_of",
    "slot_of",
]

CLEAR_BATCH = 1000
"""How many clears ``clear_many`` has in flight at once (their tickets, their erasures: one
projector step erases all the clears it applies together)."""
SUBMIT_THREADS = 32
"""At most this many threads run the submits of an event loop's writes (``engine.aio``) when the
log's ``produce`` may block (Kafka): each for about one send; none waits for an acknowledgement
or a decision. On FileLog the loop runs its submits itself, except a new conversation's first
append when the key store has no spare key left (it waits for a refill's fsync) and a clear."""


@dataclass(frozen=True, slots=True)
class Written:
    """A record this engine produced, and the ticket that will answer its decision: what a
    write's submit hands to the face that waits (a thread, or an event loop)."""

    ticket: Ticket
    partition: int
    deadline: float  # time.monotonic() by which the decision must be known
    timeout: float
    batch: Batch | None  # None: a clear, a run's begin or a slot's allocation
    what: str  # the write, for the errors: "append 'a1' to 'c1'"
    then: str  # what the caller should do when the outcome is unknown
    concluder: Callable[[Decision, LogPosition | None], Concluded] | None = None  # the outcome: a batch's otherwise

    def remaining(self) -> float:
        return max(self.deadline - time.monotonic(), 0.0)

    @property
    def position(self) -> LogPosition | None:
        """Where the record is, once the log told (Kafka: on its acknowledgement)."""
        return self.ticket.position

    def where(self) -> str:
        position = self.position
        return f"at {position}" if position is not None else f"to partition {self.partition} (not yet acknowledged)"


Submitted = Receipt | Fence | TurnSlot | tuple[AssetRef, ...] | int | Written | None
"""A submit's result: the receipt (or a run's fence) known without a write (the fast path), a
``Written`` to wait on, or None (a clear of a conversation already closed)."""

Concluded = Receipt | Fence | TurnSlot | tuple[AssetRef, ...] | int | None
"""A write's outcome: a batch's receipt, a run's fence, a turn slot, a message's assets, how many
messages a delete removed from view, None for a clear."""


def receipt_of(outcome: Concluded) -> Receipt:
    assert isinstance(outcome, Receipt)  # Invariant: a batch's write concludes with its receipt or raises.
    return outcome


def fence_of(outcome: Concluded) -> Fence:
    assert isinstance(outcome, Fence)  # Invariant: a run's begin concludes with its fence or raises.
    return outcome


def slot_of(outcome: Concluded) -> TurnSlot:
    assert isinstance(outcome, TurnSlot)  # Invariant: an allocation concludes with its slot or raises.
    return outcome


def count_of(outcome: Concluded) -> int:
    assert type(outcome) is int  # Invariant: a delete concludes with its count or raises.
    return outcome


def assets_of(outcome: Concluded) -> tuple[AssetRef, ...]:
    assert isinstance(outcome, tuple)  # Invariant: a link concludes with the message's assets or raises.
    return outcome




def _on_loop() -> bool:
    """Whether this thread runs an event loop: its writes must never do the log's I/O (a thread
    that will wait for its decision anyway may lead the group commit: one hand-off less)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _now_ms() -> int:
    return now_ms()  # InvalidConfiguration, before any I/O, when the host clock is before 1970 or after 9999


class Writes:
    """The engine's writes over its log, state and projector (owned by the engine)."""

    def __init__(self, log_: Log, store: StateStore, projector: Projector, reads: Reads,
                 check_open: Callable[[], None], is_closed: Callable[[], bool],
                 serve: Callable[[ConversationID], None] = lambda c: None, keys: KeyStore | None = None) -> None:
        """``serve(c)`` raises unless this engine serves the partition of ``c`` now (``NotOwner``,
        ``NotReady``): checked before any write touches the log. ``keys``: content is sealed under
        the conversation's data key from it (None: plain records)."""
        self._keys = keys
        self._log = log_
        self._store = store
        self._projector = projector
        self._reads = reads
        self._check_open = check_open
        self._is_closed = is_closed
        self._serve = serve
        self._lock = threading.Lock()
        self._submitters: ThreadPoolExecutor | None = None
        log_.expect_writers(lambda: projector.deliveries.tickets)  # FileLog's group commit gathers them

    def close(self) -> None:
        """Shut the submit pool down; queued submits still run and raise ``EngineClosed``."""
        with self._lock:
            submitters, self._submitters = self._submitters, None
        if submitters is not None:
            submitters.shutdown(wait=False)

    def submit_append(self, batch: Batch, timeout: float, expected_last: Receipt | Empty | None,
                      fence: Fence | None = None, turn: TurnSlot | None = None) -> Submitted:
        check_timeout(timeout)
        if not isinstance(batch, Batch):
            raise InvalidBatch(f"invalid batch: expected a schemas.Batch, got {type(batch).__name__}")
        expected = expected_of(batch, expected_last)
        fence = check_fence(fence, batch.conversation_id)
        slot = check_slot(turn, batch.conversation_id)
        if slot is not None and not any(starts_turn(m) for m in batch.messages):
            raise InvalidBatch(f"invalid turn: the batch has no user message that opens a turn, so it cannot be "
                               f"filed under turn slot {slot.turn_id!r}; append it without turn=")
        self._check_open()
        self._serve(batch.conversation_id)
        return self._submit_batch(batch, BatchAppended.of(batch, _now_ms(), expected, fence, slot), timeout)

    def submit_replace(self, batch: Batch, old_turn_id: str, reason: str, timeout: float,
                       fence: Fence | None = None) -> Submitted:
        check_timeout(timeout)
        if not isinstance(batch, Batch):
            raise InvalidBatch(f"invalid batch: expected a schemas.Batch, got {type(batch).__name__}")
        fence = check_fence(fence, batch.conversation_id)
        if reason not in REPLACE_REASONS:
            raise InvalidBatch(f"invalid replace_turn reason {reason!r}: expected 'edit' or 'retry'")
        if not isinstance(old_turn_id, str) or not old_turn_id:
            raise InvalidBatch(f"invalid old_turn_id {old_turn_id!r}: expected a turn id (HistoryTurn.id)")
        if not starts_turn(batch.messages[0]):
            raise InvalidBatch("invalid replacement turn: it must start with its user message, not internal "
                               f"feedback (messages[0] is {batch.messages[0].role.value})")
        self._check_open()
        self._serve(batch.conversation_id)
        return self._submit_batch(batch, TurnReplaced.of(batch, _now_ms(), old_turn_id, reason, fence), timeout)

    def _submit_batch(self, batch: Batch, event: BatchAppended | TurnReplaced, timeout: float) -> Submitted:
        c, a = batch.conversation_id, batch.append_id
        # Point reads of facts that only move forward need no snapshot; the latest turn is two dependent reads.
        rows: Rows = self._store.iterator() if isinstance(event, TurnReplaced) else self._store
        known = precheck(rows, conversation_row(rows, c), event, batch, in_log_order=False)
        if known is not None:
            return self._answer(batch, known, None)
        own = Own(event, batch, None)
        if self._keys is not None:
            try:
                key = self._keys.create(c)  # the conversation's key: durable already (a spare, engine/keys/pool.py)
            except KeyErased:
                return self._answer(batch, Decision(Outcome.REJECTED_CLOSED), None)  # cleared meanwhile
            own = Own(seal_event(event, key), batch, key)
        return self._produce(record_key(c, a), encode_event(own.event), timeout, own,
                             f"append {str(a)!r} to {str(c)!r}",
                             "resend the same Batch (it is safe: a retry returns the original receipt)")

    def submit_clear(self, conversation_id: str, timeout: float, *, lead: bool = True) -> Submitted:
        """``clear``'s write; ``lead=False``: never lead the log's group commit (``clear_many``
        writes many before it waits, so the flusher writes them in few groups)."""
        check_timeout(timeout)
        c = ConversationID(conversation_id)
        self._check_open()
        self._serve(c)
        row = self._reads.conversation(c)
        if row is not None and row.closed:
            # Cleared already; an erasure a crash or an error left pending completes now.
            self._projector.complete_erasures([str(c).encode("utf-8")])
            return None
        event = ConversationCleared(c, _now_ms())
        return self._produce(record_key(c), encode_event(event), timeout, None, f"clear of {str(c)!r}",
                             "call clear again", lead=lead)

    def _open_conversation(self, c: ConversationID) -> None:
        """A write's checks before its record: the engine is open, it serves ``c``'s partition, and
        ``c`` is not cleared (``ConversationClosed``)."""
        self._check_open()
        self._serve(c)
        row = self._reads.conversation(c)
        if row is not None and row.closed:
            raise closed(c)

    def submit_begin_run(self, conversation_id: str, run_id: str, timeout: float) -> Submitted:
        """``begin_run``'s write: the run's fence at once when this state knows the run already
        (an epoch is permanent until a clear), else a ``RunBegun`` to wait on."""
        check_timeout(timeout)
        c = ConversationID(conversation_id)
        run = RunID(run_id)
        self._open_conversation(c)
        known = self._reads.run_epoch(c, run)
        if known:
            return Fence(c, run, known)
        event = RunBegun(c, run, _now_ms())
        return self._produce(record_key(c, run), encode_event(event), timeout, None,
                             f"begin of run {str(run)!r} of {str(c)!r}",
                             "call begin_run again (it is safe: the same run keeps its epoch)",
                             concluder=lambda decision, position: fence_outcome(c, run, decision, position))

    def submit_allocate_turn(self, conversation_id: str, timeout: float) -> Submitted:
        """``allocate_turn``'s write: a ``TurnAllocated`` of a new slot id to wait on (each call
        reserves a new position; a retry inside the engine resends the same record)."""
        check_timeout(timeout)
        c = ConversationID(conversation_id)
        self._open_conversation(c)
        slot_id = f"slot-{uuid7()}"
        event = TurnAllocated(c, slot_id, _now_ms())
        return self._produce(record_key(c, slot_id), encode_event(event), timeout, None,
                             f"allocation of a turn slot of {str(c)!r}",
                             "call allocate_turn again (an unused slot costs nothing)",
                             concluder=lambda decision, position: slot_outcome(c, slot_id, decision, position))

    def submit_delete_messages(self, conversation_id: str, message_ids: object, fence: Fence | None,
                               timeout: float) -> Submitted:
        """``delete_messages``' write: 0 at once for no id, ``Fenced`` at once for a fence older
        than this state's latest run, else a ``MessagesDeleted`` to wait on (decided in log order:
        an append this instance has not applied yet is deleted all the same once it precedes it)."""
        check_timeout(timeout)
        c = ConversationID(conversation_id)
        ids = check_ids(message_ids)  # type: ignore[arg-type]  # checked there: a list or tuple of str
        fence = check_fence(fence, c)
        self._open_conversation(c)
        if not ids:
            return 0
        epoch = fence.epoch if fence is not None else None
        known = fence_refusal(self._store, str(c).encode("utf-8"), epoch, in_log_order=False)
        if known is not None:
            return deleted_count(c, known, None)
        delete_id = f"del-{uuid7()}"
        named = tuple(dict.fromkeys(MessageID.format(m.append_id, m.index) for m in ids))
        event = MessagesDeleted(c, delete_id, named, epoch, _now_ms())
        return self._produce(record_key(c, delete_id), encode_event(event), timeout, None,
                             f"delete of {len(named)} message(s) of {str(c)!r}",
                             "call delete_messages again (it is safe: a deleted message stays deleted)",
                             concluder=lambda decision, position: deleted_count(c, decision, position))

    def submit_checkpointed(self, conversation_id: str, kind: str, content: bytes, timeout: float) -> Submitted:
        """A graph checkpoint change's write (``engine.checkpoints``): a ``Checkpointed`` of ``kind``
        with ``content`` (checked by the caller), sealed under the thread's data key, to wait on."""
        check_timeout(timeout)
        c = ConversationID(conversation_id)
        self._open_conversation(c)
        record_id = f"ckp-{uuid7()}"
        event = Checkpointed(c, record_id, kind, content, _now_ms())
        if self._keys is not None and kind != "prune":  # a prune carries a strategy and run ids: no content
            try:
                event = seal_checkpointed(event, self._keys.create(c))
            except KeyErased:
                raise closed(c) from None
        return self._produce(record_key(c, record_id), encode_event(event), timeout, None,
                             f"checkpoint {kind} of thread {str(c)!r}",
                             "call it again (it is safe: the same change again changes nothing)",
                             concluder=lambda decision, position: checkpointed(c, decision, position))

    def submit_link_assets(self, conversation_id: str, message_id: str, refs: object, timeout: float) -> Submitted:
        """``link_assets``' write: the message's assets at once when this state has every ref
        linked already (``AppendConflict`` when it links another at one of their ordinals: a
        linked ref stays until a clear), else an ``AssetsLinked`` (sealed like content) to wait on."""
        check_timeout(timeout)
        c = ConversationID(conversation_id)
        m = check_message_id(message_id)
        checked = check_assets(refs)
        self._open_conversation(c)
        linked = self._reads.message_assets(c, m)
        if linked is not None:
            by_ordinal = {a.ordinal: a for a in linked}
            for ref in checked:
                if by_ordinal.get(ref.ordinal, ref) != ref:
                    raise link_conflict(c, m, ref.ordinal)
            if all(ref.ordinal in by_ordinal for ref in checked):
                return linked
        event = AssetsLinked(c, m, assets_json(checked), _now_ms())
        if self._keys is not None:
            try:
                event = seal_assets(event, self._keys.create(c))
            except KeyErased:
                raise closed(c) from None
        return self._produce(record_key(c, m), encode_event(event), timeout, None,
                             f"link of assets to {m!r} of {str(c)!r}",
                             "call link_assets again (it is safe: linked refs are kept once)",
                             concluder=lambda decision, position: linked_outcome(self._reads, c, m, decision,
                                                                                 position))

    def clear_many(self, ids: Sequence[str], timeout: float) -> None:
        """Clear ``ids`` (``HistoryEngine.clear_prefix``), ``CLEAR_BATCH`` at a time: each batch's
        clears are written before any is waited on, so one projector step applies many of them
        and one erasure (one flush, one compaction) forgets them together. Every clear written is
        waited on (its ticket released) even when another fails; the first failure is raised
        after that, and calling again clears the rest (a cleared conversation is not listed)."""
        def submit(c: str) -> Callable[[], Submitted]:
            return lambda: self.submit_clear(c, timeout, lead=False)

        for start in range(0, len(ids), CLEAR_BATCH):
            self.settle_all([submit(c) for c in ids[start:start + CLEAR_BATCH]])

    def settle_all(self, submits: Sequence[Callable[[], Submitted]]) -> None:
        """Run every submit before waiting on any (one projector step decides many), then wait for
        each written one (its ticket released) even when another fails; the first failure (a
        submit stops the rest) is raised once all were waited on."""
        submitted: list[Submitted] = []
        failure: BaseException | None = None
        for submit in submits:
            try:
                submitted.append(submit())
            except BaseException as e:
                failure = e
                break
        for one in submitted:
            try:
                self.settle(one)
            except BaseException as e:
                failure = failure or e
        if failure is not None:
            raise failure

    @property
    def sealing(self) -> bool:
        return self._keys is not None

    def submit_may_block(self, conversation_id: str) -> bool:
        """Whether a submit to ``conversation_id`` may block: the log's ``produce`` may (Kafka), or
        the key store has no spare key left to give a new conversation (it waits for a refill: an
        fsync, a Kafka round trip). A spare taken by another thread between this answer and the
        submit makes the submit wait for the refill on the loop (a few ms, rare: refills start
        192 spares ahead)."""
        if self._log.produce_may_block:
            return True
        keys = self._keys
        return keys is not None and not keys.known(conversation_id)

    def _produce(self, key: bytes, value: bytes, timeout: float, own: Own | None, what: str,
                 then: str, *, lead: bool = True,
                 concluder: Callable[[Decision, LogPosition | None], Concluded] | None = None) -> Written:
        """Take the ticket, then produce the record and let the ticket follow it (its position,
        its write's failure): the ticket is released here if the produce raises, else by
        whoever waits on the returned ``Written``. ``own`` (a batch's events, None for a clear)
        lets the projector admit exactly these bytes without decoding and opening them again."""
        deadline = time.monotonic() + timeout
        ticket = self._projector.expect(key, value, own)
        try:
            self._projector.check_owned(key)  # a revoke begun before the ticket was taken: do not write
            produced = self._log.produce(key, value, timeout=timeout, lead=lead and not _on_loop())
            ticket.follow(produced)
        except BaseException:
            ticket.release()
            raise
        return Written(ticket, produced.partition, deadline, timeout, own.batch if own else None, what, then, concluder)

    def submitter(self) -> Executor:
        """The bounded pool that runs an event loop's submits (``engine.aio``) when the log's
        ``produce`` may block (Kafka: metadata, a full buffer), made on first use and shut down
        by ``close``. A submit holds a thread only for the send, not for the acknowledgement."""
        with self._lock:
            if self._submitters is None:
                self._submitters = ThreadPoolExecutor(SUBMIT_THREADS, thread_name_prefix="histlog-submit")
            return self._submitters

    def settle(self, submitted: Submitted) -> Concluded:
        """The thread face's wait: block on the ticket until the decision or the deadline."""
        if not isinstance(submitted, Written):
            return submitted
        try:
            try:
                given_up = self._projector.partition_state(submitted.partition) == "not_owned"
                decision = None if given_up else submitted.ticket.wait(None, submitted.remaining())
            except StateUnavailable as e:
                return self.conclude(submitted, None, e)
            return self.conclude(submitted, decision)
        finally:
            submitted.ticket.release()

    def conclude(self, written: Written, decision: Decision | None,
                  failure: StateUnavailable | None = None) -> Concluded:
        """The outcome of our own record at ``written.position``: its receipt, a run's fence, or
        its refusal (None for a clear). Once it is written, an outcome not known in time (a timeout, a stopped,
        failed or closed projector) is ``CommitUnconfirmed``, never a plain failure."""
        what, then, where, p = written.what, written.then, written.where(), written.partition
        if failure is not None:
            raise CommitUnconfirmed(
                f"{what} was written {where}, but the state store failed before deciding it ({failure}); "
                f"{then} once the engine is reopened") from self._projector.failure or failure
        if decision is None:
            if self._projector.partition_state(p) == "not_owned":
                raise CommitUnconfirmed(f"{what} was written {where}, but this engine gave partition "
                                        f"{p} up before deciding it; {then} to the partition's owner")
            if self._is_closed():
                raise CommitUnconfirmed(f"{what} was written {where}, but this engine was closed before "
                                        f"deciding it; {then} once the engine is reopened")
            if written.position is None:  # what a blocking append raised when not acknowledged in time
                raise LogUnavailable(f"{what} was sent {where} but the log did not acknowledge it within "
                                     f"{written.timeout}s; its outcome is unknown: {then}")
            raise CommitUnconfirmed(f"{what} was written {where} but not decided within {written.timeout}s; "
                                    f"{then}")
        if written.concluder is not None:
            return written.concluder(decision, written.position)
        if written.batch is None:
            if decision.reason:  # a clear whose erasure did not complete
                raise StateUnavailable(f"{what} closed the conversation, but erasing its content did not complete "
                                       f"({decision.reason}); call clear again to complete it")
            return None
        return self._answer(written.batch, decision, written.position)

    def _answer(self, batch: Batch, decision: Decision, position: LogPosition | None) -> Receipt:
        receipt = answer(batch, decision)  # raises the refusals
        if receipt is not None:
            return receipt
        raise CorruptLog(
            f"the event written at {position} was not accepted ({decision.reason}); "
            "run `histlog stats` and `histlog log verify`, then resend the same Batch",
            reason=decision.reason, position=position)

