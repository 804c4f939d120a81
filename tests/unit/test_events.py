"""The event codec (schemas/events.py) as a specification.

Golden bytes and pinned fingerprints are the log format: if one of those tests fails, the
change breaks every existing log and every reader in another language. Do not "update the
fixture"; add a new schema version by evolution instead (docs/events.md).
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.errors import CorruptLog, HistoryError, InvalidConfiguration
from schemas.event_content import event_batch, open_content, open_event, seal_event
from schemas.events import (
    BATCH_APPENDED_FINGERPRINT,
    BATCH_APPENDED_V1_FINGERPRINT,
    BATCH_APPENDED_V2_FINGERPRINT,
    CONVERSATION_CLEARED_FINGERPRINT,
    HEADER_SIZE,
    MAGIC,
    TURN_REPLACED_FINGERPRINT,
    TURN_REPLACED_V1_FINGERPRINT,
    AssetsLinked,
    BatchAppended,
    ConversationCleared,
    Event,
    RunBegun,
    TurnAllocated,
    TurnReplaced,
    current_schema,
    decode_event,
    encode_event,
    fingerprint_of,
    register_writer_schema,
    schema_fingerprint,
)
from schemas.ids import ConversationID
from schemas.sealed import SEALED_BATCH, SEALED_REPLACED, DataKey, Sealed
from schemas.times import MAX_TIME_MS

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "events"
DOCS = ROOT / "docs" / "events.md"

# Pinned: the fingerprints of the current schemas, as the frame carries them.
PINNED = {  # the current schemas: a batch under a turn slot, a replacement with a run or a fence
    "BatchAppended": "207d2718c0314335",
    "ConversationCleared": "c27975b3260a301e",
    "RunBegun": "19182be92f12e141",
    "TurnAllocated": "3ffc6d2cdbacce6c",
    "AssetsLinked": "7b830a66679d230a",
    "TurnReplaced": "c26c752981b35508",
}
PINNED_RUN_BATCH = "6136f4c550cf0dc3"  # BatchAppended version 4: a batch with a run or a fence, no slot
PINNED_SEALED = {  # what sealed records without a run or fence are written with (every release since sealing)
    "BatchAppended": "468102e300405467",
    "TurnReplaced": "bc5f948096c4fb8e",
}
PINNED_PLAIN = {  # what plain records are written with: the schemas of every release before sealing
    "BatchAppended": "a4d2fd8b7ee6e3e4",
    "TurnReplaced": "939f9a0f0b64df68",
}
PINNED_V1_BATCH = "c22957e66f4f2191"  # BatchAppended version 1: still decoded

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
TIMES = st.integers(0, MAX_TIME_MS)  # the representable times: the only ones a writer encodes

# Encodable events: any strings and ints of the Avro types (the writer checks only types and times).
batch_events = st.builds(
    BatchAppended,
    conversation_id=st.text(),
    append_id=st.text(),
    digest=st.text(),
    messages=st.binary(),
    message_count=INT32,
    content_bytes=INT64,
    created_at_ms=TIMES,
    expected_last=st.none() | st.text(),
    fence=st.none() | INT64,
    run_id=st.none() | st.text(),
    turn_id=st.none() | st.text(),
    turn_position=st.none() | INT64,
)
clear_events = st.builds(ConversationCleared, conversation_id=st.text(), created_at_ms=TIMES)
run_events = st.builds(RunBegun, conversation_id=st.text(), run_id=st.text(), created_at_ms=TIMES)
allocated_events = st.builds(TurnAllocated, conversation_id=st.text(), slot_id=st.text(), created_at_ms=TIMES)
linked_events = st.builds(AssetsLinked, conversation_id=st.text(), message_id=st.text(), assets=st.binary(),
                          created_at_ms=TIMES)
replaced_events = st.builds(
    TurnReplaced,
    conversation_id=st.text(),
    append_id=st.text(),
    digest=st.text(),
    messages=st.binary(),
    message_count=INT32,
    content_bytes=INT64,
    created_at_ms=TIMES,
    old_turn_id=st.text(),
    reason=st.text(),
    fence=st.none() | INT64,
    run_id=st.none() | st.text(),
)
events = st.one_of(batch_events, clear_events, replaced_events, run_events, allocated_events, linked_events)


def _is_id(text: str) -> bool:
    try:
        ConversationID(text)
    except HistoryError:
        return False
    return True


# Valid events: every field within its rule (what decode_event returns).
IDS = st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=40).filter(_is_id)
DIGESTS = st.binary(min_size=32, max_size=32).map(lambda b: "sha256:" + b.hex())
valid_batch_events = st.builds(
    BatchAppended,
    conversation_id=IDS,
    append_id=IDS,
    digest=DIGESTS,
    messages=st.binary(),
    message_count=st.integers(1, 2**31 - 1),
    content_bytes=st.integers(0, 2**63 - 1),
    created_at_ms=TIMES,
    expected_last=st.none() | st.just("") | IDS,
    fence=st.none() | st.integers(1, 2**63 - 1),
    run_id=st.none() | IDS,
)
valid_slotted_events = st.builds(  # a batch filed under a turn slot: both fields, the slot's turn id and a position
    lambda event, slot, position: dataclasses.replace(event, turn_id=f"{slot}/0", turn_position=position),
    valid_batch_events, IDS, st.integers(1, 2**63 - 1))
valid_clear_events = st.builds(ConversationCleared, conversation_id=IDS, created_at_ms=TIMES)
valid_run_events = st.builds(RunBegun, conversation_id=IDS, run_id=IDS, created_at_ms=TIMES)
valid_allocated_events = st.builds(TurnAllocated, conversation_id=IDS, slot_id=IDS, created_at_ms=TIMES)
valid_replaced_events = st.builds(
    TurnReplaced,
    conversation_id=IDS,
    append_id=IDS,
    digest=DIGESTS,
    messages=st.binary(),
    message_count=st.integers(1, 2**31 - 1),
    content_bytes=st.integers(0, 2**63 - 1),
    created_at_ms=TIMES,
    old_turn_id=st.builds(lambda a, i: f"{a}/{i}", IDS, st.integers(0, 2**31 - 2)),
    reason=st.sampled_from(["edit", "retry"]),
    fence=st.none() | st.integers(1, 2**63 - 1),
    run_id=st.none() | IDS,
)


def sample_batch() -> BatchAppended:
    return BatchAppended(
        conversation_id="conv-1",
        append_id="a1",
        digest="sha256:" + "ab" * 32,
        messages=b'[{"parts":[{"kind":"text","text":"hi"}],"role":"user"}]',
        message_count=1,
        content_bytes=55,
        created_at_ms=1_767_225_600_000,
    )


def parse_hex_dump(text: str) -> bytes:
    """Hex pairs separated by whitespace; ``#`` starts a comment to the end of the line."""
    body = " ".join(line.split("#", 1)[0] for line in text.splitlines())
    return bytes.fromhex(body)


def load_golden(name: str) -> tuple[Event, bytes]:
    spec = json.loads((GOLDEN / f"{name}.json").read_text(encoding="utf-8"))
    fields: dict[str, Any] = dict(spec["fields"])
    cls = {"BatchAppended": BatchAppended, "ConversationCleared": ConversationCleared,
           "TurnReplaced": TurnReplaced}[spec["type"]]
    if "messages" in fields:
        fields["messages"] = fields["messages"].encode("utf-8")
    if "sealed" in fields:  # the sealed fixtures: binary fields in hex
        raw = fields["sealed"]
        fields["sealed"] = Sealed(raw["key_id"], bytes.fromhex(raw["nonce"]), bytes.fromhex(raw["ciphertext"]),
                                  bytes.fromhex(raw["mac"]))
    event: Event = cls(**fields)
    return event, parse_hex_dump((GOLDEN / f"{name}.hex").read_text(encoding="utf-8"))


def crc64_avro(data: bytes) -> bytes:
    """CRC-64-AVRO (Rabin) written from the Avro spec, independently of fastavro."""
    empty = 0xC15D213AA4D7A795
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (empty & -(fp & 1))
        table.append(fp)
    fp = empty
    for byte in data:
        fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
    return fp.to_bytes(8, "little")


def reason_of(data: bytes) -> str:
    with pytest.raises(CorruptLog) as info:
        decode_event(data)
    return info.value.reason


# --------------------------------------------------------------------------- round trip


@given(valid_batch_events)
def test_batch_appended_round_trips(event: BatchAppended) -> None:
    assert decode_event(encode_event(event)) == event


@given(valid_clear_events)
def test_conversation_cleared_round_trips(event: ConversationCleared) -> None:
    assert decode_event(encode_event(event)) == event


@given(valid_replaced_events)
def test_turn_replaced_round_trips(event: TurnReplaced) -> None:
    assert decode_event(encode_event(event)) == event


@given(valid_run_events)
def test_run_begun_round_trips(event: RunBegun) -> None:
    assert decode_event(encode_event(event)) == event


@given(valid_slotted_events | valid_allocated_events)
def test_slotted_batches_and_turn_slots_round_trip(event: BatchAppended | TurnAllocated) -> None:
    assert decode_event(encode_event(event)) == event


def test_a_fence_or_run_below_its_rule_is_poison() -> None:
    good = sample_batch()
    for fence, run_id, field in ((0, None, "fence"), (-3, None, "fence"), (None, "", "run_id"),
                                 (None, " r", "run_id")):
        bad = dataclasses.replace(good, fence=fence, run_id=run_id)
        with pytest.raises(CorruptLog, match=f"invalid {field}"):
            decode_event(encode_event(bad))
    with pytest.raises(CorruptLog, match="invalid run_id"):
        decode_event(encode_event(RunBegun("c", "", 1)))


@given(events)
def test_encoding_is_framed_with_the_current_fingerprint(event: Event) -> None:
    data = encode_event(event)
    assert data[:2] == MAGIC
    name = type(event).__name__
    if isinstance(event, BatchAppended) and (event.turn_id is not None or event.turn_position is not None):
        expected = fingerprint_of(BatchAppended)  # a batch under a turn slot: the current schema
    elif isinstance(event, BatchAppended) and (event.fence is not None or event.run_id is not None):
        expected = bytes.fromhex(PINNED_RUN_BATCH)  # a batch with a run or a fence: version 4
    elif not isinstance(event, BatchAppended | TurnReplaced) or event.fence is not None or event.run_id is not None:
        expected = fingerprint_of(type(event))  # a clear, a run, a slot, a replacement with a run or fence
    else:
        expected = bytes.fromhex((PINNED_PLAIN if event.sealed is None else PINNED_SEALED)[name])
    assert data[2:HEADER_SIZE] == expected


def test_decoded_events_are_the_frozen_dataclasses() -> None:
    event = decode_event(encode_event(sample_batch()))
    assert type(event) is BatchAppended
    assert type(event.messages) is bytes
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.append_id = "other"  # type: ignore[misc]


def test_dataclass_fields_match_the_schemas() -> None:
    for cls in (BatchAppended, ConversationCleared):
        schema_fields = [f["name"] for f in current_schema(cls)["fields"]]
        assert [f.name for f in dataclasses.fields(cls)] == schema_fields
        assert all(f.get("doc") for f in current_schema(cls)["fields"]), "every field carries a doc"


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"message_count": 2**31}, ValueError),
        ({"content_bytes": 2**63}, ValueError),
        ({"created_at_ms": -(2**63) - 1}, ValueError),
        ({"created_at_ms": -1}, InvalidConfiguration),
        ({"created_at_ms": MAX_TIME_MS + 1}, InvalidConfiguration),
        ({"message_count": True}, TypeError),
        ({"message_count": 1.0}, TypeError),
        ({"conversation_id": b"c"}, TypeError),
        ({"messages": "[]"}, TypeError),
        ({"append_id": "\ud800"}, ValueError),
    ],
)
def test_unencodable_events_raise_type_or_value_errors(
    change: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        encode_event(dataclasses.replace(sample_batch(), **change))


def test_encoding_a_non_event_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        encode_event({"conversation_id": "c"})  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the format, pinned


SEALED_GOLDENS = {"batch_appended_v3": "batch_appended", "turn_replaced_v2": "turn_replaced"}
"""The sealed fixtures and the plain fixture whose event each one seals."""
WRITTEN_GOLDENS = ["batch_appended", "conversation_cleared", "turn_replaced", *SEALED_GOLDENS]
"""Every fixture today's writer produces byte for byte (plain records keep the pre-sealing schemas)."""


@pytest.mark.parametrize("name", WRITTEN_GOLDENS)
def test_golden_event_encodes_to_the_golden_bytes(name: str) -> None:
    event, golden = load_golden(name)
    assert encode_event(event) == golden, (
        f"BREAKING LOG FORMAT CHANGE: {name} no longer encodes to tests/data/events/{name}.hex"
    )


@pytest.mark.parametrize("name", [*WRITTEN_GOLDENS, "batch_appended_v1"])
def test_golden_bytes_decode_to_the_golden_event(name: str) -> None:
    event, golden = load_golden(name)
    assert decode_event(golden) == event


@pytest.mark.parametrize("name", ["batch_appended", "batch_appended_v1", "turn_replaced"])
def test_plain_goldens_still_decode_as_plain_records(name: str) -> None:
    """Logs written before sealing replay unchanged: their records decode with ``sealed`` None and
    their digest and messages as written, with the plain fingerprints they were written with."""
    event, golden = load_golden(name)
    decoded = decode_event(golden)
    assert isinstance(decoded, (BatchAppended, TurnReplaced)) and isinstance(event, (BatchAppended, TurnReplaced))
    assert decoded.sealed is None and decoded.messages == event.messages and decoded.digest == event.digest
    assert golden[2:HEADER_SIZE].hex() in (PINNED_PLAIN[type(decoded).__name__], PINNED_V1_BATCH)


def _golden_key(name: str) -> tuple[DataKey, bytes]:
    spec = json.loads((GOLDEN / f"{name}.json").read_text(encoding="utf-8"))
    return DataKey(spec["key"]["key_id"], bytes.fromhex(spec["key"]["secret"])), spec["content"].encode("utf-8")


@pytest.mark.parametrize("name", sorted(SEALED_GOLDENS))
def test_sealed_golden_opens_to_its_content(name: str) -> None:
    """The sealed fixture, opened with its fixture key, is the plain fixture's event: the same
    content, its sha256 digest, every plaintext field equal. Its bytes carry no plaintext."""
    key, content = _golden_key(name)
    _, golden = load_golden(name)
    decoded = decode_event(golden)
    assert isinstance(decoded, (BatchAppended, TurnReplaced)) and decoded.sealed is not None
    assert decoded.digest == "" and decoded.messages == b"" and decoded.sealed.key_id == key.key_id
    assert golden[2:HEADER_SIZE].hex() == PINNED_SEALED[type(decoded).__name__]
    opened = open_event(decoded, key)
    plain, _ = load_golden(SEALED_GOLDENS[name])
    assert opened.messages == content and opened == plain
    assert content not in golden and plain.digest.encode() not in golden
    assert plain.digest.removeprefix("sha256:").encode() not in golden


@pytest.mark.parametrize("name", sorted(SEALED_GOLDENS))
def test_opened_content_gives_the_batch_of_the_opened_event(name: str) -> None:
    """``event_batch(sealed, content=open_content(...))`` checks the content without a plain event
    being built: the batch (digest included) is the one of the opened event; a sealed event needs
    its content, a plain one takes none."""
    key, _ = _golden_key(name)
    _, golden = load_golden(name)
    sealed = decode_event(golden)
    assert isinstance(sealed, (BatchAppended, TurnReplaced)) and sealed.sealed is not None
    content = open_content(sealed, key)
    opened = open_event(sealed, key)
    batch, reference = event_batch(sealed, content=content), event_batch(opened)
    assert batch.digest == reference.digest == opened.digest
    assert batch.canonical_json() == reference.canonical_json() == opened.messages == content
    assert batch.messages == reference.messages
    with pytest.raises(AssertionError):
        event_batch(sealed)
    with pytest.raises(AssertionError):
        event_batch(opened, content=content)


def test_opened_content_is_checked_against_the_event() -> None:
    """Opened content is no claim to trust: a count that is not the event's is poison (the
    same reason as for a plain event), and so is content that is not canonical JSON."""
    from schemas.batch import Batch
    from schemas.messages import Message

    key = DataKey.generate()
    plain = BatchAppended.of(Batch("c", "a", [Message.user("hi"), Message.assistant("hello")]), 1_767_225_600_000)
    wrong = dataclasses.replace(plain, message_count=3)
    sealed = seal_event(wrong, key)
    with pytest.raises(CorruptLog, match="message_count or content_bytes"):
        event_batch(sealed, content=open_content(sealed, key))
    with pytest.raises(CorruptLog, match="not canonical valid messages"):
        event_batch(sealed, content=b'[{"role": "user"}]')


@pytest.mark.parametrize("name", sorted(SEALED_GOLDENS))
def test_sealed_golden_is_the_documented_construction(name: str) -> None:
    """Rebuilt here from the primitives as docs/events.md "Sealed content" states them (HKDF-SHA256
    without salt, AES-256-GCM with the length-prefixed associated data, HMAC-SHA256), independently
    of schemas/sealed.py: the fixture's ciphertext and MAC, byte for byte."""
    import hashlib
    import hmac
    import struct

    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    key, content = _golden_key(name)
    event, _ = load_golden(name)
    assert isinstance(event, (BatchAppended, TurnReplaced)) and event.sealed is not None

    def hkdf(info: bytes) -> bytes:
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(key.secret)

    def field(text: str) -> bytes:
        return struct.pack(">I", len(text.encode())) + text.encode()

    record = SEALED_BATCH if isinstance(event, BatchAppended) else SEALED_REPLACED
    assert record == ("histlog.events.BatchAppended/3" if isinstance(event, BatchAppended)
                      else "histlog.events.TurnReplaced/2")
    ad = b"histlog sealed v1" + field(record) + field(event.conversation_id) + field(event.append_id) + field(
        key.key_id)
    enc = AESGCM(hkdf(b"histlog data key v1: aes-256-gcm"))
    assert enc.encrypt(event.sealed.nonce, content, ad) == event.sealed.ciphertext
    mac = hmac.new(hkdf(b"histlog data key v1: hmac-sha256"), content, hashlib.sha256).digest()
    assert mac == event.sealed.mac


def test_an_old_version_1_batch_still_decodes_without_a_precondition() -> None:
    _, golden = load_golden("batch_appended_v1")
    assert golden[2:HEADER_SIZE] == BATCH_APPENDED_V1_FINGERPRINT
    assert BATCH_APPENDED_V1_FINGERPRINT.hex() == PINNED_V1_BATCH
    decoded = decode_event(golden)
    assert isinstance(decoded, BatchAppended) and decoded.expected_last is None
    assert encode_event(decoded)[2:HEADER_SIZE] == BATCH_APPENDED_V2_FINGERPRINT  # rewritten plain: version 2


def test_golden_batch_digest_is_the_sha256_of_its_messages() -> None:
    import hashlib

    event, _ = load_golden("batch_appended")
    assert isinstance(event, BatchAppended)
    assert event.digest == "sha256:" + hashlib.sha256(event.messages).hexdigest()


@pytest.mark.parametrize("name", sorted(PINNED))
def test_fingerprints_are_pinned(name: str) -> None:
    assert fingerprint_of(name).hex() == PINNED[name], f"BREAKING LOG FORMAT CHANGE: schema {name} changed"
    assert fingerprint_of(f"histlog.events.{name}") == fingerprint_of(name)


def test_plain_fingerprints_are_pinned() -> None:
    assert BATCH_APPENDED_V2_FINGERPRINT.hex() == PINNED_PLAIN["BatchAppended"]
    assert TURN_REPLACED_V1_FINGERPRINT.hex() == PINNED_PLAIN["TurnReplaced"]


def test_fingerprint_constants_match() -> None:
    assert fingerprint_of(BatchAppended) == BATCH_APPENDED_FINGERPRINT
    assert fingerprint_of(ConversationCleared) == CONVERSATION_CLEARED_FINGERPRINT
    assert fingerprint_of(TurnReplaced) == TURN_REPLACED_FINGERPRINT


def test_fingerprints_are_crc64_avro_of_the_parsing_canonical_form() -> None:
    assert crc64_avro(b'"int"').hex() == "8f5c393f1ad57572"  # Avro's own test vector
    canonical = (
        '{"name":"histlog.events.ConversationCleared","type":"record","fields":'
        '[{"name":"conversation_id","type":"string"},{"name":"created_at_ms","type":"long"}]}'
    )
    assert crc64_avro(canonical.encode()) == CONVERSATION_CLEARED_FINGERPRINT
    assert schema_fingerprint(current_schema(ConversationCleared)) == CONVERSATION_CLEARED_FINGERPRINT


def test_docs_show_the_golden_hex_dumps_and_fingerprints() -> None:
    text = DOCS.read_text(encoding="utf-8")
    blocks = {parse_hex_dump(b) for b in re.findall(r"```hexdump\n(.*?)```", text, flags=re.S)}
    for name in WRITTEN_GOLDENS:
        assert load_golden(name)[1] in blocks, f"docs/events.md lacks the {name} worked example"
    for hexprint in [*PINNED.values(), *PINNED_SEALED.values(), *PINNED_PLAIN.values(), PINNED_V1_BATCH,
                     PINNED_RUN_BATCH]:
        assert hexprint in text


def test_unknown_fingerprint_fixture_documented_reason() -> None:
    _, golden = load_golden("conversation_cleared")
    unknown = golden[:2] + bytes(8) + golden[HEADER_SIZE:]
    assert reason_of(unknown) == "unknown schema fingerprint 0000000000000000"


# --------------------------------------------------------------------------- corrupt values


def test_empty_value_is_too_short() -> None:
    assert reason_of(b"") == "too short"


def test_one_byte_is_too_short() -> None:
    assert reason_of(b"\xc3") == "too short"


def test_header_without_body_is_undecodable() -> None:
    assert reason_of(MAGIC + BATCH_APPENDED_FINGERPRINT).startswith("undecodable body: ")


def test_bad_magic() -> None:
    data = encode_event(sample_batch())
    assert reason_of(b"\xc3\x02" + data[2:]) == "bad magic"
    assert reason_of(b"\x00" + data[1:]) == "bad magic"


def test_unknown_fingerprint_names_it() -> None:
    data = encode_event(sample_batch())
    bogus = bytes.fromhex("0123456789abcdef")
    assert reason_of(MAGIC + bogus + data[HEADER_SIZE:]) == "unknown schema fingerprint 0123456789abcdef"


def test_every_truncation_of_the_body_is_undecodable() -> None:
    data = encode_event(sample_batch())
    for end in range(HEADER_SIZE, len(data)):
        assert reason_of(data[:end]).startswith("undecodable body: "), end


def test_trailing_bytes_are_corrupt() -> None:
    data = encode_event(sample_batch())
    assert reason_of(data + b"\x00") == "trailing bytes"
    assert reason_of(encode_event(ConversationCleared("c", 1)) + b"xyz") == "trailing bytes"


def test_invalid_utf8_in_a_string_is_undecodable() -> None:
    body = b"\x02\xff" + b"\x02a" + b"\x02d" + b"\x00" + b"\x02" + b"\x00" + b"\x00"
    assert reason_of(MAGIC + BATCH_APPENDED_FINGERPRINT + body).startswith("undecodable body: ")


def test_negative_length_is_undecodable() -> None:
    body = b"\x01" + b"\x02a\x02d\x00\x02\x00\x00"
    assert reason_of(MAGIC + BATCH_APPENDED_FINGERPRINT + body).startswith("undecodable body: ")


def test_body_of_the_other_event_type_is_detected() -> None:
    clear = encode_event(ConversationCleared("c", 1))
    relabelled = MAGIC + BATCH_APPENDED_FINGERPRINT + clear[HEADER_SIZE:]
    with pytest.raises(CorruptLog):
        decode_event(relabelled)


def test_corrupt_log_carries_reason_and_cause() -> None:
    data = encode_event(sample_batch())
    with pytest.raises(CorruptLog) as info:
        decode_event(data[:-3])
    assert info.value.__cause__ is not None
    assert "undecodable" in str(info.value)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_random_garbage_raises_only_corrupt_log(data: bytes) -> None:
    try:
        decode_event(data)
    except CorruptLog as err:
        assert err.reason


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from([BATCH_APPENDED_FINGERPRINT, CONVERSATION_CLEARED_FINGERPRINT]),
    st.binary(max_size=300),
)
def test_random_bodies_behind_a_valid_header_raise_only_corrupt_log(fp: bytes, body: bytes) -> None:
    try:
        event = decode_event(MAGIC + fp + body)
    except CorruptLog as err:
        assert err.reason
    else:
        assert isinstance(event, BatchAppended | ConversationCleared)


@settings(max_examples=400)
@given(events, st.data())
def test_flipped_bytes_raise_only_corrupt_log(event: Event, data: st.DataObject) -> None:
    raw = bytearray(encode_event(event))
    index = data.draw(st.integers(0, len(raw) - 1))
    raw[index] ^= data.draw(st.integers(1, 255))
    try:
        decode_event(bytes(raw))
    except CorruptLog as err:
        assert err.reason


def test_bytes_like_inputs_are_accepted() -> None:
    data = encode_event(sample_batch())
    assert decode_event(bytearray(data)) == sample_batch()  # type: ignore[arg-type]
    assert decode_event(memoryview(data)) == sample_batch()  # type: ignore[arg-type]


# --------------------------------------------------------------------------- field rules


def sample_replaced() -> TurnReplaced:
    fields = dataclasses.asdict(sample_batch())
    for only_batches in ("expected_last", "turn_id", "turn_position"):
        del fields[only_batches]
    return TurnReplaced(**fields, old_turn_id="a0/0", reason="edit")


def sample_of(kind: str) -> Event:
    return {"BatchAppended": sample_batch(), "TurnReplaced": sample_replaced(),
            "ConversationCleared": ConversationCleared("conv-1", 1_767_225_600_000)}[kind]


BAD_FIELDS: list[tuple[str, str, Any]] = [
    *[(kind, "conversation_id", bad) for kind in ("BatchAppended", "TurnReplaced", "ConversationCleared")
      for bad in ("", " c", "c\x00", "x" * 1025)],
    *[(kind, "created_at_ms", bad) for kind in ("BatchAppended", "TurnReplaced", "ConversationCleared")
      for bad in (-1, MAX_TIME_MS + 1, -(2**63), 2**63 - 1)],
    *[(kind, field, bad) for kind in ("BatchAppended", "TurnReplaced") for field, bad in [
        ("append_id", ""), ("append_id", "a\n"), ("append_id", "\u2028a"),
        ("digest", ""), ("digest", "sha256:" + "AB" * 32), ("digest", "sha256:" + "ab" * 31),
        ("digest", "md5:" + "ab" * 32), ("digest", "sha256:" + "ab" * 32 + "\n"),
        ("message_count", 0), ("message_count", -1), ("message_count", -(2**31)),
        ("content_bytes", -1), ("content_bytes", -(2**63))]],
    ("BatchAppended", "expected_last", " a1"),
    ("BatchAppended", "expected_last", "a\x1f"),
    *[("TurnReplaced", "old_turn_id", bad) for bad in ("", "a0", "a0/", "/0", "a0/01", "a0/-1", "a0/x", " a/0")],
    *[("TurnReplaced", "reason", bad) for bad in ("", "Edit", "regenerate", "edit ")],
]


@pytest.mark.parametrize(("kind", "field", "bad"), BAD_FIELDS)
def test_a_field_outside_its_rule_is_corrupt_with_its_name(kind: str, field: str, bad: Any) -> None:
    record = dataclasses.asdict(sample_of(kind)) | {field: bad}
    assert reason_of(frame(current_schema(kind), record)).startswith(f"invalid {field}: ")


@pytest.mark.parametrize("kind", ["BatchAppended", "TurnReplaced", "ConversationCleared"])
@pytest.mark.parametrize("ms", [0, 1, MAX_TIME_MS])
def test_every_representable_time_decodes(kind: str, ms: int) -> None:
    event = dataclasses.replace(sample_of(kind), created_at_ms=ms)
    assert decode_event(encode_event(event)) == event


def test_a_precondition_of_none_or_of_no_append_yet_is_valid() -> None:
    for expected in (None, "", "a0"):
        event = dataclasses.replace(sample_batch(), expected_last=expected)
        assert decode_event(encode_event(event)).expected_last == expected


def test_decoded_ids_are_validated_id_types() -> None:
    event = decode_event(encode_event(sample_batch()))
    assert type(event.conversation_id) is ConversationID
    assert type(event.append_id).__name__ == "AppendID"


def test_representable_times_are_exact_datetimes() -> None:
    from datetime import UTC, datetime

    from schemas.times import time_of

    assert time_of(0) == datetime(1970, 1, 1, tzinfo=UTC)
    assert time_of(MAX_TIME_MS) == datetime(9999, 12, 31, 23, 59, 59, 999_000, tzinfo=UTC)
    assert time_of(1_767_225_600_123).microsecond == 123_000


@pytest.mark.parametrize("ms", [-1, MAX_TIME_MS + 1])
def test_the_event_constructors_refuse_an_unrepresentable_time(ms: int) -> None:
    from schemas.batch import Batch
    from schemas.messages import Message

    batch = Batch("c", "a", [Message.user("x")])
    with pytest.raises(InvalidConfiguration, match="created_at_ms"):
        BatchAppended.of(batch, ms)
    with pytest.raises(InvalidConfiguration, match="created_at_ms"):
        TurnReplaced.of(batch, ms, "a0/0", "edit")
    with pytest.raises(InvalidConfiguration, match="created_at_ms"):
        encode_event(ConversationCleared("c", ms))


@pytest.mark.parametrize("ns", [-1_000_000, (MAX_TIME_MS + 1) * 1_000_000])
def test_a_host_clock_outside_the_representable_times_is_refused(ns: int, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from schemas.times import now_ms

    monkeypatch.setattr(time, "time_ns", lambda: ns)
    with pytest.raises(InvalidConfiguration, match=r"host clock.*fix the clock"):
        now_ms()


# --------------------------------------------------------------------------- evolution


def frame(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    schemaless_writer(buf, parse_schema(schema), record)
    return MAGIC + schema_fingerprint(schema) + buf.getvalue()


def test_newer_writer_with_an_added_defaulted_field_decodes_as_today() -> None:
    newer = current_schema(BatchAppended)
    newer["fields"].append({"name": "model", "type": "string", "default": "", "doc": "test only"})
    record = dataclasses.asdict(sample_batch()) | {"model": "gpt-test"}
    data = frame(newer, record)
    assert reason_of(data).startswith("unknown schema fingerprint ")  # poison until registered
    fp = register_writer_schema(newer)
    assert data[2:HEADER_SIZE] == fp != BATCH_APPENDED_FINGERPRINT
    assert decode_event(data) == sample_batch()
    assert register_writer_schema(newer) == fp  # idempotent


def test_older_writer_with_an_int_timestamp_is_promoted_to_long() -> None:
    older = current_schema(ConversationCleared)
    older["fields"][1]["type"] = "int"
    register_writer_schema(older)
    data = frame(older, {"conversation_id": "c", "created_at_ms": 7})
    assert decode_event(data) == ConversationCleared("c", 7)


def test_writer_lacking_a_field_the_reader_cannot_default_is_refused_at_registration() -> None:
    older = current_schema(ConversationCleared)
    older["fields"][0]["name"] = "conversation"  # renamed since; no alias in the current schema
    with pytest.raises(ValueError, match="lacks field 'conversation_id'"):
        register_writer_schema(older)


def test_registering_a_schema_of_no_known_event_fails() -> None:
    with pytest.raises(ValueError, match="no current event"):
        register_writer_schema({"type": "record", "name": "histlog.events.Nope", "fields": []})
    with pytest.raises(ValueError):
        register_writer_schema({"type": "record", "name": "x"})  # no fields: does not parse


def test_registering_the_current_schema_is_a_no_op() -> None:
    assert register_writer_schema(current_schema(BatchAppended)) == BATCH_APPENDED_FINGERPRINT
    assert decode_event(encode_event(sample_batch())) == sample_batch()


def test_unknown_event_name_has_no_fingerprint() -> None:
    with pytest.raises(KeyError):
        fingerprint_of("MessageEdited")
