"""Assets on the wire (SERVICE.md, docs/runs.md "Assets"): the refs a link sends
(``PUT .../messages/{m}/assets``), the message's assets it answers, and ``"assets"`` in a stored
message. Kept beside ``engine.service.wire`` with the same rules: the models generate
``/openapi.json`` and check what a client reads back (a bad answer is an ``InvalidRequest`` naming
the field), and a bad ref in a request is an ``InvalidRequest`` naming it, never a 500. It imports
nothing of ``engine.service.wire`` (which takes ``AssetModel`` into its stored message).
"""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from schemas.assets import MAX_ASSETS, AssetRef
from schemas.errors import InvalidRequest
from schemas.invalid import invalid

__all__ = ["AssetModel", "AssetsBody", "AssetsOut", "assets_body_of", "assets_of", "assets_out", "refs_of"]

_STRICT = ConfigDict(extra="forbid")


class AssetModel(BaseModel):
    """A media reference: ``content_hash`` (``sha256:`` + 64 lowercase hex), ``role``, ``ordinal``
    (its place among the message's assets) and the optional ``mime``, ``size_bytes``,
    ``storage_key``, ``name``; the rules are ``schemas.assets.AssetRef``'s."""
    model_config = _STRICT
    content_hash: Annotated[StrictStr, Field(pattern=r"^sha256:[0-9a-f]{64}$")]
    role: Annotated[StrictStr, Field(min_length=1)]
    ordinal: Annotated[StrictInt, Field(ge=0, le=2**31 - 1)]
    mime: StrictStr | None = None
    size_bytes: Annotated[StrictInt, Field(ge=0, le=2**63 - 1)] | None = None
    storage_key: StrictStr | None = None
    name: StrictStr | None = None


class AssetsBody(BaseModel):
    """The refs to link: 1 to 1,000, at most one per ordinal."""
    model_config = _STRICT
    assets: Annotated[list[AssetModel], Field(min_length=1, max_length=MAX_ASSETS)]


class AssetsOut(BaseModel):
    """All the message's assets after the link, in ordinal order."""
    model_config = _STRICT
    assets: list[AssetModel]


def refs_of(models: list[AssetModel]) -> tuple[AssetRef, ...]:
    """The ``AssetRef`` of each model (``InvalidRequest`` naming ``assets`` when a rule only
    ``AssetRef`` knows is broken, e.g. a control character in a string)."""
    try:
        return tuple(AssetRef(**m.model_dump()) for m in models)
    except InvalidRequest as e:
        raise InvalidRequest(f"invalid request: assets: {e}") from None


def assets_body_of(body: bytes) -> tuple[AssetRef, ...]:
    """The refs of a link's body; ``InvalidRequest`` naming the field when it is not
    ``{"assets": [AssetRef, ...]}``."""
    try:
        tree = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise InvalidRequest('invalid request body: not JSON; send {"assets": [{"content_hash": "sha256:...", '
                             '"role": "image", "ordinal": 0}]}') from None
    try:
        parsed = AssetsBody.model_validate(tree)
    except ValidationError as exc:
        raise InvalidRequest(str(invalid(exc, "request"))) from None
    return refs_of(parsed.assets)


def assets_out(refs: tuple[AssetRef, ...]) -> dict[str, Any]:
    """The link's answer."""
    return {"assets": [r.tree() for r in refs]}


def assets_of(tree: Any) -> tuple[AssetRef, ...]:
    """An ``AssetsOut`` answer as refs (``InvalidRequest`` when it is not one)."""
    try:
        parsed = AssetsOut.model_validate(tree)
    except ValidationError as exc:
        raise InvalidRequest(str(invalid(exc, "link_assets answer"))) from None
    return refs_of(parsed.assets)
