"""The poison-record fuzzer (issue 11): nothing a producer can put on the log stops the projector.

Valid events of every type are mutated field by field (ints to the edges of and past their Avro
and row ranges, strings to "", control characters, lone surrogates as raw UTF-8 bytes, huge
values, wrong digest formats; ``messages`` to non-canonical, invalid or deeply nested JSON), and
mixed with random byte strings and truncations and bit flips of valid encodings. The records
are appended directly to a real 2-partition FileLog, next to valid events that build up state
(duplicates, conflicts, clears, replacements), with a custom projection live. Then:

* the projector never stops: ``stats()`` answers, and a valid append after the garbage is
  accepted and readable;
* ``stats().corrupt`` counts exactly the records that are not valid events, as judged by an
  oracle written here from docs/events.md (fastavro decoding plus the field rules), not by the
  code under test;
* every instance decides the same: a second engine on a copy of the log (state built from
  scratch, projection caught up afterwards) gives identical stats, poison list, reads and
  projection rows;
* no read API raises anything but its documented errors.

Examples: ``HISTLOG_FUZZ_EXAMPLES`` (default 25, a few seconds each... under ~30 s in all);
set it to thousands for a long run.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from io import BytesIO
from pathlib import Path
from typing import Any

from fastavro import parse_schema, schemaless_reader
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import HistoryEngine
from engine.log.base import record_key
from schemas import Batch, HistoryError, Message, WindowTooSmall
from schemas.events import (
    BATCH_APPENDED_V2_FINGERPRINT,
    MAGIC,
    TURN_REPLACED_V1_FINGERPRINT,
    current_schema,
    fingerprint_of,
)
from schemas.ids import AppendID, ConversationID
from tests.poison_support import Tape, batch_record, clear_record, replaced_record, snapshot

EXAMPLES = int(os.environ.get("HISTLOG_FUZZ_EXAMPLES", "25"))
SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schemas"

KINDS = ("BatchAppended", "TurnReplaced", "ConversationCleared")
CONVS = ("c0", "c1", "c2", "c3", "c4")
APPENDS = ("a0", "a1", "a2", "a3")
LAST_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z (docs/events.md)

# The fuzzed records are *plain* ones (what a writer without sealing, and every release before
# it, puts on the log): their schemas and fingerprints. Sealed records are fuzzed by the sealed
# schema tests (tests/unit/test_sealed_schemas.py) and the erasure tests.
_PLAIN_FILES = {"BatchAppended": ("batch_appended.avsc", BATCH_APPENDED_V2_FINGERPRINT),
                "TurnReplaced": ("turn_replaced.avsc", TURN_REPLACED_V1_FINGERPRINT)}


def plain_schema(kind: str) -> dict[str, Any]:
    if kind not in _PLAIN_FILES:
        return current_schema(kind)
    schema: dict[str, Any] = json.loads((SCHEMA_DIR / _PLAIN_FILES[kind][0]).read_text("utf-8"))
    return schema


def plain_fingerprint(kind: str) -> bytes:
    return _PLAIN_FILES[kind][1] if kind in _PLAIN_FILES else fingerprint_of(kind)


# --------------------------------------------------------------------------- raw Avro writer
# Written here, not with fastavro or encode_event, so any int (2**64, 2**100) and any raw string
# bytes (invalid UTF-8, a lone surrogate) can be put on the log.


def _varint(n: int) -> bytes:
    u = (n << 1) if n >= 0 else ((-n << 1) - 1)  # zigzag, for any size of int
    out = bytearray()
    while True:
        byte, u = u & 0x7F, u >> 7
        out.append(byte | (0x80 if u else 0))
        if not u:
            return bytes(out)


def _value(avro_type: Any, value: Any) -> bytes:
    if isinstance(avro_type, list):  # ["null", "string"]
        return _varint(0) if value is None else _varint(1) + _value("string", value)
    if avro_type in ("int", "long"):
        return _varint(value)
    raw = value if isinstance(value, bytes) else value.encode("utf-8", "surrogatepass")
    return _varint(len(raw)) + raw


def raw_event(kind: str, record: dict[str, Any]) -> bytes:
    body = b"".join(_value(f["type"], record[f["name"]]) for f in plain_schema(kind)["fields"])
    return MAGIC + plain_fingerprint(kind) + body


# --------------------------------------------------------------------------- the oracle

_READERS: dict[bytes, tuple[str, Any, Any]] = {
    plain_fingerprint(kind): (kind, parse_schema(plain_schema(kind)), None) for kind in KINDS
}
_V1 = parse_schema(json.loads((SCHEMA_DIR / "batch_appended.v1.avsc").read_text("utf-8")))
_READERS[bytes.fromhex("c22957e66f4f2191")] = ("BatchAppended", _V1, parse_schema(plain_schema("BatchAppended")))


def _is_id(value: Any) -> bool:
    try:
        ConversationID(value)
        AppendID(value)
    except HistoryError:
        return False
    return True


def _is_turn_id(value: str) -> bool:
    m = re.fullmatch(r"(.*)/(0|[1-9][0-9]{0,9})", value, re.DOTALL)
    return m is not None and _is_id(m.group(1))


def is_valid(key: bytes, value: bytes) -> bool:
    """Whether ``(key, value)`` is a valid event (docs/events.md §1 and §5), judged independently."""
    if len(value) < 10 or value[:2] != MAGIC or value[2:10] not in _READERS:
        return False
    kind, writer, reader = _READERS[value[2:10]]
    buf = BytesIO(value[10:])
    try:
        rec = schemaless_reader(buf, writer, reader)
    except Exception:
        return False
    if buf.tell() != len(value) - 10 or not isinstance(rec, dict):
        return False
    if not _is_id(rec["conversation_id"]) or not 0 <= rec["created_at_ms"] <= LAST_MS:
        return False
    if kind == "ConversationCleared":
        return key == rec["conversation_id"].encode() + b"\x1f"
    if not _is_id(rec["append_id"]) or key != record_key(rec["conversation_id"], rec["append_id"]):
        return False
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", rec["digest"]):
        return False
    if rec["digest"] != "sha256:" + hashlib.sha256(rec["messages"]).hexdigest():
        return False
    if not 1 <= rec["message_count"] < 2**31 or not 0 <= rec["content_bytes"] < 2**63:
        return False
    if kind == "BatchAppended" and rec["expected_last"] not in (None, "") and not _is_id(rec["expected_last"]):
        return False
    if kind == "TurnReplaced" and (not _is_turn_id(rec["old_turn_id"]) or rec["reason"] not in ("edit", "retry")):
        return False
    try:
        batch = Batch.from_canonical(rec["conversation_id"], rec["append_id"], rec["messages"])
    except HistoryError:
        return False
    if len(batch) != rec["message_count"] or batch.content_bytes() != rec["content_bytes"]:
        return False
    return kind != "TurnReplaced" or batch.messages[0].role == "user"


# --------------------------------------------------------------------------- strategies

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
TIMES = st.sampled_from([0, 1, 1_767_225_600_000, LAST_MS])
NASTY_INTS = st.sampled_from([
    -1, 0, 1, 2**31 - 1, 2**31, 2**32, 2**63 - 1, 2**63, 2**64, 2**64 + 1, 2**100,
    -(2**31), -(2**63), -(2**63) - 1, -(2**64), LAST_MS, LAST_MS + 1, 253_402_300_800_000,
])
NASTY_STRINGS = st.sampled_from([
    "", " ", "a ", " a", "\t", "\x00", "a\x1fb", "a\x7f", "\x85", "\u2028", "a\nb", "x" * 1025,
    "é" * 600, "a/0", "a0/0", "a0/00", "/", "sha256:", "sha256:" + "0" * 64, "sha256:" + "F" * 64,
    "sha256:" + "0" * 63, "SHA256:" + "0" * 64, "edit", "retry", "Edit",
    b"\xed\xa0\x80", b"a\xed\xb0\x80", b"\xff\xfe", b"\xc3", b"\x80",  # lone surrogates, invalid UTF-8
])
_DEEP = (b'[{"metadata":{"k":' + b"[" * 10_000 + b"]" * 10_000
         + b'},"parts":[{"kind":"text","text":"x"}],"role":"user"}]')
_USER = b'{"parts":[{"kind":"text","text":"hi"}],"role":"user"}'
NASTY_MESSAGES = st.sampled_from([
    b"", b"[]", b"{}", b"null", b"[null]", b"[" + _USER, _USER, b"[" + _USER + b"]\n", b" [" + _USER + b"]",
    b'[{"role":"user","parts":[{"kind":"text","text":"hi"}]}]',  # keys not sorted
    b'[{"parts":[{"kind":"text","text":"hi","citations":[]}],"role":"user"}]',  # default not omitted
    b'[{"parts":[{"kind":"tool_call","id":"t","name":"n","arguments":""}],"role":"user"}]',  # kind not allowed
    b'[{"metadata":{"k":1.50},"parts":[{"kind":"text","text":"hi"}],"role":"user"}]',  # valid, exact number
    b'[{"metadata":{"k":NaN},"parts":[{"kind":"text","text":"hi"}],"role":"user"}]',
    b'[{"metadata":{"k":1,"k":2},"parts":[{"kind":"text","text":"hi"}],"role":"user"}]',
    b'[{"parts":[{"kind":"text","text":"\xed\xa0\x80"}],"role":"user"}]',
    b'[{"parts":[{"kind":"text","text":"\\ud800"}],"role":"user"}]',
    b'[{"parts":[{"kind":"text","text":"hi"}],"role":"assistant"}]',  # fine, but not a replacement turn
    _DEEP, b"[" * 5000,
])

fields_of = {kind: [f["name"] for f in plain_schema(kind)["fields"]] for kind in KINDS}


@st.composite
def valid_records(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    kind = draw(st.sampled_from(KINDS))
    conv, append, when = draw(st.sampled_from(CONVS)), draw(st.sampled_from(APPENDS)), draw(TIMES)
    if kind == "ConversationCleared":
        return kind, clear_record(conv, when)
    text = draw(TEXT)
    if kind == "TurnReplaced":
        old = f"{draw(st.sampled_from((*APPENDS, 'r0', 'r1')))}/0"
        reason = draw(st.sampled_from(["edit", "retry"]))
        return kind, replaced_record(conv, "r" + append[1:], text, when, old, reason)
    expected = draw(st.sampled_from([None, "", *APPENDS]))
    return kind, batch_record(conv, append, text, when, expected)


def _refresh(record: dict[str, Any]) -> None:
    """Make digest, count and sizes agree with ``messages`` again (so deeper rules are reached)."""
    record["digest"] = "sha256:" + hashlib.sha256(record["messages"]).hexdigest()
    try:
        batch = Batch.from_canonical("c", "a", record["messages"])
    except HistoryError:
        return
    record["message_count"], record["content_bytes"] = len(batch), batch.content_bytes()


@st.composite
def mutated_records(draw: st.DrawFn) -> tuple[bytes, bytes]:
    kind, record = draw(valid_records())
    original_key = record_key(record["conversation_id"], record.get("append_id", ""))
    field = draw(st.sampled_from(fields_of[kind]))
    avro_type = next(f["type"] for f in plain_schema(kind)["fields"] if f["name"] == field)
    if field == "messages":
        record["messages"] = draw(NASTY_MESSAGES)
        if draw(st.booleans()):
            _refresh(record)
    elif avro_type in ("int", "long"):
        record[field] = draw(NASTY_INTS)
    else:
        record[field] = draw(NASTY_STRINGS | st.none()) if field == "expected_last" else draw(NASTY_STRINGS)
    key = original_key
    if field in ("conversation_id", "append_id") and draw(st.booleans()):
        try:  # the key an honest producer would give the mutated ids
            key = record_key(record["conversation_id"], record.get("append_id", ""))
        except (HistoryError, AttributeError, TypeError):
            key = original_key
    return key, raw_event(kind, record)


@st.composite
def damaged_records(draw: st.DrawFn) -> tuple[bytes, bytes]:
    kind, record = draw(valid_records())
    data = bytearray(raw_event(kind, record))
    key = record_key(record["conversation_id"], record.get("append_id", ""))
    if draw(st.booleans()):
        data = data[:draw(st.integers(0, len(data) - 1))]
    else:
        for _ in range(draw(st.integers(1, 3))):
            data[draw(st.integers(0, len(data) - 1))] ^= draw(st.integers(1, 255))
    return key, bytes(data)


@st.composite
def good_records(draw: st.DrawFn) -> tuple[bytes, bytes]:
    kind, record = draw(valid_records())
    return record_key(record["conversation_id"], record.get("append_id", "")), raw_event(kind, record)


_BATCH_HEADER = MAGIC + plain_fingerprint("BatchAppended")
garbage = st.tuples(st.sampled_from([b"c0\x1fa0", b"c1\x1f", b"", b"\x1f"]) | st.binary(max_size=20),
                    st.binary(max_size=200) | st.binary(max_size=30).map(lambda b: _BATCH_HEADER + b))
records = st.lists(st.one_of(good_records(), good_records(), mutated_records(), damaged_records(), garbage),
                   min_size=1, max_size=30)


# --------------------------------------------------------------------------- the property


def _read_everything(engine: HistoryEngine) -> dict[str, Any]:
    """Every read API on every conversation: only documented errors may come out."""
    out = snapshot(engine)
    for c in [*engine.conversations(), *CONVS]:
        for limit in (1, 3, 50):
            try:
                out[f"window {c} {limit}"] = [m.canonical_json() for m in engine.window(c, limit)]
            except WindowTooSmall:
                out[f"window {c} {limit}"] = "too small"
        load = engine.read_within_bytes(c, 200)
        out[f"bytes {c}"] = ([m.id for m in load.messages], load.truncated)
        for entry in engine.entries(c):
            out[f"turn {c} {entry.id}"] = engine.turn(c, entry.id).id if entry.message.role == "user" else None
        checkpoint = engine.latest_interrupted_checkpoint(c)
        out[f"interrupted {c}"] = None if checkpoint is None else checkpoint.id
    return out


@settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES <= 100,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(records)
def test_no_record_stops_the_projector_and_every_instance_decides_the_same(
        batch: list[tuple[bytes, bytes]]) -> None:
    with tempfile.TemporaryDirectory(prefix="histlog-fuzz-") as tmp:
        first, second = Path(tmp) / "first", Path(tmp) / "second"
        with HistoryEngine.open(first, partitions=2) as eng:
            eng.register(Tape())
            for key, value in batch:
                eng.log.append(key, value)
            sentinel = eng.append(Batch("sentinel", "s1", [Message.user("after the garbage")]))
            assert eng.catch_up(timeout=30)
            assert [m.text() for m in eng.read("sentinel", at_least=sentinel)] == ["after the garbage"]
            stats = eng.stats()
            assert stats.corrupt == sum(not is_valid(k, v) for k, v in batch)
            assert len(eng.poison()) == stats.corrupt
            expected = _read_everything(eng)
            tape = eng.view(Tape.name).scan(b"")
        shutil.copytree(first / "log", second / "log")
        shutil.copytree(first / "keys", second / "keys")  # the sentinels are sealed under these
        with HistoryEngine.open(second) as other:
            assert _read_everything(other) == expected
            other.register(Tape())
            assert other.view(Tape.name).scan(b"") == tape


def test_the_oracle_tells_valid_from_invalid() -> None:
    """The oracle itself: a valid record is valid, each kind of damage is not."""
    kind, record = "BatchAppended", batch_record("c0", "a0", "hi", 0)
    key = record_key("c0", "a0")
    assert is_valid(key, raw_event(kind, record))
    assert not is_valid(record_key("c0", "a1"), raw_event(kind, record))
    assert not is_valid(key, raw_event(kind, record | {"created_at_ms": -1}))
    assert not is_valid(key, raw_event(kind, record | {"message_count": 2**40}))
    assert not is_valid(key, raw_event(kind, record | {"expected_last": b"\xed\xa0\x80"}))
    assert not is_valid(key, raw_event(kind, record)[:-1])
    assert is_valid(b"c0\x1f", raw_event("ConversationCleared", clear_record("c0", LAST_MS)))
    assert not is_valid(b"c0\x1f", raw_event("ConversationCleared", clear_record("c0", LAST_MS + 1)))
