"""The routes of graph checkpoints (``engine.checkpoints``; LangGraph's saver over HTTP,
``engine.integrations.langgraph``): their handlers and their ``Op`` rows, which
``engine.service.routes`` puts in its table. Bodies and answers are ``engine.service.wire_checkpoints``'."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from engine.service import wire_checkpoints
from engine.service.auth import read_body
from engine.service.route_base import Context, Op, json_response
from engine.service.routing import Forward, Param, segment
from schemas.checkpoints import check_name
from schemas.errors import NotFound
from schemas.ids import ConversationID

__all__ = ["CHECKPOINT_OPS"]


def _ns(query: dict[str, Any]) -> str | None:
    """``?ns=`` checked (None when absent)."""
    ns = query.get("ns")
    return None if ns is None else check_name(ns, "query parameter ns", empty=True)


def _before(query: dict[str, Any]) -> str | None:
    before = query.get("before")
    return None if before is None else check_name(before, "query parameter before")


async def post_checkpoint(request: Request, ctx: Context, query: dict[str, Any]) -> Response:
    c = segment(request, "c")
    args = wire_checkpoints.put_body_of(await read_body(request, ctx.max_body))
    await ctx.router.engine(c).put_checkpoint(c, **args)
    return json_response({"checkpoint_id": args["checkpoint_id"]})


async def post_checkpoint_writes(request: Request, ctx: Context, query: dict[str, Any]) -> Response:
    c, k = segment(request, "c"), check_name(segment(request, "k"), "checkpoint_id")
    ns = _ns(query) or ""
    args = wire_checkpoints.writes_body_of(await read_body(request, ctx.max_body))
    await ctx.router.engine(c).put_checkpoint_writes(c, ns, k, args.task_id, args.writes, task_path=args.task_path)
    return json_response({})


async def _one_checkpoint(request: Request, ctx: Context, query: dict[str, Any], k: str | None) -> Response:
    c = segment(request, "c")
    ns = _ns(query) or ""
    stored = await ctx.router.engine(c).get_checkpoint(c, ns, k)
    if stored is None:
        which = "no checkpoint" if k is None else f"no checkpoint {k!r}"
        raise NotFound(f"{which} in namespace {ns!r} of thread {c!r} (a thread cleared has none)")
    return json_response(wire_checkpoints.stored_checkpoint_json(stored))


async def get_latest_checkpoint(request: Request, ctx: Context, query: dict[str, Any]) -> Response:
    return await _one_checkpoint(request, ctx, query, None)


async def get_checkpoint_by_id(request: Request, ctx: Context, query: dict[str, Any]) -> Response:
    return await _one_checkpoint(request, ctx, query, check_name(segment(request, "k"), "checkpoint_id"))


async def get_thread_checkpoints(request: Request, ctx: Context, query: dict[str, Any]) -> Response:
    c = segment(request, "c")
    ns, before = _ns(query), _before(query)
    stored = await ctx.router.engine(c).list_checkpoints(c, ns, before=before, limit=query.get("limit"))
    return json_response({"checkpoints": [wire_checkpoints.stored_checkpoint_json(s) for s in stored]})


async def get_all_checkpoints(request: Request, ctx: Context, query: dict[str, Any]) -> Response:
    stored = await ctx.router.local.list_checkpoints(None, None, before=_before(query), limit=query.get("limit"))
    return json_response({"checkpoints": [wire_checkpoints.stored_checkpoint_json(s) for s in stored]})


async def post_prune_checkpoints(request: Request, ctx: Context, query: dict[str, Any]) -> Response:
    c = segment(request, "c")
    strategy = wire_checkpoints.prune_body_of(await read_body(request, ctx.max_body))
    await ctx.router.engine(c).prune_checkpoints([c], strategy)
    return json_response({})


async def post_delete_checkpoint_runs(request: Request, ctx: Context, query: dict[str, Any]) -> Response:
    run_ids = wire_checkpoints.run_ids_body_of(await read_body(request, ctx.max_body))
    await ctx.router.local.delete_checkpoint_runs(run_ids)
    return json_response({})


async def post_copy_checkpoints(request: Request, ctx: Context, query: dict[str, Any]) -> Response:
    """``copy_checkpoints`` on the source's owner; in a cluster, when another member owns the
    target, the copy's puts and writes are sent there (each marked forwarded: one hop)."""
    c = segment(request, "c")
    target = str(ConversationID(wire_checkpoints.copy_body_of(await read_body(request, ctx.max_body))))
    engine = ctx.router.engine(c)
    decided = ctx.router.serving(target)
    if not isinstance(decided, Forward) or ctx.forwarder is None:
        await engine.copy_checkpoints(c, target)
        return json_response({})
    stored = list(await engine.list_checkpoints(c))
    for path, tree in wire_checkpoints.copy_requests(target, reversed(stored)):
        await ctx.forwarder.post_json(decided.url, path, tree, request.headers.get("authorization"))
    return json_response({})


_T = "/v1/threads/{c}/checkpoints"
_NS = Param("ns", "str", "the checkpoint namespace (default \"\": the root graph's)")
_NS_ALL = Param("ns", "str", "only this checkpoint namespace (\"\": the root graph's; absent: every namespace)")
_CKP_BEFORE = Param("before", "str", "only checkpoints whose id sorts before this checkpoint id")
_CKP_LIMIT = Param("limit", "int", "at most this many checkpoints (default: all)")

CHECKPOINT_OPS: tuple[Op, ...] = (
    Op("POST", _T, "put_checkpoint", "Store a graph checkpoint of the thread (a conversation): its namespace, id, "
       "parent and run, the serde's checkpoint and metadata, its channel versions and the channel values it adds; "
       "answered once applied (a read after it sees it). The same put again changes nothing", post_checkpoint,
       (200, wire_checkpoints.PutOut), body=wire_checkpoints.PutBody, errors=(400, 401, 410, 413, 503, 504)),
    Op("GET", _T, "list_checkpoints", "The thread's checkpoints newest first in each namespace (without ns: every "
       "namespace, in key order), only those before checkpoint id before, at most limit", get_thread_checkpoints,
       (200, wire_checkpoints.CheckpointsOut), query=(_NS_ALL, _CKP_BEFORE, _CKP_LIMIT), errors=(400, 401, 503)),
    Op("GET", _T + "/latest", "latest_checkpoint", "The namespace's newest checkpoint, with its channel values and "
       "pending writes (404 when it has none)", get_latest_checkpoint, (200, wire_checkpoints.StoredCheckpointModel),
       query=(_NS,), errors=(400, 401, 404, 503)),
    Op("GET", _T + "/{k}", "get_checkpoint", "The checkpoint k of the namespace, with its channel values and pending "
       "writes (404 when there is none); an id spelled latest is sent as %6Catest", get_checkpoint_by_id,
       (200, wire_checkpoints.StoredCheckpointModel), query=(_NS,), errors=(400, 401, 404, 503)),
    Op("POST", _T + "/{k}/writes", "put_checkpoint_writes", "Store a task's pending writes to checkpoint k (a "
       "write at an index >= 0 the task wrote already is kept, a special one, with a negative index, replaced); "
       "answered once applied", post_checkpoint_writes, (200, wire_checkpoints.DoneOut), query=(_NS,),
       body=wire_checkpoints.WritesBody, errors=(400, 401, 410, 413, 503, 504)),
    Op("POST", _T + ":prune", "prune_checkpoints", "Prune the thread's checkpoints: keep_latest keeps each "
       "namespace's newest with its writes, delete removes them all (the thread stays open)", post_prune_checkpoints,
       (200, wire_checkpoints.DoneOut), body=wire_checkpoints.PruneBody, errors=(400, 401, 410, 413, 503, 504)),
    Op("POST", _T + ":copy", "copy_checkpoints", "Copy every checkpoint of the thread (each namespace, with its "
       "channel values and pending writes, ids kept) to the thread target", post_copy_checkpoints,
       (200, wire_checkpoints.DoneOut), body=wire_checkpoints.CopyBody, errors=(400, 401, 410, 413, 503, 504)),
    Op("GET", "/v1/checkpoints", "list_all_checkpoints", "The checkpoints of every thread this server's engine "
       "holds (served here, never forwarded: in a cluster, a member's own), newest first in each namespace, "
       "only those before checkpoint id before, at most limit", get_all_checkpoints,
       (200, wire_checkpoints.CheckpointsOut), query=(_CKP_BEFORE, _CKP_LIMIT), errors=(400, 401, 503)),
    Op("POST", "/v1/checkpoints:delete-runs", "delete_checkpoint_runs", "Remove the checkpoints (and their writes) "
       "of the runs run_ids in every thread this server's engine holds (served here, never forwarded: in a "
       "cluster, send it to every member)", post_delete_checkpoint_runs, (200, wire_checkpoints.DoneOut),
       body=wire_checkpoints.RunIdsBody, errors=(400, 401, 410, 413, 503, 504)),
)
