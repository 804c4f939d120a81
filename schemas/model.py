"""The base of every data-model class: each model's fields are declared once, as pydantic fields,
and its positional constructor and its canonical JSON are derived from that one declaration.

Promises of every ``Model`` subclass:

* **One declaration.** The positional constructor takes the fields in declaration order (a
  ``Literal`` tag such as ``kind`` is implied by the class and never passed; a field marked
  ``Rule(keyword_only=True)`` is keyword-only). The canonical tree holds every field, written
  by its type (text, booleans and integers as they are, raw JSON verbatim, a nested model as
  its own canonical JSON, or the ``Rule(encode=...)`` declared next to the field or its type
  such as base64 for ``Bytes``); a field is left out only when it says so, with a reason
  (``Rule(excluded="why")``). A field whose type has no canonical form and no declared rule
  makes the class definition fail, so no field can silently stay out of the digest.
* **Defaults omitted.** A member is written unless its value is ``None`` (an absent value is an
  absent member, JSON ``null`` is never written) or equals the field's default; ``Literal``
  tags and fields marked ``Rule(always=True)`` are written even then.
* **Validated on construction.** A pydantic ``ValidationError`` never escapes a constructor,
  ``model_validate`` or ``model_validate_json``: it becomes ``InvalidMessage`` saying what and
  where (``invalid message: parts[1]: kind 'tool_call' is not allowed for role 'user'``).
* **Canonical bytes.** ``canonical_json()`` is computed once at construction (which also proves
  that every string is valid Unicode) and cached; equality and hashing are by type and
  canonical bytes. The format is ``docs/canonical-json.md``.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
from collections.abc import Callable, Iterable, Mapping
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Final, Literal, Self, Union, get_args, get_origin

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import PydanticUndefined

from schemas.canonical import RawJSON, _dump_checked, loads_exact
from schemas.errors import InvalidMessage
from schemas.invalid import TAGS, invalid

__all__ = ["DEFAULT", "STORED", "Model", "Rule"]

_Fragment: Final = orjson.Fragment

Encoder = Callable[[Any], Any]
"""A field value -> its orjson-ready canonical tree (or, for ``Rule.convert``, a constructor
argument -> the value to validate)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Rule:
    """A field's constructor and canonical rules, declared next to the field or its type:
    ``name: Annotated[T, Rule(...)]``. Several rules on one field combine (set values win)."""

    keyword_only: bool = False
    """The positional constructor takes the field by keyword only."""
    convert: Encoder | None = None
    """Applied to a constructor argument before validation (``model_validate`` does not); a
    result of ``DEFAULT`` leaves the field at its default, as if it were not given."""
    always: bool = False
    """Written into the canonical tree even when it holds its default."""
    encode: Encoder | None = None
    """How the value is written into the canonical tree (default: by its type)."""
    excluded: str = ""
    """Why the field is left out of the canonical tree (and so of equality and the digest)."""


DEFAULT: Final = object()
"""What a ``Rule.convert`` returns for "not given": the field keeps its default."""


def _rule_of(metadata: Iterable[object]) -> Rule:
    merged = Rule()
    for item in metadata:
        if isinstance(item, Rule):
            merged = Rule(*(getattr(item, f.name) or getattr(merged, f.name) for f in dataclasses.fields(Rule)))
    return merged


# --------------------------------------------------------------------------- derivation

_WRITE: Final = object()  # in a canonical rule's default slot: write the member even at its default

CanonicalRules = tuple[tuple[str, Encoder | None, Any], ...]
"""Per written field: ``(name, encoder or None for "as it is", default or _WRITE)``."""


def _fragment(value: Model) -> orjson.Fragment:
    """A nested model as its cached canonical bytes."""
    return _Fragment(value.canonical_json())


def _fresh(value: Model) -> dict[str, Any]:
    """A nested model rebuilt from its fields (no cache)."""
    return value._fresh_tree()


def _fragments(values: Iterable[Model]) -> list[orjson.Fragment]:
    return [_Fragment(v.canonical_json()) for v in values]


def _each(encode: Encoder) -> Encoder:
    if encode is _fragment:
        return _fragments  # the hot case (a message's parts), without a call per item
    return lambda values: [encode(v) for v in values]


def _encoder(tp: Any, nested: Encoder, where: str) -> Encoder | None:
    """How a value of type ``tp`` is written into the canonical tree (``None``: as it is):
    ``nested`` for a model, the declared ``Rule.encode`` of an ``Annotated`` type."""
    origin = get_origin(tp)
    if origin is Annotated:
        rule = _rule_of(tp.__metadata__)
        return rule.encode if rule.encode is not None else _encoder(get_args(tp)[0], nested, where)
    if origin is Union or origin is types.UnionType:
        found = {_encoder(arm, nested, where) for arm in get_args(tp) if arm is not type(None)}
        if len(found) == 1:
            return found.pop()
    elif origin is tuple:
        item, *rest = get_args(tp)
        if rest == [Ellipsis]:
            each = _encoder(item, nested, where)
            return None if each is None else _each(each)
    elif origin is Literal:
        return None
    elif isinstance(tp, type):
        if issubclass(tp, Model):
            return nested
        if issubclass(tp, RawJSON):
            return RawJSON.fragment
        if tp in (str, bool, int) or issubclass(tp, StrEnum):
            return None
    raise TypeError(
        f"{where}: no canonical form for values of type {tp!r}; declare one next to the field "
        "with Annotated[..., Rule(encode=...)], or leave it out with Rule(excluded='why')"
    )


def _derive(cls: type[Model]) -> None:
    """Derive the constructor and the canonical rules of ``cls`` from its declared fields."""
    positional: list[inspect.Parameter] = []
    keyword: list[inspect.Parameter] = []
    converts: list[tuple[str, Encoder]] = []
    cached: list[tuple[str, Encoder | None, Any]] = []
    fresh: list[tuple[str, Encoder | None, Any]] = []
    for name, info in cls.model_fields.items():
        rule = _rule_of(info.metadata)
        tag = get_origin(info.annotation) is Literal
        if tag:
            TAGS.update(str(v) for v in get_args(info.annotation))
        else:
            default = inspect.Parameter.empty if info.is_required() else info.default
            kind = inspect.Parameter.KEYWORD_ONLY if rule.keyword_only else inspect.Parameter.POSITIONAL_OR_KEYWORD
            (keyword if rule.keyword_only else positional).append(inspect.Parameter(name, kind, default=default))
        if rule.convert is not None:
            converts.append((name, rule.convert))
        if rule.excluded:
            continue
        where = f"{cls.__name__}.{name}"
        written = _WRITE if tag or rule.always or info.default is PydanticUndefined else info.default
        cached.append((name, rule.encode or _encoder(info.annotation, _fragment, where), written))
        fresh.append((name, rule.encode or _encoder(info.annotation, _fresh, where), written))
    for method in ("_tree", "_fresh_tree"):
        if method in vars(cls):
            raise TypeError(f"{cls.__name__} defines {method}: the canonical tree is derived from the "
                            "fields; declare a field's form with Annotated[..., Rule(encode=...)] instead")
    cls._positional = tuple(p.name for p in positional)
    cls._converts = tuple(converts)
    cls._tree = _compile(tuple(cached))  # type: ignore[method-assign,assignment]
    cls._fresh_tree = _compile(tuple(fresh))  # type: ignore[method-assign,assignment]
    cls.__signature__ = inspect.Signature([*positional, *keyword])


def _compile(rules: CanonicalRules) -> Callable[[Model], dict[str, Any]]:
    """The tree function of ``rules`` as straight-line code, written once per class (the way
    ``dataclasses`` writes ``__init__``): it runs for every value built or read back, and a
    loop over the rules costs twice as much. Only field names (identifiers) reach the source;
    encoders and defaults are passed by reference."""
    env: dict[str, Any] = {}
    lines = ["def _tree(self):", "    d = self.__dict__", "    t = {}"]
    for i, (field, encode, default) in enumerate(rules):
        env[f"e{i}"], env[f"d{i}"] = encode, default
        write = "v is not None" if default is _WRITE else f"v is not None and v is not d{i} and v != d{i}"
        lines += [f"    v = d[{field!r}]", f"    if {write}:",
                  f"        t[{field!r}] = {'v' if encode is None else f'e{i}(v)'}"]
    lines.append("    return t")
    exec("\n".join(lines), env)
    return env["_tree"]  # type: ignore[no-any-return]


# --------------------------------------------------------------------------- base

STORED: Final = "histlog.stored_canonical"
"""Validation-context key of ``Model.from_stored``: the bytes histlog stored after validating them."""


class Model(BaseModel):
    """Frozen, strict-shaped base: positional construction, translated validation errors,
    canonical bytes derived from the fields, equality by canonical bytes.

    Each subclass repeats this constructor's signature under ``if TYPE_CHECKING:``: at run
    time nothing changes (the constructor is inherited); it tells the pydantic mypy plugin that
    the class keeps this positional constructor instead of the keyword-only one the plugin
    would otherwise give it (the plugin writes one for every class that lacks its own).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=False)
    __slots__ = ("_canon",)

    _what: ClassVar[str] = "message"
    _positional: ClassVar[tuple[str, ...]] = ()
    _converts: ClassVar[tuple[tuple[str, Encoder], ...]] = ()

    def __init__(self, /, *args: Any, **fields: Any) -> None:
        if args:
            names = self._positional
            if len(args) > len(names):
                raise TypeError(f"{type(self).__name__}() takes at most {len(names)} positional arguments "
                                f"({', '.join(names)}), {len(args)} were given")
            for name, value in zip(names, args, strict=False):
                if name in fields:
                    raise TypeError(f"{type(self).__name__}() got {name!r} both by position and by keyword")
                fields[name] = value
        for name, convert in self._converts:
            if name in fields:
                value = convert(fields[name])
                if value is DEFAULT:
                    del fields[name]
                else:
                    fields[name] = value
        try:  # what BaseModel.__init__ does, without a second call and repacking of the fields
            self.__pydantic_validator__.validate_python(fields, self_instance=self)
        except ValidationError as exc:
            raise invalid(exc, self._what) from None

    # pydantic's own fast path for nested and JSON validation (it calls a *custom* __init__ for
    # every nested model): this constructor only maps positions to names before validating.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        _derive(cls)

    # ----- canonical form
    def _tree(self) -> dict[str, Any]:
        """The canonical object as an orjson-ready dict: members holding their default omitted,
        nested models as their cached bytes, raw JSON as fragments (written per class from
        the fields by ``_derive``)."""
        raise NotImplementedError

    def _fresh_tree(self) -> dict[str, Any]:
        """``_tree`` with every nested model rebuilt from its fields instead of its cache."""
        raise NotImplementedError

    def _compute(self) -> bytes:
        return _dump_checked(self._tree(), "")

    def canonical_json(self) -> bytes:
        """The canonical JSON of this value (cached): see ``docs/canonical-json.md``."""
        try:
            return self._canon  # type: ignore[attr-defined,no-any-return]
        except AttributeError:
            canon = self._compute()
            object.__setattr__(self, "_canon", canon)
            return canon

    def _check(self) -> None:
        """Cross-field rules; raise ``ValueError`` (pydantic adds the location)."""

    def model_post_init(self, context: Any, /) -> None:
        """Check cross-field rules and cache the canonical bytes (runs once per new instance,
        not when an existing instance is reused inside another model). Under a ``STORED``
        context (bytes histlog itself stored after validating them) nested values compute
        their canonical bytes lazily and the message takes the stored bytes as they are."""
        self._check()
        if context is not None and STORED in context:
            return
        object.__setattr__(self, "_canon", self._compute())

    def fragment(self) -> orjson.Fragment:
        """The canonical bytes as an ``orjson.Fragment`` (to embed them in a larger document)."""
        return _Fragment(self.canonical_json())

    # ----- identity: by type and canonical bytes
    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, Model)  # Invariant: same type as self.
        return self.canonical_json() == other.canonical_json()

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.canonical_json()))

    def __copy__(self) -> Self:
        return self

    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> Self:
        return self

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy with ``update`` applied, validated again (immutable, so no update returns ``self``)."""
        if not update:
            return self
        data = {name: getattr(self, name) for name in type(self).model_fields}
        data.update(update)
        return self.model_validate(data)

    # ----- validation entry points that never leak ValidationError
    @classmethod
    def model_validate(
        cls,
        obj: Any,
        *,
        strict: bool | None = None,
        extra: Any = None,
        from_attributes: bool | None = None,
        context: Any | None = None,
        by_alias: bool | None = None,
        by_name: bool | None = None,
    ) -> Self:
        """Validate a Python object (a dict as produced by ``model_dump()``). Raises ``InvalidMessage``."""
        try:
            return super().model_validate(
                obj,
                strict=strict,
                extra=extra,
                from_attributes=from_attributes,
                context=context,
                by_alias=by_alias,
                by_name=by_name,
            )
        except ValidationError as exc:
            raise invalid(exc, cls._what) from None

    @classmethod
    def model_validate_json(
        cls,
        json_data: str | bytes | bytearray,
        *,
        strict: bool | None = None,
        extra: Any = None,
        context: Any | None = None,
        by_alias: bool | None = None,
        by_name: bool | None = None,
    ) -> Self:
        """Parse JSON exactly (number spellings in metadata and details are kept; duplicate keys,
        NaN and unknown members rejected) and validate it. Raises ``InvalidMessage``."""
        try:
            tree = loads_exact(json_data)
        except ValueError as exc:
            raise InvalidMessage(f"invalid {cls._what}: {exc}") from None
        return cls.model_validate(tree, context=context)

    @classmethod
    def from_stored(cls, data: bytes) -> Self:
        """Rebuild a value from canonical bytes that histlog validated and stored itself (the
        read path): its structure is validated again, its canonical bytes are taken as stored
        instead of being recomputed. For bytes from anywhere else use ``from_canonical``.

        Only values without raw JSON (metadata, tool details) take this path: pydantic's parser
        would respell their numbers, so those go through the exact ``from_canonical``. The test
        is on bytes: ``"metadata"``/``"details"`` with unescaped quotes occur only as keys or as
        whole string values (then the exact path runs needlessly, never wrongly)."""
        if b'"metadata"' in data or b'"details"' in data:
            return cls.from_canonical(data)
        try:
            return cls.__pydantic_validator__.validate_json(data, context={STORED: data})  # type: ignore[no-any-return]
        except ValidationError as exc:
            raise invalid(exc, cls._what) from None

    @classmethod
    def from_canonical(cls, data: bytes) -> Self:
        """Rebuild a value from its canonical JSON (e.g. read back from storage).

        Fast path: pydantic's JSON parser, accepted only when the result's canonical bytes equal
        ``data`` exactly; otherwise (number spellings pydantic cannot keep, or bytes that are not
        canonical) the exact parser of ``model_validate_json``. Raises ``InvalidMessage``.
        """
        try:
            message = cls.__pydantic_validator__.validate_json(data)
            if message.canonical_json() == data:
                return message  # type: ignore[no-any-return]
        except (ValidationError, ValueError):
            pass
        return cls.model_validate_json(data)

    def model_dump_json(self, **kwargs: Any) -> str:
        """The canonical JSON as ``str``. Keyword options (indent, exclude...) fall back to
        pydantic's serialiser, which loses number spellings in metadata and details."""
        if not kwargs:
            return self.canonical_json().decode("utf-8")
        return super().model_dump_json(**kwargs)
