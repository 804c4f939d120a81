"""FileLog throughput against raw-file baselines measured in the same run.

``python -m bench.bench_log [--quick]`` prints a table and one JSON line. ``run(quick)``
returns the same numbers as a dict:

* ``raw_write_fsync``: one ``os.write`` + ``os.fsync`` per 400-byte record, one at a time
  (what a log without group commit can do at best);
* ``raw_write``: one ``os.write`` per record, no fsync (the ceiling);
* ``filelog_always_T``: ``FileLog.append`` with ``fsync="always"`` from T threads;
* ``scan``: reading 200k records back with ``FileLog.read`` (CRC-checked), records/s;
* ``open``: opening a log whose newest segment holds 140k records (about 62 MiB) after a
  clean close, from its saved tail index (``engine.log.index``) against the same open with the
  index deleted (every frame walked), best of 3 each, in ms; and the close after an indexed open
  (which saves the index from the CRC its writer kept) against reading the segment back and
  taking its CRC-32C (what a close did before the writer kept it).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import crc32c

from bench.common import run_threads
from engine.log import format as fmt
from engine.log.base import record_key
from engine.log.file import FileLog

VALUE = b"v" * 400


def _raw(directory: Path, count: int, *, fsync: bool) -> float:
    fd = os.open(directory / f"raw-{fsync}.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        start = time.perf_counter()
        for _ in range(count):
            os.write(fd, VALUE)
            if fsync:
                os.fsync(fd)
        return count / (time.perf_counter() - start)
    finally:
        os.close(fd)


def _filelog(directory: Path, threads: int, per_thread: int) -> dict[str, float]:
    with FileLog(directory / f"log-{threads}", 1, fsync="always") as log:
        rate, _ = run_threads(threads, per_thread,
                              lambda t, i: log.append(record_key(f"conversation-{t}", str(i)), VALUE))
        stats = log.stats()
    total = threads * per_thread
    return {"rate": rate, "appends": total, "fsyncs": stats.fsyncs,
            "mean_group": total / max(1, stats.writes)}


def _scan(directory: Path, count: int) -> dict[str, float]:
    root = directory / "scan"
    with FileLog(root, 1, fsync="never") as log:
        for i in range(count):
            log.append(record_key("conversation", str(i)), VALUE)
    with FileLog(root, 1) as log:
        start = time.perf_counter()
        offset, seen = 0, 0
        while True:
            batch = log.read(0, offset, 1000)
            if not batch:
                break
            seen += len(batch)
            offset = batch[-1].offset + 1
        elapsed = time.perf_counter() - start
    assert seen == count  # Invariant: every record written is read back
    return {"rate": seen / elapsed, "records": seen}


def _open(directory: Path, count: int) -> dict[str, float]:
    root = directory / "open"
    with FileLog(root, 1, fsync="never") as log:
        for i in range(count):
            log.append(record_key("conversation", str(i)), VALUE)
    index = fmt.tail_index_path(root, 0)
    segment = fmt.list_segments(fmt.partition_dir(root, 0))[-1][1]
    best = {"indexed_ms": float("inf"), "walked_ms": float("inf"), "close_ms": float("inf"),
            "reread_ms": float("inf")}
    for _ in range(3):
        for kind in ("indexed_ms", "walked_ms"):
            if kind == "walked_ms":
                index.unlink()  # the close below saves it again
            start = time.perf_counter()
            log = FileLog(root, 1)
            opened = time.perf_counter()
            walked = log.stats().tail_frames_scanned
            log.close()
            closed = time.perf_counter()
            best[kind] = min(best[kind], (opened - start) * 1000)
            if kind == "indexed_ms":
                best["close_ms"] = min(best["close_ms"], (closed - opened) * 1000)
            assert walked == (count if kind == "walked_ms" else 0)  # Invariant: the open this row names
        start = time.perf_counter()
        crc32c.crc32c(segment.read_bytes())
        best["reread_ms"] = min(best["reread_ms"], (time.perf_counter() - start) * 1000)
    segment_mib = sum(p.stat().st_size for _, p in fmt.list_segments(fmt.partition_dir(root, 0))) / 2**20
    return {"records": count, "segment_mib": segment_mib, **best, "speedup": best["walked_ms"] / best["indexed_ms"]}


def run(quick: bool = False) -> dict[str, Any]:
    fsync_count = 300 if quick else 1500
    per_thread = {1: 300 if quick else 1500, 16: 60 if quick else 300, 64: 20 if quick else 100}
    scan_count = 20_000 if quick else 200_000
    with tempfile.TemporaryDirectory(prefix="bench-log-") as tmp:
        d = Path(tmp)
        results: dict[str, Any] = {
            "raw_write_fsync": _raw(d, fsync_count, fsync=True),
            "raw_write": _raw(d, fsync_count * 20, fsync=False),
        }
        for threads, n in per_thread.items():
            results[f"filelog_always_{threads}"] = _filelog(d, threads, n)
        results["scan"] = _scan(d, scan_count)
        results["open"] = _open(d, 20_000 if quick else 140_000)
    base = results["raw_write_fsync"]
    for threads in per_thread:
        row = results[f"filelog_always_{threads}"]
        row["vs_raw_fsync"] = row["rate"] / base
    return results


def report(r: dict[str, Any]) -> str:
    rows = [("raw os.write + os.fsync, one at a time", r["raw_write_fsync"], ""),
            ("raw os.write, no fsync", r["raw_write"], "")]
    for key in ("filelog_always_1", "filelog_always_16", "filelog_always_64"):
        x = r[key]
        rows.append((f"FileLog.append fsync=always, {key.rsplit('_', 1)[1]} threads", x["rate"],
                     f"{x['vs_raw_fsync']:.1f}x raw fsync, {x['mean_group']:.1f} records/write"))
    rows.append((f"FileLog.read scan of {r['scan']['records']} records", r["scan"]["rate"], ""))
    o = r["open"]
    rows.append((f"FileLog open, tail of {o['records']} records ({o['segment_mib']:.0f} MiB), saved index",
                 o["records"] / o["indexed_ms"] * 1000,
                 f"{o['indexed_ms']:.1f} ms vs {o['walked_ms']:.0f} ms walking every frame (x{o['speedup']:.0f}); "
                 f"its close {o['close_ms']:.1f} ms (reading the segment back for its CRC: "
                 f"{o['reread_ms']:.1f} ms more)"))
    width = max(len(name) for name, _, _ in rows)
    lines = [f"{'operation':<{width}}  {'records/s':>12}  note", "-" * (width + 40)]
    lines += [f"{name:<{width}}  {rate:>12,.0f}  {note}" for name, rate, note in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    out = run(quick="--quick" in sys.argv)
    print(report(out))
    print(json.dumps(out, sort_keys=True))
