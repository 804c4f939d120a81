"""The graph-checkpoint calls of the clients (``engine.checkpoints.EngineCheckpoints`` over HTTP:
``/v1/threads/{thread}/checkpoints...``, docs/service.md "Checkpoints"), written once as plans
like ``engine.client.calls``' and bound to both faces in ``engine/client/faces.py``, so
``engine.integrations.langgraph.HistlogSaver`` runs on a ``HistoryClient`` and an
``AsyncHistoryClient`` as it runs on a ``HistoryEngine``.

Each plan has the engine method's name and arguments (``timeout`` is the call's, None: the
client's) and returns what it returns (``list_checkpoints`` a list). Arguments are checked before
any request by the engine's own builders (``put_content``, ``writes_content``, ``prune_content``)
and ``check_name``, so bad input fails with the engine's ``InvalidRequest`` without reaching the
server. Every write is safe to resend (the same put, writes, prune or copy again changes
nothing), so each is marked ``write``: a 504 or an unanswered try is retried within the timeout.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

from engine.checkpoints import _thread_ids, prune_content, put_content, writes_content
from engine.client.calls import Plan, _params, _timeout, clear
from engine.client.policy import Request
from engine.service import wire_checkpoints as wire
from schemas.checkpoints import StoredCheckpoint, Typed, check_name
from schemas.errors import InvalidRequest, NotFound
from schemas.ids import ConversationID

__all__ = ["clear", "copy_checkpoints", "delete_checkpoint_runs", "get_checkpoint", "list_checkpoints",
           "prune_checkpoints", "put_checkpoint", "put_checkpoint_writes"]


def _thread(thread_id: str) -> tuple[str, str]:
    """The thread's checkpoints path and its conversation (the request's route)."""
    c = str(ConversationID(thread_id))
    return wire.thread_path(c), c


def put_checkpoint(thread_id: str, checkpoint_ns: str, checkpoint_id: str, *, parent_id: str | None,
                   run_id: str | None, checkpoint: Typed, metadata: Typed, versions: Mapping[str, str],
                   blobs: Iterable[tuple[str, str, Typed | None]] = (), timeout: float | None = None) -> Plan[None]:
    """``HistoryEngine.put_checkpoint``: ``POST /v1/threads/{thread}/checkpoints``; returns once
    applied on the server (a read after it sees it)."""
    _timeout(timeout)
    added = list(blobs)  # read once: checked, then sent
    put_content(checkpoint_ns, checkpoint_id, parent_id, run_id, checkpoint, metadata, versions, added)
    path, c = _thread(thread_id)
    body = orjson.dumps(wire.put_json(checkpoint_ns, checkpoint_id, parent_id, run_id, checkpoint, metadata,
                                      versions, added))
    tree = yield Request("POST", path, body=body, write=True, timeout=timeout, conversation=c)
    wire.put_of(tree, checkpoint_id)


def put_checkpoint_writes(thread_id: str, checkpoint_ns: str, checkpoint_id: str, task_id: str,
                          writes: Sequence[tuple[int, str, Typed]], *, task_path: str = "",
                          timeout: float | None = None) -> Plan[None]:
    """``HistoryEngine.put_checkpoint_writes``: ``POST .../checkpoints/{checkpoint_id}/writes?ns=``."""
    _timeout(timeout)
    listed = list(writes)
    writes_content(checkpoint_ns, checkpoint_id, task_id, task_path, listed)
    path, c = _thread(thread_id)
    body = orjson.dumps(wire.writes_json(task_id, task_path, listed))
    tree = yield Request("POST", f"{path}/{wire.checkpoint_segment(checkpoint_id)}/writes",
                         _params(ns=checkpoint_ns or None), body=body, write=True, timeout=timeout, conversation=c)
    wire.done_of(tree, "put_checkpoint_writes")


def get_checkpoint(thread_id: str, checkpoint_ns: str = "",
                   checkpoint_id: str | None = None) -> Plan[StoredCheckpoint | None]:
    """``HistoryEngine.get_checkpoint``: ``GET .../checkpoints/{checkpoint_id}?ns=`` (or
    ``.../checkpoints/latest``); None for the server's 404."""
    path, c = _thread(thread_id)
    ns = check_name(checkpoint_ns, "checkpoint_ns", empty=True)
    cid = None if checkpoint_id is None else check_name(checkpoint_id, "checkpoint_id")
    where = "/latest" if cid is None else "/" + wire.checkpoint_segment(cid)
    tree = yield Request("GET", path + where, _params(ns=ns or None), ok=(200, 404), conversation=c)
    if _none(tree):
        return None
    return wire.stored_checkpoint_of(tree)


def _none(tree: Any) -> bool:
    """Whether an answer is the route's 404 (a route the server lacks is its ``NotFound`` raised)."""
    if not (isinstance(tree, dict) and tree.get("title") == "NotFound" and isinstance(tree.get("detail"), str)):
        return False
    if tree["detail"].startswith("no route"):
        raise NotFound(f"{tree['detail']} (is the server older than the checkpoint routes?)")
    return True


def list_checkpoints(thread_id: str | None = None, checkpoint_ns: str | None = None, *, before: str | None = None,
                     limit: int | None = None) -> Plan[list[StoredCheckpoint]]:
    """``HistoryEngine.list_checkpoints``: ``GET /v1/threads/{thread}/checkpoints?ns=&before=&limit=``
    (without ``ns``: every namespace), or without a thread ``GET /v1/checkpoints`` (the serving
    server's threads; the namespace is not a filter there, as in the engine). A list, read at once."""
    if limit is not None and (type(limit) is not int or limit < 0):
        raise InvalidRequest(f"invalid limit {limit!r}: expected an int >= 0 or None")
    place = None if thread_id is None else _thread(thread_id)
    ns = None if checkpoint_ns is None else check_name(checkpoint_ns, "checkpoint_ns", empty=True)
    cut = None if before is None else check_name(before, "before")
    query = _params(before=cut, limit=limit)
    if place is None:
        tree = yield Request("GET", "/v1/checkpoints", query)
    else:
        path, c = place
        if ns is not None:
            query["ns"] = ns
        tree = yield Request("GET", path, query, conversation=c)
    return wire.checkpoints_of(tree)


def prune_checkpoints(thread_ids: Sequence[str], strategy: str = "keep_latest",
                      timeout: float | None = None) -> Plan[None]:
    """``HistoryEngine.prune_checkpoints``: ``POST .../checkpoints:prune`` for each thread (each
    on its owner), one after the other."""
    _timeout(timeout)
    if strategy == "runs":  # a prune of runs names its runs: delete_checkpoint_runs
        raise InvalidRequest(f"invalid strategy {strategy!r}: expected keep_latest or delete")
    prune_content(strategy)
    threads = [_thread(t) for t in _thread_ids(thread_ids)]
    body = orjson.dumps({"strategy": strategy})
    for path, c in threads:
        tree = yield Request("POST", path + ":prune", body=body, write=True, timeout=timeout, conversation=c)
        wire.done_of(tree, "prune_checkpoints")


def delete_checkpoint_runs(run_ids: Sequence[str], timeout: float | None = None) -> Plan[None]:
    """``HistoryEngine.delete_checkpoint_runs``: ``POST /v1/checkpoints:delete-runs`` (the serving
    server's threads); no request for no runs."""
    _timeout(timeout)
    runs = [check_name(r, "run_id") for r in _thread_ids(run_ids, "run_ids")]
    if runs:
        tree = yield Request("POST", "/v1/checkpoints:delete-runs", body=orjson.dumps({"run_ids": runs}),
                             write=True, timeout=timeout)
        wire.done_of(tree, "delete_checkpoint_runs")


def copy_checkpoints(source_thread_id: str, target_thread_id: str, timeout: float | None = None) -> Plan[None]:
    """``HistoryEngine.copy_checkpoints``: ``POST /v1/threads/{source}/checkpoints:copy``
    with ``{"target": ...}`` (on the source's owner)."""
    _timeout(timeout)
    target = str(ConversationID(target_thread_id))
    path, c = _thread(source_thread_id)
    tree = yield Request("POST", path + ":copy", body=orjson.dumps({"target": target}), write=True, timeout=timeout,
                         conversation=c)
    wire.done_of(tree, "copy_checkpoints")
