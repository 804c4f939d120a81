"""``MessageID``: the one spelling of a stored message's id, ``APPEND_ID/INDEX``."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import AppendID, InvalidAppendID, NotFound
from schemas.ids import MAX_MESSAGE_INDEX, MessageID

append_ids = st.text(min_size=1, max_size=40).filter(lambda s: _valid(s))


def _valid(text: str) -> bool:
    try:
        AppendID(text)
    except InvalidAppendID:
        return False
    return True


@given(append_ids, st.integers(0, MAX_MESSAGE_INDEX))
def test_format_and_parse_round_trip(append_id: str, index: int) -> None:
    text = MessageID.format(append_id, index)
    assert text == f"{append_id}/{index}"
    parsed = MessageID.parse(text)
    assert parsed == MessageID(AppendID(append_id), index)
    assert (parsed.append_id, parsed.index) == (append_id, index)
    assert type(parsed.append_id) is AppendID
    assert str(parsed) == text


def test_the_index_is_what_follows_the_last_slash() -> None:
    assert MessageID.parse("tool/run/7") == MessageID(AppendID("tool/run"), 7)
    assert MessageID.parse("a/0").index == 0
    assert MessageID.parse(f"a/{MAX_MESSAGE_INDEX}").index == MAX_MESSAGE_INDEX


@pytest.mark.parametrize("text", [
    "", "a", "a/", "/", "/0", "a/00", "a/01", "a/+1", "a/-1", "a/1 ", "a/ 1", "a/1.0", "a/1e3",
    "a/\u0660", "a/\u00b2", "a/\uff11", f"a/{MAX_MESSAGE_INDEX + 1}", " a/0", "a\x00b/0", "x" * 1025 + "/0",
])
def test_parse_refuses_what_format_never_writes(text: str) -> None:
    with pytest.raises(NotFound, match="is not a message id") as info:
        MessageID.parse(text)
    assert "APPEND_ID/INDEX" in str(info.value)  # says what a message id looks like


@pytest.mark.parametrize("value", [None, 7, b"a/0", ["a", 0]])
def test_parse_refuses_a_non_string_before_anything_else(value: object) -> None:
    with pytest.raises(NotFound, match="message ids are str"):
        MessageID.parse(value)


@pytest.mark.parametrize("index", [-1, MAX_MESSAGE_INDEX + 1, True, 1.0, "0"])
def test_construction_refuses_an_index_out_of_its_range(index: object) -> None:
    with pytest.raises(NotFound, match="message index"):
        MessageID(AppendID("a"), index)  # type: ignore[arg-type]


def test_construction_checks_the_append_id() -> None:
    with pytest.raises(InvalidAppendID):
        MessageID(" a", 0)  # type: ignore[arg-type]
    assert MessageID("a", 0).append_id == AppendID("a")  # type: ignore[arg-type]


def test_message_ids_are_frozen_and_hashable() -> None:
    mid = MessageID.parse("a/1")
    assert {mid: 1}[MessageID(AppendID("a"), 1)] == 1
    with pytest.raises(AttributeError):
        mid.index = 2  # type: ignore[misc]
