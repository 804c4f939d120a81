"""Conversation and append identities.

Both are ``str`` subclasses validated in their constructor and never trimmed, normalised
or case-folded. Rules (in the order they are checked): non-empty; encodable as UTF-8 (no
lone surrogates); no leading or trailing Unicode White_Space (what Go's
``strings.TrimSpace`` removes); no control character (category Cc: U+0000-U+001F,
U+007F-U+009F); at most 1024 UTF-8 bytes. The rules guarantee that ``0x1F`` never occurs in
an id, which makes the log's record key ``conversation + 0x1F + append`` unambiguous.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

from schemas.errors import InvalidAppendID, InvalidConversationID

__all__ = ["MAX_ID_BYTES", "AppendID", "ConversationID"]

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
