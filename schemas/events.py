"""The log's event records and their codec: Avro single-object encoding (the schema files, their
fingerprints and the writer registry live in ``schemas.event_schemas``, the dataclasses in
``schemas.event_types``, the bodies in ``schemas.event_body``, the field rules in
``schemas.event_rules``, the cipher in ``schemas.sealed``, sealing, opening and checking an
event's content in ``schemas.event_content``; this module frames and decodes, and re-exports the
names callers import from it).

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

from io import BytesIO

from fastavro import schemaless_reader

from schemas.errors import CorruptLog
from schemas.event_body import (
    Tail,
    allocated_body,
    assets_body,
    batch_body,
    checkpointed_body,
    cleared_body,
    deleted_body,
    replaced_body,
    run_body,
)
from schemas.event_rules import INT_MAX, INT_MIN, LONG_MAX, LONG_MIN, REPLACE_REASONS, InvalidField
from schemas.event_schemas import (
    ASSETS_LINKED_FINGERPRINT,
    BATCH_APPENDED_FINGERPRINT,
    BATCH_APPENDED_V1_FINGERPRINT,
    BATCH_APPENDED_V2_FINGERPRINT,
    BATCH_APPENDED_V4_FINGERPRINT,
    CHECKPOINTED_FINGERPRINT,
    CONVERSATION_CLEARED_FINGERPRINT,
    HEADER_SIZE,
    MAGIC,
    MESSAGES_DELETED_FINGERPRINT,
    PREFIX_ALLOCATED,
    PREFIX_BATCH,
    PREFIX_CHECKPOINTED,
    PREFIX_CLEARED,
    PREFIX_DELETED,
    PREFIX_LINKED,
    PREFIX_PLAIN_BATCH,
    PREFIX_PLAIN_REPLACED,
    PREFIX_REPLACED,
    PREFIX_RUN,
    PREFIX_RUN_BATCH,
    PREFIX_SEALED_BATCH,
    PREFIX_SEALED_REPLACED,
    RUN_BEGUN_FINGERPRINT,
    TURN_ALLOCATED_FINGERPRINT,
    TURN_REPLACED_FINGERPRINT,
    TURN_REPLACED_V1_FINGERPRINT,
    WRITERS,
    current_schema,
    fingerprint_of,
    register_writer_schema,
    schema_fingerprint,
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
from schemas.times import check_time_ms

__all__ = [
    "ASSETS_LINKED_FINGERPRINT",
    "BATCH_APPENDED_FINGERPRINT",
    "BATCH_APPENDED_V1_FINGERPRINT",
    "BATCH_APPENDED_V2_FINGERPRINT",
    "BATCH_APPENDED_V4_FINGERPRINT",
    "CHECKPOINTED_FINGERPRINT",
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
    "Checkpointed",
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
                prefix = PREFIX_BATCH
            else:
                prefix = PREFIX_RUN_BATCH if tail else PREFIX_PLAIN_BATCH if sealed is None else PREFIX_SEALED_BATCH
            return prefix + batch_body(
                event.conversation_id, event.append_id, event.digest, event.messages, event.message_count,
                event.content_bytes, event.created_at_ms, event.expected_last, parts, tail)
        _check_str(event.old_turn_id, "old_turn_id")
        _check_str(event.reason, "reason")
        prefix = PREFIX_REPLACED if tail else PREFIX_PLAIN_REPLACED if sealed is None else PREFIX_SEALED_REPLACED
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
            return PREFIX_RUN + run_body(event.conversation_id, event.run_id, event.created_at_ms)
        if isinstance(event, TurnAllocated):
            _check_str(event.slot_id, "slot_id")
            return PREFIX_ALLOCATED + allocated_body(event.conversation_id, event.slot_id, event.created_at_ms)
        return PREFIX_CLEARED + cleared_body(event.conversation_id, event.created_at_ms)
    if cls is AssetsLinked:
        assert isinstance(event, AssetsLinked)  # Invariant: the exact type check above.
        _check_str(event.conversation_id, "conversation_id")
        _check_str(event.message_id, "message_id")
        if type(event.assets) is not bytes:
            raise TypeError(f"assets must be bytes, not {type(event.assets).__name__}")
        _check_int(event.created_at_ms, "created_at_ms", LONG_MIN, LONG_MAX)
        check_time_ms(event.created_at_ms)
        return PREFIX_LINKED + assets_body(event.conversation_id, event.message_id, event.assets,
                                            event.created_at_ms, _sealed_parts(event.sealed))
    if cls is Checkpointed:
        assert isinstance(event, Checkpointed)  # Invariant: the exact type check above.
        _check_str(event.conversation_id, "conversation_id")
        _check_str(event.record_id, "record_id")
        _check_str(event.kind, "kind")
        if type(event.content) is not bytes:
            raise TypeError(f"content must be bytes, not {type(event.content).__name__}")
        _check_int(event.created_at_ms, "created_at_ms", LONG_MIN, LONG_MAX)
        check_time_ms(event.created_at_ms)
        return PREFIX_CHECKPOINTED + checkpointed_body(event.conversation_id, event.record_id, event.kind,
                                                       event.content, event.created_at_ms,
                                                       _sealed_parts(event.sealed))
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
        return PREFIX_DELETED + deleted_body(event.conversation_id, event.delete_id, event.message_ids,
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
    writer = WRITERS.get(data[2:HEADER_SIZE])
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
