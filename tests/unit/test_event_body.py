"""The hand-written event bodies (``schemas.event_body``) against fastavro: byte-identical for
every event ``encode_event`` writes, and they decode back to the same event.

The reference is ``fastavro.schemaless_writer`` over the very writer schema ``encode_event``
frames the body with (found by the frame's fingerprint), fed the record as fastavro expects it.
"""

from __future__ import annotations

import random
from io import BytesIO
from typing import Any

import pytest
from fastavro import schemaless_writer
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.event_body import _long
from schemas.event_rules import INT_MAX, INT_MIN, LONG_MAX, LONG_MIN
from schemas.event_schemas import WRITERS
from schemas.events import (
    HEADER_SIZE,
    AssetsLinked,
    BatchAppended,
    ConversationCleared,
    Event,
    RunBegun,
    TurnAllocated,
    TurnReplaced,
    decode_event,
    encode_event,
)
from schemas.sealed import Sealed
from schemas.times import MAX_TIME_MS, MIN_TIME_MS


def fastavro_frame(event: Event, prefix: bytes) -> bytes:
    """What ``encode_event`` wrote before its bodies were hand-written: fastavro's body over the
    writer schema named by ``prefix`` (the frame ``encode_event`` chose)."""
    schema = WRITERS[prefix[2:HEADER_SIZE]].schema
    record: dict[str, Any] = {f["name"]: getattr(event, f["name"]) for f in schema["fields"]}
    sealed = record.get("sealed")
    if sealed is not None:
        record["sealed"] = {"key_id": sealed.key_id, "nonce": sealed.nonce, "ciphertext": sealed.ciphertext,
                            "mac": sealed.mac}
    buf = BytesIO()
    buf.write(prefix)
    schemaless_writer(buf, schema, record)
    return buf.getvalue()


def check(event: Event) -> bytes:
    ours = encode_event(event)
    assert ours == fastavro_frame(event, ours[:HEADER_SIZE])
    return ours


_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)
_IDS = st.one_of(_TEXT, st.sampled_from(["c", "é-ü", "日本語", "🦀" * 30, "x" * 2000, ""]))
_LONGS = st.one_of(st.integers(LONG_MIN, LONG_MAX), st.sampled_from([LONG_MIN, LONG_MAX, 0, -1, 63, 64, -64, -65]))
_INTS = st.one_of(st.integers(INT_MIN, INT_MAX), st.sampled_from([INT_MIN, INT_MAX, 0, -1, 1]))
_TIMES = st.one_of(st.integers(MIN_TIME_MS, MAX_TIME_MS), st.sampled_from([MIN_TIME_MS, MAX_TIME_MS]))
_MESSAGES = st.one_of(st.binary(max_size=300), st.sampled_from([b"", b"\x00" * 70_000]))
_SEALED = st.one_of(st.none(), st.builds(Sealed, _IDS, st.binary(min_size=12, max_size=12),
                                         st.one_of(st.binary(max_size=200), st.just(b"\xff" * 20_000)),
                                         st.binary(min_size=32, max_size=32)))


@settings(max_examples=400, deadline=None)
@given(_IDS, _IDS, _TEXT, _MESSAGES, _INTS, _LONGS, _TIMES, st.one_of(st.none(), st.just(""), _IDS), _SEALED)
def test_a_batch_body_is_fastavros(c: str, a: str, digest: str, messages: bytes, count: int, size: int,
                                   at: int, expected: str | None, sealed: Sealed | None) -> None:
    check(BatchAppended(c, a, digest, messages, count, size, at, expected, sealed))


@settings(max_examples=400, deadline=None)
@given(_IDS, _IDS, _TEXT, _MESSAGES, _INTS, _LONGS, _TIMES, _IDS, _TEXT, _SEALED)
def test_a_replacement_body_is_fastavros(c: str, a: str, digest: str, messages: bytes, count: int, size: int,
                                         at: int, old: str, reason: str, sealed: Sealed | None) -> None:
    check(TurnReplaced(c, a, digest, messages, count, size, at, old, reason, sealed))


@settings(max_examples=200, deadline=None)
@given(_IDS, _TIMES)
def test_a_clear_body_is_fastavros(c: str, at: int) -> None:
    check(ConversationCleared(c, at))


_OPTIONAL_LONGS = st.one_of(st.none(), _LONGS)
_OPTIONAL_IDS = st.one_of(st.none(), _IDS)


@settings(max_examples=300, deadline=None)
@given(_IDS, _IDS, _TEXT, _MESSAGES, _INTS, _LONGS, _TIMES, _SEALED, _OPTIONAL_LONGS, _OPTIONAL_IDS,
       _OPTIONAL_IDS, _OPTIONAL_LONGS)
def test_a_batch_body_with_a_run_or_a_slot_is_fastavros(c: str, a: str, digest: str, messages: bytes, count: int,
                                                        size: int, at: int, sealed: Sealed | None, fence: int | None,
                                                        run: str | None, turn: str | None,
                                                        position: int | None) -> None:
    check(BatchAppended(c, a, digest, messages, count, size, at, None, sealed, fence, run, turn, position))


@settings(max_examples=200, deadline=None)
@given(_IDS, _IDS, _MESSAGES, _TIMES, _SEALED)
def test_slot_run_and_assets_bodies_are_fastavros(c: str, ident: str, assets: bytes, at: int,
                                                  sealed: Sealed | None) -> None:
    check(RunBegun(c, ident, at))
    check(TurnAllocated(c, ident, at))
    check(AssetsLinked(c, ident, assets, at, sealed))


def test_valid_events_round_trip_byte_identical_to_fastavro() -> None:
    """Seeded random valid events (unicode ids, extreme counts and times, every precondition
    form, sealed and plain): our bytes are fastavro's and decode back to the event."""
    rng = random.Random(16)
    from bench.common import batch  # a valid 2-message batch, any ids

    for i in range(300):
        conv = rng.choice(["c", "conv-é", "会話", "🦀-x", "c" * 1000]) + str(i)
        b = batch(conv, f"a-{i}")
        at = rng.choice([MIN_TIME_MS, MAX_TIME_MS, 1_767_225_600_000, rng.randint(MIN_TIME_MS, MAX_TIME_MS)])
        sealed = None if i % 2 else Sealed(f"{rng.getrandbits(128):032x}", rng.randbytes(12),
                                           rng.randbytes(rng.choice([16, 17, 300, 5000])), rng.randbytes(32))
        digest, messages = ("", b"") if sealed is not None else (b.digest, b.canonical_json())
        expected = rng.choice([None, "", "a-0", "ü-prev"])
        events: list[Event] = [
            BatchAppended(b.conversation_id, b.append_id, digest, messages, rng.choice([1, INT_MAX]),
                          rng.choice([0, LONG_MAX, 55]), at, expected, sealed),
            TurnReplaced(b.conversation_id, b.append_id, digest, messages, rng.choice([1, INT_MAX]),
                         rng.choice([0, LONG_MAX]), at, "a-0/0", rng.choice(["edit", "retry"]), sealed),
            ConversationCleared(b.conversation_id, at),
        ]
        for event in events:
            assert decode_event(check(event)) == event


@pytest.mark.parametrize("n", [0, 1, -1, 63, -64, 64, -65, 2**31 - 1, -2**31, 2**62, LONG_MAX, LONG_MIN])
def test_the_varint_is_the_avro_specs(n: int) -> None:
    """Zig-zag then base-128, low group first (Avro spec examples: 0->00, -1->01, 1->02, 64->8001)."""
    z = (n << 1) ^ (n >> 63)
    want = bytearray()
    while True:
        low, z = z & 0x7F, z >> 7
        want.append(low | (0x80 if z else 0))
        if not z:
            break
    assert _long(n) == bytes(want)
    assert {0: b"\x00", -1: b"\x01", 1: b"\x02", 64: b"\x80\x01"}.get(n, bytes(want)) == bytes(want)


@pytest.mark.parametrize("field", ["conversation_id", "append_id", "digest"])
def test_a_string_that_is_not_utf8_raises_as_before(field: str) -> None:
    """A lone surrogate cannot be UTF-8: a ValueError (UnicodeEncodeError) like fastavro's, no bytes."""
    fields: dict[str, Any] = {"conversation_id": "c", "append_id": "a", "digest": "d"} | {field: "x\udc80"}
    event = BatchAppended(fields["conversation_id"], fields["append_id"], fields["digest"], b"[]", 1, 0, 0)
    with pytest.raises(UnicodeEncodeError):
        encode_event(event)
    with pytest.raises(UnicodeEncodeError):
        fastavro_frame(event, encode_event(BatchAppended("c", "a", "d", b"[]", 1, 0, 0))[:HEADER_SIZE])
