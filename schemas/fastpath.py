"""Exact fast validation of a batch's canonical bytes (the replay and catch-up path).

``fast_batch(conversation_id, append_id, data)`` returns the ``Batch`` that
``Batch.from_canonical`` returns for ``data``, or ``None`` when it cannot tell cheaply; the
caller then runs the full model, which gives the verdict and the reason. This path never
decides a rejection, so it cannot disagree on one. Promises:

* **Never accepts what the full model rejects.** ``data`` is parsed with orjson; every value is
  checked against its field's declaration (type, strictness, ``min_length``, ``Literal`` tag,
  enum member, required or default, no unknown member); each model's post-validation step
  runs as pydantic runs it (the cross-field ``_check`` rules); each message's canonical bytes
  are written from its fields by the models' own canonical writer (``Model._fresh_tree``), and
  ``data`` is accepted only if those bytes, joined, are byte-for-byte ``data``. Anything else
  (non-canonical bytes, a number spelling orjson does not keep such as ``1e3``, an unknown
  shape, any exception at all) is ``None``.
* **Same result.** Every message equals, field by field and type by type, the one the full
  model builds (so do the rows made from them); its canonical bytes and content size are set,
  its parts' are computed on first use, the state ``Model.from_stored`` leaves values in.
  ``tests/unit/test_fast_validation.py`` is the differential proof (hypothesis: valid and
  mutated events, fast vs full, same verdict and same batch).
* **One home per rule.** No rule of a field is written here: the checks are *derived* at import
  from the pydantic declarations (``schemas/messages.py``, ``schemas/parts.py``), and the
  validator a type declares (``Metadata``, ``Bytes``, ``RawJSON``) is called as is. What this
  module does not understand (a new constraint, a pydantic validator decorator, another config,
  an alias, a private attribute...) makes its class *unsupported*: its values always take the
  full model, and ``UNSUPPORTED`` says why (a unit test requires it empty, so a model change
  that the fast path does not cover fails a test instead of drifting).
* The digest is never a shortcut: it is public, any producer can compute it over invalid
  messages, and every instance must agree on poison.

Measured on a shared 2-core machine, CPU time, fast vs full in the same run (3 runs):
``event_batch`` per record of a 2-message text turn 16.0-16.4 vs 20.2-22.8 us (0.71-0.79x), of
the bench's 20-message batch with tool calls, results and metadata 241-266 vs 265-292 us
(0.86-1.00x: message metadata is validated by its own validator on both paths and dominates
there); replay of 30,000 2-message batches (``bench_engine``'s replay, timed in process CPU
time) 9,270-9,978 records per CPU second with this path, 8,701-9,155 without.
What remains is common to both paths: building Python objects, each model's post-init step and
the canonical writer (``python -m bench.bench_schemas``).
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Annotated, Any, Final, Literal, Union, get_args, get_origin

import orjson
from annotated_types import MinLen
from pydantic import BaseModel, PlainSerializer, PlainValidator, Strict, WithJsonSchema
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from schemas.batch import Batch
from schemas.canonical import RawJSON, _dump_checked
from schemas.ids import AppendID, ConversationID
from schemas.messages import Message
from schemas.model import STORED, Model, Rule

__all__ = ["SUPPORTED", "UNSUPPORTED", "fast_batch"]

Check = Callable[[Any], Any]
"""A parsed JSON value -> the field's validated value; raises (anything) when it is not one."""


class _Unsupported(Exception):
    """A declaration this module does not understand (found at import: its class defers)."""


class _Defer(Exception):
    """Not the common shape: let the full model decide."""


_DEFER: Final = _Defer
"""Raised as a class (a new instance each time: no traceback shared between threads)."""


@dataclass(frozen=True, slots=True)
class _Field:
    """One field's check: inline ``str`` (with ``arg`` = min length), ``bool``, ``tag`` (``arg``
    = the tag), or ``call`` (``arg`` = a ``Check``)."""

    kind: str
    arg: Any


def _call(rule: _Field) -> Check:
    """``rule`` as a callable (inside tuples and optionals)."""
    if rule.kind == "call":
        check: Check = rule.arg
        return check
    kind, arg = rule.kind, rule.arg

    def inline(value: Any) -> Any:
        if kind == "str":
            if type(value) is not str or len(value) < arg:
                raise _DEFER
        elif kind == "bool":
            if type(value) is not bool:
                raise _DEFER
        elif value != arg or type(value) is not str:  # tag
            raise _DEFER
        return value
    return inline


def _plain(func: Callable[..., Any], where: str) -> _Field:
    params = [p for p in inspect.signature(func).parameters.values() if p.default is inspect.Parameter.empty]
    if len(params) != 1:
        raise _Unsupported(f"{where}: validator {func.__name__} takes validation info")
    return _Field("call", func)


def _optional(inner: Check) -> _Field:
    def check(value: Any) -> Any:
        return None if value is None else inner(value)
    return _Field("call", check)


def _tuple_of(inner: Check) -> _Field:
    def check(value: Any) -> Any:
        if type(value) is not list:
            raise _DEFER
        return tuple([inner(item) for item in value])
    return _Field("call", check)


def _enum(enum: type[StrEnum]) -> _Field:
    members = {m.value: m for m in enum}

    def check(value: Any) -> Any:
        if type(value) is not str:
            raise _DEFER
        return members[value]  # KeyError: not a member
    return _Field("call", check)


def _nested(cls: type[Model]) -> Check:
    """The builder of ``cls`` itself once derived (the common case: no call in between), else
    a lookup at run time that defers while ``cls`` has none (unsupported, or still deriving)."""
    _visit(cls)
    build = _BUILDERS.get(cls)
    if build is not None:
        return build

    def check(value: Any) -> Any:
        found = _BUILDERS.get(cls)
        if found is None:
            raise _DEFER
        return found(value)
    return check


def _tag_of(cls: type[Model], field: str) -> str:
    info = cls.model_fields.get(field)
    args = get_args(info.annotation) if info is not None and get_origin(info.annotation) is Literal else ()
    if len(args) != 1 or not isinstance(args[0], str):
        raise _Unsupported(f"{cls.__name__}.{field} is not a one-value Literal tag")
    return args[0]


def _union(arms: tuple[Any, ...], discriminator: str, where: str) -> _Field:
    table: dict[str, Check] = {}
    for arm in arms:
        if not (isinstance(arm, type) and issubclass(arm, Model)):
            raise _Unsupported(f"{where}: union arm {arm!r} is not a model")
        table[_tag_of(arm, discriminator)] = _nested(arm)

    def check(value: Any) -> Any:  # the builder refuses a non-object; a non-str tag is a KeyError
        return table[value[discriminator]](value)  # KeyError / TypeError: no such tag
    return _Field("call", check)


def _raw_json(tp: type[RawJSON], where: str) -> _Field:
    """A ``RawJSON`` value runs the validator its type declares for pydantic."""
    schema: Any = tp.__get_pydantic_core_schema__(tp, None)  # type: ignore[arg-type]
    if schema.get("type") != "function-plain" or schema["function"].get("type") != "no-info":
        raise _Unsupported(f"{where}: {tp.__name__} declares no plain validator")
    return _plain(schema["function"]["function"], where)


_IGNORED: Final = (PlainSerializer, WithJsonSchema, Rule)
"""Field metadata that takes no part in validation: serialisation, JSON schema, and the
canonical rules (applied by the canonical writer, which writes every message built here)."""


def _checker(tp: Any, metadata: list[Any] | tuple[Any, ...], where: str) -> _Field:
    """The check of a value of type ``tp`` under field ``metadata``; ``_Unsupported`` otherwise."""
    metadata = [item for item in metadata if not isinstance(item, _IGNORED)]
    strict = False
    min_len = 0
    plain: _Field | None = None
    discriminator: str | None = None
    for item in metadata:
        if isinstance(item, Strict) and item.strict:
            strict = True
        elif type(item) is MinLen:
            min_len = item.min_length
        elif type(item) is PlainValidator:
            plain = _plain(item.func, where)
        elif type(item) is FieldInfo and isinstance(item.discriminator, str) and not item.metadata:
            discriminator = item.discriminator
        else:
            raise _Unsupported(f"{where}: constraint {item!r}")
    if plain is not None:
        if strict or min_len or discriminator:
            raise _Unsupported(f"{where}: a plain validator next to other constraints")
        return plain  # pydantic runs only this validator for the field
    origin = get_origin(tp)
    if origin is Annotated:
        return _checker(get_args(tp)[0], [*metadata, *tp.__metadata__], where)
    if origin is Union or origin is types.UnionType:
        arms = get_args(tp)
        if discriminator is not None and not strict and not min_len:
            return _union(arms, discriminator, where)
        rest = [a for a in arms if a is not type(None)]
        if len(rest) == 1 and len(arms) == 2 and not metadata:
            return _optional(_call(_checker(rest[0], (), where)))
        raise _Unsupported(f"{where}: union {tp!r}")
    if discriminator is not None:
        raise _Unsupported(f"{where}: a discriminator on {tp!r}")
    if origin is tuple:
        args = get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis and not metadata:
            return _tuple_of(_call(_checker(args[0], (), where)))
        raise _Unsupported(f"{where}: tuple {tp!r}")
    if origin is Literal:
        args = get_args(tp)
        if len(args) == 1 and isinstance(args[0], str) and not metadata:
            return _Field("tag", args[0])
        raise _Unsupported(f"{where}: literal {tp!r}")
    if not isinstance(tp, type):
        raise _Unsupported(f"{where}: type {tp!r}")
    if issubclass(tp, Model) and not metadata:
        return _Field("call", _nested(tp))
    if issubclass(tp, RawJSON) and not metadata:
        return _raw_json(tp, where)
    if issubclass(tp, StrEnum) and not metadata:
        return _enum(tp)
    if tp is str and strict:
        return _Field("str", min_len)
    if tp is bool and strict and not min_len:
        return _Field("bool", None)
    raise _Unsupported(f"{where}: {tp!r} with {metadata!r}")


# --------------------------------------------------------------------------- per-class builders

_VALIDATION_DECORATORS: Final = ("validators", "field_validators", "root_validators", "model_validators",
                                 "field_serializers", "model_serializers", "computed_fields")
_BASE_POST_INIT: Final = inspect.unwrap(Model.model_post_init)
_BASE_CHECK: Final = Model._check
_NESTED: Final = MappingProxyType({STORED: None})
"""The post-init context of a value inside a message: its rules run (``_check``); its canonical
bytes are computed on first use, as ``Model.from_stored`` leaves them."""

_slot: Final = {name: vars(BaseModel)[name].__set__ for name in
                ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__")}
"""The setters of a model's four slots (what ``object.__setattr__`` finds, without the lookup)."""


def _post_init(cls: type[Model]) -> Callable[[Any, Any], None] | None:
    """The post-init step pydantic runs on a validated ``cls`` value (its own, without pydantic's
    private-attribute wrapper: ``cls`` has none, and the builder sets the empty private dict the
    wrapper would), or ``None`` when under ``_NESTED`` it does nothing: the base step, whose
    only work there is ``_check``, with the base's empty ``_check``."""
    step = inspect.unwrap(cls.model_post_init)
    if step is _BASE_POST_INIT and cls._check is _BASE_CHECK:
        return None
    return step  # type: ignore[no-any-return]


def _derive(cls: type[Model]) -> Callable[[Any], Any]:
    """The builder of ``cls`` from one parsed JSON object: straight-line code written once per
    class from its fields (as ``schemas.model`` writes ``_tree``); only field names reach the
    source, checks and defaults are passed by reference."""
    name = cls.__name__
    if dict(cls.model_config) != dict(Model.model_config):
        raise _Unsupported(f"{name}: model_config {dict(cls.model_config)} is not the base's")
    for kind in _VALIDATION_DECORATORS:
        if getattr(cls.__pydantic_decorators__, kind):
            raise _Unsupported(f"{name}: declares {kind}")
    if cls.__private_attributes__ or "__get_pydantic_core_schema__" in vars(cls):
        raise _Unsupported(f"{name}: private attributes or its own core schema")
    env: dict[str, Any] = {"D": _DEFER, "M": object(), "new": object.__new__, "cls": cls,
                           **{f"s{i}": f for i, f in enumerate(_slot.values())}}
    lines = ["def build(t):", "    if type(t) is not dict: raise D", "    n = len(t)", "    v = {}"]
    for i, (field, info) in enumerate(cls.model_fields.items()):
        where = f"{name}.{field}"
        if not field.isidentifier():
            raise _Unsupported(f"{where}: not an identifier")
        if info.alias or info.validation_alias or info.default_factory is not None or info.discriminator:
            raise _Unsupported(f"{where}: alias, default factory or field discriminator")
        rule = _checker(info.annotation, info.metadata, where)
        env[f"c{i}"], env[f"d{i}"] = rule.arg, info.default
        lines += [f"    x = t.get({field!r}, M)", "    if x is M:",
                  "        raise D" if info.default is PydanticUndefined else f"        v[{field!r}] = d{i}",
                  "    else:", "        n -= 1"]
        if rule.kind == "str":
            test = "type(x) is not str" + (f" or len(x) < {int(rule.arg)}" if rule.arg else "")
            lines += [f"        if {test}: raise D", f"        v[{field!r}] = x"]
        elif rule.kind == "bool":
            lines += ["        if type(x) is not bool: raise D", f"        v[{field!r}] = x"]
        elif rule.kind == "tag":
            lines += [f"        if x != c{i} or type(x) is not str: raise D", f"        v[{field!r}] = c{i}"]
        else:
            lines += [f"        v[{field!r}] = c{i}(x)"]
    lines += ["    if n: raise D",  # an unknown member
              "    o = new(cls)", "    s0(o, v)", "    s1(o, set(t))", "    s2(o, None)", "    s3(o, {})"]
    post = _post_init(cls)
    if post is not None and cls is not Message:
        env["post"], env["nested"] = post, _NESTED
        lines.append("    post(o, nested)")
    lines.append("    return o")
    exec("\n".join(lines), env)
    return env["build"]  # type: ignore[no-any-return]


_BUILDERS: dict[type[Model], Callable[[Any], Any]] = {}
_VISITING: set[type[Model]] = set()
UNSUPPORTED: Final[dict[str, str]] = {}
"""Model classes this module does not build (their values take the full model), and why."""


def _visit(cls: type[Model]) -> None:
    """Derive ``cls`` (and every model its fields reach) once; record why when it cannot be."""
    if cls in _BUILDERS or cls in _VISITING or cls.__name__ in UNSUPPORTED:
        return
    _VISITING.add(cls)
    try:
        _BUILDERS[cls] = _derive(cls)
    except _Unsupported as exc:
        UNSUPPORTED[cls.__name__] = str(exc)
    finally:
        _VISITING.discard(cls)


_visit(Message)
SUPPORTED: Final[frozenset[type[Model]]] = frozenset(_BUILDERS)
"""The model classes built here (reached from ``Message``); every other one defers."""
_BUILD_MESSAGE: Final = _BUILDERS.get(Message)
_MESSAGE_POST: Final = _post_init(Message)


def fast_batch(conversation_id: ConversationID, append_id: AppendID, data: bytes,
               digest: str | None = None) -> Batch | None:
    """The batch ``Batch.from_canonical(conversation_id, append_id, data)`` returns, or ``None``
    when this path cannot tell (then the full model decides, and gives the reason). Never raises.
    ``digest``: ``digest_of(data)``, when the caller computed it from these bytes already."""
    build, post = _BUILD_MESSAGE, _MESSAGE_POST
    if build is None or post is None:
        return None
    try:
        tree = orjson.loads(data)
        if type(tree) is not list or not tree:
            return None
        messages = []
        canonical = []
        for item in tree:
            message = build(item)
            written = _dump_checked(message._fresh_tree(), "")  # the canonical writer, from the fields
            post(message, {STORED: written})
            messages.append(message)
            canonical.append(written)
        if b"[" + b",".join(canonical) + b"]" != data:
            return None
        batch = Batch.__new__(Batch)
        batch._set(ConversationID(conversation_id), AppendID(append_id), tuple(messages), data, digest)
    except Exception:  # any doubt at all defers to the full model
        return None
    return batch
