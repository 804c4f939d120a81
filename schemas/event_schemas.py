"""The event schemas (``schemas/*.avsc``): the current one of each record, the historic writers
old logs may hold, their fingerprints, and the registry of writer schemas ``decode_event`` reads
(``register_writer_schema``). A part of the events' wire format: ``schemas.events`` frames and
decodes with it and is its home (``docs/events.md`` §3, §7); the hand-written bodies
(``schemas.event_body``) are checked here, at import, against these schemas' fields.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from fastavro import parse_schema
from fastavro.schema import fingerprint, to_parsing_canonical_form

from schemas.event_body import (
    ALLOCATED_FIELDS,
    ASSETS_FIELDS,
    BATCH_FIELDS,
    CHECKPOINTED_FIELDS,
    CLEARED_FIELDS,
    DELETED_FIELDS,
    REPLACED_FIELDS,
    RUN_FIELDS,
    SEALED_FIELDS,
    SLOT_FIELDS,
    TAIL_FIELDS,
)
from schemas.event_rules import (
    check_allocated_record,
    check_batch_record,
    check_checkpointed_record,
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
    Checkpointed,
    ConversationCleared,
    Event,
    MessagesDeleted,
    RunBegun,
    TurnAllocated,
    TurnReplaced,
)
from schemas.sealed import Sealed

__all__ = [
    "ASSETS_LINKED_FINGERPRINT",
    "BATCH_APPENDED_FINGERPRINT",
    "BATCH_APPENDED_V1_FINGERPRINT",
    "BATCH_APPENDED_V2_FINGERPRINT",
    "BATCH_APPENDED_V3_FINGERPRINT",
    "BATCH_APPENDED_V4_FINGERPRINT",
    "CHECKPOINTED_FINGERPRINT",
    "CONVERSATION_CLEARED_FINGERPRINT",
    "HEADER_SIZE",
    "MAGIC",
    "MESSAGES_DELETED_FINGERPRINT",
    "PREFIX_ALLOCATED",
    "PREFIX_BATCH",
    "PREFIX_CHECKPOINTED",
    "PREFIX_CLEARED",
    "PREFIX_DELETED",
    "PREFIX_LINKED",
    "PREFIX_PLAIN_BATCH",
    "PREFIX_PLAIN_REPLACED",
    "PREFIX_REPLACED",
    "PREFIX_RUN",
    "PREFIX_RUN_BATCH",
    "PREFIX_SEALED_BATCH",
    "PREFIX_SEALED_REPLACED",
    "RUN_BEGUN_FINGERPRINT",
    "TURN_ALLOCATED_FINGERPRINT",
    "TURN_REPLACED_FINGERPRINT",
    "TURN_REPLACED_V1_FINGERPRINT",
    "TURN_REPLACED_V2_FINGERPRINT",
    "WRITERS",
    "Writer",
    "current_schema",
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
    Checkpointed.AVRO_NAME: "checkpointed.avsc",
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
class Writer:
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


def _build_checkpointed(rec: dict[str, Any]) -> Event:
    check_checkpointed_record(rec)
    _sealed_of(rec)
    return Checkpointed(**rec)


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
    Checkpointed.AVRO_NAME: _build_checkpointed,
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

CHECKPOINTED_FINGERPRINT: Final[bytes] = _CURRENT_FINGERPRINTS[Checkpointed.AVRO_NAME]
"""Fingerprint bytes of the ``Checkpointed`` schema (frame bytes 2..9)."""

WRITERS: dict[bytes, Writer] = {
    fp: Writer(fp, name, _CURRENT[name], None, _BUILDERS[name]) for name, fp in _CURRENT_FINGERPRINTS.items()
}

# Frame prefixes of the current schemas, computed once.
PREFIX_BATCH: Final = MAGIC + BATCH_APPENDED_FINGERPRINT
PREFIX_CLEARED: Final = MAGIC + CONVERSATION_CLEARED_FINGERPRINT
PREFIX_REPLACED: Final = MAGIC + TURN_REPLACED_FINGERPRINT
PREFIX_RUN: Final = MAGIC + RUN_BEGUN_FINGERPRINT
PREFIX_ALLOCATED: Final = MAGIC + TURN_ALLOCATED_FINGERPRINT
PREFIX_LINKED: Final = MAGIC + ASSETS_LINKED_FINGERPRINT
PREFIX_DELETED: Final = MAGIC + MESSAGES_DELETED_FINGERPRINT
PREFIX_CHECKPOINTED: Final = MAGIC + CHECKPOINTED_FINGERPRINT


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
    if fp in WRITERS:
        return fp
    writer_names: set[str] = {f["name"] for f in parsed["fields"]}
    for field in _CURRENT[name]["fields"]:
        names = {field["name"], *field.get("aliases", ())}
        if "default" not in field and not names & writer_names:
            raise ValueError(
                f"writer schema of {name} lacks field {field['name']!r}, which has no default in the "
                "current schema: add a default to the current schema or keep the field"
            )
    WRITERS[fp] = Writer(fp, name, parsed, _CURRENT[name], _BUILDERS[name])
    return fp


def _register_historic() -> dict[str, bytes]:
    prints = {}
    for filename in _HISTORIC_FILES:
        schema = json.loads((_SCHEMA_DIR / filename).read_text(encoding="utf-8"))
        fp = prints[filename] = register_writer_schema(schema)
        writer = WRITERS[fp]
        if filename in _PREFIX_FILES:
            fields = writer.schema["fields"]
            current = _CURRENT[writer.name]["fields"][:len(fields)]
            assert [(f["name"], f["type"]) for f in fields] == [
                (f["name"], f["type"]) for f in current], filename  # Invariant: pinned by the schema files.
            WRITERS[fp] = Writer(fp, writer.name, writer.schema, None, writer.build)
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
PREFIX_PLAIN_BATCH: Final = MAGIC + BATCH_APPENDED_V2_FINGERPRINT
PREFIX_PLAIN_REPLACED: Final = MAGIC + TURN_REPLACED_V1_FINGERPRINT
PREFIX_SEALED_BATCH: Final = MAGIC + BATCH_APPENDED_V3_FINGERPRINT
PREFIX_SEALED_REPLACED: Final = MAGIC + TURN_REPLACED_V2_FINGERPRINT
PREFIX_RUN_BATCH: Final = MAGIC + BATCH_APPENDED_V4_FINGERPRINT


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
assert _layout(WRITERS[BATCH_APPENDED_V2_FINGERPRINT].schema) == list(BATCH_FIELDS)
assert _layout(WRITERS[BATCH_APPENDED_V3_FINGERPRINT].schema) == [*BATCH_FIELDS, _SEALED_LAYOUT]
assert _layout(WRITERS[BATCH_APPENDED_V4_FINGERPRINT].schema) == [*BATCH_FIELDS, _SEALED_LAYOUT, *TAIL_FIELDS]
assert _layout(_CURRENT[BatchAppended.AVRO_NAME]) == [*BATCH_FIELDS, _SEALED_LAYOUT, *TAIL_FIELDS, *SLOT_FIELDS]
assert _layout(WRITERS[TURN_REPLACED_V1_FINGERPRINT].schema) == list(REPLACED_FIELDS)
assert _layout(WRITERS[TURN_REPLACED_V2_FINGERPRINT].schema) == [*REPLACED_FIELDS, _SEALED_LAYOUT]
assert _layout(_CURRENT[TurnReplaced.AVRO_NAME]) == [*REPLACED_FIELDS, _SEALED_LAYOUT, *TAIL_FIELDS]
assert _layout(_CURRENT[ConversationCleared.AVRO_NAME]) == list(CLEARED_FIELDS)
assert _layout(_CURRENT[RunBegun.AVRO_NAME]) == list(RUN_FIELDS)
assert _layout(_CURRENT[TurnAllocated.AVRO_NAME]) == list(ALLOCATED_FIELDS)
assert _layout(_CURRENT[AssetsLinked.AVRO_NAME]) == [*ASSETS_FIELDS, _SEALED_LAYOUT]
assert _layout(_CURRENT[MessagesDeleted.AVRO_NAME]) == list(DELETED_FIELDS)
assert _layout(_CURRENT[Checkpointed.AVRO_NAME]) == [*CHECKPOINTED_FIELDS, _SEALED_LAYOUT]

