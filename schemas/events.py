"""The log's event records and their codec: Avro single-object encoding (about 550 lines: the
events, their plain and sealed forms and their codec are one wire format, kept in one module;
the field rules live in ``schemas.event_rules``, the cipher in ``schemas.sealed``, sealing,
opening and checking an event's content in ``schemas.event_content``).

Every log value is one event framed as Avro *single-object encoding*::

    C3 01 | CRC-64-AVRO fingerprint of the writer schema (8 bytes, little-endian) | Avro binary body

``docs/events.md`` is the contract for readers in other languages (schemas, framing,
fingerprints, record key, partitioner, evolution, poison records).

Promises:

* ``decode_event(encode_event(e)) == e`` for every *valid* encodable event.
* ``decode_event`` returns only valid events: every field is checked (``schemas.event_rules``,
  the one home of these rules; table in ``docs/events.md`` §5): ids are valid ``ConversationID`` /
  ``AppendID`` (returned as those types), ``digest`` is ``sha256:`` + 64 lowercase hex digits,
  ``message_count`` is 1..2**31-1, ``content_bytes`` 0..2**63-1, ``created_at_ms`` a
  representable time (``MIN_TIME_MS``..``MAX_TIME_MS``), ``expected_last`` null, ``""`` or an
  append id, ``old_turn_id`` a turn id (``append-id/index``), ``reason`` ``edit`` or ``retry``
  (the time range is defined once, in ``schemas/times.py``).
  ``schemas.event_content.event_batch`` checks the ``messages`` bytes of a decoded event against
  its digest, count and sizes. Together they decide, from the record's bytes alone, whether it is poison, so every
  value that reaches the projections fits their fixed-width rows.
* **Sealed content** (docs/events.md "Sealed content"): ``BatchAppended`` v3 and ``TurnReplaced``
  v2 carry either the plain form (``digest`` + ``messages``) or ``sealed`` (AES-256-GCM under the
  conversation's data key, ``schemas.sealed``) with ``digest`` ``""`` and no ``messages``; a
  sealed record is written with the current schemas, a plain one with the plain schemas of
  every release before sealing (byte for byte what they wrote, so their readers still read
  it). ``schemas.event_content`` (``seal_event`` / ``open_event``) is the one place content is
  sealed and opened; the codec never sees a key store.
* Writers refuse an unrepresentable time before any I/O: ``BatchAppended.of``,
  ``TurnReplaced.of`` and ``encode_event`` raise ``InvalidConfiguration``.
* ``encode_event`` is deterministic: equal events give equal bytes (pinned by golden tests;
  a change is a breaking log-format change).
* ``decode_event`` raises only ``CorruptLog`` (with a short ``reason``) for any input that is
  not exactly one framed event: ``too short``, ``bad magic``, ``unknown schema fingerprint
  <hex>``, ``undecodable body: ...``, ``trailing bytes``, ``invalid <field>: ...``. The caller (the projector) decides
  the policy: count the record as poison, quarantine it with its position, skip it.
* Decoding resolves the writer schema (found by fingerprint) against the *current* reader
  schema of the same record name, so older and newer writers decode as today's dataclasses
  (added fields with defaults, ``int`` -> ``long`` promotion, aliases). Writer schemas other
  than the current ones must be registered with ``register_writer_schema``.

Thread-safe: no shared mutable buffers; the writer registry only ever grows, by atomic dict
assignment.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any, Final

from fastavro import parse_schema, schemaless_reader
from fastavro.schema import fingerprint, to_parsing_canonical_form

from schemas.errors import CorruptLog
from schemas.event_body import (
    ALLOCATED_FIELDS,
    ASSETS_FIELDS,
    BATCH_FIELDS,
    CLEARED_FIELDS,
    DELETED_FIELDS,
    REPLACED_FIELDS,
    RUN_FIELDS,
    SEALED_FIELDS,
    SLOT_FIELDS,
    TAIL_FIELDS,
    Tail,
    allocated_body,
    assets_body,
    batch_body,
    cleared_body,
    deleted_body,
    replaced_body,
    run_body,
)
from schemas.event_rules import (
    INT_MAX,
    INT_MIN,
    LONG_MAX,
    LONG_MIN,
    REPLACE_REASONS,
    InvalidField,
    check_allocated_record,
    check_batch_record,
    check_cleared_record,
    check_deleted_record,
    check_linked_record,
    check_replaced_record,
    check_run_record,
)
from schemas.event_types import (
    NAMESPACE,
    AssetsLinked,
    BatchAppended,
    ConversationCleared,
    Event,
    MessagesDeleted,
    RunBegun,
    TurnAllocated,
    TurnReplaced,
)
from schemas.sealed import Sealed
from schemas.times import check_time_ms

__all__ = [
    "ASSETS_LINKED_FINGERPRINT",
    "BATCH_APPENDED_FINGERPRINT",
    "BATCH_APPENDED_V1_FINGERPRINT",
    "BATCH_APPENDED_V2_FINGERPRINT",
    "BATCH_APPENDED_V4_FINGERPRINT",
    "CONVERSATION_CLEARED_FINGERPRINT",
    "HEADER_SIZE",
    "MAGIC",
    "MESSAGES_DELETED_FINGERPRINT",
    "NAMESPACE",
    "REPLACE_REASONS",
    "RUN_BEGUN_FINGERPRINT",
    "TURN_ALLOCATED_FINGERPRINT",
    "TURN_REPLACED_FINGERPRINT",
    "TURN_REPLACED_V1_FINGERPRINT",
    "AssetsLinked",
    "BatchAppended",
    "ConversationCleared",
    "Event",
    "MessagesDeleted",
    "RunBegun",
    "TurnAllocated",
    "TurnReplaced",
    "current_schema",
    "decode_event",
    "encode_event",
    "fingerprint_of",
    "register_writer_schema",
    "schema_fingerprint",
]

MAGIC: Final = b"\xc3\x01"
"""The two marker bytes that open every single-object-encoded value (Avro spec, format version 1)."""

HEADER_SIZE: Final = 10
"""Marker (2 bytes) + fingerprint (8 bytes); the Avro body follows."""


# --------------------------------------------------------------------------- schemas

_SCHEMA_DIR: Final = Path(__file__).resolve().parent

_CURRENT_FILES: Final[dict[str, str]] = {
    BatchAppended.AVRO_NAME: "batch_appended.v5.avsc",
    ConversationCleared.AVRO_NAME: "conversation_cleared.avsc",
    TurnReplaced.AVRO_NAME: "turn_replaced.v3.avsc",
    RunBegun.AVRO_NAME: "run_begun.avsc",
    TurnAllocated.AVRO_NAME: "turn_allocated.avsc",
    AssetsLinked.AVRO_NAME: "assets_linked.avsc",
    MessagesDeleted.AVRO_NAME: "messages_deleted.avsc",
}
_HISTORIC_FILES: Final = ("batch_appended.v1.avsc", "batch_appended.avsc", "turn_replaced.avsc",
                          "batch_appended.v3.avsc", "turn_replaced.v2.avsc", "batch_appended.v4.avsc")
"""Older writer schemas that logs may hold: registered at import, so old logs still replay.
They are also what ``encode_event`` writes an event *without* a run or fence with, byte for byte
what earlier releases wrote (so their readers still read it): a plain one with
``batch_appended.avsc`` (version 2) / ``turn_replaced.avsc`` (version 1), a sealed one with
``batch_appended.v3.avsc`` / ``turn_replaced.v2.avsc``; a batch with a run or a fence but no turn
slot with ``batch_appended.v4.avsc``. Only a write with a run or a fence needs ``TurnReplaced`` v3,
and only a batch filed under a turn slot ``BatchAppended`` v5."""
_PREFIX_FILES: Final = ("batch_appended.avsc", "turn_replaced.avsc", "batch_appended.v3.avsc",
                        "turn_replaced.v2.avsc", "batch_appended.v4.avsc")
"""The historic writers whose fields are the current schema's first fields exactly: their bodies
are read as written, without fastavro's schema resolution (which costs about as much again per
record on replay); the dataclass's defaults (None) fill the fields they lack."""


def schema_fingerprint(schema: Any) -> bytes:
    """The 8 fingerprint bytes of a schema as they appear in the frame.

    CRC-64-AVRO (Rabin) of the schema's Parsing Canonical Form; fastavro returns the hex of
    the little-endian bytes, which is exactly the on-the-wire order.
    """
    return bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))


@dataclass(frozen=True, slots=True)
class _Writer:
    """A known writer schema: how to read a body written with it."""

    fingerprint: bytes
    name: str
    schema: Any  # the parsed writer schema
    reader: Any  # the parsed current schema of ``name``, or None when the writer *is* it
    build: Callable[[dict[str, Any]], Event]


def _sealed_of(rec: dict[str, Any]) -> None:
    """The record's ``sealed`` union as a ``Sealed`` (absent in plain writers' records)."""
    raw = rec.get("sealed")
    if raw is not None:
        rec["sealed"] = Sealed(raw["key_id"], raw["nonce"], raw["ciphertext"], raw["mac"])


def _build_batch(rec: dict[str, Any]) -> Event:
    check_batch_record(rec)
    _sealed_of(rec)
    return BatchAppended(**rec)


def _build_cleared(rec: dict[str, Any]) -> Event:
    check_cleared_record(rec)
    return ConversationCleared(**rec)


def _build_replaced(rec: dict[str, Any]) -> Event:
    check_replaced_record(rec)
    _sealed_of(rec)
    return TurnReplaced(**rec)


def _build_run(rec: dict[str, Any]) -> Event:
    check_run_record(rec)
    return RunBegun(**rec)


def _build_allocated(rec: dict[str, Any]) -> Event:
    check_allocated_record(rec)
    return TurnAllocated(**rec)


def _build_deleted(rec: dict[str, Any]) -> Event:
    check_deleted_record(rec)
    return MessagesDeleted(**rec)


def _build_linked(rec: dict[str, Any]) -> Event:
    check_linked_record(rec)
    _sealed_of(rec)
    return AssetsLinked(**rec)


_BUILDERS: Final[dict[str, Callable[[dict[str, Any]], Event]]] = {
    BatchAppended.AVRO_NAME: _build_batch,
    ConversationCleared.AVRO_NAME: _build_cleared,
    TurnReplaced.AVRO_NAME: _build_replaced,
    RunBegun.AVRO_NAME: _build_run,
    TurnAllocated.AVRO_NAME: _build_allocated,
    AssetsLinked.AVRO_NAME: _build_linked,
    MessagesDeleted.AVRO_NAME: _build_deleted,
}


def _load_current() -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, bytes]]:
    parsed: dict[str, Any] = {}
    raw: dict[str, dict[str, Any]] = {}
    prints: dict[str, bytes] = {}
    for name, filename in _CURRENT_FILES.items():
        schema = json.loads((_SCHEMA_DIR / filename).read_text(encoding="utf-8"))
        parsed_schema: dict[str, Any] = parse_schema(schema)  # type: ignore[assignment]
        # Invariant: the file declares the record the table says it does.
        assert parsed_schema["name"] == name, (filename, parsed_schema["name"])
        raw[name] = schema
        parsed[name] = parsed_schema
        prints[name] = schema_fingerprint(parsed_schema)
    return parsed, raw, prints


_CURRENT, _CURRENT_RAW, _CURRENT_FINGERPRINTS = _load_current()

BATCH_APPENDED_FINGERPRINT: Final[bytes] = _CURRENT_FINGERPRINTS[BatchAppended.AVRO_NAME]
"""Fingerprint bytes of the current ``BatchAppended`` schema (frame bytes 2..9)."""

CONVERSATION_CLEARED_FINGERPRINT: Final[bytes] = _CURRENT_FINGERPRINTS[ConversationCleared.AVRO_NAME]
"""Fingerprint bytes of the current ``ConversationCleared`` schema (frame bytes 2..9)."""

TURN_REPLACED_FINGERPRINT: Final[bytes] = _CURRENT_FINGERPRINTS[TurnReplaced.AVRO_NAME]
"""Fingerprint bytes of the current ``TurnReplaced`` schema (frame bytes 2..9)."""

RUN_BEGUN_FINGERPRINT: Final[bytes] = _CURRENT_FINGERPRINTS[RunBegun.AVRO_NAME]
"""Fingerprint bytes of the ``RunBegun`` schema (frame bytes 2..9)."""

TURN_ALLOCATED_FINGERPRINT: Final[bytes] = _CURRENT_FINGERPRINTS[TurnAllocated.AVRO_NAME]
"""Fingerprint bytes of the ``TurnAllocated`` schema (frame bytes 2..9)."""

ASSETS_LINKED_FINGERPRINT: Final[bytes] = _CURRENT_FINGERPRINTS[AssetsLinked.AVRO_NAME]
"""Fingerprint bytes of the ``AssetsLinked`` schema (frame bytes 2..9)."""

MESSAGES_DELETED_FINGERPRINT: Final[bytes] = _CURRENT_FINGERPRINTS[MessagesDeleted.AVRO_NAME]
"""Fingerprint bytes of the ``MessagesDeleted`` schema (frame bytes 2..9)."""

_WRITERS: dict[bytes, _Writer] = {
    fp: _Writer(fp, name, _CURRENT[name], None, _BUILDERS[name]) for name, fp in _CURRENT_FINGERPRINTS.items()
}

# Frame prefixes of the current schemas, computed once.
_PREFIX_BATCH: Final = MAGIC + BATCH_APPENDED_FINGERPRINT
_PREFIX_CLEARED: Final = MAGIC + CONVERSATION_CLEARED_FINGERPRINT
_PREFIX_REPLACED: Final = MAGIC + TURN_REPLACED_FINGERPRINT
_PREFIX_RUN: Final = MAGIC + RUN_BEGUN_FINGERPRINT
_PREFIX_ALLOCATED: Final = MAGIC + TURN_ALLOCATED_FINGERPRINT
_PREFIX_LINKED: Final = MAGIC + ASSETS_LINKED_FINGERPRINT
_PREFIX_DELETED: Final = MAGIC + MESSAGES_DELETED_FINGERPRINT


def _full_name(name: str) -> str:
    return name if "." in name else f"{NAMESPACE}.{name}"


def fingerprint_of(name: str | type[Event]) -> bytes:
    """Fingerprint bytes of a record's current schema (``"BatchAppended"``, its full name, or the class)."""
    full = name.AVRO_NAME if isinstance(name, type) else _full_name(name)
    try:
        return _CURRENT_FINGERPRINTS[full]
    except KeyError:
        known = sorted(_CURRENT_FINGERPRINTS)
        raise KeyError(f"no current event schema named {full!r}; known: {known}") from None


def current_schema(name: str | type[Event]) -> dict[str, Any]:
    """A copy of the current schema (as written in its ``.avsc`` file) of a record."""
    full = name.AVRO_NAME if isinstance(name, type) else _full_name(name)
    return json.loads(json.dumps(_CURRENT_RAW[full]))  # type: ignore[no-any-return]


def register_writer_schema(schema: Mapping[str, Any]) -> bytes:
    """Make records written with another version of an event schema decodable; return its fingerprint.

    ``schema`` is a record schema whose full name is one of the current events'. Its bodies
    are resolved against the current schema by Avro's rules, so a reader field without a
    default must exist in the writer (by name or alias) — checked here, not at decode time.
    Idempotent. Raises ``ValueError`` for an unparseable, unknown or irreconcilable schema.
    """
    try:
        parsed = parse_schema(dict(schema))
    except Exception as exc:  # fastavro raises several unrelated types
        raise ValueError(f"writer schema does not parse: {exc}") from exc
    if not isinstance(parsed, dict) or parsed.get("type") != "record":
        raise ValueError("a writer schema must be an Avro record")
    name = parsed["name"]
    if name not in _CURRENT:
        raise ValueError(f"writer schema names {name!r}, which is no current event ({sorted(_CURRENT)})")
    fp = schema_fingerprint(parsed)
    if fp in _WRITERS:
        return fp
    writer_names: set[str] = {f["name"] for f in parsed["fields"]}
    for field in _CURRENT[name]["fields"]:
        names = {field["name"], *field.get("aliases", ())}
        if "default" not in field and not names & writer_names:
            raise ValueError(
                f"writer schema of {name} lacks field {field['name']!r}, which has no default in the "
                "current schema: add a default to the current schema or keep the field"
            )
    _WRITERS[fp] = _Writer(fp, name, parsed, _CURRENT[name], _BUILDERS[name])
    return fp


def _register_historic() -> dict[str, bytes]:
    prints = {}
    for filename in _HISTORIC_FILES:
        schema = json.loads((_SCHEMA_DIR / filename).read_text(encoding="utf-8"))
        fp = prints[filename] = register_writer_schema(schema)
        writer = _WRITERS[fp]
        if filename in _PREFIX_FILES:
            fields = writer.schema["fields"]
            current = _CURRENT[writer.name]["fields"][:len(fields)]
            assert [(f["name"], f["type"]) for f in fields] == [
                (f["name"], f["type"]) for f in current], filename  # Invariant: pinned by the schema files.
            _WRITERS[fp] = _Writer(fp, writer.name, writer.schema, None, writer.build)
    return prints


_HISTORIC_PRINTS: Final = _register_historic()
BATCH_APPENDED_V1_FINGERPRINT: Final[bytes] = _HISTORIC_PRINTS["batch_appended.v1.avsc"]
"""Fingerprint bytes of ``BatchAppended`` version 1 (``schemas/batch_appended.v1.avsc``): still
decoded (``expected_last`` reads as ``None``), never written."""
BATCH_APPENDED_V2_FINGERPRINT: Final[bytes] = _HISTORIC_PRINTS["batch_appended.avsc"]
"""Fingerprint bytes of ``BatchAppended`` version 2 (``schemas/batch_appended.avsc``): what a plain
batch is written with (``seal=False``, and every release before sealing)."""
TURN_REPLACED_V1_FINGERPRINT: Final[bytes] = _HISTORIC_PRINTS["turn_replaced.avsc"]
"""Fingerprint bytes of ``TurnReplaced`` version 1 (``schemas/turn_replaced.avsc``): what a plain
replacement is written with."""
BATCH_APPENDED_V3_FINGERPRINT: Final[bytes] = _HISTORIC_PRINTS["batch_appended.v3.avsc"]
"""Fingerprint bytes of ``BatchAppended`` version 3: what a sealed batch without run or fence is written with."""
TURN_REPLACED_V2_FINGERPRINT: Final[bytes] = _HISTORIC_PRINTS["turn_replaced.v2.avsc"]
"""Fingerprint bytes of ``TurnReplaced`` version 2: what a sealed replacement without run or fence is written with."""
BATCH_APPENDED_V4_FINGERPRINT: Final[bytes] = _HISTORIC_PRINTS["batch_appended.v4.avsc"]
"""Fingerprint bytes of ``BatchAppended`` version 4: what a batch with a run or fence, no turn slot, is written with."""
_PREFIX_PLAIN_BATCH: Final = MAGIC + BATCH_APPENDED_V2_FINGERPRINT
_PREFIX_PLAIN_REPLACED: Final = MAGIC + TURN_REPLACED_V1_FINGERPRINT
_PREFIX_SEALED_BATCH: Final = MAGIC + BATCH_APPENDED_V3_FINGERPRINT
_PREFIX_SEALED_REPLACED: Final = MAGIC + TURN_REPLACED_V2_FINGERPRINT
_PREFIX_RUN_BATCH: Final = MAGIC + BATCH_APPENDED_V4_FINGERPRINT


def _layout(schema: dict[str, Any]) -> list[tuple[str, Any]]:
    """A parsed record schema's (field, type) pairs as ``schemas.event_body`` names them."""
    def kind(t: Any) -> Any:
        if isinstance(t, dict) and t["type"] == "fixed":
            return t["size"]
        if isinstance(t, list) and isinstance(t[-1], dict):  # ["null", SealedContent]
            return ["null", _layout(t[-1])]
        if isinstance(t, dict) and t["type"] == "array":
            return ["array", t["items"]]
        if isinstance(t, list) and t == ["null", {"type": "long"}]:  # parse_schema's spelling of ["null","long"]
            return ["null", "long"]
        return t
    return [(f["name"], kind(f["type"])) for f in schema["fields"]]


# Invariant: the hand-written bodies (schemas.event_body) follow these schemas' fields exactly.
_SEALED_LAYOUT: Final = ("sealed", ["null", list(SEALED_FIELDS)])
assert _layout(_WRITERS[BATCH_APPENDED_V2_FINGERPRINT].schema) == list(BATCH_FIELDS)
assert _layout(_WRITERS[BATCH_APPENDED_V3_FINGERPRINT].schema) == [*BATCH_FIELDS, _SEALED_LAYOUT]
assert _layout(_WRITERS[BATCH_APPENDED_V4_FINGERPRINT].schema) == [*BATCH_FIELDS, _SEALED_LAYOUT, *TAIL_FIELDS]
assert _layout(_CURRENT[BatchAppended.AVRO_NAME]) == [*BATCH_FIELDS, _SEALED_LAYOUT, *TAIL_FIELDS, *SLOT_FIELDS]
assert _layout(_WRITERS[TURN_REPLACED_V1_FINGERPRINT].schema) == list(REPLACED_FIELDS)
assert _layout(_WRITERS[TURN_REPLACED_V2_FINGERPRINT].schema) == [*REPLACED_FIELDS, _SEALED_LAYOUT]
assert _layout(_CURRENT[TurnReplaced.AVRO_NAME]) == [*REPLACED_FIELDS, _SEALED_LAYOUT, *TAIL_FIELDS]
assert _layout(_CURRENT[ConversationCleared.AVRO_NAME]) == list(CLEARED_FIELDS)
assert _layout(_CURRENT[RunBegun.AVRO_NAME]) == list(RUN_FIELDS)
assert _layout(_CURRENT[TurnAllocated.AVRO_NAME]) == list(ALLOCATED_FIELDS)
assert _layout(_CURRENT[AssetsLinked.AVRO_NAME]) == [*ASSETS_FIELDS, _SEALED_LAYOUT]
assert _layout(_CURRENT[MessagesDeleted.AVRO_NAME]) == list(DELETED_FIELDS)

# --------------------------------------------------------------------------- codec


def _check_str(value: object, field: str) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{field} must be str, not {type(value).__name__}")


def _check_int(value: object, field: str, lo: int, hi: int) -> None:
    if type(value) is not int:
        raise TypeError(f"{field} must be int, not {type(value).__name__}")
    if not lo <= value <= hi:
        raise ValueError(f"{field} {value} is outside [{lo}, {hi}]")


def _sealed_parts(sealed: object) -> tuple[str, bytes, bytes, bytes] | None:
    """A ``sealed`` field's parts for ``schemas.event_body``, its types and sizes checked."""
    if sealed is None:
        return None
    if not isinstance(sealed, Sealed):
        raise TypeError(f"sealed must be a schemas.sealed.Sealed, not {type(sealed).__name__}")
    _check_str(sealed.key_id, "sealed.key_id")
    for name in ("nonce", "ciphertext", "mac"):
        if type(getattr(sealed, name)) is not bytes:
            raise TypeError(f"sealed.{name} must be bytes")
    if len(sealed.nonce) != 12 or len(sealed.mac) != 32:
        raise ValueError("sealed.nonce is 12 bytes and sealed.mac 32 (Avro fixed)")
    return sealed.key_id, sealed.nonce, sealed.ciphertext, sealed.mac


def encode_event(event: Event) -> bytes:
    """Frame one event. A batch or replacement without a run or fence is written with the
    version every earlier release wrote: plain (``sealed`` None) with v2 / v1, sealed with v3 /
    v2; one with a run or a fence with the current schema (``BatchAppended`` v4, ``TurnReplaced``
    v3). A clear and a run's begin with their schemas.

    Raises ``TypeError`` / ``ValueError`` for a field of the wrong type, an integer outside its
    Avro range (``message_count`` is an ``int``, the others ``long``) or a string that is not
    encodable as UTF-8, and ``InvalidConfiguration`` (a ``ValueError``) for an unrepresentable
    ``created_at_ms``; nothing partial is ever returned. Other field rules are the reader's
    (``decode_event``): tests and tools may still write such poison records on purpose.
    The body is written by ``schemas.event_body``: fastavro's bytes exactly, at about half a
    plain event's former cost and a quarter of a sealed one's (whose union fastavro validated).
    """
    cls = type(event)
    if cls is BatchAppended or cls is TurnReplaced:
        assert isinstance(event, BatchAppended | TurnReplaced)  # Invariant: narrowed by the type check above.
        _check_str(event.conversation_id, "conversation_id")
        _check_str(event.append_id, "append_id")
        _check_str(event.digest, "digest")
        if type(event.messages) is not bytes:
            raise TypeError(f"messages must be bytes, not {type(event.messages).__name__}")
        _check_int(event.message_count, "message_count", INT_MIN, INT_MAX)
        _check_int(event.content_bytes, "content_bytes", LONG_MIN, LONG_MAX)
        _check_int(event.created_at_ms, "created_at_ms", LONG_MIN, LONG_MAX)
        check_time_ms(event.created_at_ms)
        sealed = event.sealed
        parts = _sealed_parts(sealed)
        tail: Tail | None = None
        if event.fence is not None or event.run_id is not None:
            if event.fence is not None:
                _check_int(event.fence, "fence", LONG_MIN, LONG_MAX)
            if event.run_id is not None:
                _check_str(event.run_id, "run_id")
            tail = (event.fence, event.run_id)
        if isinstance(event, BatchAppended):
            if event.expected_last is not None:
                _check_str(event.expected_last, "expected_last")
            if event.turn_id is not None or event.turn_position is not None:
                if event.turn_id is not None:
                    _check_str(event.turn_id, "turn_id")
                if event.turn_position is not None:
                    _check_int(event.turn_position, "turn_position", LONG_MIN, LONG_MAX)
                tail = (event.fence, event.run_id, event.turn_id, event.turn_position)
                prefix = _PREFIX_BATCH
            else:
                prefix = _PREFIX_RUN_BATCH if tail else _PREFIX_PLAIN_BATCH if sealed is None else _PREFIX_SEALED_BATCH
            return prefix + batch_body(
                event.conversation_id, event.append_id, event.digest, event.messages, event.message_count,
                event.content_bytes, event.created_at_ms, event.expected_last, parts, tail)
        _check_str(event.old_turn_id, "old_turn_id")
        _check_str(event.reason, "reason")
        prefix = _PREFIX_REPLACED if tail else _PREFIX_PLAIN_REPLACED if sealed is None else _PREFIX_SEALED_REPLACED
        return prefix + replaced_body(
            event.conversation_id, event.append_id, event.digest, event.messages, event.message_count,
            event.content_bytes, event.created_at_ms, event.old_turn_id, event.reason, parts, tail)
    if cls is ConversationCleared or cls is RunBegun or cls is TurnAllocated:
        assert isinstance(event, ConversationCleared | RunBegun | TurnAllocated)  # Invariant: the type check above.
        _check_str(event.conversation_id, "conversation_id")
        _check_int(event.created_at_ms, "created_at_ms", LONG_MIN, LONG_MAX)
        check_time_ms(event.created_at_ms)
        if isinstance(event, RunBegun):
            _check_str(event.run_id, "run_id")
            return _PREFIX_RUN + run_body(event.conversation_id, event.run_id, event.created_at_ms)
        if isinstance(event, TurnAllocated):
            _check_str(event.slot_id, "slot_id")
            return _PREFIX_ALLOCATED + allocated_body(event.conversation_id, event.slot_id, event.created_at_ms)
        return _PREFIX_CLEARED + cleared_body(event.conversation_id, event.created_at_ms)
    if cls is AssetsLinked:
        assert isinstance(event, AssetsLinked)  # Invariant: the exact type check above.
        _check_str(event.conversation_id, "conversation_id")
        _check_str(event.message_id, "message_id")
        if type(event.assets) is not bytes:
            raise TypeError(f"assets must be bytes, not {type(event.assets).__name__}")
        _check_int(event.created_at_ms, "created_at_ms", LONG_MIN, LONG_MAX)
        check_time_ms(event.created_at_ms)
        return _PREFIX_LINKED + assets_body(event.conversation_id, event.message_id, event.assets,
                                            event.created_at_ms, _sealed_parts(event.sealed))
    if cls is MessagesDeleted:
        assert isinstance(event, MessagesDeleted)  # Invariant: the exact type check above.
        _check_str(event.conversation_id, "conversation_id")
        _check_str(event.delete_id, "delete_id")
        if type(event.message_ids) is not tuple:
            raise TypeError(f"message_ids must be a tuple, not {type(event.message_ids).__name__}")
        for m in event.message_ids:
            _check_str(m, "message_ids[]")
        if event.fence is not None:
            _check_int(event.fence, "fence", LONG_MIN, LONG_MAX)
        _check_int(event.created_at_ms, "created_at_ms", LONG_MIN, LONG_MAX)
        check_time_ms(event.created_at_ms)
        return _PREFIX_DELETED + deleted_body(event.conversation_id, event.delete_id, event.message_ids,
                                              event.fence, event.created_at_ms)
    raise TypeError(f"not a histlog event: {cls.__name__}")


def _corrupt(reason: str, detail: str) -> CorruptLog:
    return CorruptLog(f"undecodable event value ({reason}): {detail}", reason=reason)


def decode_event(data: bytes) -> Event:
    """Decode one framed event (any registered writer schema) into the current dataclass.

    Raises ``CorruptLog`` — and nothing else — when ``data`` is not exactly one framed event.
    """
    if type(data) is not bytes:
        data = bytes(data)
    if len(data) < HEADER_SIZE:
        raise _corrupt("too short", f"{len(data)} bytes, a framed event has at least {HEADER_SIZE + 1}")
    if data[:2] != MAGIC:
        raise _corrupt("bad magic", f"starts with {data[:2].hex()}, expected c301 (Avro single-object)")
    writer = _WRITERS.get(data[2:HEADER_SIZE])
    if writer is None:
        fp = data[2:HEADER_SIZE].hex()
        raise _corrupt(
            f"unknown schema fingerprint {fp}",
            "written with a schema this reader does not know; upgrade the reader or register the schema",
        )
    buf = BytesIO(data)
    buf.seek(HEADER_SIZE)
    try:
        record = schemaless_reader(buf, writer.schema, writer.reader)
        if buf.tell() != len(data):
            end = buf.tell()
            raise _corrupt("trailing bytes", f"the {writer.name} body ends at byte {end} of {len(data)}")
        return writer.build(record)  # type: ignore[arg-type]
    except CorruptLog:
        raise
    except InvalidField as exc:
        raise _corrupt(f"invalid {exc}"[:300], f"as {writer.name}") from None
    except Exception as exc:  # fastavro, EOF, struct, unicode and resolution errors alike
        raise _corrupt(f"undecodable body: {type(exc).__name__}: {exc}"[:200], f"as {writer.name}") from exc
