"""The sealed event schemas (schemas/batch_appended.v3.avsc, schemas/turn_replaced.v2.avsc) are an
Avro evolution of today's: every older writer resolves into them (plain records read with
``sealed = null``), a sealed record round-trips, and today's reader, which does not know them,
reports a sealed record as poison (unknown fingerprint), never crashes or reads it as plain."""

from __future__ import annotations

import json
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer

from schemas.errors import CorruptLog
from schemas.events import MAGIC, BatchAppended, decode_event, schema_fingerprint
from schemas.sealed import SEALED_BATCH, SEALED_REPLACED, DataKey, open_sealed, seal

DIR = Path(__file__).resolve().parents[2] / "schemas"
CONTENT = b'[{"parts":[{"kind":"text","text":"hi"}],"role":"user"}]'
DIGEST = "sha256:" + "ab" * 32
KEY = DataKey.generate()


def _schema(name: str) -> Any:
    return parse_schema(json.loads((DIR / name).read_text(encoding="utf-8")))


def _write(schema: Any, record: dict[str, Any]) -> bytes:
    buf = BytesIO()
    schemaless_writer(buf, schema, record)
    return buf.getvalue()


def _read(body: bytes, writer: Any, reader: Any) -> dict[str, Any]:
    return schemaless_reader(BytesIO(body), writer, reader)  # type: ignore[no-any-return]


BASE = {"conversation_id": "c", "append_id": "a", "message_count": 1, "content_bytes": 40, "created_at_ms": 1}
PLAIN = {**BASE, "digest": DIGEST, "messages": CONTENT}
CASES = [
    ("batch_appended.v1.avsc", "batch_appended.v3.avsc", PLAIN),
    ("batch_appended.avsc", "batch_appended.v3.avsc", {**PLAIN, "expected_last": ""}),
    ("turn_replaced.avsc", "turn_replaced.v2.avsc", {**PLAIN, "old_turn_id": "a0/0", "reason": "edit"}),
]


@pytest.mark.parametrize(("old", "new", "record"), CASES)
def test_plain_records_of_every_older_writer_resolve_with_sealed_null(old: str, new: str,
                                                                       record: dict[str, Any]) -> None:
    got = _read(_write(_schema(old), record), _schema(old), _schema(new))
    assert got["sealed"] is None
    assert got["digest"] == DIGEST and got["messages"] == CONTENT
    assert {k: got[k] for k in record} == record


@pytest.mark.parametrize(("name", "record_name", "extra"), [
    ("batch_appended.v3.avsc", SEALED_BATCH, {"expected_last": None}),
    ("turn_replaced.v2.avsc", SEALED_REPLACED, {"old_turn_id": "a0/0", "reason": "retry"}),
])
def test_sealed_record_round_trips_and_holds_no_plain_content(name: str, record_name: str,
                                                               extra: dict[str, Any]) -> None:
    s = seal(KEY, CONTENT, conversation_id="c", append_id="a", record=record_name)
    record = {**BASE, **extra, "digest": "", "messages": b"",
              "sealed": {"key_id": s.key_id, "nonce": s.nonce, "ciphertext": s.ciphertext, "mac": s.mac}}
    schema = _schema(name)
    body = _write(schema, record)
    assert CONTENT not in body and b"sha256" not in body
    got = _read(body, schema, schema)
    assert got == record
    sealed = type(s)(**got["sealed"])
    assert open_sealed(KEY, sealed, conversation_id="c", append_id="a", record=record_name) == CONTENT


@pytest.mark.parametrize("bad", [{"nonce": b"\0" * 11}, {"mac": b"\0" * 31}])
def test_fixed_sizes_are_enforced_by_the_schema(bad: dict[str, bytes]) -> None:
    sealed = {"key_id": KEY.key_id, "nonce": b"\0" * 12, "ciphertext": b"\0" * 16, "mac": b"\0" * 32, **bad}
    with pytest.raises(ValueError):
        _write(_schema("batch_appended.v3.avsc"), {**BASE, "digest": "", "messages": b"", "sealed": sealed})


def test_new_fingerprints_differ_and_an_old_reader_reports_them_as_poison() -> None:
    v3 = _schema("batch_appended.v3.avsc")
    prints = {schema_fingerprint(_schema(n)) for n in ("batch_appended.v1.avsc", "batch_appended.avsc",
                                                        "turn_replaced.avsc", "turn_replaced.v2.avsc")}
    assert schema_fingerprint(v3) not in prints and len(prints) == 4
    s = seal(KEY, CONTENT, conversation_id="c", append_id="a")
    body = _write(v3, {**BASE, "digest": "", "messages": b"", "expected_last": None,
                       "sealed": {"key_id": s.key_id, "nonce": s.nonce, "ciphertext": s.ciphertext, "mac": s.mac}})
    event = decode_event(MAGIC + schema_fingerprint(v3) + body)  # this reader knows the sealed schema
    assert isinstance(event, BatchAppended) and event.sealed == s and event.digest == "" and event.messages == b""
    # A reader of a release before sealing knew only the plain fingerprints (what it would say is
    # what today's reader says of any fingerprint it does not know):
    with pytest.raises(CorruptLog, match="unknown schema fingerprint"):
        decode_event(MAGIC + bytes(8) + body)


def test_the_documented_fingerprints_are_the_files() -> None:
    doc = (DIR.parent / "docs" / "erasure.md").read_text(encoding="utf-8")
    for name in ("batch_appended.v3.avsc", "turn_replaced.v2.avsc"):
        assert f"`schemas/{name}`, fingerprint `{schema_fingerprint(_schema(name)).hex()}`" in doc
