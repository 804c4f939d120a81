"""Runs and fences, turn slots and assets on ``HistoryEngine`` (API.md "Runs, slots, assets,
deletes"; the rules are ``projections.runs``', ``projections.slots``' and ``projections.assets``'):
``begin_run``, the two questions about what a run wrote, ``allocate_turn``, ``link_assets`` and
``delete_messages`` (``engine.deletes``). A
mixin, so the facade keeps one home per face; the asyncio face (``engine.aio``) calls the same checks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from engine.reading import EngineReads
from engine.writes import assets_of, count_of, fence_of, slot_of
from schemas.assets import AssetRef
from schemas.errors import ConversationClosed, Fenced, InvalidRequest, NotFound
from schemas.ids import ConversationID, MessageID, RunID
from schemas.runs import Fence
from schemas.slots import TurnSlot

if TYPE_CHECKING:  # pragma: no cover
    from engine.writes import Writes

__all__ = ["EngineRuns", "check_root_turn", "request_of"]


def check_root_turn(root_turn: object, *, required: bool) -> str | None:
    """``root_turn`` as a turn id (``HistoryTurn.id``), or None when allowed; ``InvalidRequest``
    naming it otherwise, before any I/O."""
    if root_turn is None and not required:
        return None
    if not isinstance(root_turn, str):
        raise InvalidRequest(f"invalid root_turn: expected a turn id (HistoryTurn.id, e.g. 'a-2/0'), "
                             f"got {type(root_turn).__name__}")
    try:
        MessageID.parse(root_turn)
    except NotFound as e:
        raise InvalidRequest(f"invalid root_turn {root_turn[:80]!r}: {e}") from None
    return root_turn


def request_of(c: ConversationID, run: RunID, root_turn: str, found: MessageID | None) -> str:
    if found is None:
        raise NotFound(f"run {str(run)!r} of {str(c)!r} applied no request that is still visible, and turn "
                       f"{root_turn!r} is no visible user message: read turns() for the conversation's turns")
    return str(found)


class EngineRuns(EngineReads):
    """``begin_run``, ``run_wrote_history`` and ``run_request_message`` (``HistoryEngine``'s)."""

    _writes: Writes
    catch_up: Callable[..., bool]  # HistoryEngine's

    def begin_run(self, conversation_id: str, run_id: str, timeout: float = 30.0) -> Fence:
        """The run ``run_id`` now owns the conversation's writes: its ``Fence``, whose ``epoch``
        admission gives in log order (1 for the conversation's first run, then one more for each
        new run; the same run again keeps its epoch). Writes with ``fence=`` are refused with
        ``Fenced`` once a later run began before them in the log. ``ConversationClosed`` for a
        cleared conversation; ``InvalidRequest`` for a bad run id. ``timeout``: as ``append``."""
        writes = self._writes
        return fence_of(writes.settle(writes.submit_begin_run(conversation_id, run_id, timeout)))

    def allocate_turn(self, conversation_id: str, timeout: float = 30.0) -> TurnSlot:
        """Reserve the conversation's next turn before any of its rows exist: a ``TurnSlot``
        whose ``turn_id`` (``<slot id>/0``) and ``position`` admission gives in log order, so every
        subscriber can learn the turn's identity when the input is accepted. ``append(batch,
        turn=slot)`` files the batch's user-led turn under it. The position is spent whether or
        not a turn uses it (positions are compared, never counted); the slot is usable while no
        later turn exists, once (``SlotUnavailable`` otherwise). ``ConversationClosed`` for a
        cleared conversation. ``timeout``: as ``append``."""
        writes = self._writes
        return slot_of(writes.settle(writes.submit_allocate_turn(conversation_id, timeout)))

    def link_assets(self, conversation_id: str, message_id: str, refs: list[AssetRef],
                    timeout: float = 30.0) -> tuple[AssetRef, ...]:
        """Attach media references to the visible message ``message_id`` (the reference's
        ``LinkAssets``), decided in log order; returns all of the message's assets, in ordinal
        order, after the link. Idempotent: a ref already linked changes nothing; another ref at an
        ordinal the message links already raises ``AppendConflict`` (nothing is linked).
        ``NotFound`` for a message that is not visible (unknown, or its turn was replaced),
        ``ConversationClosed`` once cleared, ``InvalidRequest`` for bad refs or more than
        ``schemas.assets.MAX_ASSETS``, before any I/O. The refs are sealed in the log like content
        and erased by ``clear``; every read's ``StoredMessage.assets`` returns them."""
        writes = self._writes
        return assets_of(writes.settle(writes.submit_link_assets(conversation_id, message_id, refs, timeout)))

    def delete_messages(self, conversation_id: str, message_ids: list[str], *, fence: Fence | None = None,
                        timeout: float = 30.0) -> int:
        """Delete stored messages (moderation, a user's request): decided in log order, they leave
        every read (entries, windows, budgets, turn sources, measures, locate, turns, reads by id,
        the hidden rows of replaced turns) and the state, whose files are compacted before this
        returns, as a clear's are; a turn whose messages are all deleted disappears. Returns how
        many of them were visible. Unknown, malformed and already deleted ids change nothing (a
        retry is safe), and a deleted message never comes back (its append id stays known: the
        same append again is a duplicate). Custom projections and subscribers get a
        ``MessagesDeleted`` event. The log keeps the records that carried them, sealed under the
        conversation's keys, until ``clear`` erases the conversation. ``fence``: as ``append``'s
        (``Fenced``); ``ConversationClosed`` once cleared; ``InvalidWindow`` for ids that are not a
        list of str or more than 10,000, before any I/O. O(messages after the first one deleted)."""
        writes = self._writes
        return count_of(writes.settle(writes.submit_delete_messages(conversation_id, message_ids, fence, timeout)))

    def fence_of_epoch(self, conversation_id: str, epoch: int, timeout: float = 10.0) -> Fence:
        """The ``Fence`` of the run that has ``epoch`` in the conversation, as this instance has
        applied it: what a write that names its fence by epoch alone (HTTP's ``"fence": N``)
        carries. An epoch this instance has not applied yet waits (at most ``timeout`` seconds)
        for it to catch up with the log's end, since another instance may have begun that run
        just now; ``Fenced`` when no run of that epoch began even then (a write under it would be
        refused; ``ConversationClosed`` once it was cleared). ``InvalidRequest`` for an epoch that
        is not an int >= 1."""
        c = ConversationID(conversation_id)
        if type(epoch) is not int or not 1 <= epoch < 1 << 63:
            raise InvalidRequest(f"invalid fence: an epoch is an int of at least 1 (begin_run's), got {epoch!r}")
        self._ready(c)
        run = self._reads.run_of_epoch(c, epoch)
        if run is None:
            self.catch_up(timeout=timeout)
            run = self._reads.run_of_epoch(c, epoch)
        if run is None and self._reads.closed(c):  # a clear dropped its runs: what the write would meet
            raise ConversationClosed(f"conversation {str(c)!r} is closed forever (it was cleared); start a new "
                                     "conversation id", conversation_id=c)
        if run is None:
            raise Fenced(f"no run of epoch {epoch} has begun in {str(c)!r}: call begin_run and write under its "
                         "fence", conversation_id=c)
        return Fence(c, RunID(run), epoch)

    def run_wrote_history(self, conversation_id: str, run_id: str, root_turn: str | None = None) -> bool:
        """Whether run ``run_id`` (a batch's ``run_id``, or a fence's run) wrote any message,
        hidden ones included (a request that a replacement removed is not restored); with
        ``root_turn``, a message in that turn. One point read or one seek."""
        c = ConversationID(conversation_id)
        run = RunID(run_id)
        turn = check_root_turn(root_turn, required=False)
        self._ready(c)
        return self._reads.run_wrote_history(c, run, turn)

    def run_request_message(self, conversation_id: str, run_id: str, root_turn: str) -> str:
        """The message id of the run's applied request: the newest visible user message the run
        wrote, else the root turn's request (``root_turn``, when it is a visible user message,
        e.g. an inbound request stored before the run began); ``NotFound`` when neither exists."""
        c = ConversationID(conversation_id)
        run = RunID(run_id)
        turn = check_root_turn(root_turn, required=True)
        assert turn is not None  # Invariant: required.
        self._ready(c)
        return request_of(c, run, turn, self._reads.run_request(c, run, turn))
