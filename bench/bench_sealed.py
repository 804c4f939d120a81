"""The cost of sealing, vs the event encode alone, and of the embedded key store, vs a raw fsync.

Per batch (2 and 20 messages, ``bench.common.batch``-like turns), microseconds, best of 5 rounds:

* baseline: ``encode_event(BatchAppended.of(batch))`` (today's write-path codec) and
  ``decode_event`` + ``event_batch`` (today's read path);
* seal / open / seal + open of the canonical bytes (``schemas.sealed``);
* sealed encode: seal + the v3 (``batch_appended.v3.avsc``) body; sealed decode: the v3 body + open
  (what the write path and the projector will pay once wired).

Key store (milliseconds per operation, on the data directory's file system, same run):

* baseline: append 100 bytes to a file + fsync; ``FileKeyStore.create`` (one framed append + fsync,
  plus a directory fsync when its bucket file is new);
  rocksdict ``put`` with ``sync=True`` (the alternative considered);
* ``FileKeyStore.destroy`` with N keys already in the store (marker append + a bucket rewrite).

Memory (bytes per conversation, a fresh process's RSS growth once 65,536 new conversations, four
times ``DERIVED_KEYS``, each got a key from ``FileKeyStore.create`` and sealed once under it): with
the bound on derived state, vs every key keeping its derived AES-GCM and HMAC state (the bound
lifted: what releases before it held).

``python -m bench.bench_sealed [--quick]``: a table, then one JSON line. Numbers are ratios to the
baselines of the same run; the lead re-measures on a quiet machine.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from io import BytesIO
from pathlib import Path
from typing import Any

from fastavro import parse_schema, schemaless_reader, schemaless_writer

from bench.common import best_us
from engine.keys import FileKeyStore
from schemas import Batch, Message
from schemas.event_content import event_batch
from schemas.events import BatchAppended, decode_event, encode_event
from schemas.sealed import DERIVED_KEYS, DataKey, Sealed, open_sealed, seal

_ROOT = Path(__file__).resolve().parents[1]
MEMORY_CONVERSATIONS = 4 * DERIVED_KEYS

_V3 = parse_schema(json.loads((Path(__file__).resolve().parents[1] / "schemas" / "batch_appended.v3.avsc")
                              .read_text(encoding="utf-8")))


def _batch(n: int) -> Batch:
    messages = []
    for i in range(n // 2):
        messages += [Message.user(f"what is the status of order a-{i}?"),
                     Message.assistant(f"Order a-{i} shipped yesterday; it arrives Friday.")]
    return Batch("conv-bench", "append-1", messages)




def _codec(n: int, quick: bool) -> dict[str, float]:
    iterations = 2_000 if quick else 20_000
    batch, key = _batch(n), DataKey.generate()
    data = batch.canonical_json()
    event = BatchAppended.of(batch, 1)
    framed = encode_event(event)
    sealed = seal(key, data, conversation_id="conv-bench", append_id="append-1")

    def v3_body() -> bytes:
        s = seal(key, data, conversation_id="conv-bench", append_id="append-1")
        buf = BytesIO()
        schemaless_writer(buf, _V3, {"conversation_id": "conv-bench", "append_id": "append-1", "digest": "",
                                     "messages": b"", "message_count": len(batch),
                                     "content_bytes": batch.content_bytes(), "created_at_ms": 1,
                                     "expected_last": None,
                                     "sealed": {"key_id": s.key_id, "nonce": s.nonce, "ciphertext": s.ciphertext,
                                                "mac": s.mac}})
        return buf.getvalue()

    body = v3_body()

    def v3_open() -> bytes:
        rec = schemaless_reader(BytesIO(body), _V3, None)
        return open_sealed(key, Sealed(**rec["sealed"]), conversation_id="conv-bench", append_id="append-1")

    def read_path() -> object:
        decoded = decode_event(framed)
        assert isinstance(decoded, BatchAppended)  # Invariant: the framed event is a batch
        return event_batch(decoded)

    assert v3_open() == data  # Invariant: the sealed path round-trips.
    encode_us = best_us(lambda: encode_event(BatchAppended.of(batch, 1)), iterations)
    return {
        "bytes": float(len(data)),
        "encode_us": encode_us,
        "decode_us": best_us(read_path, iterations // 4),
        "seal_us": best_us(lambda: seal(key, data, conversation_id="conv-bench", append_id="append-1"), iterations),
        "open_us": best_us(lambda: open_sealed(key, sealed, conversation_id="conv-bench", append_id="append-1"),
                         iterations),
        "seal_open_us": best_us(lambda: open_sealed(key, seal(key, data, conversation_id="conv-bench",
                                                            append_id="append-1"),
                                                  conversation_id="conv-bench", append_id="append-1"), iterations),
        "sealed_encode_us": best_us(v3_body, iterations),
        "sealed_decode_open_us": best_us(v3_open, iterations),
        "key_derive_us": best_us(lambda: DataKey(key.key_id, key.secret).prepare(), iterations // 4),
    }


def _ms(fn: Callable[[int], object], n: int) -> float:
    start = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - start) / n * 1000


def _store(quick: bool, root: Path) -> dict[str, float]:
    n = 30 if quick else 200
    out: dict[str, float] = {}
    raw = root / "raw.bin"
    fd = os.open(raw, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def raw_append(_: int) -> None:
        os.write(fd, b"x" * 100)
        os.fsync(fd)

    out["baseline_append_fsync_ms"] = _ms(raw_append, n)
    os.close(fd)
    with FileKeyStore(root / "keys") as store:  # mostly new bucket files: + a directory fsync each
        out["file_create_new_bucket_ms"] = _ms(lambda i: store.create(f"c-{i}"), n)
    try:
        from rocksdict import Options, Rdict, WriteOptions
        db = Rdict(str(root / "rocks"), Options(raw_mode=True))
        wo = WriteOptions()
        wo.sync = True
        secret = os.urandom(100)
        out["rocksdict_put_sync_ms"] = _ms(lambda i: db.put(f"c-{i}".encode(), secret, wo), n)
        db.close()
    except ImportError:  # pragma: no cover - rocksdict is a dependency
        pass
    for keys in (2_560, 25_600):
        path = root / f"keys-{keys}"
        with FileKeyStore(path) as store:
            for i in range(64):
                store.create(f"d-{i}")
        _fill(path, keys)  # the rest written directly: the same frames as create, without 25k fsyncs
        with FileKeyStore(path) as store:
            m = max(5, n // 10)
            out[f"file_create_{keys}_ms"] = _ms(lambda i, s=store: s.create(f"e-{i}"), n)  # buckets exist
            out[f"file_destroy_{keys}_ms"] = _ms(lambda i, s=store, k=keys: s.destroy(f"d-{i * 97 % k}"), m)
    return out


def _fill(path: Path, keys: int) -> None:
    from engine.keys.files import bucket_of
    from engine.keys.record import encode_record, frame
    buckets: dict[int, list[bytes]] = {}
    for i in range(64, keys):
        c = f"d-{i}"
        buckets.setdefault(bucket_of(c), []).append(frame(encode_record(c, DataKey.generate())))
    for b, frames in buckets.items():
        with open(path / f"b-{b:02x}.keys", "ab") as f:
            f.write(b"".join(frames))


def key_memory_child(n: int, limit: int) -> float:
    """In this process (a fresh one): RSS growth per conversation, in bytes, once ``n`` new
    conversations each got their key from a ``FileKeyStore`` (a spare, bound in memory) and
    sealed a batch under it, with the bound on derived state at ``limit``."""
    from schemas import sealed

    sealed._DERIVED.limit = limit
    page = os.sysconf("SC_PAGE_SIZE")

    def rss() -> int:
        return int(Path("/proc/self/statm").read_text().split()[1]) * page

    with tempfile.TemporaryDirectory(prefix="histlog-bench-memory-", dir=os.environ.get("HISTLOG_BENCH_DIR")) as tmp, \
            FileKeyStore(Path(tmp) / "keys") as store:
        store.create("warm")
        gc.collect()
        before = rss()
        for i in range(n):
            seal(store.create(f"conv-{i:08d}"), b"[]", conversation_id="c", append_id="a")
        gc.collect()
        return (rss() - before) / n


def _key_memory(n: int, limit: int) -> float:
    code = "import sys; from bench.bench_sealed import key_memory_child as f; print(f(*map(int, sys.argv[1:])))"
    out = subprocess.run([sys.executable, "-c", code, str(n), str(limit)], cwd=_ROOT, check=True,
                         capture_output=True, text=True, timeout=600)
    return float(out.stdout.split()[-1])


def _memory() -> dict[str, float]:
    bounded = _key_memory(MEMORY_CONVERSATIONS, DERIVED_KEYS)
    unbounded = _key_memory(MEMORY_CONVERSATIONS, MEMORY_CONVERSATIONS)
    return {"conversations": MEMORY_CONVERSATIONS, "bound": DERIVED_KEYS,
            "bounded_bytes_per_conversation": round(bounded), "unbounded_bytes_per_conversation": round(unbounded),
            "ratio": round(bounded / unbounded, 3)}


def run(quick: bool = False) -> dict[str, Any]:
    result: dict[str, Any] = {"bench": "sealed", "unit": "us (codec), ms (store)"}
    for n in (2, 20):
        result[f"batch_{n}"] = _codec(n, quick)
    with tempfile.TemporaryDirectory(prefix="histlog-bench-sealed-", dir=os.environ.get("HISTLOG_BENCH_DIR")) as tmp:
        result["store"] = _store(quick, Path(tmp))
    result["memory"] = _memory()
    return result


def report(result: dict[str, Any]) -> str:
    rows = [("encode_event (today, baseline)", "encode_us"), ("seal", "seal_us"), ("open", "open_us"),
            ("seal + open", "seal_open_us"), ("seal + v3 encode", "sealed_encode_us"),
            ("v3 decode + open", "sealed_decode_open_us"), ("decode_event + event_batch (today)", "decode_us"),
            ("DataKey made + derived (once per key)", "key_derive_us")]
    lines = [f"{'operation (us per batch)':40}{'2 msgs':>9}{'20 msgs':>9}{'2: x enc':>10}{'20: x enc':>10}"]
    for label, key in rows:
        a, b = result["batch_2"][key], result["batch_20"][key]
        lines.append(f"{label:40}{a:9.2f}{b:9.2f}{a / result['batch_2']['encode_us']:9.2f}x"
                     f"{b / result['batch_20']['encode_us']:9.2f}x")
    store = result["store"]
    base = store["baseline_append_fsync_ms"]
    lines.append(f"{'key store (ms per op)':40}{'ms':>9}{'x fsync':>10}")
    for key, value in store.items():
        lines.append(f"{key:40}{value:9.3f}{value / base:9.2f}x")
    mem = result["memory"]
    bounded, unbounded = mem["bounded_bytes_per_conversation"], mem["unbounded_bytes_per_conversation"]
    lines.append(f"memory per conversation, {mem['conversations']:,} with a key each: {bounded:,} B with the bound "
                 f"({mem['bound']:,} derived), {unbounded:,} B with every key derived (x{mem['ratio']:.2f})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    result = run(quick="--quick" in args)
    print(report(result))
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
