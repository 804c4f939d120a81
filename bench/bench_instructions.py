"""Instructions per operation of the per-record path, counted by callgrind, against the raw log.

Callgrind counts are deterministic (the same on every run, whatever the machine's load), so they
decide a change to the per-record path where the wall clock of this 2-core VM cannot
(docs/design.md §11). Every figure is a marginal cost: in one process, with the inputs built
before and warmed up, callgrind counts a window of N operations and one of 2N (it dumps its
counters at each ``operator.call``, the bench's mark), and the difference over N is the cost of
one operation, its fixed costs cancelled. Every thread counts (the group commit, the
projector), the kernel's work does not (an fsync costs its syscall only). Hash seeds are fixed
and the inputs frozen out of the cyclic GC, so a count repeats to within about 1%.

Rows (one writer, 2-message batches, the bench's ``batch``; sealed unless named plain):

* ``append``: ``HistoryEngine.append`` of a built batch, decided (written, admitted, its
  receipt back), fsync ``always``; the baseline ``raw_append``: ``FileLog.append`` of the
  pre-encoded record, fsync ``always``.
* ``replay``: ``HistoryEngine.open`` after ``state/`` was deleted, per record; the baseline
  ``raw_replay``: ``FileLog.read`` of the same log and ``decode_event`` of each record.
* ``append_plain`` / ``replay_plain``: the same with ``seal=False``: the price of sealing.
* The split (each alone, the same marginal way), named by what the engine calls per record:
  ``of`` (``BatchAppended.of``: the canonical content, its digest), ``seal`` (``seal_event``),
  ``encode`` (``encode_event`` of the sealed event), ``decode`` (``decode_event``), ``open``
  (``open_content``), ``validate`` (``event_batch`` of the opened content: the pydantic models),
  ``receipt`` (``answer``: a decision to a ``Receipt``), ``rocksdb`` (one ``WriteBatch`` of the 10
  keys a 2-message turn writes, to a real RocksDB); on the projector's side, for a record of its
  own (plain, as ``Known`` hands it over): ``admit`` (admission and the rows into a step's
  ``Tx``, not committed), ``rows`` (``full.append`` alone: the rows of a 2-message turn) and
  ``step`` (``Projector.apply`` of that one record with its ticket: admission, the commit to
  RocksDB, the checkpoint, the publish and the ticket's decision, on the calling thread).

Run ``python -m bench.bench_instructions [--quick]`` or ``histlog bench instructions`` (needs
valgrind: ``apt-get install valgrind``; about 4 minutes, quick about 1): a table, then one JSON
line. The budgets of issue 44 (append <= 270k, replay <= 200k) are printed beside the rows; they
are not asserted.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["report", "run"]

ROOT = Path(__file__).resolve().parents[1]
BUDGETS = {"append": 270_000, "replay": 200_000}

_PRELUDE = """
import gc, json, operator, sys
from pathlib import Path
from bench.common import batch, event_bytes
n, target = int(sys.argv[1]), Path(sys.argv[2])
batches = [batch(f"conv-{i // 10}", f"a-{i}") for i in range(3 * n + 40)]
labels = []
def mark(label):  # callgrind dumps at operator.call: the window that ends here is ``label``
    labels.append(label)
    operator.call(len, ())
def pair(name, small, big):  # inputs are built: the cyclic GC stops walking them, as a caller's objects
    gc.collect()
    gc.freeze()
    mark("gap")
    small()
    mark(name + ":n")
    big()
    mark(name + ":2n")
"""

_END = """
print(json.dumps(labels))
"""

_APPEND = """
from engine import HistoryEngine
eng = HistoryEngine.open(target, partitions=1, fsync="always", seal=SEAL)
for b in batches[:20]:
    eng.append(b)
def appends(lo, hi):
    for b in batches[lo:hi]:
        eng.append(b)
pair("NAME", lambda: appends(20, n + 20), lambda: appends(n + 20, 3 * n + 20))
eng.close()
"""

_RAW_APPEND = """
from engine.log.file import FileLog
from engine.log.base import record_key
records = [(record_key(b.conversation_id, b.append_id), event_bytes(b)) for b in batches]
log = FileLog(target, 1, fsync="always")
for k, v in records[:20]:
    log.append(k, v)
def appends(lo, hi):
    for k, v in records[lo:hi]:
        log.append(k, v)
pair("raw_append", lambda: appends(20, n + 20), lambda: appends(n + 20, 3 * n + 20))
log.close()
"""

_REPLAY = """
from engine import HistoryEngine
def replay(d):
    HistoryEngine.open(d, partitions=1, fsync="always").close()
replay(target / "warm")
pair("NAME", lambda: replay(target / "n"), lambda: replay(target / "2n"))
"""

_RAW_REPLAY = """
from engine.log.file import FileLog
from schemas.events import decode_event
def scan(d):
    log = FileLog(d / "log", None, fsync="always")
    offset = 0
    while True:
        got = log.read(0, offset, 1000)
        if not got:
            break
        for r in got:
            decode_event(r.value)
        offset = got[-1].offset + 1
    log.close()
scan(target / "warm")
pair("raw_replay", lambda: scan(target / "n"), lambda: scan(target / "2n"))
"""

_PARTS = """
from engine.keys import FileKeyStore
from schemas.events import BatchAppended, encode_event, decode_event
from schemas.event_content import seal_event, open_content, event_batch
from schemas.positions import LogPosition
from projections.admission import Decision, Outcome
from engine.refusals import answer
from rocksdict import Rdict, WriteBatch
keys = FileKeyStore(target / "keys")
key = keys.create("conv-bench")
keys.close()  # its spare keys' refill thread stops: nothing runs beside the loops
of = [BatchAppended.of(b, 1_700_000_000_000) for b in batches]
sealed = [seal_event(e, key) for e in of]
encoded = [encode_event(e) for e in sealed]
decoded = [decode_event(v) for v in encoded]
opened = [open_content(e, key) for e in decoded]
accepted = [Decision(Outcome.ACCEPTED, b.digest, LogPosition(0, i)) for i, b in enumerate(batches)]
from dataclasses import dataclass
from projections import full
from projections.admission import Own, admit
from projections.rows import ConversationRow, Stats
from projections.runtime import Projector
from projections.store import StateStore
from schemas.records import record_key_bytes
@dataclass
class Record:
    partition: int
    offset: int
    key: bytes
    value: bytes
plain = [encode_event(e) for e in of]
records = [Record(0, i, record_key_bytes(b.conversation_id.encode(), b.append_id.encode()), v)
           for i, (b, v) in enumerate(zip(batches, plain))]
owns = [Own(e, b, None) for e, b in zip(of, batches)]
known = {(r.key, r.value): own for r, own in zip(records, owns)}
store = StateStore(target / "state")
txs = [store.tx() for _ in batches]
txs_rows = [store.tx() for _ in batches]
counters = Stats()
convs = [b.conversation_id.encode() for b in batches]
projector = Projector(StateStore(target / "steps"), 1)
def step(i):  # the projector's step of one record of its own, as one writer's append gives it
    r = records[i]
    ticket = projector.expect(r.key, r.value, owns[i])
    projector.apply([r])
    ticket.release()
db = Rdict(str(target / "db"))
rows = [[(f"{b.conversation_id}/{b.append_id}/{j}".encode(), b"v" * 120) for j in range(10)] for b in batches]
def rocksdb(i):
    wb = WriteBatch()
    for k, v in rows[i]:
        wb.put(k, v)
    db.write(wb)
steps = {
    "of": lambda i: BatchAppended.of(batches[i], 1_700_000_000_000),
    "seal": lambda i: seal_event(of[i], key),
    "encode": lambda i: encode_event(sealed[i]),
    "decode": lambda i: decode_event(encoded[i]),
    "open": lambda i: open_content(decoded[i], key),
    "validate": lambda i: event_batch(decoded[i], content=opened[i]),
    "receipt": lambda i: answer(batches[i], accepted[i]),
    "rocksdb": rocksdb,
    "admit": lambda i: admit(txs[i], counters, LogPosition(0, i), records[i].key, records[i].value, known=known),
    "rows": lambda i: full.append(txs_rows[i], convs[i], ConversationRow(), batches[i], 1_700_000_000_000),
    "step": step,
}
def loop(step, lo, hi):
    for i in range(lo, hi):
        step(i)
for name, step in steps.items():
    loop(step, 0, 20)
    pair(name, lambda: loop(step, 20, n + 20), lambda: loop(step, n + 20, 3 * n + 20))
db.close()
"""

PARTS = ("of", "seal", "encode", "decode", "open", "validate", "receipt", "rocksdb", "admit", "rows", "step")
"""The split, in the order ``_PARTS`` measures them."""


def _windows(code: str, n: int, target: Path) -> dict[str, int]:
    """Callgrind's instructions in each labelled window of ``code`` run with ``n`` on ``target``."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "callgrind.out"
        done = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                               "--dump-before=_operator_call*", sys.executable, "-c", _PRELUDE + code + _END,
                               str(n), str(target)],
                              capture_output=True, text=True, timeout=1800, check=False, cwd=ROOT,
                              env={**os.environ, "PYTHONHASHSEED": "0"})  # the same dict layouts every run
        if done.returncode != 0:
            raise RuntimeError(f"callgrind failed ({done.returncode}): {done.stderr[-800:]}")
        labels = json.loads(done.stdout.strip().splitlines()[-1])
        dumps = sorted(Path(scratch).glob("callgrind.out.*"), key=lambda p: int(p.suffix[1:]))
        if len(dumps) != len(labels):
            raise RuntimeError(f"callgrind wrote {len(dumps)} windows for {len(labels)} marks")
        counts = {}
        for label, dump in zip(labels, dumps, strict=True):
            found = re.search(r"^summary: (\d+)", dump.read_text(errors="replace"), re.M)
            assert found is not None, dump
            counts[label] = int(found.group(1))
    return counts


def _per(counts: dict[str, int], name: str, n: int) -> int:
    """The marginal cost of one operation: the 2N window less the N window, over N."""
    return (counts[f"{name}:2n"] - counts[f"{name}:n"]) // n


def _fill(target: Path, n: int, seal: bool) -> None:
    """A log of ``n`` batches written by the engine (outside callgrind), its state deleted."""
    code = ("import sys\nfrom pathlib import Path\nfrom bench.common import batch\nfrom engine import HistoryEngine\n"
            "n, d, seal = int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == 'sealed'\n"
            "with HistoryEngine.open(d, partitions=1, fsync='never', seal=seal) as eng:\n"
            "    for i in range(n):\n        eng.append(batch(f'conv-{i // 10}', f'a-{i}'))\n")
    subprocess.run([sys.executable, "-c", code, str(n), str(target), "sealed" if seal else "plain"], check=True,
                   timeout=600, cwd=ROOT, capture_output=True)
    shutil.rmtree(target / "state")


def _measure(name: str, code: str, n: int, *, logs: bool | None = None) -> dict[str, int]:
    with tempfile.TemporaryDirectory(prefix="histlog-instr-") as scratch:
        target = Path(scratch)
        if logs is not None:  # replays: logs of 20 (warm-up), N and 2N records
            for sub, size in (("warm", 20), ("n", n), ("2n", 2 * n)):
                _fill(target / sub, size, logs)
        else:
            target = target / "d"
        counts = _windows(code, n, target)
    print(f"  {name}: done", file=sys.stderr, flush=True)
    return counts


def run(quick: bool = False) -> dict[str, Any]:
    """Instructions per operation (see the module docstring); ``quick``: a quarter of the
    operations (the counts stay exact, the set-up's share of the noise grows)."""
    if shutil.which("valgrind") is None:
        return {"bench": "instructions", "skipped": "skipped: bench instructions needs valgrind (callgrind counts "
                                                    "the instructions): apt-get install valgrind"}
    n = 100 if quick else 400
    result: dict[str, Any] = {"bench": "instructions", "unit": "instructions per operation", "n": n}
    for name, seal in (("append", "True"), ("append_plain", "False")):
        counts = _measure(name, _APPEND.replace("SEAL", seal).replace("NAME", name), n)
        result[name] = _per(counts, name, n)
    result["raw_append"] = _per(_measure("raw_append", _RAW_APPEND, n), "raw_append", n)
    for name, sealed in (("replay", True), ("replay_plain", False)):
        result[name] = _per(_measure(name, _REPLAY.replace("NAME", name), n, logs=sealed), name, n)
    result["raw_replay"] = _per(_measure("raw_replay", _RAW_REPLAY, n, logs=True), "raw_replay", n)
    parts = _measure("parts", _PARTS, n)
    result["parts"] = {part: _per(parts, part, n) for part in PARTS}
    return result


def report(result: dict[str, Any]) -> str:
    if "skipped" in result:
        return str(result["skipped"])

    def ratio(a: str, b: str) -> str:
        return f"{result[a] / result[b]:.2f}x"

    lines = [f"{'callgrind instructions per operation':44}{'histlog':>11}{'baseline':>11}{'ratio':>8}"
             f"{'budget':>10}",
             f"{'append, sealed (vs FileLog.append)':44}{result['append']:>11,}{result['raw_append']:>11,}"
             f"{ratio('append', 'raw_append'):>8}{BUDGETS['append']:>10,}",
             f"{'replay, sealed (vs FileLog.read + decode)':44}{result['replay']:>11,}{result['raw_replay']:>11,}"
             f"{ratio('replay', 'raw_replay'):>8}{BUDGETS['replay']:>10,}",
             f"{'append, sealed vs plain (price of sealing)':44}{result['append']:>11,}"
             f"{result['append_plain']:>11,}{ratio('append', 'append_plain'):>8}",
             f"{'replay, sealed vs plain (price of sealing)':44}{result['replay']:>11,}"
             f"{result['replay_plain']:>11,}{ratio('replay', 'replay_plain'):>8}",
             "per record, each part alone: " + ", ".join(f"{k} {v:,}" for k, v in result["parts"].items())]
    return "\n".join(lines)


def main() -> int:
    result = run(quick="--quick" in sys.argv[1:])
    print(report(result))
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
