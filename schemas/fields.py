"""Field types the models share, each with its validation, its JSON form and its canonical rule.

* ``Metadata``: non-empty string keys to JSON values, held as a ``FrozenDict`` of ``RawJSON``
  (number spellings kept); written into the canonical tree as the values' exact text.
* ``Bytes``: ``bytes`` in Python, standard padded base64 (RFC 4648 section 4) in JSON and in
  the canonical tree.

The canonical rule of a type is declared here, next to the type, as a ``Rule`` in its
``Annotated`` metadata: every field of that type gets it (``schemas.model`` reads it).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Annotated, Any, Final

import orjson
from pydantic import PlainSerializer, PlainValidator, WithJsonSchema
from pydantic_core import core_schema

from schemas.canonical import EMPTY_METADATA, FrozenDict, RawJSON
from schemas.errors import InvalidMessage
from schemas.model import DEFAULT, Rule

__all__ = ["Bytes", "Metadata", "b64", "metadata_tree"]

_Fragment: Final = orjson.Fragment


# --------------------------------------------------------------------------- metadata


def _validate_metadata(value: Any) -> FrozenDict:
    if type(value) is FrozenDict and all(type(v) is RawJSON for v in value.values()):
        return value if value else EMPTY_METADATA
    if not isinstance(value, Mapping):
        raise ValueError(
            f"metadata must be a mapping of string keys to JSON values, got {type(value).__name__}"
        )
    if not value:
        return EMPTY_METADATA
    out: dict[str, RawJSON] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise ValueError(f"metadata key {key!r} is not a string")
        if not key:
            raise ValueError("empty key (metadata keys must be non-empty strings)")
        try:
            out[str(key)] = item if isinstance(item, RawJSON) else RawJSON.of(item)
        except InvalidMessage as exc:
            raise ValueError(f"[{key!r}]: {str(exc).removeprefix('invalid JSON value: ')}") from None
    return FrozenDict(out)


def _serialize_metadata(value: FrozenDict, info: core_schema.SerializationInfo) -> dict[str, Any]:
    if info.mode_is_json():
        return {k: v.value() for k, v in value.items()}
    return dict(value)


def metadata_tree(metadata: FrozenDict) -> dict[str, Any]:
    """Metadata as an orjson-ready object: each value's canonical text embedded verbatim."""
    return {k: _Fragment(str.__str__(v)) for k, v in metadata.items()}


def _none_is_default(value: Any) -> Any:
    """A constructor's ``metadata=None`` means "no metadata"."""
    return DEFAULT if value is None else value


Metadata = Annotated[
    FrozenDict,
    PlainValidator(_validate_metadata),
    PlainSerializer(_serialize_metadata),
    WithJsonSchema(
        {
            "type": "object",
            "propertyNames": {"minLength": 1},
            "additionalProperties": {"description": "Any JSON value (number spellings are preserved)."},
        }
    ),
    Rule(encode=metadata_tree, convert=_none_is_default),
]
"""Metadata: non-empty string keys to JSON values, stored as a ``FrozenDict`` of ``RawJSON``."""


# --------------------------------------------------------------------------- bytes


def _validate_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        try:
            return base64.b64decode(value.encode("ascii"), validate=True)
        except (UnicodeEncodeError, binascii.Error):
            raise ValueError("expected standard base64 (RFC 4648, with padding)") from None
    raise ValueError(f"expected bytes (or a base64 string), got {type(value).__name__}")


def b64(data: bytes) -> str:
    """Standard padded base64 of ``data`` (how bytes are written in JSON)."""
    return base64.b64encode(data).decode("ascii")


def _serialize_bytes(value: bytes, info: core_schema.SerializationInfo) -> bytes | str:
    return b64(value) if info.mode_is_json() else value


Bytes = Annotated[
    bytes,
    PlainValidator(_validate_bytes),
    PlainSerializer(_serialize_bytes),
    WithJsonSchema({"type": "string", "contentEncoding": "base64"}),
    Rule(encode=b64),
]
"""Bytes: ``bytes`` in Python, standard padded base64 (RFC 4648 section 4) in JSON."""
