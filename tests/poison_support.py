"""Helpers to put hand-made records on a log, as any producer could (docs/events.md).

``frame`` writes an event body with fastavro directly, bypassing ``encode_event`` and every
check the histlog writer makes, so tests can put on the log exactly what a foreign producer
(or a broken clock) would. ``Tape`` is a custom projection that records what it is fed.
"""

from __future__ import annotations

from io import BytesIO
from typing import Any

from fastavro import parse_schema, schemaless_writer

from engine.facade import HistoryEngine
from engine.log.base import record_key
from projections.custom import Projection, ProjectionTx
from projections.events import BatchEvent, ClearEvent, ProjectedEvent, TurnReplacedEvent
from schemas.batch import Batch
from schemas.events import MAGIC, current_schema, fingerprint_of
from schemas.messages import Message

__all__ = ["Tape", "batch_record", "clear_record", "frame", "replaced_record", "snapshot"]


def frame(name: str, record: dict[str, Any]) -> bytes:
    """The single-object encoding of ``record`` with the current schema ``name``, unchecked."""
    buf = BytesIO()
    buf.write(MAGIC + fingerprint_of(name))
    schemaless_writer(buf, parse_schema(current_schema(name)), record)
    return buf.getvalue()


def batch_record(conversation_id: str, append_id: str, text: str, created_at_ms: int,
                 expected_last: str | None = None) -> dict[str, Any]:
    """The fields of a valid ``BatchAppended`` of one user message (``created_at_ms`` as given)."""
    batch = Batch(conversation_id, append_id, [Message.user(text)])
    return {"conversation_id": conversation_id, "append_id": append_id, "digest": batch.digest,
            "messages": batch.canonical_json(), "message_count": len(batch),
            "content_bytes": batch.content_bytes(), "created_at_ms": created_at_ms,
            "expected_last": expected_last}


def replaced_record(conversation_id: str, append_id: str, text: str, created_at_ms: int,
                    old_turn_id: str, reason: str = "edit") -> dict[str, Any]:
    """The fields of a valid ``TurnReplaced`` whose new turn is one user message."""
    record = batch_record(conversation_id, append_id, text, created_at_ms)
    del record["expected_last"]
    record.update(old_turn_id=old_turn_id, reason=reason)
    return record


def clear_record(conversation_id: str, created_at_ms: int) -> dict[str, Any]:
    return {"conversation_id": conversation_id, "created_at_ms": created_at_ms}


def key_of(record: dict[str, Any]) -> bytes:
    """The record key an honest producer gives ``record`` (docs/events.md §4)."""
    return record_key(record["conversation_id"], record.get("append_id", ""))


class Tape(Projection):
    """Writes one row per delivered event, keyed by its log position (kind, ids, time)."""

    name = "poison-tape"

    def apply(self, event: ProjectedEvent, tx: ProjectionTx) -> None:
        p = event.position
        if isinstance(event, TurnReplacedEvent):
            value = f"replaced {event.conversation_id} {event.append_id} {event.old_turn_id}"
        elif isinstance(event, BatchEvent):
            value = f"batch {event.conversation_id} {event.append_id} {event.first_seq}"
        else:
            assert isinstance(event, ClearEvent)
            value = f"clear {event.conversation_id}"
        value += f" {event.created_at.isoformat()}"
        tx.put(f"ev/{p.partition:04d}/{p.offset:020d}".encode(), value.encode())


def snapshot(engine: HistoryEngine) -> dict[str, Any]:
    """Everything the read APIs say about the engine's history (to compare two instances)."""
    s = engine.stats()
    out: dict[str, Any] = {
        "stats": (s.end_offsets, s.applied_offsets, s.accepted, s.duplicates, s.conflicts, s.rejected_closed,
                  s.corrupt, s.precondition_failed, s.not_replaceable),
        "poison": engine.poison(),
    }
    for c in engine.conversations():
        entries = engine.entries(c, include_hidden=True)
        out[f"conv {c}"] = (
            [m.canonical_json() for m in engine.read(c)],
            [(e.id, e.position, e.created_at, e.superseded_by, e.reason, e.message.canonical_json())
             for e in entries],
            latest.id if (latest := engine.latest_turn(c)) is not None else None,
            engine.measure(c),
            [(t.id, t.content, t.created_at, t.interrupted) for t in engine.turn_sources(c, 1 << 40).messages],
        )
    return out
