"""The parts of a message (text, media, reasoning, tool call, tool result, refusal) and the small
values they hold (``Citation``, ``Media``, ``ToolOutput``).

Each is a frozen ``schemas.model.Model``: its fields, declared once below, give its positional
constructor (``TextPart("hi")``; a part's ``metadata`` is keyword-only) and its canonical JSON
(``docs/canonical-json.md``: a part is ``kind`` plus its members, defaults omitted). ``Part`` is
the discriminated union on ``kind``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictStr

from schemas.canonical import EMPTY_METADATA, RawJSON
from schemas.fields import Bytes, Metadata
from schemas.model import Model, Rule

__all__ = [
    "AnyPart",
    "Citation",
    "ContentItem",
    "Media",
    "MediaPart",
    "Part",
    "ReasoningPart",
    "RefusalPart",
    "TextPart",
    "ToolCallPart",
    "ToolOutput",
    "ToolResultPart",
]


# --------------------------------------------------------------------------- small values


class Citation(Model):
    """A source a text part cites: ``uri`` (non-empty) and an optional ``title``."""

    if TYPE_CHECKING:  # the positional constructor of Model, for the type checker
        def __init__(self, /, *args: Any, **fields: Any) -> None: ...

    _what = "citation"
    uri: StrictStr = Field(min_length=1)
    title: StrictStr = ""


class Media(Model):
    """A media item: ``mime_type`` (``type/subtype``) and exactly one of inline ``data`` (bytes,
    base64 in JSON) or a ``uri`` reference; an optional file ``name``."""

    if TYPE_CHECKING:  # the positional constructor of Model, for the type checker
        def __init__(self, /, *args: Any, **fields: Any) -> None: ...

    _what = "media"
    mime_type: StrictStr
    data: Bytes | None = None
    uri: StrictStr | None = None
    name: StrictStr | None = None

    def _check(self) -> None:
        if "/" not in self.mime_type.strip("/") or self.mime_type != self.mime_type.strip():
            raise ValueError(f"mime_type {self.mime_type!r} is not of the form type/subtype")
        if (self.data is None) == (self.uri is None):
            raise ValueError("give exactly one of data or uri")
        if self.data is not None and not self.data:
            raise ValueError("data is empty")
        if self.uri is not None and not self.uri:
            raise ValueError("uri is empty")


# --------------------------------------------------------------------------- parts


class _Part(Model):
    _what = "part"
    metadata: Annotated[Metadata, Rule(keyword_only=True)] = EMPTY_METADATA


class TextPart(_Part):
    """Plain text, with optional citations."""

    if TYPE_CHECKING:  # the positional constructor of Model, for the type checker
        def __init__(self, /, *args: Any, **fields: Any) -> None: ...

    kind: Literal["text"] = "text"
    text: StrictStr
    citations: tuple[Citation, ...] = ()


class MediaPart(_Part):
    """An image, audio clip, document... (see ``Media``)."""

    if TYPE_CHECKING:  # the positional constructor of Model, for the type checker
        def __init__(self, /, *args: Any, **fields: Any) -> None: ...

    kind: Literal["media"] = "media"
    media: Media


class ReasoningPart(_Part):
    """Model reasoning: readable ``text`` and/or opaque provider ``state`` bytes (base64 in JSON)."""

    if TYPE_CHECKING:  # the positional constructor of Model, for the type checker
        def __init__(self, /, *args: Any, **fields: Any) -> None: ...

    kind: Literal["reasoning"] = "reasoning"
    text: StrictStr = ""
    state: Bytes = b""


class ToolCallPart(_Part):
    """A tool call the assistant made. ``arguments`` is the model's exact text (not parsed,
    not required to be JSON); ``id`` and ``name`` are non-empty."""

    if TYPE_CHECKING:  # the positional constructor of Model, for the type checker
        def __init__(self, /, *args: Any, **fields: Any) -> None: ...

    kind: Literal["tool_call"] = "tool_call"
    id: StrictStr = Field(min_length=1)
    name: StrictStr = Field(min_length=1)
    arguments: StrictStr


ContentItem = Annotated[TextPart | MediaPart, Field(discriminator="kind")]


class ToolOutput(Model):
    """What a tool returned: ``content`` (text or media parts, for the model) and ``details``
    (one JSON value as ``RawJSON``, for programs; JSON ``null`` is the same as no details)."""

    if TYPE_CHECKING:  # the positional constructor of Model, for the type checker
        def __init__(self, /, *args: Any, **fields: Any) -> None: ...

    _what = "tool output"
    content: tuple[ContentItem, ...] = ()
    details: RawJSON | None = None

    def _check(self) -> None:
        if self.details == "null":  # JSON null details == no details (keeps the JSON round trip exact)
            object.__setattr__(self, "details", None)

    @classmethod
    def text(cls, text: str, *, details: Any = None) -> ToolOutput:
        """An output holding one text part."""
        return cls((TextPart(text),), details)


def _text_output(output: Any) -> Any:
    """A plain string given to ``ToolResultPart`` is ``ToolOutput.text(output)``."""
    return ToolOutput.text(output) if isinstance(output, str) else output


class ToolResultPart(_Part):
    """The result of the tool call ``id``; ``output`` may be given as a plain string
    (``ToolOutput.text``) to the constructor."""

    if TYPE_CHECKING:  # the positional constructor of Model, for the type checker
        def __init__(self, /, *args: Any, **fields: Any) -> None: ...

    kind: Literal["tool_result"] = "tool_result"
    id: StrictStr = Field(min_length=1)
    name: StrictStr = Field(min_length=1)
    output: Annotated[ToolOutput, Rule(convert=_text_output)]
    is_error: StrictBool = False


class RefusalPart(_Part):
    """The assistant declined; ``text`` says why."""

    if TYPE_CHECKING:  # the positional constructor of Model, for the type checker
        def __init__(self, /, *args: Any, **fields: Any) -> None: ...

    kind: Literal["refusal"] = "refusal"
    text: StrictStr


Part = Annotated[
    TextPart | MediaPart | ReasoningPart | ToolCallPart | ToolResultPart | RefusalPart,
    Field(discriminator="kind"),
]
"""Any part; a discriminated union on ``kind``."""

AnyPart = TextPart | MediaPart | ReasoningPart | ToolCallPart | ToolResultPart | RefusalPart
