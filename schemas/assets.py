"""Media references linked to stored messages (``link_assets``; the reference's ``LinkAssets``):
``AssetRef`` and its one canonical JSON form, what the ``AssetsLinked`` event carries (sealed like
content) and what the state keeps per message.

An asset is content-addressed: ``content_hash`` (``sha256:`` + 64 lowercase hex) names the media
file, which histlog never stores; ``role`` says what it is to the message (``"image"``,
``"attachment"``, ...), ``ordinal`` its place among the message's assets (at most one ref per
ordinal: linking the same ref again changes nothing, another ref at a linked ordinal conflicts).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from schemas.errors import InvalidRequest

__all__ = ["MAX_ASSETS", "AssetRef", "assets_from_json", "assets_json", "check_assets", "trusted_assets"]

MAX_ASSETS: Final = 1000
"""At most this many refs in one ``link_assets`` call (one log record)."""

_HASH: Final = re.compile(r"sha256:[0-9a-f]{64}")
_MAX_TEXT: Final = 1024  # UTF-8 bytes of role, mime, storage_key, name
_FIELDS: Final = ("content_hash", "role", "ordinal", "mime", "size_bytes", "storage_key", "name")


def _text(value: object, field: str, *, required: bool) -> None:
    if value is None and not required:
        return
    if not isinstance(value, str) or (required and not value):
        raise InvalidRequest(f"invalid asset {field}: expected a {'non-empty ' if required else ''}string"
                             f"{'' if required else ' or None'}, got {value!r:.80}")
    if len(value.encode("utf-8", "surrogatepass")) > _MAX_TEXT or any(ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F
                                                                        for ch in value):
        raise InvalidRequest(f"invalid asset {field}: at most {_MAX_TEXT} UTF-8 bytes and no control "
                             f"characters, got {value!r:.80}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequest(f"invalid asset {field}: not valid UTF-8 (a lone surrogate)") from None


@dataclass(frozen=True, slots=True)
class AssetRef:
    """A media reference of a stored message; every field is checked when it is made
    (``InvalidRequest`` naming the field)."""

    content_hash: str
    role: str
    ordinal: int
    mime: str | None = None
    size_bytes: int | None = None
    storage_key: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.content_hash, str) or _HASH.fullmatch(self.content_hash) is None:
            raise InvalidRequest(f"invalid asset content_hash {self.content_hash!r:.90}: expected 'sha256:' and 64 "
                                 "lowercase hex digits (the SHA-256 of the media file)")
        _text(self.role, "role", required=True)
        if type(self.ordinal) is not int or not 0 <= self.ordinal < 1 << 31:
            raise InvalidRequest(f"invalid asset ordinal {self.ordinal!r:.40}: expected an int from 0 to 2**31-1")
        _text(self.mime, "mime", required=False)
        if self.size_bytes is not None and (type(self.size_bytes) is not int or not 0 <= self.size_bytes < 1 << 63):
            raise InvalidRequest(f"invalid asset size_bytes {self.size_bytes!r:.40}: expected an int >= 0 or None")
        _text(self.storage_key, "storage_key", required=False)
        _text(self.name, "name", required=False)

    def tree(self) -> dict[str, Any]:
        """The ref as JSON values, the fields that are None left out."""
        return {f: getattr(self, f) for f in _FIELDS if getattr(self, f) is not None}

    @classmethod
    def from_tree(cls, tree: object) -> AssetRef:
        """``tree()``'s inverse: ``InvalidRequest`` for anything but an object of those fields."""
        if not isinstance(tree, Mapping):
            raise InvalidRequest(f"invalid asset: expected an object with content_hash, role and ordinal, got "
                                 f"{type(tree).__name__}")
        unknown = sorted(set(tree) - set(_FIELDS))
        if unknown:
            raise InvalidRequest(f"invalid asset: unknown field {unknown[0]!r:.80} (known: {', '.join(_FIELDS)})")
        missing = [f for f in _FIELDS[:3] if f not in tree]
        if missing:
            raise InvalidRequest(f"invalid asset {missing[0]}: required")
        return cls(**tree)


def check_assets(refs: object) -> tuple[AssetRef, ...]:
    """``refs`` as the refs of one ``link_assets`` call, sorted by ordinal: a non-empty list or
    tuple of ``AssetRef`` with at most ``MAX_ASSETS``, at most one per ordinal (the same ref twice
    is kept once). ``InvalidRequest`` otherwise, before any I/O."""
    if isinstance(refs, str | bytes) or not isinstance(refs, Iterable):
        raise InvalidRequest(f"invalid assets: expected a list of AssetRef, got {type(refs).__name__}")
    items = list(refs)
    if not items or len(items) > MAX_ASSETS:
        raise InvalidRequest(f"invalid assets: expected 1 to {MAX_ASSETS} refs in one call, got {len(items)}")
    by_ordinal: dict[int, AssetRef] = {}
    for ref in items:
        if not isinstance(ref, AssetRef):
            raise InvalidRequest(f"invalid assets: expected AssetRef items, got {type(ref).__name__}")
        if by_ordinal.setdefault(ref.ordinal, ref) != ref:
            raise InvalidRequest(f"invalid assets: two different refs at ordinal {ref.ordinal}")
    return tuple(by_ordinal[o] for o in sorted(by_ordinal))


def assets_json(refs: Iterable[AssetRef]) -> bytes:
    """The canonical JSON array of ``refs`` (sorted keys, no spaces): the event's content."""
    return orjson.dumps([r.tree() for r in refs], option=orjson.OPT_SORT_KEYS)


def trusted_assets(data: bytes) -> tuple[AssetRef, ...]:
    """``assets_from_json`` of bytes admission checked already (a state row): the refs built
    without checking their fields again (reads return them at the cost of a dict each)."""
    out = []
    new, setattr_ = object.__new__, object.__setattr__
    for tree in orjson.loads(data):
        ref = new(AssetRef)
        for name in _FIELDS:
            setattr_(ref, name, tree.get(name))
        out.append(ref)
    return tuple(out)


def assets_from_json(data: bytes) -> tuple[AssetRef, ...]:
    """``assets_json``'s inverse; ``InvalidRequest`` for bytes that are not such an array."""
    try:
        tree = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise InvalidRequest(f"invalid assets: not JSON ({e})") from None
    if not isinstance(tree, list):
        raise InvalidRequest("invalid assets: expected a JSON array")
    return tuple(AssetRef.from_tree(t) for t in tree)
