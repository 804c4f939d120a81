"""Every ID rule (``schemas.ids``), for both ID types (an independent statement of the rules)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import AppendID, ConversationID, InvalidAppendID, InvalidConversationID

KINDS = [(ConversationID, InvalidConversationID), (AppendID, InvalidAppendID)]
WHITE_SPACE = set(
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)


def rule_says_valid(value: str) -> bool:
    if not value:
        return False
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return False
    if value[0] in WHITE_SPACE or value[-1] in WHITE_SPACE:
        return False
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in value):
        return False
    return size <= 1024


@pytest.mark.parametrize(("cls", "err"), KINDS)
@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("", "empty"),
        ("a\ud800b", "invalid UTF-8"),
        (" a", "leading or trailing whitespace"),
        ("a\u3000", "leading or trailing whitespace"),
        ("a\x85", "leading or trailing whitespace"),
        ("a\x07b", "contains control character U+0007"),
        ("a\x1fb", "contains control character U+001F"),
        ("a\x7fb", "contains control character U+007F"),
        ("a\x9fb", "contains control character U+009F"),
        ("x" * 1025, "longer than 1024 bytes"),
        ("é" * 513, "longer than 1024 bytes"),
    ],
)
def test_bad_id_raises_typed_error_with_reason(cls: type, err: type, value: str, reason: str) -> None:
    with pytest.raises(err, match=reason.replace("+", r"\+")):
        cls(value)


@pytest.mark.parametrize(("cls", "err"), KINDS)
def test_1024_bytes_is_the_limit_counted_in_utf8(cls: type, err: type) -> None:
    assert cls("x" * 1024) == "x" * 1024
    assert cls("é" * 512) == "é" * 512  # 1024 bytes, 512 characters
    assert cls("😀" * 256) == "😀" * 256
    with pytest.raises(err):
        cls("😀" * 256 + "x")


@pytest.mark.parametrize(("cls", "err"), KINDS)
def test_ids_are_never_trimmed_or_normalised(cls: type, err: type) -> None:
    for value in ["a b", "Ab", "e\u0301", "ﬁ", "a\u200bb"]:
        assert str(cls(value)) == value
    assert cls("Ab") != cls("ab")


@pytest.mark.parametrize(("cls", "err"), KINDS)
def test_id_errors_are_value_errors(cls: type, err: type) -> None:
    with pytest.raises(ValueError):
        cls("")


@given(st.text(max_size=40))
def test_random_unicode_accepted_exactly_when_the_rules_say(value: str) -> None:
    for cls, err in KINDS:
        if rule_says_valid(value):
            assert cls(value) == value
        else:
            with pytest.raises(err):
                cls(value)


@given(st.text(alphabet=st.characters(codec="utf-8"), min_size=1000, max_size=1100))
def test_length_rule_at_the_boundary(value: str) -> None:
    assert (rule_says_valid(value)) == _accepts(value)


def _accepts(value: str) -> bool:
    try:
        ConversationID(value)
    except InvalidConversationID:
        return False
    return True
