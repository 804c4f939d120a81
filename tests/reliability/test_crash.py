"""Crash safety: kill -9 a writer at random moments; every printed receipt must survive, nothing
duplicated, no batch torn, no turn replacement half-applied, and the state must equal a rebuild
from the log."""

from __future__ import annotations

import itertools
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from engine import HistoryEngine
from schemas import InvalidReceipt, Receipt
from tests.conformance.facade_contract import snapshot
from tests.reliability.crash_writer import TURNS
from tests.reliability.pipe_lines import PipeLines

ROUNDS = int(os.environ.get("HISTLOG_CRASH_ROUNDS", "20"))
REPO = Path(__file__).resolve().parents[2]
WAIT_S = 60.0  # bound on each wait for the writer (start and print, die, drain)


def parse(lines: list[bytes]) -> list[Receipt]:
    """The writer's lines ``SEQ RECEIPT_JSON`` as receipts. SEQ must run 0, 1, 2... with no gap,
    so not one printed receipt was lost on the way; any other line is a failure naming it."""
    out = []
    for n, line in enumerate(lines):
        seq, _, body = line.partition(b" ")
        assert seq == b"%d" % n, f"line {n} of the writer's output is {line!r}: a line lost or foreign"
        try:
            out.append(Receipt.from_json(body))
        except InvalidReceipt as exc:
            raise AssertionError(f"the writer printed {line!r}, which is not a receipt: {exc}") from None
    return out


def run_and_kill(data: Path, round_: int, rng: random.Random) -> list[Receipt]:
    """Start a writer, read ``want`` receipts, kill -9 it, then read every receipt it printed
    before it died. Every line must be a whole receipt: the writer prints each with one atomic
    pipe write (see crash_writer), so a kill cannot cut one and a partial line is an error too."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.reliability.crash_writer", str(data), str(round_)],
                            cwd=REPO, stdout=subprocess.PIPE, bufsize=0)
    assert proc.stdout is not None
    # One reader for the whole stream (never readline() then communicate(): see pipe_lines).
    out = PipeLines(proc.stdout.fileno())
    try:
        deadline = time.monotonic() + WAIT_S
        assert out.line(deadline) == b"ready\n"
        want = rng.randrange(1, 400)
        lines: list[bytes] = []
        while len(lines) < want:
            line = out.line(deadline)
            assert line is not None, "the writer died on its own"
            lines.append(line)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=WAIT_S) == -signal.SIGKILL
        lines += out.rest(time.monotonic() + WAIT_S)  # the writer is gone: end of file is near
        assert out.tail == b"", f"a receipt line cut by the kill: {out.tail!r}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=WAIT_S)
        proc.stdout.close()
    return parse(lines)


def check_turns(engine: HistoryEngine) -> set[str]:
    """Conversation ``turns``: one visible turn, every replaced one hidden whole, each superseded
    by the next turn in order. Returns the append ids it holds."""
    visible = engine.entries(TURNS)
    assert [e.message.text() for e in visible][:1] == ["q"] and len(visible) == 2
    assert visible[1].message.text() == f"a {visible[0].append_id}"
    everything = engine.entries(TURNS, include_hidden=True)
    assert everything[-2:] == visible
    turns = [everything[i:i + 2] for i in range(0, len(everything), 2)]
    for older, newer in itertools.pairwise(turns):
        assert [e.superseded_by for e in older] == [newer[0].id] * 2, "a torn or unlinked replacement"
        assert {e.append_id for e in older} == {older[0].append_id} and older[0].reason == "retry"
    return {f"{TURNS}/{t[0].append_id}" for t in turns}


def check_history(engine: HistoryEngine, receipts: list[Receipt]) -> None:
    seen_ids: set[str] = set()
    for conv in engine.conversations():
        if conv == TURNS:
            seen_ids |= check_turns(engine)
            continue
        entries = engine.entries(conv)
        texts = [e.message.text() for e in entries]
        # No batch torn: messages alternate q/a of the same append id.
        assert len(texts) % 2 == 0
        for q, a in zip(texts[0::2], texts[1::2], strict=True):
            assert q.startswith("q ") and a == "a " + q[2:], (q, a)
        ids = [e.append_id for e in entries[0::2]]
        assert len(ids) == len(set(ids)), "a batch appears twice"
        seen_ids.update(f"{conv}/{a}" for a in ids)
    for r in receipts:
        assert f"{r.conversation_id}/{r.append_id}" in seen_ids, f"lost a returned receipt: {r}"


def test_kill_9_at_random_moments_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("HISTLOG_CRASH_SEED", "7")))
    data = tmp_path / "data"
    receipts: list[Receipt] = []
    for round_ in range(ROUNDS):
        receipts += run_and_kill(data, round_, rng)
        with HistoryEngine.open(data) as engine:
            check_history(engine, receipts)
            for r in receipts[-20:]:  # a retry after the crash returns the same receipt
                assert engine.read(r.conversation_id, at_least=r)
    assert len(receipts) >= ROUNDS
    with HistoryEngine.open(data) as engine:
        before = snapshot(engine), engine.entries(TURNS, include_hidden=True)
        stats = engine.stats()
    shutil.rmtree(data / "state")
    with HistoryEngine.open(data) as engine:
        assert (snapshot(engine), engine.entries(TURNS, include_hidden=True)) == before
        rebuilt = engine.stats()
        assert (rebuilt.accepted, rebuilt.duplicates) == (stats.accepted, stats.duplicates)
