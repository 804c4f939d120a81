"""The bodies of the routes that name many things at once (SERVICE.md): reads by message ids
(``POST .../messages:by-ids``), deletes by message ids (``POST .../messages:delete``) and clears
by prefix (``POST /v1/conversations:clear``). Kept beside ``engine.service.wire`` (the one home
of every other representation, whose models and converters these reuse), with the same rules:
the pydantic models validate the request bodies and generate ``/openapi.json``; a bad body is an
``InvalidRequest`` naming the field.

What the engine decides about the values (more than ``MAX_IDS`` ids, an empty prefix) it
raises itself, with the class it raises in process, so a caller sees the same error either way.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from engine.service.wire import TurnSourceModel, body_tree
from schemas.errors import InvalidRequest
from schemas.invalid import invalid

__all__ = ["ClearedOut", "DeletedOut", "IdsBody", "PrefixBody", "SourcesByIdsOut", "cleared_of", "deleted_of",
           "ids_body_of", "prefix_body_of"]

_STRICT = ConfigDict(extra="forbid")


class IdsBody(BaseModel):
    """The message ids to read or delete (``APPEND_ID/INDEX``, as ``entries`` gives them), at most
    10,000."""
    model_config = _STRICT
    ids: list[str]


class PrefixBody(BaseModel):
    """Clear every open conversation whose id starts with ``prefix`` (not empty)."""
    model_config = _STRICT
    prefix: str


class SourcesByIdsOut(BaseModel):
    model_config = _STRICT
    sources: list[TurnSourceModel]


class ClearedOut(BaseModel):
    model_config = _STRICT
    cleared: Annotated[int, Field(ge=0)]


class DeletedOut(BaseModel):
    """How many of the named messages were visible (and are now deleted from every read)."""
    model_config = _STRICT
    deleted: Annotated[StrictInt, Field(ge=0)]


def _parsed(body: bytes, model: type[BaseModel], shape: str) -> Any:
    tree = body_tree(body)
    if not isinstance(tree, dict):
        raise InvalidRequest(f"request body: expected a JSON object {shape}")
    try:
        return model.model_validate(tree)
    except ValidationError as exc:
        raise InvalidRequest(str(invalid(exc, "request"))) from None


def ids_body_of(body: bytes) -> list[str]:
    """The ids of a by-ids (or delete) body; ``InvalidRequest`` naming the field when it is not
    ``{"ids": [str, ...]}``."""
    parsed: IdsBody = _parsed(body, IdsBody, '{"ids": ["APPEND_ID/INDEX", ...]}')
    return parsed.ids


def prefix_body_of(body: bytes) -> str:
    """The prefix of a clear-by-prefix body; ``InvalidRequest`` naming the field when it is not
    ``{"prefix": str}``."""
    parsed: PrefixBody = _parsed(body, PrefixBody, '{"prefix": "bot-7/"}')
    return parsed.prefix


def cleared_of(tree: Any) -> int:
    """The count of a clear-by-prefix answer (``InvalidRequest`` when it is not one)."""
    try:
        return ClearedOut.model_validate(tree).cleared
    except ValidationError as exc:
        raise InvalidRequest(str(invalid(exc, "clear_prefix answer"))) from None


def deleted_of(tree: Any) -> int:
    """The count of a delete-by-ids answer (``InvalidRequest`` when it is not one)."""
    try:
        return DeletedOut.model_validate(tree).deleted
    except ValidationError as exc:
        raise InvalidRequest(str(invalid(exc, "delete_messages answer"))) from None
