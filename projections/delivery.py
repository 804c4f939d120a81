"""What the projector hands out after each committed step: each writer's decision, and the
accepted events to subscribers.

**Tickets.** A writer takes a ``Ticket`` for its record key *before* it produces the record;
from then on the projector hands the ticket the decision of every record under that key it
applies (its own, and the rare identical retry or conflict from elsewhere). After the append
returns the position, ``Ticket.wait(position)`` answers from what the ticket holds, so a
projector that applied the record before the writer looked cannot make the decision
"forgotten": there is no cache to evict it from. A ticket lives as long as one write (the
writer's ``with`` block), so what it holds is bounded by the records under one key written
meanwhile; nothing is kept for positions no writer of this process waits on.

**Subscriptions.** A ``Subscription`` is a thread-safe iterator of the accepted events
(``projections.events``: the objects custom projections get), in log order per partition,
from the first step committed after ``subscribe`` returned. Its buffer is bounded and the
projector never waits for a consumer: when an event does not fit, the subscription is *lost*
and, after the buffered events, raises ``SubscriptionLost`` (subscribe again, then re-read).

The projector's stop ends every subscription (after its buffered events) and answers every
waiting ticket "undecided"; its failure is raised to both.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType

from projections.admission import Decision
from projections.events import ProjectedEvent
from schemas.errors import HistoryError, InvalidConfiguration, SubscriptionLost
from schemas.positions import LogPosition

__all__ = ["DEFAULT_BUFFER", "Deliveries", "Subscription", "Ticket"]

DEFAULT_BUFFER = 1000
_WAKE = 1.0  # the longest a blocked ``next`` sleeps between checks (a close from a signal handler)

Failure = Callable[[], HistoryError]
"""Makes the (typed) error that says why the projector stopped, a new one for each raise."""


class Ticket:
    """One writer's claim on the decisions of the records under its key (see the module)."""

    __slots__ = ("_cond", "_decisions", "_owner", "key")

    def __init__(self, owner: Deliveries, key: bytes) -> None:
        self._owner = owner
        self._cond = threading.Condition(owner._lock)
        self._decisions: dict[LogPosition, Decision] = {}
        self.key = key

    def wait(self, position: LogPosition, timeout: float) -> Decision | None:
        """The decision for ``position`` (a record under this ticket's key), or None when it is
        not decided within ``timeout`` seconds or the projector stopped first. Raises the
        projector's failure."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                decision = self._decisions.get(position)
                if decision is not None:
                    return decision
                if self._owner._failure is not None:
                    raise self._owner._failure()
                remaining = deadline - time.monotonic()
                if self._owner._stopped or remaining <= 0:
                    return None
                self._cond.wait(remaining)


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

    @contextlib.contextmanager
    def ticket(self, key: bytes) -> Iterator[Ticket]:
        """A ticket for the records under ``key``, for the duration of the ``with`` block (take
        it before producing the record)."""
        ticket = Ticket(self, key)
        with self._lock:
            self._tickets.setdefault(key, []).append(ticket)
        try:
            yield ticket
        finally:
            with self._lock:
                waiting = self._tickets[key]
                waiting.remove(ticket)
                if not waiting:
                    del self._tickets[key]

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
        with self._lock:
            if self._tickets:
                for position, key, decision in decided:
                    for ticket in self._tickets.get(key, ()):
                        ticket._decisions[position] = decision
                        ticket._cond.notify_all()
            if any(s._closed for s in self._subscriptions):
                self._subscriptions = [s for s in self._subscriptions if not s._closed]
            subscriptions = list(self._subscriptions) if events else []
        for subscription in subscriptions:
            subscription._offer(events)

    def fail(self, failure: Failure) -> None:
        """The projector stopped on a failure: every ticket and subscription raises it."""
        with self._lock:
            self._failure = failure
            subscriptions = self._end_all()
        for subscription in subscriptions:
            subscription._end()

    def stop(self) -> None:
        """The projector stopped (engine close): waiting tickets answer "undecided", subscriptions
        end after their buffered events."""
        with self._lock:
            self._stopped = True
            subscriptions = self._end_all()
        for subscription in subscriptions:
            subscription._end()

    def _end_all(self) -> list[Subscription]:
        for waiting in self._tickets.values():
            for ticket in waiting:
                ticket._cond.notify_all()
        subscriptions, self._subscriptions = self._subscriptions, []
        return subscriptions
