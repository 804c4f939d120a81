"""The routes of SERVICE.md as a thin table over the engine's calls.

Each ``Op`` is one row: method, path, query parameters, body and response models, the error
statuses it can give, and its handler. The handler parses (``wire``, ``routing``), asks the
``Router`` which engine serves the conversation, calls it, and renders with ``wire``; errors are
raised, never rendered here (``engine.service.app`` turns every one into a problem+json through
``problems``). ``/openapi.json`` is generated from this same table.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from engine.arguments import EMPTY, check_clear_prefix, check_ids
from engine.client import members
from engine.cluster.ownership import OwnershipMap
from engine.runs import check_root_turn
from engine.service import examples, wire, wire_assets, wire_bulk, wire_runs, wire_slots
from engine.service.auth import read_body
from engine.service.forward import is_forwarded
from engine.service.route_base import DEFAULT_MAX_WAITERS, Context, Handler, Op, Waiters, json_response
from engine.service.routes_checkpoints import CHECKPOINT_OPS
from engine.service.routes_partitions import PARTITION_OPS
from engine.service.routing import Param, segment
from schemas.batch import Batch, Receipt
from schemas.errors import LogUnavailable, NotFound, NotReady
from schemas.ids import RunID
from schemas.positions import HistoryPosition
from schemas.runs import Fence

__all__ = ["DEFAULT_MAX_WAITERS", "OPS", "Context", "Handler", "Op", "Waiters", "json_response", "merge_pages"]

AT_LEAST_TIMEOUT = 10.0
"""How long a read with ``at_least`` waits for this instance to apply that position (then 503)."""
PAGE_DEFAULT = 1000
"""``GET /v1/conversations`` answers at most this many ids per page unless ``limit`` says fewer."""
PAGE_MAX = 10_000


async def _at_least(ctx: Context, c: str, query: dict[str, Any]) -> None:
    """Wait (on the loop, no thread) until ``at_least`` is applied here; at most
    ``ctx.waiters.limit`` reads wait at once, one more is a 503 at once."""
    if "at_least" not in query:
        return
    engine, position, waiters = ctx.router.engine(c), query["at_least"], ctx.waiters
    if engine.engine._has_applied(position):
        return
    if waiters.count >= waiters.limit:
        raise LogUnavailable(f"at_least: {waiters.count} reads are already waiting for log positions on this "
                             f"server, its --max-waiters; retry shortly, or serve with a larger --max-waiters")
    waiters.count += 1
    try:
        await engine.wait_applied(position, AT_LEAST_TIMEOUT)
    finally:
        waiters.count -= 1


# ----- handlers
async def put_append(request: Request, ctx: Context, query: dict[str, Any]) -> Response:
    c, a = segment(request, "c"), segment(request, "a")
    parsed = wire.append_body_of(await read_body(request, ctx.max_body))
    batch = Batch(c, a, parsed.messages, run_id=parsed.run_id)
    turn = wire_slots.turn_slot_of(c, parsed.turn)  # a bad slot is a 400 before any I/O
    engine = ctx.router.engine(c)
    fence: Fence | None = None
    if parsed.fence is not None:  # its epoch: the run of that epoch, as this owner applied it
        fence = await engine.fence_of_epoch(c, parsed.fence)
    receipt: Receipt
    if parsed.replaces is not None:
        receipt = await engine.replace_turn(batch, parsed.replaces.turn_id, parsed.replaces.reason, fence=fence)
    else:
        expected = parsed.expected_last
        receipt = await engine.append(batch, expected_last=(
            None if expected is None else EMPTY if expected == "empty" else wire.receipt_of(expected.model_dump())),
            fence=fence, turn=turn)
    return Response(wire.receipt_json(receipt), media_type="application/json")


async def post_run(request: Request, ctx: Context, query: dict[str, Any]) -> Response:
    c, run = segment(request, "c"), RunID(segment(request, "r"))
    return json_response(wire_runs.fence_json(await ctx.router.engine(c).begin_run(c, run)))


async def post_turn_slot(request: Request, ctx: Context, query: dict[str, Any]) -> Response:
    c = segment(request, "c")
    return json_response(wire_slots.slot_json(await ctx.router.engine(c).allocate_turn(c)))


async def get_run(request: Request, ctx: Context, query: dict[str, Any]) -> Response:
    c, run = segment(request, "c"), RunID(segment(request, "r"))
    root = check_root_turn(query.get("root_turn"), required=False)
    await _at_least(ctx, c, query)
    engine = ctx.router.engine(c)
    wrote = await engine.run_wrote_history(c, run, root)
    request_id: str | None = None
    if root is not None:
        try:
            request_id = await engine.run_request_message(c, run, root)
        except NotFound:
            request_id = None
    return json_response({"wrote_history": wrote, "request_message_id": request_id})


async def delete_conversation(request: Request, ctx: Context, query: dict[str, Any]) -> Response:
    c = segment(request, "c")
    await ctx.router.engine(c).clear(c)
    return Response(status_code=204)


async def post_clear_prefix(request: Request, ctx: Context, query: dict[str, Any]) -> Response:
    """``clear_prefix`` on this member's conversations; in a cluster (unless the request was
    forwarded) also on every other owner's, the counts added up."""
    prefix = check_clear_prefix(wire_bulk.prefix_body_of(await read_body(request, ctx.max_body)))
    owners = ctx.router.current()
    if owners is None:
        return json_response({"cleared": await ctx.router.local.clear_prefix(prefix)})
    ids = await _owned_page(ctx, prefix, None, wire.MAX_INT)  # what this member owns (its engine may hold more)
    await ctx.router.local._clear_all(ids)
    cleared = len(ids)
    if ctx.forwarder is not None and not is_forwarded(request):
        others = _other_owners(owners, "their conversations were not cleared; send the same request again shortly "
                                       "(it is idempotent)")
        trees = await asyncio.gather(*(ctx.forwarder.post_json(url, "/v1/conversations:clear", {"prefix": prefix},
                                                               request.headers.get("authorization"))
                                       for url in others))
        cleared += sum(wire_bulk.cleared_of(tree) for tree in trees)
    return json_response({"cleared": cleared})


async def post_by_ids(request: Request, ctx: Context, query: dict[str, Any]) -> Response:
    c = segment(request, "c")
    ids = wire_bulk.ids_body_of(await read_body(request, ctx.max_body))
    await _at_least(ctx, c, query)
    engine = ctx.router.engine(c)
    if query.get("view") == "turn-sources":
        sources = await engine.turn_sources_by_ids(c, ids)
        return json_response({"sources": [orjson.Fragment(s.to_json()) for s in sources]})
    return json_response({"messages": wire.messages_json(await engine.entries_by_ids(c, ids))})


async def post_delete(request: Request, ctx: Context, query: dict[str, Any]) -> Response:
    """``delete_messages``; ``?fence=EPOCH`` resolved to its run's fence as ``put_append`` resolves
    ``"fence"``. The ids are checked first (``InvalidWindow``), before the fence's lookup, which
    may wait for the log."""
    c = segment(request, "c")
    ids = wire_bulk.ids_body_of(await read_body(request, ctx.max_body))
    check_ids(ids)
    engine = ctx.router.engine(c)
    fence: Fence | None = None
    if "fence" in query:
        fence = await engine.fence_of_epoch(c, query["fence"])
    return json_response({"deleted": await engine.delete_messages(c, ids, fence=fence)})


async def get_conversations(request: Request, ctx: Context, query: dict[str, Any]) -> Response:
    """This member's page of the conversations it serves; in a cluster (unless the request was
    forwarded) merged with every other owner's page of the same query (``merge_pages``)."""
    prefix: str = query.get("prefix", "")
    after: str | None = query.get("after")
    limit: int = query.get("limit", PAGE_DEFAULT)
    chosen = await _owned_page(ctx, prefix, after, limit + 1)
    pages = [(chosen[:limit], len(chosen) > limit)]
    owners = ctx.router.current()
    if owners is not None and ctx.forwarder is not None and not is_forwarded(request):
        others = _other_owners(owners, "the list would miss their conversations; retry shortly")
        params = {k: v for k, v in (("prefix", prefix), ("after", after), ("limit", str(limit))) if v}
        trees = await asyncio.gather(*(ctx.forwarder.get_json(url, "/v1/conversations", params,
                                                              request.headers.get("authorization"))
                                       for url in others))
        pages += [(list(tree["conversations"]), tree["next"] is not None) for tree in trees]
    page, following = merge_pages(pages, limit)
    return json_response({"conversations": page, "next": following})


def _other_owners(owners: OwnershipMap, consequence: str) -> list[str]:
    """The other members that own partitions (a fan-out's targets), or ``NotReady`` while some
    partition has no owner (a rebalance), saying what that means for this request."""
    missing = sorted(set(range(owners.partitions)) - set(owners.owners))
    if missing:
        raise NotReady(f"partitions {missing[:8]} have no owner right now (the group is rebalancing), so "
                       f"{consequence}")
    return sorted(set(owners.owners.values()) - {owners.self_url})


async def _owned_page(ctx: Context, prefix: str, after: str | None, wanted: int) -> list[str]:
    """Up to ``wanted`` ids of the conversations this member serves, from the engine's pages (the
    open-conversation index: O(page), plus the ids of partitions it no longer owns)."""
    chosen: list[str] = []
    while len(chosen) < wanted:
        asked = wanted - len(chosen)
        ids = [str(i) for i in await ctx.router.local.conversations(prefix, after, asked)]
        chosen += [i for i in ids if ctx.router.owns(i)]
        if len(ids) < asked:
            break
        after = ids[-1]
    return chosen


def merge_pages(pages: list[tuple[list[str], bool]], limit: int) -> tuple[list[str], str | None]:
    """One lexical page of at most ``limit`` ids from several members' pages of the same query
    (each its first ``limit`` ids past ``after``, and whether it has more), and its ``next``.

    Nothing is skipped: an id left out of the merged page is greater than its last id (the
    ``limit`` smallest of the union are kept), and a member's ids past its own page are greater
    than its page's last, which is at least the merged page's last, so the next page (``after``
    = ``next``) asks every member for them again."""
    union = sorted({i for ids, _ in pages for i in ids})
    page = union[:limit]
    more = len(union) > limit or any(has_more for _, has_more in pages)
    return page, (page[-1] if more and page else None)


async def get_cluster(request: Request, ctx: Context, query: dict[str, Any]) -> Response:
    """The map; with ``lag=true`` also each owner's lag (``engine.client.members``): this server's
    from its own stats, the others' from their ``/v1/stats`` with the request's token, each bounded."""
    owners = ctx.router.current()
    here = str(request.base_url).rstrip("/")
    tree = wire.cluster_json(owners, partitions=ctx.router.local.engine.log.partitions, here=here)
    if query.get("lag", False):
        me, authorization = tree["self"], request.headers.get("authorization")

        async def stats_of(url: str) -> Any:
            if url == me:
                return await _stats_tree(ctx)
            if ctx.forwarder is None:  # a map naming other members comes with a cluster's forwarder
                raise NotReady(f"this server has no way to ask {url}: it is not a cluster member")
            return await ctx.forwarder.get_json(url, "/v1/stats", {}, authorization, who="the member")

        tree["members"] = await members.members_lag(tree["owners"], stats_of)
    return json_response(tree)


async def get_messages(request: Request, ctx: Context, query: dict[str, Any]) -> Response:
    c = segment(request, "c")
    await _at_least(ctx, c, query)
    rows = await ctx.router.engine(c).entries(c, query.get("after"), query.get("before"), query.get("limit"),
                                                query.get("include_hidden", False), query.get("order", "asc"),
                                                query.get("since"), query.get("until"))
    return json_response({"messages": wire.messages_json(rows)})


async def put_assets(request: Request, ctx: Context, query: dict[str, Any]) -> Response:
    c, m = segment(request, "c"), segment(request, "m")
    refs = wire_assets.assets_body_of(await read_body(request, ctx.max_body))
    return json_response(wire_assets.assets_out(await ctx.router.engine(c).link_assets(c, m, list(refs))))


async def get_position(request: Request, ctx: Context, query: dict[str, Any]) -> Response:
    c, m = segment(request, "c"), segment(request, "m")
    await _at_least(ctx, c, query)
    return json_response({"position": str(await ctx.router.engine(c).position_of(c, m))})


async def get_located(request: Request, ctx: Context, query: dict[str, Any]) -> Response:
    c, x = segment(request, "c"), segment(request, "x")
    await _at_least(ctx, c, query)
    found = await ctx.router.engine(c).locate(c, x, query.get("before", 0), query.get("after", 0))
    return json_response(wire.located_json(found))


async def get_window(request: Request, ctx: Context, query: dict[str, Any]) -> Response:
    c = segment(request, "c")
    await _at_least(ctx, c, query)
    messages = await ctx.router.engine(c)._window_canonical(c, query["limit"], query.get("before"))
    return json_response({"messages": [orjson.Fragment(m) for m in messages]})


async def get_budget(request: Request, ctx: Context, query: dict[str, Any]) -> Response:
    c = segment(request, "c")
    await _at_least(ctx, c, query)
    load = await ctx.router.engine(c).read_within_bytes(
        c, query["max_bytes"], query.get("after", HistoryPosition.START), query.get("before"),
        query.get("unit", "turn"))
    return json_response(wire.load_json(load, "messages"))


async def get_turn_sources(request: Request, ctx: Context, query: dict[str, Any]) -> Response:
    c = segment(request, "c")
    await _at_least(ctx, c, query)
    load = await ctx.router.engine(c).turn_sources(c, query["max_bytes"], query.get("after", HistoryPosition.START),
                                                     query.get("before"), query.get("unit", "turn"))
    return json_response(wire.load_json(load, "sources"))


async def get_measure(request: Request, ctx: Context, query: dict[str, Any]) -> Response:
    c = segment(request, "c")
    await _at_least(ctx, c, query)
    m = await ctx.router.engine(c).measure(c, query.get("after", HistoryPosition.START))
    return json_response({"messages": m.messages, "content_bytes": m.content_bytes, "turns": m.turns})


async def get_latest_turn(request: Request, ctx: Context, query: dict[str, Any]) -> Response:
    c = segment(request, "c")
    await _at_least(ctx, c, query)
    turn = await ctx.router.engine(c).latest_turn(c)
    return json_response({"turn": None if turn is None else wire.turn_json(turn)})


async def get_turn(request: Request, ctx: Context, query: dict[str, Any]) -> Response:
    c, m = segment(request, "c"), segment(request, "m")
    await _at_least(ctx, c, query)
    return json_response(wire.turn_json(await ctx.router.engine(c).turn(c, m)))


async def get_checkpoint(request: Request, ctx: Context, query: dict[str, Any]) -> Response:
    c = segment(request, "c")
    await _at_least(ctx, c, query)
    stored = await ctx.router.engine(c).latest_interrupted_checkpoint(c)
    return json_response({"message": None if stored is None else wire.stored_json(stored)})


async def _stats_tree(ctx: Context) -> dict[str, Any]:
    engine = ctx.router.local
    stats = await engine.stats()
    poison = await asyncio.to_thread(engine.engine.poison)
    return wire.stats_json(stats, poison)


async def get_stats(request: Request, ctx: Context, query: dict[str, Any]) -> Response:
    return json_response(await _stats_tree(ctx))


# ----- the table
_AT_LEAST = Param("at_least", "log", "wait (bounded) until this instance has applied PARTITION:OFFSET "
                  "(e.g. a receipt's position): read-your-writes from anywhere")
_AFTER = Param("after", "history", "only messages after this TURN:SEQ (exclusive)", example="1:2")
_BEFORE = Param("before", "history", "only messages before this TURN:SEQ (exclusive)", example="3:0")
_C = "/v1/conversations/{c}"

OPS: tuple[Op, ...] = (
    Op("PUT", _C + "/appends/{a}", "append",
       "Append one batch atomically and idempotently (or replace the latest turn); identical retries "
       "return the same receipt", put_append, (200, wire.ReceiptModel), body=wire.AppendBody,
       errors=(400, 401, 409, 410, 412, 413, 503, 504), examples=examples.APPEND),
    Op("POST", _C + "/runs/{r}", "begin_run", "The run now owns the conversation's writes: its fence (the epoch "
       "writes give as \"fence\"; the same run again keeps its epoch)", post_run, (200, wire_runs.FenceOut),
       errors=(400, 401, 410, 503, 504)),
    Op("GET", _C + "/runs/{r}", "run", "What a run wrote: any message, hidden ones too (run_wrote_history), and "
       "with root_turn its applied request (run_request_message, null when none)", get_run,
       (200, wire_runs.RunOut), query=(
           Param("root_turn", "str", "a turn id (HistoryTurn.id): only messages in that turn count, and the "
                 "request falls back to it"), _AT_LEAST)),
    Op("POST", _C + "/turn-slots", "allocate_turn", "Reserve the conversation's next turn before any of its rows "
       "exist: its turn id and position (an append files its user-led turn under it with \"turn\"; a slot is "
       "spent whether or not it is used)", post_turn_slot, (200, wire_slots.TurnSlotOut),
       errors=(400, 401, 410, 503, 504)),
    Op("DELETE", _C, "clear", "Close a conversation forever (idempotent)", delete_conversation, (204, None),
       errors=(400, 401, 503, 504)),
    Op("POST", "/v1/conversations:clear", "clear_prefix", "Clear every open conversation whose id starts with "
       "prefix (each erased as clear erases it); idempotent and resumable: send it again after a failure",
       post_clear_prefix, (200, wire_bulk.ClearedOut), body=wire_bulk.PrefixBody, errors=(400, 401, 413, 503, 504),
       examples=examples.CLEAR_PREFIX),
    Op("GET", "/v1/conversations", "conversations", "Open conversations in lexical order, paged",
       get_conversations, (200, wire.ConversationsPage), query=(
           Param("prefix", "str", "only ids starting with this"),
           Param("after", "str", "only ids after this one (the previous page's next)"),
           Param("limit", "int", f"at most this many ids (default {PAGE_DEFAULT})", minimum=1)),
       errors=(400, 401, 503)),
    Op("GET", _C + "/messages", "entries", "The stored messages of a conversation", get_messages,
       (200, wire.StoredMessagesOut), query=(
           _AFTER, _BEFORE, Param("limit", "int", "at most this many (the oldest first; with order=desc the newest)",
                                  example="50"),
           Param("include_hidden", "bool", "also the messages of replaced turns"),
           Param("order", "order", "asc: oldest first (default); desc: newest first, so limit keeps the newest "
                 "and before=<the page's last position> is the page before", example="desc"),
           Param("since", "time", "only messages with created_at at or after this time (ISO 8601 with a zone)"),
           Param("until", "time", "only messages with created_at before this time (exclusive)"), _AT_LEAST)),
    Op("POST", _C + "/messages:by-ids", "entries_by_ids", "The visible messages named by their ids, in history "
       "order (ids that name none are left out; at most 10,000)", post_by_ids, (200, wire.StoredMessagesOut),
       query=(Param("view", "view", "messages (default): StoredMessages; turn-sources: {\"sources\": [...]}, "
                    "as turn_sources_by_ids"), _AT_LEAST),
       body=wire_bulk.IdsBody, errors=(400, 401, 413, 503), examples=examples.BY_IDS),
    Op("POST", _C + "/messages:delete", "delete_messages", "Delete the visible messages named by their ids from "
       "every read (at most 10,000; unknown, hidden, already deleted or malformed ids change nothing and are not "
       "counted); how many were deleted. A resend is safe: deleting again deletes nothing", post_delete,
       (200, wire_bulk.DeletedOut), query=(
           Param("fence", "int", "the epoch of the run that writes (begin_run's): refused as 409 Fenced once a "
                 "later run of the conversation began", minimum=1),),
       body=wire_bulk.IdsBody, errors=(400, 401, 404, 409, 410, 413, 503, 504), examples=examples.DELETE),
    Op("PUT", _C + "/messages/{m}/assets", "link_assets", "Link media references to a visible message "
       "(idempotent: a ref already linked changes nothing, another ref at a linked ordinal is a conflict); "
       "all its assets after the link", put_assets, (200, wire_assets.AssetsOut), body=wire_assets.AssetsBody,
       errors=(400, 401, 404, 409, 410, 413, 503, 504), examples=examples.ASSETS),
    Op("GET", _C + "/messages/{m}/position", "position_of", "Where a visible message is (TURN:SEQ, to page from it)",
       get_position, (200, wire.PositionOut), query=(_AT_LEAST,)),
    Op("GET", _C + "/external/{x}", "locate", "The newest visible message with this metadata external_id (a "
       "platform's own message id), with visible messages around it", get_located, (200, wire.LocatedOut), query=(
           Param("before", "int", "at most this many visible messages before it (default 0)"),
           Param("after", "int", "at most this many visible messages after it (default 0)"), _AT_LEAST)),
    Op("GET", _C + "/window", "window", "The newest whole turns within limit messages (system merged first)",
       get_window, (200, wire.WindowOut), query=(
           Param("limit", "int", "at most this many messages", required=True, minimum=1, example="20"),
           Param("before", "history", "the window of the messages before this TURN:SEQ (a retry's history)"),
           _AT_LEAST),
       errors=(400, 401, 404, 422, 503)),
    Op("GET", _C + "/budget", "read_within_bytes", "The newest units within a budget of content bytes",
       get_budget, (200, wire.StoredLoadOut), query=(
           Param("max_bytes", "int", "the budget in content bytes", required=True, example="8192"), _AFTER, _BEFORE,
           Param("unit", "unit", "keep whole turns (default) or single messages"), _AT_LEAST)),
    Op("GET", _C + "/turn-sources", "turn_sources", "What turn-response composition reads, within a budget",
       get_turn_sources, (200, wire.SourcesOut), query=(
           Param("max_bytes", "int", "the budget in content bytes", required=True, example="8192"), _AFTER, _BEFORE,
           Param("unit", "unit", "keep whole turns (default) or single messages"), _AT_LEAST)),
    Op("GET", _C + "/measure", "measure", "Counts after a position, without payloads", get_measure,
       (200, wire.MeasureOut), query=(_AFTER, _AT_LEAST)),
    Op("GET", _C + "/turns/latest", "latest_turn", "The latest visible turn, or null", get_latest_turn,
       (200, wire.LatestTurnOut), query=(_AT_LEAST,)),
    Op("GET", _C + "/messages/{m}/turn", "turn", "The visible turn holding a message", get_turn,
       (200, wire.TurnModel), query=(_AT_LEAST,)),
    Op("GET", _C + "/interrupted-checkpoint", "latest_interrupted_checkpoint",
       "The latest interrupted assistant checkpoint of the latest turn, or null", get_checkpoint,
       (200, wire.CheckpointOut), query=(_AT_LEAST,)),
    *CHECKPOINT_OPS,
    Op("GET", "/v1/cluster", "cluster", "The owner of every partition as this member last learned it (a server "
       "without --group: group null, generation -1, itself owning every partition); with lag=true also each "
       "owner's lag", get_cluster, (200, wire.ClusterOut), query=(
           Param("lag", "bool", "also \"members\": each owner URL with its partitions and its lag per partition "
                 "(from its own /v1/stats, asked concurrently, at most "
                 f"{members.MEMBER_TIMEOUT_S:g} s each; one that does not answer is \"reachable\": false with "
                 "its \"error\", and the answer is still 200). Default false: the map alone"),),
       errors=(400, 401)),
    Op("GET", "/v1/stats", "stats", "Log offsets, lag and admission counts (histlog stats --json)", get_stats,
       (200, wire.StatsOut), errors=(400, 401, 503)),
    *PARTITION_OPS,
)
