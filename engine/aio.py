"""``AsyncHistoryEngine``: the engine's asyncio face, for the HTTP service and ``async`` bots.

The same methods as ``HistoryEngine``, with the same arguments, results and errors, as
coroutines. It is a thin shell: every rule stays in ``HistoryEngine``; this module only decides
where each step runs.

**Writes** (``append``, ``replace_turn``, ``clear``) are the facade's two halves:

* the *submit* (validate, fast path from local state, take the ticket, produce the record:
  ``Log.produce``, which does not wait for durability) runs **on the loop** when the log's
  ``produce`` cannot block (FileLog, MemoryLog: RocksDB point reads of some microseconds plus
  an enqueue; the group commit runs on the log's flusher thread). Kafka's ``send`` can block on
  metadata or a full buffer, so there the submit runs on the engine's bounded submit pool
  (``engine.writes.Writes.submitter``, ``SUBMIT_THREADS`` = 32 threads), holding a thread for
  the send only, never for the acknowledgement. So does the first append of a conversation
  when the key store has no spare key left for it (it waits for a refill, which fsyncs the key
  store or asks Kafka: ``Writes.submit_may_block``), and a clear.
* the *wait* for the projector's decision holds no thread: it awaits ``Ticket.watch``, a future
  the projector resolves through ``call_soon_threadsafe`` after the step that decides the
  record is committed (or the log's error, at once, when the write fails). So 1,000 appends
  in flight hold no thread on FileLog and at most the pool's on Kafka; the wait is bounded by
  ``timeout`` (then ``CommitUnconfirmed``, as on the thread face), and a timed-out or cancelled
  write releases its ticket (one cancelled during a pooled submit: once the submit ends).

**Waits** for a log position (``wait_applied``, so every ``at_least`` of the service) hold no
thread either: a future the projector resolves after the step that applies the position, or on
its failure or the partition's revoke (``projections.waiting.Positions.when_applied``); a wait
that times out or is cancelled removes its waiter.

**Reads** whose cost is small and bounded by their arguments run on the loop itself: ``window``
and ``entries`` asked for at most ``INLINE_MESSAGES`` messages, ``measure`` (two point reads).
Every other read runs on the loop's default executor (``asyncio.to_thread``): an unbounded read
(a whole history) would stall every coroutine of the loop. Measured on the development VM (2 cores) through the service,
``window(20)`` of a 100-message conversation: the hand-off to a thread cost about 0.25 ms at p50
with the server busy (the loop thread and the worker contend for the interpreter lock), more
than the read itself (about 0.25 ms); a small read inline holds the loop no longer than the
hand-off would have.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import ParamSpec, TypeVar

from engine.arguments import Empty, check_clear_prefix, check_timeout
from engine.checkpoints import AsyncCheckpoints
from engine.facade import EngineStats, HistoryEngine
from engine.reading import at_least_position
from engine.writes import CLEAR_BATCH, Concluded, Submitted, Written, assets_of, count_of, fence_of, receipt_of, slot_of
from projections.admission import Decision
from projections.delivery import Ticket
from projections.navigation import Order
from projections.reads import Unit
from schemas.assets import AssetRef
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
from schemas.errors import StateUnavailable
from schemas.ids import ConversationID
from schemas.messages import Message
from schemas.positions import HistoryPosition, LogPosition
from schemas.runs import Fence
from schemas.slots import TurnSlot

__all__ = ["AsyncHistoryEngine"]

INLINE_MESSAGES = 256
"""A ``window`` or ``entries`` of at most this many messages runs on the loop (see the module)."""

P = ParamSpec("P")
T = TypeVar("T")


async def _off_loop(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    return await asyncio.to_thread(fn, *args, **kwargs)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _release_abandoned(job: asyncio.Future[Submitted]) -> None:
    """A submit whose caller was cancelled while it ran: give its ticket back once it is done."""
    if not job.cancelled() and job.exception() is None:
        written = job.result()
        if isinstance(written, Written):
            written.ticket.release()


def _expire(future: asyncio.Future[Decision | None]) -> None:
    """The write's timeout passed undecided: its wait ends with None (``CommitUnconfirmed``)."""
    if not future.done():
        future.set_result(None)


async def _decided(ticket: Ticket, timeout: float) -> Decision | None:
    """The ticket's decision, or None once ``timeout`` passed: ``asyncio.wait_for`` without its
    second future and task wrapper (one timer on the loop, cancelled on the answer). A
    cancellation of the caller cancels the watched future, as ``wait_for`` does; the projector
    skips a future that is done."""
    future = ticket.watch()
    if future.done():
        return future.result()
    timer = asyncio.get_running_loop().call_later(timeout, _expire, future)
    try:
        return await future
    finally:
        timer.cancel()


def _conversation_of(batch: object) -> str:
    """The batch's conversation id ("" for what is no batch: its submit refuses it)."""
    return str(batch.conversation_id) if isinstance(batch, Batch) else ""


class AsyncHistoryEngine(AsyncCheckpoints):
    """``HistoryEngine``'s methods as coroutines over one engine (which it does not own: close
    the engine yourself)."""

    __slots__ = ("engine",)
    engine: HistoryEngine

    def __init__(self, engine: HistoryEngine) -> None:
        self.engine = engine

    async def _write(self, submit: Callable[[], Submitted], conversation_id: str) -> Concluded:
        """Run the submit (on the loop, or on a worker thread when it may block: producing to
        Kafka, a new conversation's key), then await the decision on the loop."""
        writes = self.engine._writes
        if not writes.submit_may_block(conversation_id):
            submitted = submit()
        else:
            job = asyncio.get_running_loop().run_in_executor(writes.submitter(), submit)
            try:
                submitted = await asyncio.shield(job)
            except asyncio.CancelledError:
                job.add_done_callback(_release_abandoned)
                raise
        if not isinstance(submitted, Written):
            return submitted
        try:
            try:
                decision = await _decided(submitted.ticket, submitted.remaining())
            except StateUnavailable as e:
                return writes.conclude(submitted, None, e)
            return writes.conclude(submitted, decision)
        finally:
            submitted.ticket.release()

    # -- writes
    async def append(self, batch: Batch, timeout: float = 30.0, *, expected_last: Receipt | Empty | None = None,
                     fence: Fence | None = None, turn: TurnSlot | None = None) -> Receipt:
        writes = self.engine._writes
        return receipt_of(await self._write(lambda: writes.submit_append(batch, timeout, expected_last, fence, turn),
                                            _conversation_of(batch)))

    async def replace_turn(self, batch: Batch, old_turn_id: str, reason: str, timeout: float = 30.0, *,
                           fence: Fence | None = None) -> Receipt:
        writes = self.engine._writes
        return receipt_of(await self._write(lambda: writes.submit_replace(batch, old_turn_id, reason, timeout, fence),
                                            _conversation_of(batch)))

    async def begin_run(self, conversation_id: str, run_id: str, timeout: float = 30.0) -> Fence:
        writes = self.engine._writes
        return fence_of(await self._write(lambda: writes.submit_begin_run(conversation_id, run_id, timeout),
                                          conversation_id if isinstance(conversation_id, str) else ""))

    async def allocate_turn(self, conversation_id: str, timeout: float = 30.0) -> TurnSlot:
        writes = self.engine._writes
        return slot_of(await self._write(lambda: writes.submit_allocate_turn(conversation_id, timeout),
                                         conversation_id if isinstance(conversation_id, str) else ""))

    async def link_assets(self, conversation_id: str, message_id: str, refs: list[AssetRef],
                          timeout: float = 30.0) -> tuple[AssetRef, ...]:
        writes = self.engine._writes
        return assets_of(await self._write(lambda: writes.submit_link_assets(conversation_id, message_id, refs,
                                                                              timeout),
                                           conversation_id if isinstance(conversation_id, str) else ""))

    async def delete_messages(self, conversation_id: str, message_ids: list[str], *, fence: Fence | None = None,
                              timeout: float = 30.0) -> int:
        """``HistoryEngine.delete_messages``: its decision awaited on the loop (the compaction of
        the rows' files runs on the engine's eraser thread, as a clear's does)."""
        writes = self.engine._writes
        return count_of(await self._write(lambda: writes.submit_delete_messages(conversation_id, message_ids, fence,
                                                                                 timeout),
                                          conversation_id if isinstance(conversation_id, str) else ""))

    async def fence_of_epoch(self, conversation_id: str, epoch: int, timeout: float = 10.0) -> Fence:
        # On a worker thread: an epoch not applied yet waits for the catch-up with the log's end.
        return await asyncio.to_thread(self.engine.fence_of_epoch, conversation_id, epoch, timeout)

    async def run_wrote_history(self, conversation_id: str, run_id: str, root_turn: str | None = None) -> bool:
        return self.engine.run_wrote_history(conversation_id, run_id, root_turn)  # one point read or seek

    async def run_request_message(self, conversation_id: str, run_id: str, root_turn: str) -> str:
        return self.engine.run_request_message(conversation_id, run_id, root_turn)  # a seek and a few point reads

    async def clear(self, conversation_id: str, timeout: float = 30.0) -> None:
        await self._write(lambda: self.engine._writes.submit_clear(conversation_id, timeout),
                          conversation_id if isinstance(conversation_id, str) else "")

    async def clear_prefix(self, prefix: str, timeout: float = 30.0) -> int:
        """``HistoryEngine.clear_prefix``: the clears of each batch awaited together on the loop."""
        prefix = check_clear_prefix(prefix)
        check_timeout(timeout)
        ids = await self.conversations(prefix)
        await self._clear_all(ids, timeout)
        return len(ids)

    async def _clear_all(self, ids: Sequence[str], timeout: float = 30.0) -> None:
        """Clear ``ids``, ``CLEAR_BATCH`` at a time (the service's cluster members list their own)."""
        for start in range(0, len(ids), CLEAR_BATCH):
            done = await asyncio.gather(*(self.clear(c, timeout) for c in ids[start:start + CLEAR_BATCH]),
                                        return_exceptions=True)
            failed = next((d for d in done if isinstance(d, BaseException)), None)
            if failed is not None:
                raise failed

    async def wait_applied(self, position: LogPosition, timeout: float = 30.0) -> None:
        """``HistoryEngine.wait_applied`` without a thread: the wait is a future the projector
        resolves (``Positions.when_applied``), so any number of waiters hold no worker."""
        engine = self.engine
        if engine._has_applied(position):
            return
        engine._check_waitable(position, timeout)
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()

        def wake() -> None:  # on the projector's thread, under its lock: hand off only
            loop.call_soon_threadsafe(_settle, woken)

        projector = engine._projector
        cancel = projector.when_applied(position, wake)
        if cancel is None:
            return
        try:
            await asyncio.wait_for(woken, timeout)
        except TimeoutError:
            cancel()
            projector.after_wait(position)
            if engine._has_applied(position):  # applied as the time ran out
                return
            raise engine._not_applied(position, timeout) from None
        except BaseException:  # cancelled: nothing of the waiter is left behind
            cancel()
            raise
        projector.after_wait(position)

    # -- reads
    async def read(self, conversation_id: str, at_least: Receipt | None = None, timeout: float = 30.0) -> list[Message]:
        if at_least is not None:  # the facade's checks first, then the wait on the loop, then the read
            check_timeout(timeout)
            self.engine._ready(ConversationID(conversation_id))
            await self.wait_applied(at_least_position(at_least), timeout)
        return await _off_loop(self.engine.read, conversation_id, None, timeout)

    async def conversations(self, prefix: str | None = None, after: str | None = None,
                            limit: int | None = None) -> list[ConversationID]:
        return await _off_loop(self.engine.conversations, prefix, after, limit)

    async def entries(self, conversation_id: str, after: HistoryPosition | None = None,
                      before: HistoryPosition | None = None, limit: int | None = None,
                      include_hidden: bool = False, order: Order = "asc", since: datetime | None = None,
                      until: datetime | None = None) -> list[StoredMessage]:
        args = (conversation_id, after, before, limit, include_hidden, order, since, until)
        if isinstance(limit, int) and 0 <= limit <= INLINE_MESSAGES:
            return self.engine.entries(*args)
        return await _off_loop(self.engine.entries, *args)

    async def entries_by_ids(self, conversation_id: str, ids: list[str]) -> list[StoredMessage]:
        if isinstance(ids, (list, tuple)) and len(ids) <= INLINE_MESSAGES:
            return self.engine.entries_by_ids(conversation_id, ids)
        return await _off_loop(self.engine.entries_by_ids, conversation_id, ids)

    async def turn_sources_by_ids(self, conversation_id: str, ids: list[str]) -> list[TurnSource]:
        if isinstance(ids, (list, tuple)) and len(ids) <= INLINE_MESSAGES:
            return self.engine.turn_sources_by_ids(conversation_id, ids)
        return await _off_loop(self.engine.turn_sources_by_ids, conversation_id, ids)

    async def position_of(self, conversation_id: str, message_id: str) -> HistoryPosition:
        return self.engine.position_of(conversation_id, message_id)  # two point reads: on the loop

    async def locate(self, conversation_id: str, external_id: str, before: int = 0, after: int = 0) -> Located:
        if isinstance(before, int) and isinstance(after, int) and 0 <= before + after <= INLINE_MESSAGES:
            return self.engine.locate(conversation_id, external_id, before, after)
        return await _off_loop(self.engine.locate, conversation_id, external_id, before, after)

    async def turn(self, conversation_id: str, message_id: str) -> HistoryTurn:
        return await _off_loop(self.engine.turn, conversation_id, message_id)

    async def turns(self, conversation_id: str) -> list[HistoryTurn]:
        return await _off_loop(self.engine.turns, conversation_id)

    async def latest_turn(self, conversation_id: str) -> HistoryTurn | None:
        return await _off_loop(self.engine.latest_turn, conversation_id)

    async def latest_interrupted_checkpoint(self, conversation_id: str) -> StoredMessage | None:
        return await _off_loop(self.engine.latest_interrupted_checkpoint, conversation_id)

    async def window(self, conversation_id: str, limit: int, before: HistoryPosition | None = None) -> list[Message]:
        if isinstance(limit, int) and 0 <= limit <= INLINE_MESSAGES:
            return self.engine.window(conversation_id, limit, before)
        return await _off_loop(self.engine.window, conversation_id, limit, before)

    async def _window_canonical(self, conversation_id: str, limit: int, before: HistoryPosition | None = None
                                ) -> list[bytes]:
        """``window`` as canonical JSON bytes (the service's form, see the facade's)."""
        if isinstance(limit, int) and 0 <= limit <= INLINE_MESSAGES:
            return self.engine._window_canonical(conversation_id, limit, before)
        return await _off_loop(self.engine._window_canonical, conversation_id, limit, before)

    async def window_entries(self, conversation_id: str, limit: int) -> StoredWindow:
        return await _off_loop(self.engine.window_entries, conversation_id, limit)

    async def read_within_bytes(self, conversation_id: str, max_bytes: int,
                                after: HistoryPosition = HistoryPosition.START, before: HistoryPosition | None = None,
                                unit: Unit = "turn") -> HistoryLoad[StoredMessage]:
        return await _off_loop(self.engine.read_within_bytes, conversation_id, max_bytes, after, before, unit)

    async def turn_sources(self, conversation_id: str, max_bytes: int, after: HistoryPosition = HistoryPosition.START,
                           before: HistoryPosition | None = None, unit: Unit = "turn") -> HistoryLoad[TurnSource]:
        return await _off_loop(self.engine.turn_sources, conversation_id, max_bytes, after, before, unit)

    async def measure(self, conversation_id: str, after: HistoryPosition = HistoryPosition.START) -> Measure:
        return self.engine.measure(conversation_id, after)

    async def stats(self) -> EngineStats:
        return await _off_loop(self.engine.stats)
