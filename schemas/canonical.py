"""Canonical JSON: the exact bytes histlog digests and stores (see ``docs/canonical-json.md``).

Rules, in short: UTF-8; no insignificant whitespace; object keys sorted by Unicode code point
(the same as UTF-8 byte order); strings escaped as RFC 8785 does (only ``"``, ``\\`` and
U+0000-U+001F; ``\\b \\f \\n \\r \\t`` short, every other control character as ``\\u00xx`` in
lowercase hex; nothing else, not even U+007F or U+2028); numbers spelled exactly as given
(unlike RFC 8785), integers and floats that come from Python values spelled once by orjson.

Nesting is bounded: a JSON value (a metadata value, tool ``details``) holds at most
``MAX_DEPTH`` (64) levels of arrays and objects, and any JSON text histlog parses at most
``MAX_DOCUMENT_DEPTH`` (the value limit plus room for the message and batch envelope). Deeper
input is refused with ``InvalidMessage`` (``ValueError`` from ``loads_exact``) *before* any
recursive step, so no input can reach Python's recursion limit.

``RawJSON`` holds one JSON value in that canonical form. The writer is orjson with
``OPT_SORT_KEYS``; already-canonical pieces (a ``RawJSON``, a part's cached bytes) are passed
through as ``orjson.Fragment`` so nothing is parsed or spelled twice.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any, Final

import orjson
from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

from schemas.errors import InvalidMessage

__all__ = [
    "DIGEST_PATTERN",
    "EMPTY_METADATA",
    "MAX_DEPTH",
    "MAX_DOCUMENT_DEPTH",
    "FrozenDict",
    "RawJSON",
    "digest_of",
    "dumps",
    "loads_exact",
]

_SORT: Final = orjson.OPT_SORT_KEYS
_Fragment: Final = orjson.Fragment


DIGEST_PATTERN: Final = re.compile(r"sha256:[0-9a-f]{64}")
"""What every digest looks like (``fullmatch``): ``sha256:`` and 64 lowercase hex digits."""

MAX_DEPTH: Final = 64
"""The deepest a JSON value (metadata value, tool ``details``) may nest arrays and objects: ``[]``
is 1 level, ``[[]]`` 2. Far below Python's recursion limit and orjson's own (255)."""

MAX_DOCUMENT_DEPTH: Final = MAX_DEPTH + 16
"""The deepest any JSON text may nest: a value at ``MAX_DEPTH`` plus the envelope of a batch
file (``{"messages":[{"parts":[{"output":{"details":...}}]}]}`` is 6 levels), with room to spare."""


_SHA256: Final = hashlib.sha256()  # never updated: each digest copies it


def digest_of(data: bytes) -> str:
    """``"sha256:"`` + the lowercase hex SHA-256 of ``data``: the digest of a batch or message.

    From a copy of an empty state made once: ``hashlib.sha256()`` looks its algorithm up in
    OpenSSL on every call (about 6,700 instructions, as much as hashing 200 bytes; a copy is 400)."""
    h = _SHA256.copy()
    h.update(data)
    return "sha256:" + h.hexdigest()


def dumps(value: Any) -> bytes:
    """Serialise an already-prepared tree (dict/list/str/bool/None/int/float/Fragment) canonically.

    Callers must have replaced every ``RawJSON`` by ``orjson.Fragment`` (see ``RawJSON.fragment``)
    and rejected non-finite floats; this is the hot path and checks nothing else.
    """
    return orjson.dumps(value, option=_SORT)


class _Num:
    """The exact text of one JSON number as the parser saw it (never a ``str``: see ``loads_exact``)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"<JSON number {self.text}>"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON (NaN and Infinity are not allowed)")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate object key {key!r}")
            seen.add(key)
    return out


_STRUCTURE: Final = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)
"""A whole JSON string (skipped: brackets in it are text) or one bracket."""


def _too_deep(text: str, limit: int) -> bool:
    """Whether ``text`` nests arrays/objects deeper than ``limit``, found without recursion."""
    if text.count("[") + text.count("{") <= limit:  # cannot nest deeper than it has openers
        return False
    depth = 0
    for match in _STRUCTURE.finditer(text):
        token = match.group()
        if token == "[" or token == "{":
            depth += 1
            if depth > limit:
                return True
        elif token == "]" or token == "}":
            depth -= 1
    return False


_DECODER: Final = json.JSONDecoder(
    parse_int=_Num, parse_float=_Num, parse_constant=_reject_constant, object_pairs_hook=_no_duplicates
)


def loads_exact(data: str | bytes | bytearray | memoryview) -> Any:
    """Parse JSON keeping every number's exact spelling (as an internal ``_Num``).

    Rejects invalid JSON, invalid UTF-8, ``NaN``/``Infinity``, duplicate object keys and text
    nested deeper than ``MAX_DOCUMENT_DEPTH`` (checked before parsing) with a ``ValueError``
    saying why. Lone surrogates in strings are *not* rejected here: the canonical
    writer refuses them. Objects become ``dict``, arrays ``list``.
    """
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"not UTF-8: {exc.reason} at byte {exc.start}") from None
    elif isinstance(data, str):
        text = data
    else:
        raise ValueError(f"expected JSON text (str or bytes), got {type(data).__name__}")
    if _too_deep(text, MAX_DOCUMENT_DEPTH):
        raise ValueError(f"JSON nested deeper than {MAX_DOCUMENT_DEPTH} levels of arrays and objects "
                         f"(metadata values and tool details may nest at most {MAX_DEPTH}); flatten it")
    try:
        return _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None


def _deep(where: str) -> ValueError:
    root = where.split("[", 1)[0]  # the path down 64 levels says nothing useful
    return ValueError(f"{root} nested deeper than {MAX_DEPTH} levels of arrays and objects "
                      f"(a JSON value may nest at most {MAX_DEPTH}); flatten it")


def _prepare(value: Any, where: str, depth: int = 0) -> Any:
    """Turn a Python JSON-like value into an orjson-ready tree, rejecting what JSON cannot hold
    and nesting deeper than ``MAX_DEPTH`` (``depth``: containers around ``value``), which also
    stops a self-containing list or dict."""
    if value is None or value is True or value is False:
        return value
    cls = type(value)
    if cls is str:
        return value
    if cls is RawJSON or isinstance(value, RawJSON):
        return _Fragment(str.__str__(value))
    if cls is _Num:
        return _number(value.text, where)
    if cls is int:
        if -(2**63) <= value < 2**64:
            return value
        try:
            float(value)
        except OverflowError:
            raise _out_of_range(where, f"an integer of {value.bit_length()} bits") from None
        return _Fragment(int.__repr__(value))
    if cls is float:
        if not math.isfinite(value):
            raise ValueError(f"{where}: {value!r} is not a JSON number (NaN and Infinity are not allowed)")
        return value
    if isinstance(value, Mapping):
        if depth >= MAX_DEPTH:
            raise _deep(where)
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{where}: object key {key!r} is not a string")
            out[str(key)] = _prepare(item, f"{where}[{key!r}]", depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        if depth >= MAX_DEPTH:
            raise _deep(where)
        return [_prepare(item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value)]
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return _prepare(int(value), where, depth)
    if isinstance(value, float):
        return _prepare(float(value), where, depth)
    raise ValueError(f"{where}: {cls.__name__} is not a JSON value")


def _number(text: str, where: str) -> orjson.Fragment:
    """A number's exact spelling, once it is known to be in range: a JSON number in a message must
    be a finite 64-bit float (at most about 1.8e308 in magnitude), spelled however it was given.
    That is what every JSON reader holds (JavaScript, orjson and most others read numbers as
    doubles; Python's ``json`` stops at 4,300 digits), so a value one face accepts every face
    reads back; ``1e999`` or 400 nines are refused on every entry (``InvalidMessage``; a record
    that carries one is poison), as in a request's envelope."""
    if not math.isfinite(float(text)):  # the JSON grammar is a subset of float()'s
        shown = text if len(text) <= 24 else f"{text[:20]}... ({len(text)} characters)"
        raise _out_of_range(where, f"the number {shown}")
    return _Fragment(text)


def _out_of_range(where: str, what: str) -> ValueError:
    return ValueError(f"{where}: {what} is out of range (a JSON number in a message must be a finite "
                      "64-bit float, at most about 1.8e308 in magnitude); send it as a string")


def _first_surrogate(value: Any, where: str) -> str | None:
    """Where the first lone surrogate in a tree is (for error messages only; slow path)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            inner = f"{where}.{key}" if where else str(key)
            if _first_surrogate(key, "key"):
                return f"{where or 'object'} key {key!r}"
            found = _first_surrogate(item, inner)
            if found:
                return found
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = _first_surrogate(item, f"{where}[{i}]")
            if found:
                return found
    return None


def _dump_checked(tree: Any, where: str) -> bytes:
    try:
        return orjson.dumps(tree, option=_SORT)
    except (TypeError, orjson.JSONEncodeError) as exc:
        spot = _first_surrogate(tree, where)
        if spot is not None:
            raise ValueError(f"{spot}: lone surrogate (text must be valid Unicode)") from None
        raise ValueError(f"{where}: cannot serialise: {exc}") from None


class RawJSON(str):
    """One JSON value, held as its canonical JSON text (the ``str`` value *is* the canonical form).

    ``RawJSON(text)`` parses ``text`` (rejecting invalid JSON, ``NaN``/``Infinity``, duplicate
    object keys and lone surrogates) and re-serialises it canonically: keys sorted by code
    point, no whitespace, RFC 8785 string escaping, and every number spelled exactly as given.
    So ``RawJSON('{ "b": 1e3, "a": [1.50] }') == '{"a":[1.50],"b":1e3}'``.
    ``RawJSON.of(value)`` serialises a Python value (dict/list/tuple/str/int/float/bool/None,
    nested ``RawJSON`` kept verbatim) once. ``value()`` parses it back (numbers as Python
    ``int``/``float``, so spellings are lost there). Errors raise ``InvalidMessage``.
    """

    __slots__ = ()

    def __new__(cls, text: str | bytes = "") -> RawJSON:
        if type(text) is cls:
            return text
        try:
            tree = loads_exact(text)
            canonical = _dump_checked(_prepare(tree, "JSON value"), "JSON value")
        except ValueError as exc:
            raise InvalidMessage(f"invalid JSON value: {exc}") from None
        return str.__new__(cls, canonical.decode("utf-8"))

    @classmethod
    def of(cls, value: Any) -> RawJSON:
        """Serialise a Python value once into its canonical JSON text. Raises ``InvalidMessage``."""
        if isinstance(value, RawJSON):
            return value
        try:
            canonical = _dump_checked(_prepare(value, "JSON value"), "JSON value")
        except ValueError as exc:
            raise InvalidMessage(f"invalid JSON value: {exc}") from None
        return cls._trusted(canonical.decode("utf-8"))

    @classmethod
    def _trusted(cls, canonical: str) -> RawJSON:
        """Wrap text already known to be canonical (internal)."""
        return str.__new__(cls, canonical)

    def fragment(self) -> orjson.Fragment:
        """This value as an ``orjson.Fragment``, to embed it verbatim in a canonical document."""
        return _Fragment(str.__str__(self))

    def value(self) -> Any:
        """The JSON value as Python objects (lossy for number spellings)."""
        return json.loads(str.__str__(self))

    def __repr__(self) -> str:
        return f"RawJSON({str.__repr__(self)})"

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            _validate_raw,
            serialization=core_schema.plain_serializer_function_ser_schema(_serialize_raw, info_arg=True),
        )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {"description": "Any JSON value (number spellings are preserved)."}


def _validate_raw(value: Any) -> RawJSON:
    """Pydantic validator: a ``RawJSON`` is kept verbatim; any other value is serialised once."""
    if isinstance(value, RawJSON):
        return value
    try:
        return RawJSON.of(value)
    except InvalidMessage as exc:
        raise ValueError(str(exc).removeprefix("invalid JSON value: ")) from None


def _serialize_raw(value: RawJSON, info: core_schema.SerializationInfo) -> Any:
    return value.value() if info.mode_is_json() else value


class FrozenDict(dict[str, Any]):
    """A ``dict`` that refuses mutation and hashes by content: how metadata is stored.

    It is a real ``dict`` (so pydantic, orjson and ``json`` serialise it as an object), but
    every mutating method raises ``TypeError``. Values are ``RawJSON`` for metadata.
    """

    __slots__ = ("_hash",)

    def _readonly(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("metadata is immutable; build a new message instead")

    __setitem__ = _readonly
    __delitem__ = _readonly
    __ior__ = _readonly
    clear = _readonly
    pop = _readonly
    popitem = _readonly
    setdefault = _readonly
    update = _readonly

    def __hash__(self) -> int:  # type: ignore[override]
        try:
            return self._hash  # type: ignore[attr-defined,no-any-return]
        except AttributeError:
            h = hash(frozenset(self.items()))
            object.__setattr__(self, "_hash", h)
            return h

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenDict:
        return self

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return (FrozenDict, (dict(self),))

    def __repr__(self) -> str:
        return f"FrozenDict({dict.__repr__(self)})"


EMPTY_METADATA: Final = FrozenDict()
"""The shared empty metadata mapping (immutable, so sharing is safe)."""
