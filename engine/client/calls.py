"""Every client call, written once: what it sends (``Request``s, from SERVICE.md's routes) and how
it reads the answers (``engine.service.wire``'s parsers, the server's own representations).

A call is a *plan*: a generator that yields the requests it needs, receives each answer's JSON
tree (None for a 204) and returns the call's result. The sync and the asyncio client run the same
plans (``engine/client/faces.py``), so the two faces cannot drift; most plans are one request,
``conversations`` follows the ``next`` pages, ``turns`` reads the visible entries and then the
turn of each.

Arguments are checked before any request by the facade's own rules (``ConversationID``,
``engine.arguments``), so bad input fails with the engine's typed error without reaching the
server; everything the server decides (admission, a reason or turn id it refuses) comes back as
its problem+json and is raised as that class.
"""

from __future__ import annotations

from collections.abc import Generator
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import quote

import orjson

from engine.arguments import (
    Empty,
    check_budget,
    check_clear_prefix,
    check_context,
    check_cursors,
    check_ids,
    check_limit,
    check_message_id,
    check_order,
    check_prefix,
    check_timeout,
    check_window,
    expected_of,
    time_bound,
)
from engine.client.policy import Request
from engine.facade import EngineStats
from engine.runs import check_root_turn
from engine.service import wire_assets
from engine.service.wire import (
    MAX_INT,
    StatsOut,
    history_position_of,
    located_of,
    log_position_of,
    measure_of,
    receipt_of,
    source_of,
    stats_of,
    stored_of,
    time_text,
    turn_of,
)
from engine.service.wire_bulk import cleared_of, deleted_of
from engine.service.wire_runs import fence_of, run_of
from engine.service.wire_slots import slot_of, turn_json
from projections.navigation import Order
from projections.reads import Unit
from schemas.assets import AssetRef, check_assets
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
from schemas.errors import InvalidBatch, InvalidRequest, InvalidWindow, LogUnavailable, NotFound
from schemas.event_rules import REPLACE_REASONS
from schemas.ids import ConversationID, MessageID, RunID
from schemas.messages import Message, Role, starts_turn
from schemas.positions import HistoryPosition, LogPosition
from schemas.runs import Fence, check_fence
from schemas.slots import TurnSlot, check_slot

__all__ = ["Plan", "allocate_turn", "append", "begin_run", "clear", "clear_prefix", "conversations",
           "delete_messages", "entries", "entries_by_ids", "latest_interrupted_checkpoint", "latest_turn",
           "link_assets", "locate", "measure", "poison", "position_of", "read", "read_within_bytes", "replace_turn",
           "run_request_message", "run_wrote_history", "stats", "turn", "turn_sources", "turn_sources_by_ids",
           "turns", "window", "window_entries"]

T = TypeVar("T")
Plan = Generator[Request, Any, T]

_PAGE = 1000
"""How many conversation ids one ``conversations`` request asks for."""


def _seg(text: str) -> str:
    """One percent-encoded path segment (RFC 3986: ``/`` is ``%2F``, UTF-8 bytes as ``%XX``)."""
    return quote(text, safe="")


def _conv(conversation_id: str) -> str:
    return "/v1/conversations/" + _seg(ConversationID(conversation_id))


def _field(tree: Any, name: str) -> Any:
    if not isinstance(tree, dict) or name not in tree:
        raise InvalidRequest(f"the service answered without {name!r}: {str(tree)[:200]}; is it a histlog server?")
    return tree[name]


def _cursor(p: HistoryPosition) -> HistoryPosition:
    """``p`` inside the range the wire carries (each number 0..``MAX_INT``), selecting the same
    messages: ``HistoryPosition`` accepts any ints and only compares, while stored positions are
    ``(turn >= 0, 1 <= seq < MAX_INT)``, so a cursor before ``0:0`` is ``0:0`` and one past the
    range is its end."""
    if p.turn < 0:
        return HistoryPosition.START
    if p.turn > MAX_INT:
        return HistoryPosition(MAX_INT, MAX_INT)
    return HistoryPosition(p.turn, min(max(p.seq, 0), MAX_INT))


def _budget(max_bytes: int) -> int:
    """``max_bytes`` inside the wire's range, loading the same: any budget <= 0 loads nothing, and
    one past ``MAX_INT`` bytes is no tighter than ``MAX_INT``."""
    return min(max(max_bytes, 0), MAX_INT)


def _params(**given: object) -> dict[str, str]:
    """The query: absent or default values (None, ``after`` at START, ``unit`` "turn") left out."""
    out: dict[str, str] = {}
    for name, value in given.items():
        if isinstance(value, HistoryPosition):
            value = _cursor(value)
        if value is None or (name == "after" and value == HistoryPosition.START) or (name, value) == ("unit", "turn"):
            continue
        out[name] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return out


# ----- writes
def _put(batch: Batch, extra: dict[str, Any], timeout: float | None, fence: Fence | None = None,
         turn: object = None) -> Plan[Receipt]:
    """The append's ``PUT``; with ``fence``, its epoch as ``"fence"``, and the batch's run (else the
    fence's) as ``"run_id"``, as the engine records it; with ``turn``, the slot as ``"turn"``."""
    fence = check_fence(fence, batch.conversation_id)
    slot = _slot(turn, batch)
    if fence is not None:
        extra = {**extra, "fence": fence.epoch}
    if slot is not None:
        extra = {**extra, "turn": turn_json(slot)}
    run = batch.run_id if batch.run_id is not None or fence is None else fence.run_id
    if run is not None:
        extra = {**extra, "run_id": str(run)}
    body = orjson.dumps({"messages": orjson.Fragment(batch.canonical_json()), **extra})
    path = f"{_conv(batch.conversation_id)}/appends/{_seg(batch.append_id)}"
    tree = yield Request("PUT", path, body=body, write=True, timeout=timeout,
                         conversation=str(batch.conversation_id))
    receipt = receipt_of(tree)
    receipt.validate_for(batch)  # the server's answer names this batch, or it is not a receipt for it
    return receipt


def append(batch: Batch, timeout: float | None = None, *, expected_last: Receipt | Empty | None = None,
           fence: Fence | None = None, turn: TurnSlot | None = None) -> Plan[Receipt]:
    """``HistoryEngine.append``: ``PUT .../appends/{a}``; a resend returns the original receipt.
    ``turn``: the slot as ``"turn"`` (a refused slot is the server's 409 ``SlotUnavailable``)."""
    _timeout(timeout)
    _batch(batch)
    expected = expected_of(batch, expected_last)
    extra: dict[str, Any] = {}
    if expected == "":
        extra["expected_last"] = "empty"
    elif expected is not None:
        assert isinstance(expected_last, Receipt)  # Invariant: expected_of accepted it as a Receipt.
        extra["expected_last"] = expected_last.to_dict()
    return _put(batch, extra, timeout, fence, turn)


def _slot(turn: object, batch: Batch) -> TurnSlot | None:
    """``turn`` checked by the engine's rules before any request: None or a ``TurnSlot``
    (``InvalidRequest``) of the batch's conversation (``SlotUnavailable``), for a batch with a
    user message that opens a turn (``InvalidBatch``)."""
    slot = check_slot(turn, batch.conversation_id)
    if slot is not None and not any(starts_turn(m) for m in batch.messages):
        raise InvalidBatch(f"invalid turn: the batch has no user message that opens a turn, so it cannot be "
                           f"filed under turn slot {slot.turn_id!r}; append it without turn=")
    return slot


def replace_turn(batch: Batch, old_turn_id: str, reason: str, timeout: float | None = None, *,
                 fence: Fence | None = None) -> Plan[Receipt]:
    """``HistoryEngine.replace_turn``: the same ``PUT`` with ``"replaces"``; the server checks the
    reason, the turn id and the turn's first message with the facade's rules."""
    _timeout(timeout)
    _batch(batch)
    if not isinstance(old_turn_id, str):
        raise InvalidBatch(f"invalid old_turn_id {old_turn_id!r}: expected a turn id (HistoryTurn.id)")
    if reason not in REPLACE_REASONS:  # the event's own rule; the wire's enum would say InvalidRequest
        raise InvalidBatch(f"invalid replace_turn reason {reason!r}: expected 'edit' or 'retry'")
    return _put(batch, {"replaces": {"turn_id": old_turn_id, "reason": reason}}, timeout, fence)


def begin_run(conversation_id: str, run_id: str, timeout: float | None = None) -> Plan[Fence]:
    """``HistoryEngine.begin_run``: ``POST .../runs/{r}`` (a resend keeps the run's epoch)."""
    _timeout(timeout)
    path = f"{_conv(conversation_id)}/runs/{_seg(RunID(run_id))}"
    tree = yield Request("POST", path, write=True, timeout=timeout, conversation=str(conversation_id))
    return fence_of(tree)


def allocate_turn(conversation_id: str, timeout: float | None = None) -> Plan[TurnSlot]:
    """``HistoryEngine.allocate_turn``: ``POST .../turn-slots`` (each call reserves a new position;
    a slot left unused costs nothing)."""
    _timeout(timeout)
    path = f"{_conv(conversation_id)}/turn-slots"
    slot = slot_of((yield Request("POST", path, write=True, timeout=timeout, conversation=str(conversation_id))))
    if slot.conversation_id != conversation_id:
        raise InvalidRequest(f"the service answered allocate_turn of {str(conversation_id)!r} with a slot of "
                             f"{str(slot.conversation_id)!r}; is it a histlog server?")
    return slot


def link_assets(conversation_id: str, message_id: str, refs: list[AssetRef],
                timeout: float | None = None) -> Plan[tuple[AssetRef, ...]]:
    """``HistoryEngine.link_assets``: ``PUT .../messages/{m}/assets`` (a resend changes nothing)."""
    _timeout(timeout)
    path = _conv(conversation_id)
    m = check_message_id(message_id)
    checked = check_assets(refs)  # before any request, as the engine checks them
    body = orjson.dumps({"assets": [r.tree() for r in checked]})
    tree = yield Request("PUT", f"{path}/messages/{_seg(m)}/assets", body=body, write=True, timeout=timeout,
                         conversation=str(conversation_id))
    return wire_assets.assets_of(tree)


def delete_messages(conversation_id: str, message_ids: list[str], *, fence: Fence | None = None,
                    timeout: float | None = None) -> Plan[int]:
    """``HistoryEngine.delete_messages``: ``POST .../messages:delete`` with ``{"ids": [...]}`` (and
    ``?fence=EPOCH`` with a fence); how many of the named messages were visible. The ids and the
    fence are checked before any request, as the engine checks them. A resend is safe: deleting
    again deletes nothing (it counts 0), so a retry after a timeout never deletes more."""
    _timeout(timeout)
    path = _conv(conversation_id) + "/messages:delete"
    check_ids(message_ids)
    checked = check_fence(fence, conversation_id)
    tree = yield Request("POST", path, _params(fence=None if checked is None else checked.epoch),
                         body=orjson.dumps({"ids": list(message_ids)}), write=True, timeout=timeout,
                         conversation=str(conversation_id))
    return deleted_of(tree)


def _run(conversation_id: str, run_id: str, root_turn: str | None) -> Plan[Any]:
    path = f"{_conv(conversation_id)}/runs/{_seg(RunID(run_id))}"
    return run_of((yield Request("GET", path, _params(root_turn=root_turn), conversation=str(conversation_id))))


def run_wrote_history(conversation_id: str, run_id: str, root_turn: str | None = None) -> Plan[bool]:
    """``HistoryEngine.run_wrote_history``: ``GET .../runs/{r}``."""
    answer = yield from _run(conversation_id, run_id, check_root_turn(root_turn, required=False))
    return bool(answer.wrote_history)


def run_request_message(conversation_id: str, run_id: str, root_turn: str) -> Plan[str]:
    """``HistoryEngine.run_request_message``: ``GET .../runs/{r}?root_turn=``; ``NotFound`` when the
    server answers null."""
    turn = check_root_turn(root_turn, required=True)
    answer = yield from _run(conversation_id, run_id, turn)
    if answer.request_message_id is None:
        raise NotFound(f"run {run_id!r} of {conversation_id!r} applied no request that is still visible, and turn "
                       f"{turn!r} is no visible user message: read turns() for the conversation's turns")
    return str(answer.request_message_id)


def clear(conversation_id: str, timeout: float | None = None) -> Plan[None]:
    """``HistoryEngine.clear``: ``DELETE /v1/conversations/{c}``."""
    _timeout(timeout)
    yield Request("DELETE", _conv(conversation_id), write=True, ok=(200, 204), timeout=timeout,
                  conversation=str(conversation_id))


def clear_prefix(prefix: str, timeout: float | None = None) -> Plan[int]:
    """``HistoryEngine.clear_prefix``: ``POST /v1/conversations:clear`` (a cluster member clears
    on every owner); a resend after a failure clears the rest."""
    _timeout(timeout)
    prefix = check_clear_prefix(prefix)
    tree = yield Request("POST", "/v1/conversations:clear", body=orjson.dumps({"prefix": prefix}), write=True,
                         timeout=timeout)
    return cleared_of(tree)


# ----- reads
def entries(conversation_id: str, after: HistoryPosition | None = None, before: HistoryPosition | None = None,
            limit: int | None = None, include_hidden: bool = False, order: Order = "asc",
            since: datetime | None = None, until: datetime | None = None) -> Plan[list[StoredMessage]]:
    """``HistoryEngine.entries``: ``GET .../messages`` (``order``, ``since``, ``until`` too)."""
    path = _conv(conversation_id) + "/messages"
    check_cursors(after, before)
    check_limit(limit)
    check_order(order)
    time_bound(since, "since")
    time_bound(until, "until")
    query = _params(after=after, before=before, limit=limit, include_hidden=include_hidden or None,
                    order=None if order == "asc" else order, since=None if since is None else time_text(since),
                    until=None if until is None else time_text(until))
    tree = yield Request("GET", path, query, conversation=str(conversation_id))
    return [stored_of(row) for row in _field(tree, "messages")]


def _by_ids(conversation_id: str, ids: list[str], view: str | None) -> Plan[Any]:
    path = _conv(conversation_id) + "/messages:by-ids"
    check_ids(ids)
    return (yield Request("POST", path, _params(view=view), body=orjson.dumps({"ids": list(ids)}),
                          conversation=str(conversation_id)))


def entries_by_ids(conversation_id: str, ids: list[str]) -> Plan[list[StoredMessage]]:
    """``HistoryEngine.entries_by_ids``: ``POST .../messages:by-ids``."""
    tree = yield from _by_ids(conversation_id, ids, None)
    return [stored_of(row) for row in _field(tree, "messages")]


def turn_sources_by_ids(conversation_id: str, ids: list[str]) -> Plan[list[TurnSource]]:
    """``HistoryEngine.turn_sources_by_ids``: ``POST .../messages:by-ids?view=turn-sources``."""
    tree = yield from _by_ids(conversation_id, ids, "turn-sources")
    return [source_of(row) for row in _field(tree, "sources")]


def position_of(conversation_id: str, message_id: str) -> Plan[HistoryPosition]:
    """``HistoryEngine.position_of``: ``GET .../messages/{m}/position``."""
    path = _conv(conversation_id)
    if not isinstance(message_id, str):
        raise InvalidRequest(f"invalid message_id: expected a str, got {type(message_id).__name__}")
    MessageID.parse(message_id)  # NotFound for what spells no message id, as the engine, before any request
    tree = yield Request("GET", f"{path}/messages/{_seg(message_id)}/position", conversation=str(conversation_id))
    text = _field(tree, "position")
    return history_position_of(text if isinstance(text, str) else "", "position")


def locate(conversation_id: str, external_id: str, before: int = 0, after: int = 0) -> Plan[Located]:
    """``HistoryEngine.locate``: ``GET .../external/{external_id}?before=&after=``."""
    path = _conv(conversation_id)
    if not isinstance(external_id, str):
        raise InvalidWindow(f"invalid external_id: expected a str, got {type(external_id).__name__}")
    check_context(before, "before")
    check_context(after, "after")
    tree = yield Request("GET", f"{path}/external/{_seg(external_id)}",
                         _params(before=before or None, after=after or None), conversation=str(conversation_id))
    return located_of(tree)


def read(conversation_id: str, at_least: Receipt | None = None, timeout: float | None = None
         ) -> Plan[list[Message]]:
    """``HistoryEngine.read``: the visible entries' messages; ``at_least`` waits on the server."""
    _timeout(timeout)
    path = _conv(conversation_id) + "/messages"
    if at_least is not None and not isinstance(at_least, Receipt):
        raise TypeError(f"at_least must be a Receipt, got {type(at_least).__name__}")
    tree = yield Request("GET", path, _params(at_least=at_least.position if at_least is not None else None),
                         timeout=timeout, conversation=str(conversation_id))
    return [stored_of(row).message for row in _field(tree, "messages")]


def window(conversation_id: str, limit: int, before: HistoryPosition | None = None) -> Plan[list[Message]]:
    """``HistoryEngine.window``: ``GET .../window`` (``before``: what the middleware's retry and edit read)."""
    path = _conv(conversation_id) + "/window"
    check_window(limit)
    check_cursors(None, before)
    tree = yield Request("GET", path, _params(limit=limit, before=before), conversation=str(conversation_id))
    return [Message.model_validate(m) for m in _field(tree, "messages")]


def window_entries(conversation_id: str, limit: int) -> Plan[StoredWindow]:
    """``HistoryEngine.window_entries`` from the routes there are: the window, then the visible
    entries whose newest non-system messages it holds (O(history): for the CLI's display, not
    for a bot's hot path, which reads ``window``). Two reads: if a write lands between them and
    they disagree, both are read again (at most three times)."""
    for _ in range(3):
        messages = yield from window(conversation_id, limit)
        system = messages[0] if messages and messages[0].role is Role.SYSTEM else None
        wanted = messages[1:] if system is not None else messages
        rows = [r for r in (yield from entries(conversation_id)) if r.message.role is not Role.SYSTEM]
        tail = rows[len(rows) - len(wanted):] if wanted else []
        if [r.message for r in tail] == wanted:
            return StoredWindow(system, tail)
    raise LogUnavailable(f"the window of {str(conversation_id)!r} kept changing while it was read; try again")


def read_within_bytes(conversation_id: str, max_bytes: int, after: HistoryPosition = HistoryPosition.START,
                      before: HistoryPosition | None = None, unit: Unit = "turn") -> Plan[HistoryLoad[StoredMessage]]:
    """``HistoryEngine.read_within_bytes``: ``GET .../budget``."""
    path = _conv(conversation_id) + "/budget"
    check_budget(max_bytes, unit)
    check_cursors(after, before)
    tree = yield Request("GET", path, _params(max_bytes=_budget(max_bytes), after=after, before=before, unit=unit),
                         conversation=str(conversation_id))
    return HistoryLoad([stored_of(row) for row in _field(tree, "messages")], bool(_field(tree, "truncated")))


def turn_sources(conversation_id: str, max_bytes: int, after: HistoryPosition = HistoryPosition.START,
                 before: HistoryPosition | None = None, unit: Unit = "turn") -> Plan[HistoryLoad[TurnSource]]:
    """``HistoryEngine.turn_sources``: ``GET .../turn-sources``."""
    path = _conv(conversation_id) + "/turn-sources"
    check_budget(max_bytes, unit)
    check_cursors(after, before)
    tree = yield Request("GET", path, _params(max_bytes=_budget(max_bytes), after=after, before=before, unit=unit),
                         conversation=str(conversation_id))
    return HistoryLoad([source_of(row) for row in _field(tree, "sources")], bool(_field(tree, "truncated")))


def measure(conversation_id: str, after: HistoryPosition = HistoryPosition.START) -> Plan[Measure]:
    """``HistoryEngine.measure``: ``GET .../measure``."""
    path = _conv(conversation_id) + "/measure"
    check_cursors(after, None)
    return measure_of((yield Request("GET", path, _params(after=after), conversation=str(conversation_id))))


def turn(conversation_id: str, message_id: str) -> Plan[HistoryTurn]:
    """``HistoryEngine.turn``: ``GET .../messages/{m}/turn``."""
    path = _conv(conversation_id)
    if not isinstance(message_id, str):
        raise InvalidRequest(f"invalid message_id: expected a str, got {type(message_id).__name__}")
    return turn_of((yield Request("GET", f"{path}/messages/{_seg(message_id)}/turn",
                                  conversation=str(conversation_id))))


def latest_turn(conversation_id: str) -> Plan[HistoryTurn | None]:
    """``HistoryEngine.latest_turn``: ``GET .../turns/latest``."""
    tree = _field((yield Request("GET", _conv(conversation_id) + "/turns/latest",
                                  conversation=str(conversation_id))), "turn")
    return None if tree is None else turn_of(tree)


def turns(conversation_id: str) -> Plan[list[HistoryTurn]]:
    """``HistoryEngine.turns`` from the routes there are: the visible entries, then the turn of
    the first message of each turn position (each equals ``turn(c, t.id)`` by definition)."""
    rows = yield from entries(conversation_id)
    firsts: dict[int, str] = {}
    for row in rows:
        if row.position.turn > 0:
            firsts.setdefault(row.position.turn, row.id)
    out: list[HistoryTurn] = []
    for message_id in firsts.values():
        out.append((yield from turn(conversation_id, message_id)))
    return out


def latest_interrupted_checkpoint(conversation_id: str) -> Plan[StoredMessage | None]:
    """``HistoryEngine.latest_interrupted_checkpoint``: ``GET .../interrupted-checkpoint``."""
    tree = _field((yield Request("GET", _conv(conversation_id) + "/interrupted-checkpoint",
                                  conversation=str(conversation_id))), "message")
    return None if tree is None else stored_of(tree)


def conversations(prefix: str | None = None, after: str | None = None,
                  limit: int | None = None) -> Plan[list[ConversationID]]:
    """``HistoryEngine.conversations``: the pages of ``GET /v1/conversations``, following ``next``
    until ``limit`` ids (or the last page)."""
    prefix = check_prefix(prefix)
    if after is not None:
        after = ConversationID(after)
    check_limit(limit)
    out: list[ConversationID] = []
    while limit is None or len(out) < limit:
        page = _PAGE if limit is None else min(_PAGE, limit - len(out))
        tree = yield Request("GET", "/v1/conversations", _params(prefix=prefix or None, after=after, limit=page))
        out.extend(ConversationID(c) for c in _field(tree, "conversations"))
        after = _field(tree, "next")
        if after is None:
            break
    return out


def stats() -> Plan[EngineStats]:
    """``HistoryEngine.stats``: ``GET /v1/stats`` (the serving instance's)."""
    return stats_of((yield Request("GET", "/v1/stats")))


def poison() -> Plan[list[tuple[LogPosition, str]]]:
    """``HistoryEngine.poison``: the quarantined records ``GET /v1/stats`` lists."""
    tree = yield Request("GET", "/v1/stats")
    try:
        listed = StatsOut.model_validate(tree).poison
    except ValueError as exc:
        raise InvalidRequest(f"the service's stats are malformed: {exc}") from None
    return [(log_position_of(p.position, "poison.position"), p.reason) for p in listed]


# ----- argument checks shared by the plans
def _timeout(timeout: float | None) -> None:
    if timeout is not None:
        check_timeout(timeout)


def _batch(batch: object) -> None:
    if not isinstance(batch, Batch):
        raise InvalidBatch(f"invalid batch: expected a schemas.Batch, got {type(batch).__name__}")

