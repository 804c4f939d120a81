"""Conversation and append identities.

Both are ``str`` subclasses validated in their constructor and never trimmed, normalised
or case-folded. Rules (in the order they are checked): non-empty; encodable as UTF-8 (no
lone surrogates); no leading or trailing Unicode White_Space (what Go's
``strings.TrimSpace`` removes); no control character (category Cc: U+0000-U+001F,
U+007F-U+009F); at most 1024 UTF-8 bytes. The rules guarantee that ``0x1F`` never occurs in
an id, which makes the log's record key ``conversation + 0x1F + append`` unambiguous
(``schemas.records``).

``MessageID`` is the one spelling of a stored message's id, ``APPEND_ID/INDEX`` (a turn's id is
the id of its first message): ``MessageID.format`` writes it, ``MessageID.parse`` reads it back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

from schemas.errors import HistoryError, InvalidAppendID, InvalidConversationID, InvalidRequest, NotFound

__all__ = ["MAX_ID_BYTES", "MAX_MESSAGE_INDEX", "AppendID", "ConversationID", "MessageID", "RunID"]

MAX_ID_BYTES = 1024

# Unicode White_Space (as Go's unicode.IsSpace / strings.TrimSpace see it).
_WHITE_SPACE = (
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _check(value: object, kind: str, error: type[ValueError]) -> str:
    if not isinstance(value, str):
        raise error(f"invalid {kind}: expected a string, got {type(value).__name__}")
    if not value:
        raise error(f"invalid {kind}: empty")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise error(f"invalid {kind}: invalid UTF-8 (lone surrogate)") from None
    if value[0] in _WHITE_SPACE or value[-1] in _WHITE_SPACE:
        raise error(f"invalid {kind}: leading or trailing whitespace in {value!r}")
    bad = _CONTROL.search(value)
    if bad is not None:
        raise error(f"invalid {kind}: contains control character U+{ord(bad.group()):04X}")
    if size > MAX_ID_BYTES:
        raise error(f"invalid {kind}: longer than {MAX_ID_BYTES} bytes ({size} bytes)")
    return value


class _ID(str):
    _kind: ClassVar[str]
    _error: ClassVar[type[ValueError]]
    __slots__ = ()

    def __new__(cls, value: str) -> Any:
        if type(value) is cls:
            return value
        return super().__new__(cls, _check(value, cls._kind, cls._error))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str.__repr__(self)})"

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            cls, serialization=core_schema.plain_serializer_function_ser_schema(str)
        )


class ConversationID(_ID):
    """Identifies one conversation (one history). Raises ``InvalidConversationID``."""

    _kind = "conversation id"
    _error = InvalidConversationID
    __slots__ = ()


class AppendID(_ID):
    """Names one immutable append within a conversation. Raises ``InvalidAppendID``.

    A retry must reuse the same id with the same Batch, including after a lost acknowledgement.
    """

    _kind = "append id"
    _error = InvalidAppendID
    __slots__ = ()


class RunID(_ID):
    """Names one run of an agent within a conversation (``begin_run``): the same rules as the
    other ids. Raises ``InvalidRequest``."""

    _kind = "run id"
    _error = InvalidRequest
    __slots__ = ()


MAX_MESSAGE_INDEX: Final = 9_999_999_999
"""Largest ``INDEX`` a message id may spell (ten digits; a batch holds far fewer messages)."""

_INDEX: Final = re.compile(r"0|[1-9][0-9]{0,9}")
_EXAMPLE: Final = "APPEND_ID/INDEX, e.g. 'a-2/0', as entries() shows them"


@dataclass(frozen=True, slots=True)
class MessageID:
    """The id of a stored message: ``APPEND_ID/INDEX``, its append's id and its 0-based index in
    that append's batch. Unique within its conversation (append ids are), stable forever.

    ``str(MessageID(a, i))`` is ``MessageID.format(a, i)``. ``parse`` accepts exactly what
    ``format`` writes for a valid append id (the index in canonical decimal: no sign, no leading
    zero, at most ten digits) and raises ``NotFound`` for anything else: a string that is not a
    message id names no message. The append id may itself contain ``/``: the index is what
    follows the last one.
    """

    append_id: AppendID
    index: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "append_id", AppendID(self.append_id))
        if not isinstance(self.index, int) or isinstance(self.index, bool) \
                or not 0 <= self.index <= MAX_MESSAGE_INDEX:
            raise NotFound(f"a message index is an int in 0..{MAX_MESSAGE_INDEX}, got {self.index!r}; "
                           f"message ids are {_EXAMPLE}")

    def __str__(self) -> str:
        return self.format(self.append_id, self.index)

    @staticmethod
    def format(append_id: str, index: int) -> str:
        """``append_id/index``: the one spelling of a message id (no validation: the hot path of
        reads, whose rows hold only valid ids)."""
        return f"{append_id}/{index}"

    @classmethod
    def parse(cls, text: object) -> MessageID:
        """The message id ``text`` spells; ``NotFound`` (saying what a message id looks like)
        when it spells none. Checks the text only: nothing is looked up."""
        if not isinstance(text, str):
            raise NotFound(f"message ids are str ({_EXAMPLE}), got {type(text).__name__}")
        append_id, slash, index = text.rpartition("/")
        if not slash or _INDEX.fullmatch(index) is None:
            raise NotFound(f"{text[:80]!r} is not a message id ({_EXAMPLE})")
        try:
            return cls(AppendID(append_id), int(index))
        except HistoryError as e:
            raise NotFound(f"{text[:80]!r} is not a message id ({_EXAMPLE}): {e}") from None
