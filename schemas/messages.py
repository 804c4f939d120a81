"""Messages and their parts: the validated, deeply immutable data model of a conversation.
Long (≈800 lines) because each model states its fields, its positional constructor and its
canonical tree; deriving the canonical tree from the declared fields, and moving the parts to
their own module, is the planned split.

Every model here is a frozen pydantic v2 model with ``extra="forbid"``, constructible
positionally (``TextPart("hi")``, ``Message("user", [TextPart("hi")])``). Promises:

* **Validated on construction.** A pydantic ``ValidationError`` never escapes a public
  constructor, ``model_validate`` or ``model_validate_json``: it becomes ``InvalidMessage``
  saying what and where (``invalid message: parts[1]: kind 'tool_call' is not allowed for
  role 'user'``).
* **Deeply immutable.** Sequences are tuples, metadata is a ``FrozenDict`` of ``RawJSON``
  values, bytes stay bytes. Changing the caller's list or dict afterwards changes nothing.
* **Canonical bytes.** ``canonical_json()`` is computed once at construction (it also proves
  that every string is valid Unicode) and cached; equality and hashing are by type and
  canonical bytes. The rules are in ``docs/canonical-json.md``.

Which part kinds a role may carry: system: text; user: text, media; assistant: text, media,
reasoning, tool_call, refusal; tool: tool_result.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterable, Mapping
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Final, Literal, Self, TypeVar

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    StrictBool,
    StrictStr,
    ValidationError,
    WithJsonSchema,
)
from pydantic_core import core_schema

from schemas.canonical import EMPTY_METADATA, FrozenDict, RawJSON, _dump_checked, dumps, loads_exact
from schemas.errors import InvalidMessage

__all__ = [
    "ALLOWED_KINDS",
    "Citation",
    "Media",
    "MediaPart",
    "Message",
    "Metadata",
    "Part",
    "ReasoningPart",
    "RefusalPart",
    "Role",
    "TextPart",
    "ToolCallPart",
    "ToolOutput",
    "ToolResultPart",
]

_Fragment: Final = orjson.Fragment


class Role(StrEnum):
    """Who wrote a message. A ``StrEnum``: ``Role.USER == "user"``."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


ALLOWED_KINDS: Final[Mapping[Role, frozenset[str]]] = {
    Role.SYSTEM: frozenset({"text"}),
    Role.USER: frozenset({"text", "media"}),
    Role.ASSISTANT: frozenset({"text", "media", "reasoning", "tool_call", "refusal"}),
    Role.TOOL: frozenset({"tool_result"}),
}
"""The part kinds each role may carry."""

_KINDS: Final = frozenset({"text", "media", "reasoning", "tool_call", "refusal", "tool_result"})


# --------------------------------------------------------------------------- field types


def _validate_metadata(value: Any) -> FrozenDict:
    if type(value) is FrozenDict and all(type(v) is RawJSON for v in value.values()):
        return value
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
]
"""Metadata: non-empty string keys to JSON values, stored as a ``FrozenDict`` of ``RawJSON``."""


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


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _serialize_bytes(value: bytes, info: core_schema.SerializationInfo) -> bytes | str:
    return _b64(value) if info.mode_is_json() else value


Bytes = Annotated[
    bytes,
    PlainValidator(_validate_bytes),
    PlainSerializer(_serialize_bytes),
    WithJsonSchema({"type": "string", "contentEncoding": "base64"}),
]
"""Bytes: ``bytes`` in Python, standard padded base64 (RFC 4648 section 4) in JSON."""


# --------------------------------------------------------------------------- errors


def _where(loc: tuple[int | str, ...]) -> str:
    out = ""
    prev_index = False
    for comp in loc:
        if isinstance(comp, int):
            out += f"[{comp}]"
            prev_index = True
            continue
        if prev_index and comp in _KINDS:  # the discriminator tag pydantic adds after a union index
            prev_index = False
            continue
        prev_index = False
        if comp.startswith("function-"):
            continue
        out += f".{comp}" if out else comp
    return out


def _join(outer: str, inner: str) -> str:
    if not outer or not inner:
        return outer or inner
    return outer + inner if inner.startswith("[") else f"{outer}.{inner}"


def _reasons(exc: ValidationError) -> list[tuple[str, str]]:
    """``(where, reason)`` for each error, flattening the ``InvalidMessage`` that nested models'
    constructors raise (pydantic calls a model's custom ``__init__`` for nested input)."""
    out: list[tuple[str, str]] = []
    for err in exc.errors(include_url=False, include_input=False):
        kind = err.get("type", "")
        msg = err.get("msg", "")
        where = _where(tuple(err.get("loc", ())))
        cause = (err.get("ctx") or {}).get("error")
        nested = getattr(cause, "reasons", None) if isinstance(cause, InvalidMessage) else None
        if nested:
            out.extend((_join(where, w), r) for w, r in nested)
            continue
        if kind == "extra_forbidden":
            msg = "unknown member"
        elif kind == "missing":
            msg = "missing required member"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        if msg.startswith("["):  # a validator that reports a sub-location, e.g. metadata['k']
            close = msg.find("]: ")
            if close > 0:
                where, msg = where + msg[: close + 1], msg[close + 3 :]
        out.append((where, msg))
    return out


def invalid(exc: ValidationError, what: str = "message") -> InvalidMessage:
    """Turn a pydantic ``ValidationError`` into an ``InvalidMessage``: what and where, one line.

    The result carries ``reasons``: a list of ``(where, reason)`` pairs.
    """
    reasons = _reasons(exc)
    lines = [f"{w}: {r}" if w else r for w, r in reasons]
    text = f"invalid {what}: {lines[0]}" if lines else f"invalid {what}"
    if len(lines) > 1:
        more = "; ".join(lines[1:4]) + ("; ..." if len(lines) > 4 else "")
        text += f" (and {len(lines) - 1} more: {more})"
    err = InvalidMessage(text)
    err.reasons = reasons  # type: ignore[attr-defined]
    return err


# --------------------------------------------------------------------------- base


class _Model(BaseModel):
    """Frozen, strict-shaped base: translates validation errors, equality by canonical bytes."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=False)
    __slots__ = ("_canon",)

    _what: ClassVar[str] = "message"

    def _init(self, data: dict[str, Any]) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise invalid(exc, self._what) from None

    # ----- canonical form
    def _tree(self) -> dict[str, Any]:
        """The canonical object as an orjson-ready dict (defaults omitted, RawJSON as Fragments)."""
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
        not when an existing instance is reused inside another model). Under a ``_STORED``
        context (bytes histlog itself stored after validating them) nested values compute
        their canonical bytes lazily and the message takes the stored bytes as they are."""
        self._check()
        if context is not None and _STORED in context:
            return
        object.__setattr__(self, "_canon", self._compute())

    def fragment(self) -> orjson.Fragment:
        """The canonical bytes as an ``orjson.Fragment`` (to embed them in a larger document)."""
        return _Fragment(self.canonical_json())

    # ----- identity: by type and canonical bytes
    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, _Model)  # Invariant: same type as self.
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
        """Rebuild a message from canonical bytes that histlog validated and stored itself (the
        read path): its structure is validated again, its canonical bytes are taken as stored
        instead of being recomputed. For bytes from anywhere else use ``from_canonical``.

        Only values without raw JSON (metadata, tool details) take this path: pydantic's parser
        would respell their numbers, so those go through the exact ``from_canonical``. The test
        is on bytes: ``"metadata"``/``"details"`` with unescaped quotes occur only as keys or as
        whole string values (then the exact path runs needlessly, never wrongly)."""
        if b'"metadata"' in data or b'"details"' in data:
            return cls.from_canonical(data)
        try:
            return cls.__pydantic_validator__.validate_json(data, context={_STORED: data})  # type: ignore[no-any-return]
        except ValidationError as exc:
            raise invalid(exc, cls._what) from None

    @classmethod
    def from_canonical(cls, data: bytes) -> Self:
        """Rebuild a message from its canonical JSON (e.g. read back from storage).

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


_F = TypeVar("_F", bound=Callable[..., None])


def _positional(init: _F) -> _F:
    """Mark a positional ``__init__`` as pydantic's own, so nested and JSON validation keep
    pydantic's fast path (pydantic calls a *custom* ``__init__`` for every nested model)."""
    init.__pydantic_base_init__ = True  # type: ignore[attr-defined]
    return init


_STORED: Final = "histlog.stored_canonical"  # validation context key of Message.from_stored

_MISSING: Any = object()  # "not given": pydantic reports a missing member instead of a TypeError


def _given(extra: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """The constructor arguments actually given (``None`` metadata means "use the default")."""
    for name, value in fields.items():
        if value is not _MISSING and not (name == "metadata" and value is None):
            extra[name] = value
    return extra


def _meta_fragments(metadata: FrozenDict) -> dict[str, Any]:
    return {k: _Fragment(str.__str__(v)) for k, v in metadata.items()}


# --------------------------------------------------------------------------- small values


class Citation(_Model):
    """A source a text part cites: ``uri`` (non-empty) and an optional ``title``."""

    _what = "citation"
    uri: StrictStr = Field(min_length=1)
    title: StrictStr = ""

    @_positional
    def __init__(self, uri: str = _MISSING, title: str = _MISSING, **extra: Any) -> None:
        self._init(_given(extra, uri=uri, title=title))

    def _tree(self) -> dict[str, Any]:
        tree: dict[str, Any] = {"uri": self.uri}
        if self.title:
            tree["title"] = self.title
        return tree


class Media(_Model):
    """A media item: ``mime_type`` (``type/subtype``) and exactly one of inline ``data`` (bytes,
    base64 in JSON) or a ``uri`` reference; an optional file ``name``."""

    _what = "media"
    mime_type: StrictStr
    data: Bytes | None = None
    uri: StrictStr | None = None
    name: StrictStr | None = None

    @_positional
    def __init__(
        self,
        mime_type: str = _MISSING,
        data: bytes | None = _MISSING,
        uri: str | None = _MISSING,
        name: str | None = _MISSING,
        **extra: Any,
    ) -> None:
        self._init(_given(extra, mime_type=mime_type, data=data, uri=uri, name=name))

    def _check(self) -> None:
        if "/" not in self.mime_type.strip("/") or self.mime_type != self.mime_type.strip():
            raise ValueError(f"mime_type {self.mime_type!r} is not of the form type/subtype")
        if (self.data is None) == (self.uri is None):
            raise ValueError("give exactly one of data or uri")
        if self.data is not None and not self.data:
            raise ValueError("data is empty")
        if self.uri is not None and not self.uri:
            raise ValueError("uri is empty")

    def _tree(self) -> dict[str, Any]:
        tree: dict[str, Any] = {"mime_type": self.mime_type}
        if self.data is not None:
            tree["data"] = _b64(self.data)
        if self.uri is not None:
            tree["uri"] = self.uri
        if self.name is not None:
            tree["name"] = self.name
        return tree


# --------------------------------------------------------------------------- parts


class _Part(_Model):
    _what = "part"
    metadata: Metadata = EMPTY_METADATA

    def _with_meta(self, tree: dict[str, Any]) -> dict[str, Any]:
        if self.metadata:
            tree["metadata"] = _meta_fragments(self.metadata)
        return tree


class TextPart(_Part):
    """Plain text, with optional citations."""

    kind: Literal["text"] = "text"
    text: StrictStr
    citations: tuple[Citation, ...] = ()

    @_positional
    def __init__(
        self,
        text: str = _MISSING,
        citations: Iterable[Citation] = _MISSING,
        *,
        metadata: Mapping[str, Any] | None = None,
        **extra: Any,
    ) -> None:
        self._init(_given(extra, text=text, citations=citations, metadata=metadata))

    def _tree(self) -> dict[str, Any]:
        tree: dict[str, Any] = {"kind": "text", "text": self.text}
        if self.citations:
            tree["citations"] = [c._tree() for c in self.citations]
        return self._with_meta(tree)


class MediaPart(_Part):
    """An image, audio clip, document... (see ``Media``)."""

    kind: Literal["media"] = "media"
    media: Media

    @_positional
    def __init__(
        self,
        media: Media | Mapping[str, Any] = _MISSING,
        *,
        metadata: Mapping[str, Any] | None = None,
        **extra: Any,
    ) -> None:
        self._init(_given(extra, media=media, metadata=metadata))

    def _tree(self) -> dict[str, Any]:
        return self._with_meta({"kind": "media", "media": self.media._tree()})


class ReasoningPart(_Part):
    """Model reasoning: readable ``text`` and/or opaque provider ``state`` bytes (base64 in JSON)."""

    kind: Literal["reasoning"] = "reasoning"
    text: StrictStr = ""
    state: Bytes = b""

    @_positional
    def __init__(
        self,
        text: str = _MISSING,
        state: bytes | str = _MISSING,
        *,
        metadata: Mapping[str, Any] | None = None,
        **extra: Any,
    ) -> None:
        self._init(_given(extra, text=text, state=state, metadata=metadata))

    def _tree(self) -> dict[str, Any]:
        tree: dict[str, Any] = {"kind": "reasoning"}
        if self.text:
            tree["text"] = self.text
        if self.state:
            tree["state"] = _b64(self.state)
        return self._with_meta(tree)


class ToolCallPart(_Part):
    """A tool call the assistant made. ``arguments`` is the model's exact text (not parsed,
    not required to be JSON); ``id`` and ``name`` are non-empty."""

    kind: Literal["tool_call"] = "tool_call"
    id: StrictStr = Field(min_length=1)
    name: StrictStr = Field(min_length=1)
    arguments: StrictStr

    @_positional
    def __init__(
        self,
        id: str = _MISSING,
        name: str = _MISSING,
        arguments: str = _MISSING,
        *,
        metadata: Mapping[str, Any] | None = None,
        **extra: Any,
    ) -> None:
        self._init(_given(extra, id=id, name=name, arguments=arguments, metadata=metadata))

    def _tree(self) -> dict[str, Any]:
        return self._with_meta(
            {"arguments": self.arguments, "id": self.id, "kind": "tool_call", "name": self.name}
        )


ContentItem = Annotated[TextPart | MediaPart, Field(discriminator="kind")]


class ToolOutput(_Model):
    """What a tool returned: ``content`` (text or media parts, for the model) and ``details``
    (one JSON value as ``RawJSON``, for programs; JSON ``null`` is the same as no details)."""

    _what = "tool output"
    content: tuple[ContentItem, ...] = ()
    details: RawJSON | None = None

    @_positional
    def __init__(
        self, content: Iterable[TextPart | MediaPart] = _MISSING, details: Any = _MISSING, **extra: Any
    ) -> None:
        self._init(_given(extra, content=content, details=details))

    def _check(self) -> None:
        if self.details == "null":  # JSON null details == no details (keeps the JSON round trip exact)
            object.__setattr__(self, "details", None)

    @classmethod
    def text(cls, text: str, *, details: Any = None) -> ToolOutput:
        """An output holding one text part."""
        return cls((TextPart(text),), details)

    def _tree(self) -> dict[str, Any]:
        tree: dict[str, Any] = {}
        if self.content:
            tree["content"] = [c.fragment() for c in self.content]
        if self.details is not None:
            tree["details"] = self.details.fragment()
        return tree


class ToolResultPart(_Part):
    """The result of the tool call ``id``; ``output`` may be given as a plain string
    (``ToolOutput.text``) to the constructor."""

    kind: Literal["tool_result"] = "tool_result"
    id: StrictStr = Field(min_length=1)
    name: StrictStr = Field(min_length=1)
    output: ToolOutput
    is_error: StrictBool = False

    @_positional
    def __init__(
        self,
        id: str = _MISSING,
        name: str = _MISSING,
        output: ToolOutput | str | Mapping[str, Any] = _MISSING,
        is_error: bool = _MISSING,
        *,
        metadata: Mapping[str, Any] | None = None,
        **extra: Any,
    ) -> None:
        if isinstance(output, str):
            output = ToolOutput.text(output)
        self._init(_given(extra, id=id, name=name, output=output, is_error=is_error, metadata=metadata))

    def _tree(self) -> dict[str, Any]:
        tree: dict[str, Any] = {
            "id": self.id,
            "kind": "tool_result",
            "name": self.name,
            "output": self.output._tree(),
        }
        if self.is_error:
            tree["is_error"] = True
        return self._with_meta(tree)


class RefusalPart(_Part):
    """The assistant declined; ``text`` says why."""

    kind: Literal["refusal"] = "refusal"
    text: StrictStr

    @_positional
    def __init__(
        self, text: str = _MISSING, *, metadata: Mapping[str, Any] | None = None, **extra: Any
    ) -> None:
        self._init(_given(extra, text=text, metadata=metadata))

    def _tree(self) -> dict[str, Any]:
        return self._with_meta({"kind": "refusal", "text": self.text})


Part = Annotated[
    TextPart | MediaPart | ReasoningPart | ToolCallPart | ToolResultPart | RefusalPart,
    Field(discriminator="kind"),
]
"""Any part; a discriminated union on ``kind``."""

AnyPart = TextPart | MediaPart | ReasoningPart | ToolCallPart | ToolResultPart | RefusalPart


# --------------------------------------------------------------------------- message


def _as_part(item: Any) -> Any:
    return TextPart(item) if isinstance(item, str) else item


class Message(_Model):
    """One message: a ``role``, at least one part (kinds allowed for the role), and metadata.

    ``canonical_json()`` is the message's canonical JSON (cached); ``content_bytes()`` is the
    length of the canonical JSON without the message-level metadata (part metadata stays):
    what byte budgets count.
    """

    _what = "message"
    __slots__ = ("_content_bytes",)

    role: Role
    parts: tuple[Part, ...]
    metadata: Metadata = EMPTY_METADATA

    @_positional
    def __init__(
        self,
        role: Role | str = _MISSING,
        parts: Iterable[AnyPart | Mapping[str, Any]] = _MISSING,
        metadata: Mapping[str, Any] | None = None,
        **extra: Any,
    ) -> None:
        self._init(_given(extra, role=role, parts=parts, metadata=metadata))

    def _check(self) -> None:
        if not self.parts:
            raise ValueError("parts: a message needs at least one part")
        allowed = ALLOWED_KINDS[self.role]
        for i, part in enumerate(self.parts):
            if part.kind not in allowed:
                raise ValueError(
                    f"parts[{i}]: kind {part.kind!r} is not allowed for role {self.role.value!r}"
                )

    # ----- constructors
    @classmethod
    def system(cls, text: str, *, metadata: Mapping[str, Any] | None = None) -> Message:
        """A system message with one text part."""
        return cls(Role.SYSTEM, (TextPart(text),), metadata)

    @classmethod
    def user(cls, *parts_or_text: AnyPart | str, metadata: Mapping[str, Any] | None = None) -> Message:
        """A user message; plain strings become text parts."""
        return cls(Role.USER, [_as_part(p) for p in parts_or_text], metadata)

    @classmethod
    def assistant(cls, *parts_or_text: AnyPart | str, metadata: Mapping[str, Any] | None = None) -> Message:
        """An assistant message; plain strings become text parts."""
        return cls(Role.ASSISTANT, [_as_part(p) for p in parts_or_text], metadata)

    @classmethod
    def tool(cls, *results: ToolResultPart, metadata: Mapping[str, Any] | None = None) -> Message:
        """A tool message carrying tool results."""
        return cls(Role.TOOL, results, metadata)

    # ----- reading
    def text(self) -> str:
        """The text parts' text joined with ``""`` (other kinds are skipped)."""
        return "".join([p.text for p in self.parts if p.kind == "text"])

    def _tree_without_metadata(self) -> dict[str, Any]:
        return {"parts": [p.fragment() for p in self.parts], "role": self.role.value}

    def _tree(self) -> dict[str, Any]:
        tree = self._tree_without_metadata()
        if self.metadata:
            tree["metadata"] = _meta_fragments(self.metadata)
        return tree

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        if context is not None and _STORED in context:
            object.__setattr__(self, "_canon", context[_STORED])
        # Without message metadata the content is the canonical JSON itself; otherwise it is
        # computed on first use (-1 = not yet). Set here so reads never miss the slot.
        object.__setattr__(self, "_content_bytes", -1 if self.metadata else len(self.canonical_json()))

    def content_bytes(self) -> int:
        """Length of the canonical JSON without message-level metadata (cached)."""
        size: int = self._content_bytes  # type: ignore[attr-defined]
        if size < 0:
            size = len(dumps(self._tree_without_metadata()))
            object.__setattr__(self, "_content_bytes", size)
        return size

    def content_json(self) -> bytes:
        """The canonical JSON without message-level metadata (what ``content_bytes`` measures)."""
        return dumps(self._tree_without_metadata()) if self.metadata else self.canonical_json()

    def _full_recompute(self) -> bytes:
        """Serialise from the field values, ignoring every cache (benchmarks and tests)."""
        tree: dict[str, Any] = {
            "parts": [_Fragment(_dump_checked(p._tree(), "")) for p in self.parts],
            "role": self.role.value,
        }
        if self.metadata:
            tree["metadata"] = _meta_fragments(self.metadata)
        return dumps(tree)
