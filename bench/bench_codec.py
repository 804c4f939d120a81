"""Event codec benchmark: ``schemas.events`` against raw fastavro on the same record.

Run ``python -m bench.bench_codec [--quick]``. For BatchAppended events carrying a 2-message and
a 20-message canonical JSON array it measures encode, decode and encode+decode per event, and
the same operations done with bare ``fastavro.schemaless_writer`` / ``schemaless_reader`` on a
prepared dict (no framing, no dataclass, no checks). The ratio is what the single-object
framing, the input checks and the dataclass cost. Prints a table and one JSON line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from fastavro import schemaless_reader, schemaless_writer

import schemas
from schemas.events import HEADER_SIZE, BatchAppended, decode_event, encode_event

__all__ = ["run"]

TARGET_ROUND_TRIP_US = 15.0  # 2-message BatchAppended, encode + decode, on a 2-core machine


def _messages(count: int) -> bytes:
    """A canonical-looking JSON array of alternating user/assistant text messages (plain orjson)."""
    items = []
    for i in range(count):
        role = "user" if i % 2 == 0 else "assistant"
        text = f"message {i}: " + ("what is the weather like today?" if role == "user" else
                                   "It is sunny with a light breeze, around 21 °C.")
        items.append({"parts": [{"kind": "text", "text": text}], "role": role})
    return orjson.dumps(items, option=orjson.OPT_SORT_KEYS)


def _event(count: int) -> BatchAppended:
    messages = _messages(count)
    return BatchAppended(
        conversation_id="support/4242",
        append_id="0192f7c4-6a1e-7c3d-9b2a-5e8f1d2c3b4a",
        digest="sha256:" + hashlib.sha256(messages).hexdigest(),
        messages=messages,
        message_count=count,
        content_bytes=len(messages) - 2 - (count - 1),
        created_at_ms=1_767_225_600_000,
    )


def _per_op_us(fn: Callable[[], object], number: int, repeat: int) -> float:
    """Best of ``repeat`` runs of ``number`` calls, in microseconds per call."""
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def _case(count: int, number: int, repeat: int) -> dict[str, Any]:
    from fastavro import parse_schema

    event = _event(count)
    data = encode_event(event)
    # A plain event is written with the plain schema (BatchAppended v2), the bytes of every
    # release before sealing; the sealed cost is bench_sealed's.
    plain = json.loads((Path(schemas.__file__).parent / "batch_appended.avsc").read_text(encoding="utf-8"))
    schema = parse_schema(plain)
    record = dataclasses.asdict(event)
    del record["sealed"]
    body = data[HEADER_SIZE:]

    def raw_encode() -> bytes:
        buf = io.BytesIO()
        schemaless_writer(buf, schema, record)
        return buf.getvalue()

    def raw_decode() -> object:
        return schemaless_reader(io.BytesIO(body), schema)

    def raw_round_trip() -> object:
        return schemaless_reader(io.BytesIO(raw_encode()), schema)

    assert raw_encode() == body  # Invariant: same record, same body bytes; only the framing differs.
    assert decode_event(data) == event

    ops: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
        "encode": (lambda: encode_event(event), raw_encode),
        "decode": (lambda: decode_event(data), raw_decode),
        "encode+decode": (lambda: decode_event(encode_event(event)), raw_round_trip),
    }
    result: dict[str, Any] = {"messages": count, "value_bytes": len(data)}
    for name, (ours, raw) in ops.items():
        ours_us = _per_op_us(ours, number, repeat)
        raw_us = _per_op_us(raw, number, repeat)
        result[name] = {"histlog_us": round(ours_us, 3), "fastavro_us": round(raw_us, 3),
                        "ratio": round(ours_us / raw_us, 2)}
    return result


def run(quick: bool = False) -> dict[str, Any]:
    """Measure the codec; returns ``{"cases": [...], "target_round_trip_us": ..., "meets_target": ...}``."""
    number, repeat = (5_000, 3) if quick else (50_000, 5)
    cases = [_case(count, number, repeat) for count in (2, 20)]
    two = cases[0]["encode+decode"]["histlog_us"]
    return {
        "bench": "codec",
        "quick": quick,
        "cases": cases,
        "target_round_trip_us": TARGET_ROUND_TRIP_US,
        "meets_target": two <= TARGET_ROUND_TRIP_US,
    }


def report(result: dict[str, Any]) -> str:
    lines = [
        f"{'event':<32}{'op':<15}{'histlog µs':>12}{'fastavro µs':>13}{'ratio':>8}",
        "-" * 80,
    ]
    for case in result["cases"]:
        label = f"BatchAppended {case['messages']} msgs ({case['value_bytes']} B)"
        for op in ("encode", "decode", "encode+decode"):
            row = case[op]
            lines.append(f"{label:<32}{op:<15}{row['histlog_us']:>12.2f}{row['fastavro_us']:>13.2f}"
                         f"{row['ratio']:>7.2f}x")
            label = ""
    verdict = "meets" if result["meets_target"] else "MISSES"
    lines.append(f"target: 2-msg encode+decode <= {result['target_round_trip_us']} µs — {verdict}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    result = run(quick="--quick" in args)
    print(report(result))
    print(json.dumps(result, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
