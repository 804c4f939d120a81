"""Chat model types for the middleware: requests, responses, streamed deltas, and an accumulator.

All are frozen ``schemas.model.Model`` classes validated on construction (fields declared once,
which give the positional constructor and the canonical form); every failure raises
``InvalidMessage`` (never pydantic's ``ValidationError``).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, PlainValidator, StrictStr

from schemas.canonical import EMPTY_METADATA, FrozenDict
from schemas.errors import InvalidMessage
from schemas.messages import Message, Role
from schemas.model import Model, Rule
from schemas.parts import AnyPart, ReasoningPart, RefusalPart, TextPart, ToolCallPart

__all__ = [
    "ChatDelta",
    "ChatRequest",
    "ChatResponse",
    "DeltaPart",
    "FinishReason",
    "ReasoningDelta",
    "RefusalDelta",
    "ResponseAccumulator",
    "TextDelta",
    "ToolCallDelta",
    "Usage",
]


class FinishReason(StrEnum):
    """Why generation stopped. A ``StrEnum``: ``FinishReason.STOP == "stop"``."""

    STOP = "stop"
    LENGTH = "length"
    TOOL_CALLS = "tool_calls"
    CONTENT_FILTER = "content_filter"
    REFUSAL = "refusal"
    OTHER = "other"


class Usage(Model):
    """Token counts of one model call (non-negative integers)."""

    if TYPE_CHECKING:  # the positional constructor of Model, for the type checker
        def __init__(self, /, *args: Any, **fields: Any) -> None: ...

    _what = "usage"
    input_tokens: int = Field(ge=0, strict=True)
    output_tokens: int = Field(ge=0, strict=True)

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


def _freeze_options(value: Any) -> FrozenDict:
    if not isinstance(value, Mapping):
        raise ValueError(f"options must be a mapping, got {type(value).__name__}")
    if not all(isinstance(k, str) and k for k in value):
        raise ValueError("option names must be non-empty strings")
    return value if type(value) is FrozenDict else FrozenDict(value)


def _opaque_options(options: FrozenDict) -> str:
    return repr(sorted(options.items()))


class ChatRequest(Model):
    """What a chat model is asked: ``messages`` (at least one; system messages only as a
    leading prefix), ``tools`` (opaque tool definitions, passed through to the model) and
    ``options`` (opaque model options such as ``temperature``, stored read-only).

    Its canonical form is its identity only (equality, hashing; never stored): the messages'
    canonical bytes, and the ``repr`` of the opaque tools and options."""

    if TYPE_CHECKING:  # the positional constructor of Model, for the type checker
        def __init__(self, /, *args: Any, **fields: Any) -> None: ...

    _what = "chat request"
    messages: tuple[Message, ...]
    tools: Annotated[tuple[Any, ...], Rule(always=True, encode=repr)] = ()
    options: Annotated[
        FrozenDict, PlainValidator(_freeze_options), Rule(always=True, encode=_opaque_options)
    ] = EMPTY_METADATA

    def _check(self) -> None:
        if not self.messages:
            raise ValueError("messages: a request needs at least one message")
        prefix = True
        for i, message in enumerate(self.messages):
            if message.role is Role.SYSTEM:
                if not prefix:
                    raise ValueError(f"messages[{i}]: a system message may only appear in the leading prefix")
            else:
                prefix = False

    def __hash__(self) -> int:
        return hash(self.canonical_json())


class ChatResponse(Model):
    """A complete model answer: ``message`` (a valid assistant message, or ``None``),
    ``finish_reason`` and optional ``usage``."""

    if TYPE_CHECKING:  # the positional constructor of Model, for the type checker
        def __init__(self, /, *args: Any, **fields: Any) -> None: ...

    _what = "chat response"
    message: Message | None
    finish_reason: FinishReason
    usage: Usage | None = None

    def _check(self) -> None:
        if self.message is not None and self.message.role is not Role.ASSISTANT:
            raise ValueError(
                f"message: role is {self.message.role.value!r}, a response needs an assistant message"
            )

    def text(self) -> str:
        """The message's text parts joined (``""`` without a message)."""
        return self.message.text() if self.message is not None else ""


class TextDelta(Model):
    """A fragment of assistant text."""

    if TYPE_CHECKING:  # the positional constructor of Model, for the type checker
        def __init__(self, /, *args: Any, **fields: Any) -> None: ...

    _what = "delta"
    kind: Literal["text"] = "text"
    text: StrictStr


class ReasoningDelta(Model):
    """A fragment of reasoning text."""

    if TYPE_CHECKING:  # the positional constructor of Model, for the type checker
        def __init__(self, /, *args: Any, **fields: Any) -> None: ...

    _what = "delta"
    kind: Literal["reasoning"] = "reasoning"
    text: StrictStr


class ToolCallDelta(Model):
    """A fragment of the tool call ``id``: fragments of one id concatenate their ``arguments``;
    ``name`` may be given on any fragment (later fragments may repeat it or leave it empty)."""

    if TYPE_CHECKING:  # the positional constructor of Model, for the type checker
        def __init__(self, /, *args: Any, **fields: Any) -> None: ...

    _what = "delta"
    kind: Literal["tool_call"] = "tool_call"
    id: StrictStr = Field(min_length=1)
    name: Annotated[StrictStr, Rule(always=True)] = ""
    arguments: Annotated[StrictStr, Rule(always=True)] = ""


class RefusalDelta(Model):
    """A fragment of refusal text."""

    if TYPE_CHECKING:  # the positional constructor of Model, for the type checker
        def __init__(self, /, *args: Any, **fields: Any) -> None: ...

    _what = "delta"
    kind: Literal["refusal"] = "refusal"
    text: StrictStr


DeltaPart = Annotated[TextDelta | ReasoningDelta | ToolCallDelta | RefusalDelta, Field(discriminator="kind")]
"""Any delta part; a discriminated union on ``kind``."""


class ChatDelta(Model):
    """One streamed chunk: some ``parts``, and/or a ``finish_reason``, and/or ``usage``.
    A delta with none of the three is malformed."""

    if TYPE_CHECKING:  # the positional constructor of Model, for the type checker
        def __init__(self, /, *args: Any, **fields: Any) -> None: ...

    _what = "chat delta"
    parts: Annotated[tuple[DeltaPart, ...], Rule(always=True)] = ()
    finish_reason: FinishReason | None = None
    usage: Usage | None = None

    def _check(self) -> None:
        if not self.parts and self.finish_reason is None and self.usage is None:
            raise ValueError("empty delta: no parts, no finish_reason and no usage")


class ResponseAccumulator:
    """Folds a stream of ``ChatDelta`` into one ``ChatResponse``.

    ``add(delta)`` is atomic: a rejected delta (not a ``ChatDelta``, anything after a finish
    reason, a tool call fragment naming another tool) raises ``InvalidMessage`` and changes
    nothing. Consecutive text (reasoning, refusal) fragments merge into one part; every tool
    call id becomes one part at the place of its first fragment, its argument fragments
    concatenated. ``response()`` raises ``InvalidMessage`` until a finish reason arrived; the
    latest ``usage`` wins.
    """

    __slots__ = ("_finish", "_parts", "_usage")

    def __init__(self) -> None:
        # Each entry: [kind, text-or-arguments, name, call id]
        self._parts: list[list[str]] = []
        self._finish: FinishReason | None = None
        self._usage: Usage | None = None

    @property
    def finish_reason(self) -> FinishReason | None:
        return self._finish

    def add(self, delta: ChatDelta) -> None:
        """Fold one delta in (all or nothing)."""
        if not isinstance(delta, ChatDelta):
            raise InvalidMessage(f"invalid chat delta: expected a ChatDelta, got {type(delta).__name__}")
        if self._finish is not None:
            raise InvalidMessage(
                f"invalid chat delta: the stream already finished ({self._finish.value}); "
                "nothing may follow a finish reason"
            )
        parts = [list(p) for p in self._parts]  # work on a copy: commit only if every fragment fits
        calls = {p[3]: p for p in parts if p[0] == "tool_call"}
        for i, frag in enumerate(delta.parts):
            if isinstance(frag, ToolCallDelta):
                call = calls.get(frag.id)
                if call is None:
                    call = ["tool_call", frag.arguments, frag.name, frag.id]
                    calls[frag.id] = call
                    parts.append(call)
                else:
                    if frag.name and call[2] and frag.name != call[2]:
                        raise InvalidMessage(
                            f"invalid chat delta: parts[{i}]: tool call {frag.id!r} was named "
                            f"{call[2]!r}, this fragment names {frag.name!r}"
                        )
                    call[1] += frag.arguments
                    call[2] = call[2] or frag.name
            else:
                if parts and parts[-1][0] == frag.kind:
                    parts[-1][1] += frag.text
                else:
                    parts.append([frag.kind, frag.text, "", ""])
        self._parts = parts
        if delta.usage is not None:
            self._usage = delta.usage
        if delta.finish_reason is not None:
            self._finish = delta.finish_reason

    def response(self) -> ChatResponse:
        """The accumulated response. Raises ``InvalidMessage`` without a finish reason, or when
        the accumulated parts do not make a valid assistant message."""
        if self._finish is None:
            raise InvalidMessage("invalid chat response: the stream has no finish reason yet")
        built: list[AnyPart] = []
        for kind, text, name, call_id in self._parts:
            if kind == "text":
                built.append(TextPart(text))
            elif kind == "reasoning":
                built.append(ReasoningPart(text))
            elif kind == "refusal":
                built.append(RefusalPart(text))
            else:
                built.append(ToolCallPart(call_id, name, text))
        message = Message(Role.ASSISTANT, built) if built else None
        return ChatResponse(message, self._finish, self._usage)
