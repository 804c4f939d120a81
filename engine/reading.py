"""The read half of ``HistoryEngine`` (docs/design.md §5): every read of the API contract, the
wait for a position, and the two guards every call passes (``_check_open``, ``_serve``).

``EngineReads`` is a base class of ``HistoryEngine``, not an object of its own, so the public
contract stays one class; it holds no state. Each method checks its arguments before any I/O
(``engine.arguments``), then the guards, then makes one call into ``projections.reads.Reads``,
where the rows and their O(result) cost live.
"""

from __future__ import annotations

from datetime import datetime

from engine.arguments import (
    check_budget,
    check_context,
    check_cursors,
    check_ids,
    check_limit,
    check_order,
    check_prefix,
    check_timeout,
    check_window,
    time_bound,
)
from engine.log.base import Log
from projections.navigation import Order
from projections.reads import Reads, Unit
from projections.runtime import Projector
from schemas.batch import HistoryLoad, HistoryTurn, Located, Measure, Receipt, StoredMessage, StoredWindow, TurnSource
from schemas.errors import EngineClosed, InvalidReceipt, InvalidWindow, LogUnavailable, NotOwner, NotReady
from schemas.ids import ConversationID, MessageID
from schemas.messages import Message
from schemas.positions import HistoryPosition, LogPosition
from schemas.records import partition_for_key

__all__ = ["EngineReads", "at_least_position"]


def at_least_position(receipt: Receipt) -> LogPosition:
    """The log position an ``at_least=receipt`` waits for (``TypeError`` for anything but a Receipt)."""
    if not isinstance(receipt, Receipt):
        raise TypeError(f"at_least must be a Receipt, got {type(receipt).__name__}")
    return receipt.position


class EngineReads:
    """The reads of ``HistoryEngine`` over the attributes its constructor sets."""

    _log: Log
    _reads: Reads
    _projector: Projector
    _closed: bool

    # -- guards --------------------------------------------------------------------------------
    def _check_open(self) -> None:
        """Refuse calls on a closed engine, and on one whose projector stopped (its state no longer
        follows the log: fail-stop, so nothing is written that could not be decided, and nothing
        stale is served). ``stats``, ``poison`` and ``close`` still work."""
        if self._closed:
            raise EngineClosed("this HistoryEngine is closed; open a new one (HistoryEngine.open)")
        failed = self._projector.failed()
        if failed is not None:
            raise failed

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

    def _ready(self, c: ConversationID) -> None:
        """Both guards, in their order, once a read's arguments are checked."""
        self._check_open()
        self._serve(c)

    # -- reads ---------------------------------------------------------------------------------
    def read(self, conversation_id: str, at_least: Receipt | None = None, timeout: float = 30.0) -> list[Message]:
        """Detached messages in stored order; ``[]`` for unknown or closed conversations.

        ``at_least=receipt`` first waits until this instance has applied that receipt, at most
        ``timeout`` seconds (a finite number >= 0, checked even without ``at_least``; ``0``
        answers only if it is applied already), else ``LogUnavailable``.
        """
        check_timeout(timeout)
        c = ConversationID(conversation_id)
        self._ready(c)
        if at_least is not None:
            self._wait_for(at_least, timeout)
        return self._reads.messages(c)

    def _wait_for(self, receipt: Receipt, timeout: float) -> None:
        self.wait_applied(at_least_position(receipt), timeout)

    def wait_applied(self, position: LogPosition, timeout: float = 30.0) -> None:
        """Return once this instance has applied the log ``position`` (read-your-writes with a
        position from anywhere, e.g. a ``Receipt``'s), at most ``timeout`` seconds, else
        ``LogUnavailable``."""
        self._check_waitable(position, timeout)
        if not self._projector.wait_applied(position, timeout):
            raise self._not_applied(position, timeout)

    def _check_waitable(self, position: LogPosition, timeout: float) -> None:
        """The checks of ``wait_applied``'s arguments and of the engine, before any wait (the
        asyncio face's wait makes them too)."""
        check_timeout(timeout)
        if not isinstance(position, LogPosition):
            raise TypeError(f"a log position must be a LogPosition, got {type(position).__name__}")
        if position.partition >= self._log.partitions:
            raise InvalidReceipt(f"log position {position} names partition {position.partition}, but this log "
                                 f"has {self._log.partitions} (0..{self._log.partitions - 1}): use a position it gave")
        self._check_open()

    @staticmethod
    def _not_applied(position: LogPosition, timeout: float) -> LogUnavailable:
        return LogUnavailable(f"this instance has not applied {position} within {timeout}s; "
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
        self._ready(c)
        return self._reads.entries(c, after, before, limit, include_hidden, order,
                                   since_ms, until_ms)

    def entries_by_ids(self, conversation_id: str, ids: list[str]) -> list[StoredMessage]:
        """The visible messages named by ``ids`` (message ids from ``entries``), in history order,
        each once; ids that name no visible message (unknown, hidden by a replacement, or not a
        message id) are left out. At most ``MAX_IDS`` (10,000) ids per call; O(ids) point reads,
        whatever the history's length."""
        c = ConversationID(conversation_id)
        wanted = check_ids(ids)
        self._ready(c)
        return self._reads.entries_by_ids(c, wanted)

    def turn_sources_by_ids(self, conversation_id: str, ids: list[str]) -> list[TurnSource]:
        """``entries_by_ids`` as ``TurnSource``s (what ``turn_sources`` gives: id, role, content
        without metadata, time, interrupted)."""
        c = ConversationID(conversation_id)
        wanted = check_ids(ids)
        self._ready(c)
        return self._reads.turn_sources_by_ids(c, wanted)

    def position_of(self, conversation_id: str, message_id: str) -> HistoryPosition:
        """The ``HistoryPosition`` of the visible message ``message_id`` (an id from ``entries``,
        e.g. to page from it); ``NotFound`` for an unknown or hidden message. Two point reads."""
        c = ConversationID(conversation_id)
        MessageID.parse(message_id)  # NotFound for what spells no message id, before any I/O
        self._ready(c)
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
        self._ready(c)
        return self._reads.locate(c, external_id, before, after)

    def _is_closed(self, conversation_id: str) -> bool:
        """Whether the conversation was cleared (for the service's event streams, which end with
        ``closed``; one point read). The checks of every read first."""
        c = ConversationID(conversation_id)
        self._ready(c)
        return self._reads.closed(c)

    def turn(self, conversation_id: str, message_id: str) -> HistoryTurn:
        """The visible user-led turn holding ``message_id`` (an id from ``entries``); ``NotFound``
        for an unknown message, a hidden one, or one before the first user message."""
        c = ConversationID(conversation_id)
        MessageID.parse(message_id)  # NotFound for what spells no message id, before any I/O
        self._ready(c)
        return self._reads.turn(c, message_id)

    def latest_turn(self, conversation_id: str) -> HistoryTurn | None:
        """The latest visible user-led turn (the one ``replace_turn`` may replace), or None."""
        c = ConversationID(conversation_id)
        self._ready(c)
        return self._reads.latest_turn(c)

    def latest_interrupted_checkpoint(self, conversation_id: str) -> StoredMessage | None:
        """The newest assistant message with metadata ``interrupted: true`` that no later
        assistant message follows (later user or tool messages do not cancel it), or None."""
        c = ConversationID(conversation_id)
        self._ready(c)
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
        self._ready(c)
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
        self._ready(c)
        return self._reads.window_entries(c, limit)

    def turns(self, conversation_id: str) -> list[HistoryTurn]:
        """Every visible user-led turn, in order, each equal to ``turn(conversation_id, t.id)``;
        the last one is ``latest_turn``. One pass over the conversation's visible messages, so
        O(what it returns); ``[]`` for an unknown or closed conversation."""
        c = ConversationID(conversation_id)
        self._ready(c)
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
        self._ready(c)
        return self._reads.within_bytes(c, max_bytes, after, before, unit)

    def turn_sources(self, conversation_id: str, max_bytes: int, after: HistoryPosition = HistoryPosition.START,
                     before: HistoryPosition | None = None, unit: Unit = "turn") -> HistoryLoad[TurnSource]:
        """``read_within_bytes``'s window narrowed to ``TurnSource(id, role, content, created_at,
        interrupted)``, read from a keyspace of its own: no message row or metadata is loaded."""
        c = ConversationID(conversation_id)
        check_budget(max_bytes, unit)
        check_cursors(after, before)
        self._ready(c)
        return self._reads.turn_sources(c, max_bytes, after, before, unit)

    def measure(self, conversation_id: str, after: HistoryPosition = HistoryPosition.START) -> Measure:
        """``Measure(messages, content_bytes, turns)`` of the messages after ``after``, from
        running sums (two point reads, no payload). ``turns`` counts the distinct turn positions
        those messages belong to: the units of ``read_within_bytes(unit="turn")``."""
        c = ConversationID(conversation_id)
        check_cursors(after, None)
        self._ready(c)
        return self._reads.measure(c, after)

    def poison(self) -> list[tuple[LogPosition, str]]:
        """Quarantined poison records: their position and why they were skipped."""
        return self._reads.poison()
