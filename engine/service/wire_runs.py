"""The bodies of the runs' routes (SERVICE.md, docs/runs.md): a run's fence
(``POST .../runs/{r}``) and what a run wrote (``GET .../runs/{r}``). Kept beside
``engine.service.wire`` with the same rules: the models generate ``/openapi.json`` and check
what a client reads back (a bad answer is an ``InvalidRequest`` naming the field)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from schemas.errors import InvalidRequest
from schemas.invalid import invalid
from schemas.runs import Fence

__all__ = ["FenceOut", "RunOut", "fence_json", "fence_of", "run_of"]

_STRICT = ConfigDict(extra="forbid")


class FenceOut(BaseModel):
    """A run's fence: writes take its ``epoch`` as ``"fence"``."""
    model_config = _STRICT
    conversation_id: str
    run_id: str
    epoch: Annotated[StrictInt, Field(ge=1)]


class RunOut(BaseModel):
    """What a run wrote: any message (hidden ones too; in ``root_turn`` when given), and its
    applied request (null without ``root_turn``, or when it has none)."""
    model_config = _STRICT
    wrote_history: bool
    request_message_id: str | None


def fence_json(fence: Fence) -> dict[str, Any]:
    return {"conversation_id": str(fence.conversation_id), "run_id": str(fence.run_id), "epoch": fence.epoch}


def fence_of(tree: Any) -> Fence:
    """A ``FenceOut`` answer as a ``Fence`` (``InvalidRequest`` when it is not one)."""
    try:
        parsed = FenceOut.model_validate(tree)
    except ValidationError as exc:
        raise InvalidRequest(str(invalid(exc, "begin_run answer"))) from None
    return Fence(parsed.conversation_id, parsed.run_id, parsed.epoch)  # type: ignore[arg-type]


def run_of(tree: Any) -> RunOut:
    """A ``RunOut`` answer (``InvalidRequest`` when it is not one)."""
    try:
        return RunOut.model_validate(tree)
    except ValidationError as exc:
        raise InvalidRequest(str(invalid(exc, "run answer"))) from None
