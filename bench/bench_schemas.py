"""Schema hot paths vs a baseline measured in the same run.

For batches of 2 and 20 messages:
* build+validate: construct the Messages and the Batch (canonical bytes and digest included);
* canonical+digest, cached: ``batch.canonical_json()`` joined from the messages' cached bytes + SHA-256;
* canonical+digest, full: serialise every part and message again from the fields + SHA-256;
* from_canonical: validate log bytes back into a Batch with the full model;
* event_batch: what replay and catch-up do per record with a decoded event (digest, validation
  of the messages, counts), over distinct records, in CPU time;
* baseline: ``json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()`` + SHA-256 of the
  same data as plain dicts.

Run ``python -m bench.bench_schemas [--quick]``: a table, then one JSON line. ``run(quick)``
returns the same dict for ``histlog bench``. Target: canonical+digest of a 2-message batch <= 5 us.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from typing import Any

from bench.common import best_us
from schemas import Batch, Message, RawJSON, ToolCallPart, ToolOutput, ToolResultPart
from schemas.canonical import digest_of
from schemas.event_content import event_batch
from schemas.events import BatchAppended, decode_event, encode_event

TARGET_US = 5.0


def _messages(n: int) -> list[Message]:
    if n == 2:
        return [
            Message.user("What is the weather in Oslo? Please answer briefly."),
            Message.assistant("It is sunny and 21 degrees in Oslo today."),
        ]
    out: list[Message] = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            out.append(Message.user(f"What is the weather in city number {i}? Please answer briefly."))
        elif kind == 1:
            out.append(
                Message.assistant(
                    ToolCallPart(f"call_{i}", "get_weather", '{"city":"Oslo","unit":"C"}'),
                    metadata={"model": "m-1", "latency_ms": 412},
                )
            )
        elif kind == 2:
            out.append(
                Message.tool(
                    ToolResultPart(
                        f"call_{i - 1}",
                        "get_weather",
                        ToolOutput.text("Sunny, 21 C", details=RawJSON('{"t":21.0}')),
                    )
                )
            )
        else:
            out.append(Message.assistant(f"It is sunny and 21 degrees in city {i}."))
    return out


def _plain(messages: list[Message]) -> list[Any]:
    return [json.loads(m.canonical_json()) for m in messages]




def _records(n: int, count: int) -> list[Any]:
    """``count`` distinct decoded events of ``n``-message batches, as a replay meets them."""
    out = []
    for i in range(count):
        batch = Batch(f"conv-{i % 97}", f"append-{i}", _messages(n) if n != 2 else [
            Message.user(f"what is the status of order {i}?"),
            Message.assistant(f"Order {i} shipped yesterday; it arrives Friday.")])
        out.append(decode_event(encode_event(BatchAppended.of(batch, 1_767_225_600_000 + i))))
    return out


def _event_batch(n: int, quick: bool) -> float:
    """``event_batch`` per record over distinct events: best of 7 passes, microseconds of the
    thread's own CPU time per record (so the other processes of a shared machine count less
    than in wall time)."""
    events = _records(n, (300 if quick else 2000) // (1 if n == 2 else 5))
    best = float("inf")
    for _ in range(7):
        start = time.thread_time_ns()
        for e in events:
            event_batch(e)
        best = min(best, (time.thread_time_ns() - start) / len(events) / 1000)
    return best


def _bench(n: int, quick: bool) -> dict[str, float]:
    iterations = max(200, (2_000 if quick else 20_000) // n)
    messages = _messages(n)
    batch = Batch("conv-bench", "append-1", messages)
    data = batch.canonical_json()
    plain = _plain(messages)
    sha = hashlib.sha256

    def build() -> object:
        return Batch("conv-bench", "append-1", _messages(n))

    def cached() -> object:
        return digest_of(b"[" + b",".join([m.canonical_json() for m in messages]) + b"]")

    def full() -> object:
        return digest_of(b"[" + b",".join([m._full_recompute() for m in messages]) + b"]")

    def from_canonical() -> object:
        return Batch.from_canonical("conv-bench", "append-1", data)

    def baseline() -> object:
        return sha(json.dumps(plain, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    assert full() == cached() == batch.digest  # Invariant: the recompute path is the same format.
    return {
        "event_batch_us": _event_batch(n, quick),
        "build_validate_us": best_us(build, max(100, iterations // 4)),
        "canonical_digest_cached_us": best_us(cached, iterations),
        "canonical_digest_full_us": best_us(full, iterations),
        "from_canonical_us": best_us(from_canonical, max(100, iterations // 4)),
        "baseline_json_dumps_sha256_us": best_us(baseline, iterations),
        "bytes": float(len(data)),
    }


def run(quick: bool = False) -> dict[str, Any]:
    """Measure; return ``{"batch_2": {...}, "batch_20": {...}, "target_met": bool, ...}`` (microseconds)."""
    result: dict[str, Any] = {"bench": "schemas", "unit": "us"}
    for n in (2, 20):
        result[f"batch_{n}"] = _bench(n, quick)
    two = result["batch_2"]
    result["target_us"] = TARGET_US
    result["target_met"] = (
        two["canonical_digest_full_us"] <= TARGET_US and two["canonical_digest_cached_us"] <= TARGET_US
    )
    return result


def report(result: dict[str, Any]) -> str:
    rows = [
        ("build + validate (Messages + Batch)", "build_validate_us"),
        ("canonical + digest (cached bytes)", "canonical_digest_cached_us"),
        ("canonical + digest (full recompute)", "canonical_digest_full_us"),
        ("from_canonical (log bytes -> Batch)", "from_canonical_us"),
        ("event_batch per record (CPU)", "event_batch_us"),
        ("baseline json.dumps(sort_keys) + sha256", "baseline_json_dumps_sha256_us"),
    ]
    lines = [f"{'operation (us per batch)':44}{'2 msgs':>10}{'20 msgs':>10}{'2: x base':>11}{'20: x base':>11}"]
    for label, key in rows:
        a, b = result["batch_2"][key], result["batch_20"][key]
        ra = a / result["batch_2"]["baseline_json_dumps_sha256_us"]
        rb = b / result["batch_20"]["baseline_json_dumps_sha256_us"]
        lines.append(f"{label:44}{a:10.2f}{b:10.2f}{ra:10.2f}x{rb:10.2f}x")
    lines.append(
        f"canonical bytes: {int(result['batch_2']['bytes'])} / {int(result['batch_20']['bytes'])}; "
        f"target canonical+digest of 2 messages <= {TARGET_US} us: "
        f"{'met' if result['target_met'] else 'MISSED'}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    result = run(quick="--quick" in args)
    print(report(result))
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
