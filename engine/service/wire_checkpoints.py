"""Graph checkpoints on the wire (SERVICE.md, docs/service.md "Checkpoints", docs/langgraph.md
"Over HTTP"): the bodies of ``/v1/threads/{c}/checkpoints...`` and ``/v1/checkpoints...``, and
the converters both the server (``engine.service.routes``) and the clients
(``engine.client.checkpoint_calls``) use, so the two cannot drift.

Kept beside ``engine.service.wire`` with the same rules: the pydantic models validate request
bodies and generate ``/openapi.json``; a bad body is an ``InvalidRequest`` naming the field
(``blobs[1].value.data``, ``writes[0].idx``), never a 500; a bad answer read back by a client is
an ``InvalidRequest`` too. A serde-typed value (``schemas.checkpoints.Typed``) travels as
``{"type": str, "data": base64}`` (RFC 4648 with padding). Names (namespaces, ids, channels,
versions, tasks) follow ``schemas.checkpoints.check_name``: at most 1024 UTF-8 bytes without
control characters. Imports nothing of Starlette: the clients load it.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal
from urllib.parse import quote

import orjson
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from schemas.checkpoints import CheckpointWrite, StoredCheckpoint, Typed, check_name
from schemas.errors import InvalidRequest
from schemas.invalid import invalid

__all__ = [
    "MAX_INDEX",
    "CheckpointsOut",
    "CopyBody",
    "DoneOut",
    "PruneBody",
    "PutBody",
    "PutOut",
    "RunIdsBody",
    "StoredCheckpointModel",
    "TypedModel",
    "WritesArgs",
    "WritesBody",
    "checkpoint_segment",
    "checkpoints_of",
    "copy_body_of",
    "copy_requests",
    "done_of",
    "prune_body_of",
    "put_body_of",
    "put_json",
    "put_of",
    "run_ids_body_of",
    "stored_checkpoint_json",
    "stored_checkpoint_of",
    "thread_path",
    "typed_json",
    "writes_body_of",
    "writes_json",
]

_STRICT = ConfigDict(extra="forbid")
_BASE64 = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
MAX_INDEX = (1 << 31) - 1
"""The largest write index the wire takes (the smallest is ``-MAX_INDEX - 1``): a 32-bit int, as
``engine.checkpoints.writes_content`` and a ``writes`` record take it. LangGraph's indexes are a
task's few writes and -1..-4."""


def _name(value: str, *, empty: bool = False) -> str:
    try:
        return check_name(value, "name", empty=empty)
    except InvalidRequest as e:
        raise ValueError(str(e).removeprefix("invalid name: ")) from None


def _name_or_empty(value: str) -> str:
    return _name(value, empty=True)


def _base64(value: str) -> str:
    try:
        base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("expected base64 (RFC 4648: A-Z a-z 0-9 + /, padded with = to a multiple of 4)") from None
    return value


Name = Annotated[StrictStr, AfterValidator(_name), Field(min_length=1)]
"""A checkpoint id, channel, version, task or type name (``check_name``: not empty)."""
NameOrEmpty = Annotated[StrictStr, AfterValidator(_name_or_empty)]
"""A namespace or task path (``""`` allowed)."""


# ----- models (request and response bodies; the OpenAPI document is generated from these)
class TypedModel(BaseModel):
    """A value as the saver's serde typed it (``dumps_typed``): its type name and its bytes in
    base64."""
    model_config = _STRICT
    type: Name
    data: Annotated[StrictStr, AfterValidator(_base64),
                    Field(json_schema_extra={"pattern": _BASE64, "contentEncoding": "base64"})]


class BlobModel(BaseModel):
    """A channel's value at a version that the checkpoint adds (``null``: the channel has a new
    version but no value)."""
    model_config = _STRICT
    channel: Name
    version: Name
    value: TypedModel | None


class PutBody(BaseModel):
    """A checkpoint of the thread (``put_checkpoint``): its place, its run, the serde's checkpoint
    without channel values and its metadata, its channel versions, the values it adds."""
    model_config = _STRICT
    checkpoint_ns: NameOrEmpty = ""
    checkpoint_id: Name
    parent_id: Name | None = None
    run_id: Name | None = None
    checkpoint: TypedModel
    metadata: TypedModel
    versions: dict[StrictStr, StrictStr]
    blobs: list[BlobModel] = []


class PutOut(BaseModel):
    """The checkpoint stored (and applied: a read after it sees it)."""
    model_config = _STRICT
    checkpoint_id: str


class WriteModel(BaseModel):
    """One pending write: its index (negative for LangGraph's special channels), channel, value."""
    model_config = _STRICT
    idx: Annotated[StrictInt, Field(ge=-MAX_INDEX - 1, le=MAX_INDEX)]
    channel: Name
    value: TypedModel


class WritesBody(BaseModel):
    """A task's pending writes to a checkpoint (``put_checkpoint_writes``), at least one."""
    model_config = _STRICT
    task_id: Name
    task_path: NameOrEmpty = ""
    writes: Annotated[list[WriteModel], Field(min_length=1)]


class PendingWriteModel(BaseModel):
    model_config = _STRICT
    task_id: str
    channel: str
    value: TypedModel
    task_path: str
    idx: StrictInt


class StoredCheckpointModel(BaseModel):
    """A stored checkpoint (``StoredCheckpoint``): the serde's bytes, its channel values
    assembled from the blobs of its versions, its pending writes in ``(task_path, task_id, idx)``
    order."""
    model_config = _STRICT
    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    run_id: str | None
    checkpoint: TypedModel
    metadata: TypedModel
    channel_versions: dict[str, str]
    channel_values: dict[str, TypedModel]
    pending_writes: list[PendingWriteModel]


class CheckpointsOut(BaseModel):
    """Checkpoints newest first within each namespace (namespaces, and threads, in key order)."""
    model_config = _STRICT
    checkpoints: list[StoredCheckpointModel]


class PruneBody(BaseModel):
    """``keep_latest``: each namespace's newest checkpoint stays, with its writes; ``delete``: all
    go (the thread stays open)."""
    model_config = _STRICT
    strategy: Literal["keep_latest", "delete"]


class RunIdsBody(BaseModel):
    """The runs whose checkpoints go (their metadata's ``run_id``)."""
    model_config = _STRICT
    run_ids: list[Name]


class CopyBody(BaseModel):
    """The thread the checkpoints are copied to (a conversation id)."""
    model_config = _STRICT
    target: StrictStr


class DoneOut(BaseModel):
    """Done (applied: a read after it sees it)."""
    model_config = _STRICT


# ----- paths
def thread_path(thread_id: str) -> str:
    """``/v1/threads/{thread}/checkpoints`` with the thread as one percent-encoded segment."""
    return "/v1/threads/" + quote(thread_id, safe="") + "/checkpoints"


def checkpoint_segment(checkpoint_id: str) -> str:
    """A checkpoint id as one path segment; an id spelled ``latest`` is sent as ``%6Catest`` so
    the raw path does not name ``.../checkpoints/latest`` (the server decodes it back)."""
    return "%6Catest" if checkpoint_id == "latest" else quote(checkpoint_id, safe="")


# ----- values
def typed_json(value: Typed) -> dict[str, str]:
    return {"type": value[0], "data": base64.b64encode(value[1]).decode("ascii")}


def _typed(model: TypedModel) -> Typed:
    return model.type, base64.b64decode(model.data, validate=True)


def _parsed(body: bytes, model: type[BaseModel], shape: str) -> Any:
    try:
        tree = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"request body: not JSON ({exc}); send {shape}") from None
    if not isinstance(tree, dict):
        raise InvalidRequest(f"request body: expected a JSON object {shape}")
    try:
        return model.model_validate(tree)
    except ValidationError as exc:
        raise InvalidRequest(str(invalid(exc, "request"))) from None


def _answer(tree: Any, model: type[BaseModel], what: str) -> Any:
    try:
        return model.model_validate(tree)
    except ValidationError as exc:
        raise InvalidRequest(str(invalid(exc, f"{what} answer"))) from None


def _check(value: str, where: str) -> str:
    try:
        return check_name(value, "name")
    except InvalidRequest as e:
        raise InvalidRequest(f"invalid request: {where}: {str(e).removeprefix('invalid name: ')}") from None


# ----- put
def put_json(checkpoint_ns: str, checkpoint_id: str, parent_id: str | None, run_id: str | None,
             checkpoint: Typed, metadata: Typed, versions: Mapping[str, str],
             blobs: Iterable[tuple[str, str, Typed | None]]) -> dict[str, Any]:
    """A put's body (the caller checked the values: ``engine.checkpoints.put_content``)."""
    return {"checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id, "parent_id": parent_id, "run_id": run_id,
            "checkpoint": typed_json(checkpoint), "metadata": typed_json(metadata), "versions": dict(versions),
            "blobs": [{"channel": c, "version": v, "value": None if t is None else typed_json(t)} for c, v, t in blobs]}


def put_body_of(body: bytes) -> dict[str, Any]:
    """A put's body as ``put_checkpoint``'s arguments after the thread (``checkpoint_ns``,
    ``checkpoint_id`` and the keywords); ``InvalidRequest`` naming the field."""
    parsed: PutBody = _parsed(body, PutBody, '{"checkpoint_id": ..., "checkpoint": {"type": ..., "data": base64}, '
                                             '"metadata": {...}, "versions": {...}}')
    for channel, version in parsed.versions.items():
        _check(channel, f"versions: channel {channel[:40]!r}")
        _check(version, f"versions[{channel[:40]!r}]")
    return {"checkpoint_ns": parsed.checkpoint_ns, "checkpoint_id": parsed.checkpoint_id,
            "parent_id": parsed.parent_id, "run_id": parsed.run_id, "checkpoint": _typed(parsed.checkpoint),
            "metadata": _typed(parsed.metadata), "versions": dict(parsed.versions),
            "blobs": [(b.channel, b.version, None if b.value is None else _typed(b.value)) for b in parsed.blobs]}


def put_of(tree: Any, checkpoint_id: str) -> None:
    """A put's answer, for ``checkpoint_id`` (``InvalidRequest`` when it is not one)."""
    parsed: PutOut = _answer(tree, PutOut, "put_checkpoint")
    if parsed.checkpoint_id != checkpoint_id:
        raise InvalidRequest(f"the service answered the put of checkpoint {checkpoint_id!r} for "
                             f"{parsed.checkpoint_id!r}; is it a histlog server?")


# ----- writes
def writes_json(task_id: str, task_path: str, writes: Iterable[tuple[int, str, Typed]]) -> dict[str, Any]:
    """A task's writes' body (the caller checked the values: ``engine.checkpoints.writes_content``)."""
    return {"task_id": task_id, "task_path": task_path,
            "writes": [{"idx": i, "channel": c, "value": typed_json(t)} for i, c, t in writes]}


@dataclass(frozen=True, slots=True)
class WritesArgs:
    task_id: str
    task_path: str
    writes: list[tuple[int, str, Typed]]


def writes_body_of(body: bytes) -> WritesArgs:
    """A task's writes' body; ``InvalidRequest`` naming the field."""
    parsed: WritesBody = _parsed(body, WritesBody, '{"task_id": ..., "writes": [{"idx": 0, "channel": ..., '
                                                   '"value": {"type": ..., "data": base64}}]}')
    return WritesArgs(parsed.task_id, parsed.task_path, [(w.idx, w.channel, _typed(w.value)) for w in parsed.writes])


# ----- reads
def stored_checkpoint_json(stored: StoredCheckpoint) -> dict[str, Any]:
    return {"thread_id": stored.thread_id, "checkpoint_ns": stored.checkpoint_ns,
            "checkpoint_id": stored.checkpoint_id, "parent_checkpoint_id": stored.parent_checkpoint_id,
            "run_id": stored.run_id, "checkpoint": typed_json(stored.checkpoint),
            "metadata": typed_json(stored.metadata), "channel_versions": dict(stored.channel_versions),
            "channel_values": {c: typed_json(t) for c, t in stored.channel_values.items()},
            "pending_writes": [{"task_id": w.task_id, "channel": w.channel, "value": typed_json(w.value),
                                "task_path": w.task_path, "idx": w.idx} for w in stored.pending_writes]}


def _stored(m: StoredCheckpointModel) -> StoredCheckpoint:
    return StoredCheckpoint(
        m.thread_id, m.checkpoint_ns, m.checkpoint_id, m.parent_checkpoint_id, m.run_id, _typed(m.checkpoint),
        _typed(m.metadata), dict(m.channel_versions), {c: _typed(t) for c, t in m.channel_values.items()},
        tuple(CheckpointWrite(w.task_id, w.channel, _typed(w.value), w.task_path, w.idx) for w in m.pending_writes))


def stored_checkpoint_of(tree: Any) -> StoredCheckpoint:
    """A ``StoredCheckpointModel`` answer (``InvalidRequest`` when it is not one)."""
    return _stored(_answer(tree, StoredCheckpointModel, "get_checkpoint"))


def checkpoints_of(tree: Any) -> list[StoredCheckpoint]:
    """A ``CheckpointsOut`` answer (``InvalidRequest`` when it is not one)."""
    parsed: CheckpointsOut = _answer(tree, CheckpointsOut, "list_checkpoints")
    return [_stored(m) for m in parsed.checkpoints]


# ----- prune, runs, copy
def prune_body_of(body: bytes) -> str:
    parsed: PruneBody = _parsed(body, PruneBody, '{"strategy": "keep_latest"} (or "delete")')
    return parsed.strategy


def run_ids_body_of(body: bytes) -> list[str]:
    parsed: RunIdsBody = _parsed(body, RunIdsBody, '{"run_ids": ["run-1", ...]}')
    return list(parsed.run_ids)


def copy_body_of(body: bytes) -> str:
    parsed: CopyBody = _parsed(body, CopyBody, '{"target": "thread-2"}')
    return parsed.target


def done_of(tree: Any, what: str) -> None:
    """An empty answer (``{}``) of ``what`` (``InvalidRequest`` when it is something else)."""
    _answer(tree, DoneOut, what)


def copy_requests(target: str, stored: Iterable[StoredCheckpoint]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The ``(path, body)`` POSTs that copy ``stored`` (oldest first) to thread ``target``: each
    checkpoint with every blob of its versions (so the copy reads alone), then its writes, task by
    task; what ``engine.checkpoints.copy_plan`` writes in one process, sent to ``target``'s owner."""
    base = thread_path(target)
    for cp in stored:
        blobs = [(c, v, cp.channel_values.get(c)) for c, v in cp.channel_versions.items()]
        yield base, put_json(cp.checkpoint_ns, cp.checkpoint_id, cp.parent_checkpoint_id, cp.run_id, cp.checkpoint,
                             cp.metadata, cp.channel_versions, blobs)
        tasks: dict[tuple[str, str], list[tuple[int, str, Typed]]] = {}
        for w in cp.pending_writes:
            tasks.setdefault((w.task_id, w.task_path), []).append((w.idx, w.channel, w.value))
        path = f"{base}/{checkpoint_segment(cp.checkpoint_id)}/writes?ns={quote(cp.checkpoint_ns, safe='')}"
        for (task, task_path), writes in tasks.items():
            yield path, writes_json(task, task_path, writes)
