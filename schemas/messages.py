"""Messages: the validated, deeply immutable data model of a conversation.

A ``Message`` is a ``role``, at least one part of a kind the role may carry, and metadata. Like
every model here it is a frozen ``schemas.model.Model`` (fields declared once, positional
constructor ``Message("user", [TextPart("hi")])``, canonical JSON derived from the fields);
the parts are in ``schemas.parts`` and re-exported here. Promises:

* **Validated on construction.** A pydantic ``ValidationError`` never escapes a public
  constructor, ``model_validate`` or ``model_validate_json``: it becomes ``InvalidMessage``
  saying what and where (``invalid message: parts[1]: kind 'tool_call' is not allowed for
  role 'user'``).
* **Deeply immutable.** Sequences are tuples, metadata is a ``FrozenDict`` of ``RawJSON``
  values, bytes stay bytes. Changing the caller's list or dict afterwards changes nothing.
* **Canonical bytes.** ``canonical_json()`` is computed once at construction and cached;
  equality and hashing are by type and canonical bytes. The rules are in
  ``docs/canonical-json.md``.

Which part kinds a role may carry: system: text; user: text, media; assistant: text, media,
reasoning, tool_call, refusal; tool: tool_result.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Final

from schemas.canonical import EMPTY_METADATA, dumps
from schemas.fields import Metadata
from schemas.invalid import invalid as invalid
from schemas.model import STORED, Model
from schemas.parts import (
    AnyPart,
    Citation,
    ContentItem,
    Media,
    MediaPart,
    Part,
    ReasoningPart,
    RefusalPart,
    TextPart,
    ToolCallPart,
    ToolOutput,
    ToolResultPart,
)

__all__ = [
    "ALLOWED_KINDS",
    "INTERNAL_FEEDBACK",
    "AnyPart",
    "Citation",
    "ContentItem",
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
    "starts_turn",
]


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


def _as_part(item: Any) -> Any:
    return TextPart(item) if isinstance(item, str) else item


class Message(Model):
    """One message: a ``role``, at least one part (kinds allowed for the role), and metadata.

    ``canonical_json()`` is the message's canonical JSON (cached); ``content_bytes()`` is the
    length of the canonical JSON without the message-level metadata (part metadata stays):
    what byte budgets count.
    """

    if TYPE_CHECKING:  # the positional constructor of Model, for the type checker
        def __init__(self, /, *args: Any, **fields: Any) -> None: ...

    _what = "message"
    __slots__ = ("_content_bytes",)

    role: Role
    parts: tuple[Part, ...]
    metadata: Metadata = EMPTY_METADATA

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

    def _content_tree(self) -> dict[str, Any]:
        """The canonical tree without the message-level metadata: what ``content_bytes`` counts."""
        tree = self._tree()
        tree.pop("metadata", None)
        return tree

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        if context is not None and STORED in context:
            object.__setattr__(self, "_canon", context[STORED])
        # Without message metadata the content is the canonical JSON itself; otherwise it is
        # computed on first use (-1 = not yet). Set here so reads never miss the slot.
        object.__setattr__(self, "_content_bytes", -1 if self.metadata else len(self.canonical_json()))

    def content_bytes(self) -> int:
        """Length of the canonical JSON without message-level metadata (cached)."""
        size: int = self._content_bytes  # type: ignore[attr-defined]
        if size < 0:
            size = len(dumps(self._content_tree()))
            object.__setattr__(self, "_content_bytes", size)
        return size

    def content_json(self) -> bytes:
        """The canonical JSON without message-level metadata (what ``content_bytes`` measures)."""
        return dumps(self._content_tree()) if self.metadata else self.canonical_json()

    def _full_recompute(self) -> bytes:
        """Serialise from the field values, ignoring every cache (benchmarks and tests)."""
        return dumps(self._fresh_tree())


INTERNAL_FEEDBACK = "internal_feedback"
"""The metadata key an agent harness sets to JSON ``true`` on a user message it injects itself
("tests failed, try again"): stored and replayed as a user message, but inside the current turn."""


def starts_turn(message: Message) -> bool:
    """The one rule of where a turn starts: at a user message that is not internal feedback
    (metadata ``internal_feedback`` JSON ``true``). The projector's turn positions, windows
    (``WindowReader`` too), budgets, turn ids and the middleware's open turn all follow it, so an
    injected "try again" never splits the request from its tool exchange."""
    return message.role is Role.USER and message.metadata.get(INTERNAL_FEEDBACK) != "true"
