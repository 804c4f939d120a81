"""Batch, Receipt and the read-side value types."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import (
    Batch,
    HistoryLoad,
    HistoryPosition,
    InvalidAppendID,
    InvalidBatch,
    InvalidConversationID,
    InvalidReceipt,
    LogPosition,
    Measure,
    Message,
    RawJSON,
    Receipt,
    Role,
    StoredMessage,
    TextPart,
    TurnSource,
    digest_of,
)

_ONE = (
    b'{"conversation_id":"c","append_id":"a","messages":'
    b'[{"role":"user","parts":[{"kind":"text","text":"x"}]}]}'
)


def _batch(**meta: object) -> Batch:
    return Batch("conv", "app", [Message.user("hi", metadata=meta or None), Message.assistant("hello")])


def test_batch_basics() -> None:
    b = _batch()
    assert len(b) == 2 and isinstance(b.messages, tuple)
    assert b.conversation_id == "conv" and b.append_id == "app"
    assert b.canonical_json() == b"[" + b",".join(m.canonical_json() for m in b.messages) + b"]"
    assert b.digest == digest_of(b.canonical_json())
    assert b.content_bytes() == sum(m.content_bytes() for m in b.messages)


def test_empty_batch_is_invalid() -> None:
    with pytest.raises(InvalidBatch, match="at least one message"):
        Batch("c", "a", [])


@pytest.mark.parametrize("messages", [[{"role": "user"}], ["hi"], "hi", None, [TextPart("x")]])
def test_batch_needs_messages(messages: object) -> None:
    with pytest.raises(InvalidBatch):
        Batch("c", "a", messages)  # type: ignore[arg-type]


def test_batch_validates_ids() -> None:
    with pytest.raises(InvalidConversationID):
        Batch(" c", "a", [Message.user("x")])
    with pytest.raises(InvalidAppendID):
        Batch("c", "", [Message.user("x")])


def test_snapshot_ignores_later_changes_to_callers_objects() -> None:
    meta = {"k": [1]}
    parts = [TextPart("hi")]
    messages = [Message("user", parts, meta)]
    b = Batch("c", "a", messages)
    digest, snapshot = b.digest, b.messages
    messages.append(Message.user("more"))
    meta["k"].append(2)
    parts.clear()
    assert b.digest == digest and b.messages == snapshot and len(b) == 1
    with pytest.raises(AttributeError):
        b.messages = ()  # type: ignore[misc]


def test_equality_and_hash_by_ids_and_digest() -> None:
    assert _batch() == _batch() and hash(_batch()) == hash(_batch())
    assert _batch() != Batch("conv", "other", _batch().messages)
    assert _batch() != _batch(x=1)


def test_json_round_trip_preserves_digest() -> None:
    b = Batch("c", "a", [Message.user("x", metadata={"n": RawJSON("1.50e3"), "z": -0.0})])
    again = Batch.from_json(b.to_json())
    assert again == b and again.digest == b.digest
    assert Batch.from_json(b.to_json().decode()).digest == b.digest
    assert pickle.loads(pickle.dumps(b)) == b


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"{", InvalidBatch),
        (b"[]", InvalidBatch),
        (b'{"conversation_id":"c","append_id":"a"}', InvalidBatch),
        (b'{"conversation_id":"c","append_id":"a","messages":[]}', InvalidBatch),
        (b'{"conversation_id":"c","append_id":"a","messages":[],"x":1}', InvalidBatch),
        (b'{"conversation_id":"c","append_id":"a","messages":[{"role":"user","parts":[]}]}', InvalidBatch),
        (
            _ONE.replace(b'"c"', b'""', 1),
            InvalidConversationID,
        ),
        (
            _ONE.replace(b'"a"', b'" a"', 1),
            InvalidAppendID,
        ),
    ],
)
def test_from_json_errors(data: bytes, error: type) -> None:
    with pytest.raises(error):
        Batch.from_json(data)


def test_from_canonical_accepts_exact_bytes() -> None:
    b = _batch(n=RawJSON("1e3"), s="x")
    again = Batch.from_canonical("conv", "app", b.canonical_json())
    assert again == b and again.messages == b.messages


@pytest.mark.parametrize(
    "mangle",
    [
        lambda d: d.replace(b",", b", ", 1),
        lambda d: b" " + d,
        lambda d: d + b"\n",
        lambda d: d.replace(
            b'{"parts":[{"kind":"text","text":"hello"}],"role":"assistant"}',
            b'{"role":"assistant","parts":[{"kind":"text","text":"hello"}]}',
        ),
        lambda d: d.replace(b'"text":"hi"', b'"text":"h\\u0069"'),
        lambda d: d.replace(b'"kind":"text","text":"hi"', b'"citations":[],"kind":"text","text":"hi"'),
        lambda d: d.replace(b'"n":1e3', b'"n" :1e3'),
        lambda d: d.replace(b'"metadata":{', b'"metadata":{"n":1,', 1),
        lambda d: b"[]",
        lambda d: b"",
        lambda d: b"\xff",
    ],
)
def test_from_canonical_rejects_non_canonical_bytes(mangle: object) -> None:
    data = _batch(n=RawJSON("1e3")).canonical_json()
    bad = mangle(data)  # type: ignore[operator]
    assert bad != data
    with pytest.raises(InvalidBatch):
        Batch.from_canonical("conv", "app", bad)


metadata_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)


@given(st.dictionaries(st.text(min_size=1, max_size=4), metadata_values, max_size=4), st.text(max_size=20))
def test_json_and_canonical_round_trips_preserve_digest(meta: dict[str, object], text: str) -> None:
    try:
        b = Batch("c", "a", [Message.user(text, metadata=meta), Message.assistant("ok")])
    except Exception:  # lone surrogates from st.text() are rejected, as they must be
        return
    assert Batch.from_json(b.to_json()).digest == b.digest
    assert Batch.from_canonical("c", "a", b.canonical_json()).digest == b.digest


def test_receipt() -> None:
    b = _batch()
    r = Receipt("conv", "app", b.digest, LogPosition(0, 7))
    r.validate_for(b)
    assert Receipt.from_json(r.to_json()) == r
    assert r.to_dict()["position"] == {"partition": 0, "offset": 7}
    with pytest.raises(InvalidReceipt):
        r.validate_for(_batch(x=1))
    with pytest.raises(InvalidReceipt):
        Receipt("conv", "other", b.digest, LogPosition(0, 7)).validate_for(b)
    with pytest.raises(InvalidReceipt):
        Receipt("conv", "app", "sha1:x", LogPosition(0, 7))
    with pytest.raises(InvalidReceipt):
        Receipt.from_json(b"{}")
    with pytest.raises(InvalidReceipt):
        Receipt.from_json(b"nope")


def test_a_receipt_of_valid_parts_equals_the_checked_one_and_is_as_frozen() -> None:
    b = _batch()
    checked = Receipt(b.conversation_id, b.append_id, b.digest, LogPosition(0, 7))
    trusted = Receipt.of_valid(b.conversation_id, b.append_id, b.digest, LogPosition(0, 7))
    assert trusted == checked and hash(trusted) == hash(checked) and repr(trusted) == repr(checked)
    assert trusted.to_json() == checked.to_json()
    trusted.validate_for(b)
    with pytest.raises(AttributeError):
        trusted.digest = "x"  # type: ignore[misc]


def test_read_side_types_are_frozen_and_positional() -> None:
    now = datetime.now(UTC)
    sm = StoredMessage("app:0", Message.user("x"), HistoryPosition(1, 1), "app", now)  # type: ignore[arg-type]
    load = HistoryLoad([sm], False)
    src = TurnSource("app:0", Role.USER, b"{}", now, False)
    m = Measure(1, 10, 1)
    assert load.messages[0] is sm and src.role == "user" and m.turns == 1
    with pytest.raises(AttributeError):
        m.turns = 2  # type: ignore[misc]
