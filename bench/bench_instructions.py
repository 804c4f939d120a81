"""Instructions per record of replay's validation (``event_batch``), counted by callgrind.

Callgrind counts are deterministic (the same on every run, whatever the machine's load), so
they decide a change to the per-record path where the wall clock of this 2-core VM cannot
(docs/design.md §11). Each figure is the difference of two runs in a fresh interpreter, with
the same records built and ``RECORDS`` of them validated or none, divided by ``RECORDS``: the
marginal cost of one record, imports and set-up excluded.

Run ``python -m bench.bench_instructions`` (needs ``valgrind``; about a minute): a table, then
one JSON line. Measured 2026-12-06, pydantic 2.14.4: 161k instructions for a 2-message text
turn, 1,886k for the bench's 20-message batch with tool calls, results and metadata.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

RECORDS = {2: 1000, 20: 200}
"""Records validated per shape (messages per batch -> count)."""

_CHILD = """
import sys
from bench.bench_schemas import _records
from schemas.event_content import event_batch
n, count, run = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "run"
events = _records(n, count)
event_batch(events[0])  # imports and first-use set-up, in both runs
for e in events if run else ():
    event_batch(e)
"""


def _instructions(n: int, count: int, run: bool) -> int:
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "callgrind.out"
        done = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
                               "-c", _CHILD, str(n), str(count), "run" if run else "idle"],
                              capture_output=True, text=True, timeout=600, check=False,
                              cwd=Path(__file__).resolve().parents[1])
        found = re.search(r"Collected : (\d+)", done.stderr)
        if done.returncode != 0 or found is None:
            raise RuntimeError(f"callgrind failed ({done.returncode}): {done.stderr[-500:]}")
        return int(found.group(1))


def run(quick: bool = False) -> dict[str, Any]:
    """``{"event_batch_2": instructions per record, "event_batch_20": ...}`` (``quick``: a tenth
    of the records; the counts stay exact, the set-up's share of noise grows)."""
    if shutil.which("valgrind") is None:
        raise RuntimeError("valgrind is not installed: apt-get install valgrind")
    result: dict[str, Any] = {"bench": "instructions", "unit": "instructions per record"}
    for n, count in RECORDS.items():
        count = max(count // 10, 20) if quick else count
        result[f"event_batch_{n}"] = (_instructions(n, count, True) - _instructions(n, count, False)) // count
    return result


def report(result: dict[str, Any]) -> str:
    return (f"{'event_batch per record (callgrind instructions)':50}{'2 msgs':>12}{'20 msgs':>12}\n"
            f"{'':50}{result['event_batch_2']:>12,}{result['event_batch_20']:>12,}")


def main() -> int:
    result = run(quick="--quick" in sys.argv[1:])
    print(report(result))
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
