"""What the projector hands out after each committed step: each writer's decision, and the
accepted events to subscribers.

**Tickets.** A writer takes a ``Ticket`` for its record key *before* it produces the record;
from then on the projector hands the ticket the decision of every record under that key it
applies (its own, and the rare identical retry or conflict from elsewhere). The ticket learns
where its own record is from the log's handle (``Ticket.follow``: at once on FileLog, on the
broker's acknowledgement on Kafka, which can come after the projector decided the record) and
settles when it holds both, so a decision that arrives before the position, or before the
writer looks, cannot be "forgotten": there is no cache to evict it from. The writer waits only
for that (a decision implies its record was visible, which implies durable): one wait per
write. The log's failure of the write (a fail-stopped flush, a send not acknowledged) settles
the ticket at once with the log's error. A ticket lives as long as one write (the
writer's ``with`` block, or until ``release``), so what it holds is bounded by the records
under one key written meanwhile; nothing is kept for positions no writer of this process waits on.

A writer waits either on a thread (``Ticket.wait``) or on an asyncio future (``Ticket.watch``):
the projector resolves watched futures after the committed step, grouped per event loop (one
``call_soon_threadsafe`` per loop and step), so an async writer holds no thread while it waits.

**Subscriptions.** A ``Subscription`` is a thread-safe iterator of the accepted events
(``projections.events``: the objects custom projections get), in log order per partition,
from the first step committed after ``subscribe`` returned. Its buffer is bounded and the
projector never waits for a consumer: when an event does not fit, the subscription is *lost*
and, after the buffered events, raises ``SubscriptionLost`` (subscribe again, then re-read).

The projector's stop ends every subscription (after its buffered events) and answers every
waiting ticket "undecided" (a watched future: None); its failure is raised to both (a watched
future: as its exception).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
import time
from _thread import LockType
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import Any, Protocol

from projections.admission import Decision
from projections.events import ProjectedEvent
from schemas.errors import HistoryError, InvalidConfiguration, SubscriptionLost
from schemas.positions import LogPosition

__all__ = ["DEFAULT_BUFFER", "Deliveries", "Subscription", "Ticket"]

DEFAULT_BUFFER = 1000
_WAKE = 1.0  # the longest a blocked ``next`` sleeps between checks (a close from a signal handler)

Failure = Callable[[], HistoryError]
"""Makes the (typed) error that says why the projector stopped, a new one for each raise."""

_Watched = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Decision | None]", "Decision | Failure | None"]
"""A watched future and its outcome: a decision, None (undecided: stopped), or the failure."""
_Wake = _Watched | LockType
"""What a settled ticket leaves to do once the owner's lock is released: its watched future to
hand to its loop, or its waiting thread's gate to open (a futex wake: done under the lock, 40
of them in one step kept every writer's ``take`` and ``release`` waiting behind it)."""


class Produced(Protocol):
    """What a ticket needs of the log's handle for its record (``engine.log.base.Produced``)."""

    @property
    def position(self) -> LogPosition | None: ...
    @property
    def error(self) -> Exception | None: ...
    def notify(self, fn: Callable[[Any], object]) -> None: ...


class Ticket:
    """One writer's claim on the decisions of the records under its key (see the module).

    The writer's own record is the one at ``position``: told by ``follow`` (the log's handle:
    at once for FileLog, on the acknowledgement for Kafka, which may come after the decision)
    or by ``wait``/``watch``. The ticket *settles* once, on the first of: the decision of its
    own record (known position and decision both held), the write's failure (the log's error,
    at once), the projector's failure, the projector's stop, or its partition given up.

    Two ways to wait, with the same answers: ``wait`` parks the calling thread on the ticket's
    own gate (a lock released once, when it settles: one wake-up, no shared condition);
    ``watch`` parks nothing: it returns an asyncio future that the projector resolves, after
    the step that decides the record is committed, through the future's loop
    (``call_soon_threadsafe``, one per loop and step). ``release`` (or the end of
    ``Deliveries.ticket``'s ``with`` block) gives the ticket back; a released ticket gets nothing.
    """

    __slots__ = ("_abandoned", "_decisions", "_gate", "_on_release", "_outcome", "_owner", "_position",
                 "_released", "_settled", "_watch", "key")

    def __init__(self, owner: Deliveries, key: bytes, on_release: Callable[[], object] | None = None) -> None:
        self._owner = owner
        self._decisions: dict[LogPosition, Decision] = {}
        self._position: LogPosition | None = None
        self._gate = threading.Lock()
        self._gate.acquire()  # released once, when the ticket settles
        self._settled = False
        self._outcome: Decision | Failure | None = None
        self._watch: tuple[asyncio.AbstractEventLoop, asyncio.Future[Decision | None]] | None = None
        self._on_release = on_release
        self._released = False
        self._abandoned = False  # its partition was given up: nothing more will be decided here
        self.key = key

    @property
    def position(self) -> LogPosition | None:
        """Where the writer's own record is, once known."""
        return self._position

    def follow(self, produced: Produced) -> None:
        """The writer's own record is the one ``produced`` stands for: its position now if the
        log knows it, else from the log's acknowledgement; the write's error settles the
        ticket at once (any thread may run this callback: it only takes the owner's lock)."""
        if produced.position is not None:
            self._aim(produced.position)
        produced.notify(self._produced)

    def _produced(self, produced: Produced) -> None:
        error = produced.error
        if error is None:
            if produced.position is not None:
                self._aim(produced.position)
            return
        wakes: list[_Wake] = []
        with self._owner._lock:
            self._settle_locked(lambda: _as_history_error(error), wakes)
        _wake(wakes)

    def _aim(self, position: LogPosition) -> None:
        wakes: list[_Wake] = []
        with self._owner._lock:
            if self._position is None:
                self._position = position
                decision = self._decisions.get(position)
                if decision is not None:
                    self._settle_locked(decision, wakes)
        _wake(wakes)

    def wait(self, position: LogPosition | None = None, timeout: float = 30.0) -> Decision | None:
        """The decision for the writer's own record (``position``, when ``follow`` did not tell
        it), or None when it is not decided within ``timeout`` seconds or the projector stopped
        first. Raises the projector's failure, or the write's. Another position (a record under
        the same key) is only looked up, not waited for."""
        if position is not None:
            if self._position is None:
                self._aim(position)
            elif position != self._position:
                with self._owner._lock:
                    return self._decisions.get(position)
        if not self._gate.acquire(timeout=max(timeout, 0.0)):
            return None  # not settled in time
        self._gate.release()  # open for good: every later wait passes at once
        outcome = self._outcome  # set before the gate was opened (under the owner's lock)
        if outcome is None or isinstance(outcome, Decision):
            return outcome
        raise outcome()

    def watch(self, position: LogPosition | None = None) -> asyncio.Future[Decision | None]:
        """``wait`` without a thread: a future of the running loop (call it from the loop) that
        gets the decision, None once the projector stopped undecided, or the failure as its
        exception. No timeout here: the caller bounds its ``await`` (``engine.aio``: a timer that
        sets None) and then releases the ticket; a future done meanwhile is left alone."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Decision | None] = loop.create_future()
        if position is not None and self._position is None:
            self._aim(position)
        with self._owner._lock:
            settled, outcome = self._settled, self._outcome
            if not settled:
                self._watch = (loop, future)
        if settled:
            _settle([(future, outcome)])
        return future

    def release(self) -> None:
        """Give the ticket back (idempotent): the projector no longer hands it decisions."""
        self._owner._release(self)

    def _settle_locked(self, outcome: Decision | Failure | None, out: list[_Wake]) -> None:
        """Under the owner's lock: the ticket's answer, once; its waiter is woken by ``_wake(out)``
        once the lock is released (its gate opened, or its watched future handed to its loop)."""
        if self._settled:
            return
        self._settled = True
        self._outcome = outcome  # set before the gate opens: ``wait`` reads it after its acquire
        out.append(self._gate)
        watch, self._watch = self._watch, None
        if watch is not None:
            out.append((watch[0], watch[1], outcome))


def _as_history_error(error: Exception) -> HistoryError:
    if isinstance(error, HistoryError):
        return error
    wrapped = HistoryError(f"the log failed to write the record: {error!r}")
    wrapped.__cause__ = error
    return wrapped


_Settle = tuple["asyncio.Future[Decision | None]", "Decision | Failure | None"]


def _settle(wakes: Sequence[_Settle]) -> None:
    """On a loop: set each future (one still waited on) to its outcome."""
    for future, outcome in wakes:
        if future.done():
            continue  # timed out or cancelled meanwhile
        if outcome is None or isinstance(outcome, Decision):
            future.set_result(outcome)
        else:
            future.set_exception(outcome())


def _wake(wakes: Sequence[_Wake]) -> None:
    """Open the settled tickets' gates, and hand the outcomes to their loops: one
    ``call_soon_threadsafe`` per loop and step. Called without the owner's lock."""
    by_loop: dict[asyncio.AbstractEventLoop, list[_Settle]] = {}
    for item in wakes:
        if isinstance(item, tuple):
            loop, future, outcome = item
            by_loop.setdefault(loop, []).append((future, outcome))
        else:
            item.release()
    for loop, items in by_loop.items():
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody awaits its futures
            loop.call_soon_threadsafe(_settle, items)


class Subscription:
    """A thread-safe iterator of accepted events (``BatchEvent``, ``ClearEvent``,
    ``TurnReplacedEvent``), in log order per partition; a context manager; ``close()`` from any
    thread (or a signal handler) ends it.

    ``start`` holds the applied offsets when it was created: every event it yields has
    ``position.offset >= start[position.partition]``, and every event applied since is yielded
    (unless the subscription is lost). To follow a conversation without a gap: subscribe, read
    it, then skip the events at positions the read already covered.

    Iteration blocks until the next event and stops after ``close()``, or once the engine is
    closed and the buffered events are consumed. After the buffered events it raises
    ``SubscriptionLost`` when the consumer fell more than ``capacity`` events behind, and the
    projector's failure (``StateUnavailable``) when the projector stopped on one.
    """

    def __init__(self, owner: Deliveries, capacity: int, start: Sequence[int]) -> None:
        self._owner = owner
        self._cond = threading.Condition(threading.RLock())  # re-entrant: close() may run in a signal handler
        self._buffer: collections.deque[ProjectedEvent] = collections.deque()
        self._lost: LogPosition | None = None
        self._closed = False
        self._ended = False  # the engine closed: no event will be added
        self.capacity = capacity
        self.start = list(start)

    def get(self, timeout: float | None = None) -> ProjectedEvent | None:
        """The next event, waiting at most ``timeout`` seconds (``None``: until one arrives or
        the subscription ends); None when none arrived in time or when it has ended (``done``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._closed:
                    return None
                if self._buffer:
                    return self._buffer.popleft()
                if self._lost is not None:
                    raise SubscriptionLost(
                        f"this subscription fell more than {self.capacity} events behind, so the events from "
                        f"{self._lost} on were dropped; subscribe again, then re-read what you follow (e.g. "
                        "entries after the last position you saw) before consuming the new subscription",
                        position=self._lost)
                if self._owner._failure is not None:
                    raise self._owner._failure()
                if self._ended:
                    return None
                remaining = _WAKE if deadline is None else min(deadline - time.monotonic(), _WAKE)
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)

    @property
    def done(self) -> bool:
        """True once no event will ever be yielded (closed, or ended with its buffer consumed)."""
        with self._cond:
            return self._closed or (self._ended and not self._buffer and self._lost is None
                                    and self._owner._failure is None)

    def __iter__(self) -> Iterator[ProjectedEvent]:
        return self

    def __next__(self) -> ProjectedEvent:
        while True:
            event = self.get(None)
            if event is not None:
                return event
            if self.done:
                raise StopIteration

    def close(self) -> None:
        """Stop receiving events (idempotent): an iteration in progress ends, buffered events are
        dropped. It takes only this subscription's (re-entrant) lock, so a signal handler may call
        it; the projector forgets it at its next step."""
        with self._cond:
            self._closed = True
            self._buffer.clear()
            self._cond.notify_all()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    # -- the projector's side ------------------------------------------------------------------
    def _offer(self, events: Sequence[ProjectedEvent]) -> None:
        """Buffer one step's events; never waits for the consumer: past ``capacity`` the rest of
        the step is dropped and the subscription is lost."""
        with self._cond:
            if self._closed or self._lost is not None:
                return
            room = self.capacity - len(self._buffer)
            self._buffer.extend(events[:room])
            if len(events) > room:
                self._lost = events[room].position
            self._cond.notify_all()

    def _end(self) -> None:
        with self._cond:
            self._ended = True
            self._cond.notify_all()


class Deliveries:
    """The tickets and subscriptions of one projector; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tickets: dict[bytes, list[Ticket]] = {}
        self._subscriptions: list[Subscription] = []
        self._failure: Failure | None = None
        self._stopped = False
        self._taken = 0  # tickets taken and not released: read without the lock (``tickets``)

    def take(self, key: bytes, on_release: Callable[[], object] | None = None) -> Ticket:
        """A ticket for the records under ``key`` until ``Ticket.release()`` (take it before
        producing the record); ``on_release`` runs once, when it is released."""
        ticket = Ticket(self, key, on_release)
        wakes: list[_Wake] = []
        with self._lock:
            self._tickets.setdefault(key, []).append(ticket)
            self._taken += 1
            if self._failure is not None or self._stopped:  # nothing will be decided: answer at once
                ticket._settle_locked(self._failure, wakes)
        _wake(wakes)
        return ticket

    @contextlib.contextmanager
    def ticket(self, key: bytes) -> Iterator[Ticket]:
        """A ticket for the records under ``key``, for the duration of the ``with`` block."""
        ticket = self.take(key)
        try:
            yield ticket
        finally:
            ticket.release()

    def _release(self, ticket: Ticket) -> None:
        with self._lock:
            if ticket._released:
                return
            ticket._released = True
            ticket._watch = None
            waiting = self._tickets[ticket.key]
            waiting.remove(ticket)
            self._taken -= 1
            if not waiting:
                del self._tickets[ticket.key]
        if ticket._on_release is not None:
            ticket._on_release()

    @property
    def tickets(self) -> int:
        """How many tickets are taken (not yet released): the writes waiting for a decision. Takes
        no lock (one int read), so a log may ask it under its own lock (``Log.expect_writers``)."""
        return self._taken

    def subscribe(self, capacity: int, start: Sequence[int]) -> Subscription:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise InvalidConfiguration(f"invalid subscription buffer {capacity!r}: expected an int >= 1 "
                                       f"(events held for a slow consumer; default {DEFAULT_BUFFER})")
        subscription = Subscription(self, capacity, start)
        with self._lock:
            if self._stopped:
                subscription._end()
            else:
                self._subscriptions.append(subscription)
        return subscription

    @property
    def wants_events(self) -> bool:
        """Whether a step must build its accepted events (someone subscribes)."""
        return bool(self._subscriptions)

    def publish(self, decided: Sequence[tuple[LogPosition, bytes, Decision]],
                events: Sequence[ProjectedEvent]) -> None:
        """After a committed step: hand each ticket the decisions under its key, and each
        subscription the step's accepted events."""
        wakes: list[_Wake] = []
        with self._lock:
            if self._tickets:
                for position, key, decision in decided:
                    for ticket in self._tickets.get(key, ()):
                        ticket._decisions[position] = decision
                        if ticket._position == position:
                            ticket._settle_locked(decision, wakes)
            if any(s._closed for s in self._subscriptions):
                self._subscriptions = [s for s in self._subscriptions if not s._closed]
            subscriptions = list(self._subscriptions) if events else []
        _wake(wakes)
        for subscription in subscriptions:
            subscription._offer(events)

    def abandon(self, gone: Callable[[bytes], bool]) -> None:
        """The partitions of the keys ``gone`` accepts were given up: their waiting tickets answer
        "undecided" now (their records' decisions are made by the partitions' new owner)."""
        wakes: list[_Wake] = []
        with self._lock:
            for key, waiting in self._tickets.items():
                if gone(key):
                    for ticket in waiting:
                        ticket._abandoned = True
                        ticket._settle_locked(None, wakes)
        _wake(wakes)

    def fail(self, failure: Failure) -> None:
        """The projector stopped on a failure: every ticket and subscription raises it."""
        wakes: list[_Wake] = []
        with self._lock:
            self._failure = failure
            subscriptions = self._end_all(failure, wakes)
        _wake(wakes)
        for subscription in subscriptions:
            subscription._end()

    def stop(self) -> None:
        """The projector stopped (engine close): waiting tickets answer "undecided", subscriptions
        end after their buffered events."""
        wakes: list[_Wake] = []
        with self._lock:
            self._stopped = True
            subscriptions = self._end_all(None, wakes)
        _wake(wakes)
        for subscription in subscriptions:
            subscription._end()

    def _end_all(self, outcome: Failure | None, wakes: list[_Wake]) -> list[Subscription]:
        for waiting in self._tickets.values():
            for ticket in waiting:
                ticket._settle_locked(outcome, wakes)
        subscriptions, self._subscriptions = self._subscriptions, []
        return subscriptions
