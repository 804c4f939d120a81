"""A model-based fault harness (docs/design.md §7): random writes against the embedded engine (real
FileLog, real RocksDB, ``fsync="always"``) running in a child process, interleaved with faults —
kill -9 (also with a command in flight), clean reopen, deletion of the state and damage to it.

After every step the engine agrees with the plain-Python reference model
(tests/conformance/turns_model.py): entries (hidden ones too), read, windows, conversations,
latest_turn, the admission counters of ``stats()`` the model can know, and a custom
projection's mirror of the visible history; after every restart each acknowledged receipt is
still there (an identical retry returns it, or ``ConversationClosed`` once cleared). At the end
(and at every state deletion) the projections equal a rebuild from the log.

A write in flight at a kill has an unknown outcome: it is settled by resending it identically
once the engine is back, which must return the original receipt if it had been accepted, or
decide it now (the model's state is what it was when the write was sent). ``fault_stats``
counts how often each case happened.

Damage to the state is the same machine plus damage rules: test_fault_model_damage.py.
``HISTLOG_FAULT_EXAMPLES=500`` runs a long search (default 15 examples of 25 steps, < 90 s
for both files on a 2-core machine).
"""

from __future__ import annotations

import os
import select
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from engine import EMPTY
from schemas import AppendID, Batch, ConversationID, LogPosition, Message, Receipt
from tests.conformance.turns_model import Expected, RefConversation, Verdict
from tests.reliability.fault_checks import Bounds, check_observation, comparable
from tests.reliability.fault_process import Worker, Zygote

STATE_DAMAGE = True
"""Run the state-damage tests of test_fault_model_damage.py (truncated .sst, missing CURRENT /
MANIFEST, garbage in a state file): a damaged state must be rebuilt from the log (issue 11,
defect 5), and an open removes the scratch states a killed open left (defect 8)."""

EXAMPLES = int(os.environ.get("HISTLOG_FAULT_EXAMPLES", "15"))
STEPS = int(os.environ.get("HISTLOG_FAULT_STEPS", "25"))
OPEN_CONVS = 3
APPEND_IDS = st.sampled_from([f"a{i}" for i in range(6)])
SHAPES = st.sampled_from(["turn", "turn", "user", "assistant", "system_turn"])
VARIANTS = st.integers(0, 2)
PRECONDITIONS = st.sampled_from(["none", "none", "none", "right", "stale", "empty", "ghost"])
TARGETS = st.sampled_from(["latest", "latest", "latest", "older", "hidden", "bogus"])
KILL_POINTS = st.sampled_from(["sent", "written", "answered"])

fault_stats: Counter[str] = Counter()
"""What the faults met, over the whole run (printed by the test, reported with -s)."""


def batch_of(cid: str, aid: str, shape: str, variant: int) -> Batch:
    tag = f"{aid} v{variant}"
    user, answer = Message.user(f"question {tag}"), Message.assistant(f"answer {tag}")
    messages = {"turn": [user, answer], "user": [user], "assistant": [answer],
                "system_turn": [Message.system(f"system {tag}"), user, answer]}[shape]
    return Batch(cid, aid, messages)


@dataclass
class Write:
    """A write ready to send: its command, and how to judge its answer against the model."""

    cmd: dict[str, Any]
    settle: Callable[[dict[str, Any], bool], None]


class FaultModel(RuleBasedStateMachine):
    zygote: Zygote  # set by the test (one zygote serves every example)
    expect_no_scratch = False
    """Whether an open must leave no ``.replay-*`` scratch state of a killed open behind (issue
    11, defect 8: on with the state fixes, in ``DamageFaultModel``)."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="histlog-fault-"))
        self.data = self.tmp / "data"
        self.convs = [RefConversation(f"c{i}") for i in range(OPEN_CONVS)]
        self.created: dict[tuple[str, str], str] = {}
        self.bounds = Bounds()
        self.acked: list[tuple[RefConversation, Batch, Receipt]] = []
        self.checked = False
        try:
            self.worker = self.start()
        except BaseException:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise

    # -- processes -------------------------------------------------------------------------------
    def start(self) -> Worker:
        worker = self.zygote.spawn(self.data)
        if "ready" not in worker.first:
            worker.kill()
            raise AssertionError(f"the engine did not open {self.data}: {worker.first['open_error']}: "
                                 f"{worker.first['message']}\n{worker.first.get('traceback', '')}")
        return worker

    def restart(self) -> None:
        self.worker = self.start()
        if self.expect_no_scratch:
            assert not self.scratch_dirs(), f"stale scratch states left after open: {self.scratch_dirs()}"

    def check_receipts(self) -> None:
        """Every acknowledged receipt is still there: an identical retry returns it (or
        ``ConversationClosed`` once its conversation was cleared)."""
        answers = self.worker.value({"op": "resend", "batches": [b.to_json().decode() for _, b, _ in self.acked]})
        for (m, b, r), got in zip(self.acked, answers, strict=True):
            if m.closed:
                assert got.get("error") == "ConversationClosed", (b, got)
            else:
                assert got == {"ok": r.to_dict()}, f"acknowledged {r} lost or changed: an identical retry got {got}"

    def observe(self) -> dict[str, Any]:
        got: dict[str, Any] = self.worker.value({"op": "observe", "convs": [m.cid for m in self.convs]})
        return got

    def log_bytes(self) -> int:
        return sum(f.stat().st_size for f in (self.data / "log").rglob("*") if f.is_file())

    # -- choosing ----------------------------------------------------------------------------------
    def conv(self, pick: int) -> RefConversation:
        """``pick`` 0..2: an open conversation; 3: a cleared one (if any)."""
        open_ = [m for m in self.convs if not m.closed]
        closed = [m for m in self.convs if m.closed]
        return closed[-1] if pick >= OPEN_CONVS and closed else open_[pick % len(open_)]

    def expected_last(self, m: RefConversation, choice: str, batch: Batch) -> tuple[object, Any]:
        """``(value for the model, value for the worker's JSON)``."""
        receipts = [m.accepted[a].receipt for a in m.order]
        if choice == "right" and receipts:
            r = receipts[-1]
        elif choice == "stale" and len(receipts) > 1:
            r = receipts[0]
        elif choice == "ghost":
            r = Receipt(ConversationID(m.cid), AppendID(f"ghost-{batch.append_id}"), batch.digest,
                        LogPosition(0, 10**6))
        elif choice in ("right", "stale", "empty"):
            return EMPTY, "EMPTY"
        else:
            return None, None
        assert r is not None
        return r, r.to_dict()

    # -- writes --------------------------------------------------------------------------------------
    def judged(self, m: RefConversation, batch: Batch, expected: Expected, *, old_turn_id: str | None = None,
               reason: str | None = None) -> Callable[[dict[str, Any], bool], None]:
        def settle(answer: dict[str, Any], in_doubt: bool) -> None:
            verdict = expected.verdict
            if verdict is Verdict.ACCEPT:
                assert "ok" in answer, f"{batch!r}: expected acceptance, got {answer}"
                r = Receipt.from_dict(answer["ok"])
                r.validate_for(batch)
                assert all(r.position != other.position for _, _, other in self.acked), f"a reused position: {r}"
                m.accept(batch, r, old_turn_id=old_turn_id, reason=reason)
                self.acked.append((m, batch, r))
            elif verdict is Verdict.DUPLICATE:
                prior = m.accepted[str(batch.append_id)].receipt
                assert prior is not None and answer == {"ok": prior.to_dict()}, (batch, answer)
            else:
                assert verdict.error is not None
                assert answer.get("error") == verdict.error.__name__, f"{batch!r}: expected {verdict}, got {answer}"
                name = {Verdict.CONFLICT: "conflicts", Verdict.CLOSED: "rejected_closed",
                        Verdict.PRECONDITION: "precondition_failed",
                        Verdict.NOT_REPLACEABLE: "not_replaceable"}[verdict]
                self.bounds.at_most[name] += 2 if in_doubt else 1
                self.bounds.at_least[name] += int(expected.needs_log)
        return settle

    def append_write(self, pick: int, aid: str, shape: str, variant: int, precondition: str) -> Write:
        m = self.conv(pick)
        b = batch_of(m.cid, aid, shape, variant)
        model_expected, wire_expected = self.expected_last(m, precondition, b)
        expected = m.decide_append(b, model_expected)
        return Write({"op": "append", "batch": b.to_json().decode(), "expected_last": wire_expected},
                     self.judged(m, b, expected))

    def replace_write(self, pick: int, aid: str, variant: int, target: str, reason: str, same_user: bool) -> Write:
        m = self.conv(pick)
        latest = m.latest_turn_id()
        turns, hidden = m.turn_ids(), m.hidden_turn_ids()
        old = {"latest": latest, "older": turns[0] if len(turns) > 1 else latest,
               "hidden": hidden[0] if hidden else latest, "bogus": f"ghost-{aid}/0"}[target] or f"none-{aid}/0"
        row = m.row(old)
        user = row.message if same_user and row is not None and row.message.role == "user" else \
            Message.user(f"edited {aid} v{variant}")
        b = Batch(m.cid, aid, [user, Message.assistant(f"regenerated {aid} v{variant}")])
        expected = m.decide_replace(b, old, reason)
        return Write({"op": "replace", "batch": b.to_json().decode(), "old_turn_id": old, "reason": reason},
                     self.judged(m, b, expected, old_turn_id=old, reason=reason))

    def retry_write(self, pick: int, index: int, conflicting: bool) -> Write | None:
        """An identical (or, ``conflicting``, a changed) resend of an accepted batch, by its own route."""
        m = self.conv(pick)
        if not m.order:
            return None
        prior = m.accepted[m.order[index % len(m.order)]]
        b = prior.batch
        if conflicting:
            b = Batch(m.cid, b.append_id, [*b.messages, Message.assistant("and something else")])
        if prior.old_turn_id is not None and prior.reason is not None:
            return Write({"op": "replace", "batch": b.to_json().decode(), "old_turn_id": prior.old_turn_id,
                          "reason": prior.reason},
                         self.judged(m, b, m.decide_replace(b, prior.old_turn_id, prior.reason),
                                     old_turn_id=prior.old_turn_id, reason=prior.reason))
        return Write({"op": "append", "batch": b.to_json().decode(), "expected_last": None},
                     self.judged(m, b, m.decide_append(b, None)))

    def clear_write(self, pick: int) -> Write:
        m = self.conv(pick)

        def settle(answer: dict[str, Any], in_doubt: bool) -> None:
            assert answer == {"ok": None}, answer
            if not m.closed:
                m.clear()
                self.convs.append(RefConversation(f"c{len(self.convs)}"))
        return Write({"op": "clear", "conv": m.cid}, settle)

    def run(self, write: Write | None) -> None:
        if write is not None:
            write.settle(self.worker.request(write.cmd), False)

    # -- rules: writes ---------------------------------------------------------------------------------
    def begin(self) -> None:
        self.checked = False

    @rule(pick=st.integers(0, OPEN_CONVS), aid=APPEND_IDS, shape=SHAPES, variant=VARIANTS, precondition=PRECONDITIONS)
    def append(self, pick: int, aid: str, shape: str, variant: int, precondition: str) -> None:
        self.begin()
        self.run(self.append_write(pick, aid, shape, variant, precondition))

    @rule(pick=st.integers(0, OPEN_CONVS - 1), aid=APPEND_IDS, variant=VARIANTS, which=TARGETS,
          reason=st.sampled_from(["edit", "retry"]), same_user=st.booleans())
    def replace_turn(self, pick: int, aid: str, variant: int, which: str, reason: str, same_user: bool) -> None:
        self.begin()
        self.run(self.replace_write(pick, aid, variant, which, reason, same_user))

    @rule(pick=st.integers(0, OPEN_CONVS), index=st.integers(0, 20), conflicting=st.booleans())
    def retry(self, pick: int, index: int, conflicting: bool) -> None:
        self.begin()
        self.run(self.retry_write(pick, index, conflicting))

    @rule(pick=st.integers(0, OPEN_CONVS))
    def clear(self, pick: int) -> None:
        self.begin()
        self.run(self.clear_write(pick))

    # -- rules: faults -----------------------------------------------------------------------------------
    @rule(kind=st.sampled_from(["append", "append", "replace", "retry", "clear"]), pick=st.integers(0, OPEN_CONVS - 1),
          aid=APPEND_IDS, variant=VARIANTS, precondition=PRECONDITIONS, point=KILL_POINTS)
    def kill_9(self, kind: str, pick: int, aid: str, variant: int, precondition: str, point: str) -> None:
        """SIGKILL the engine with a write in flight: just sent, once the log grew (or the
        answer is there), or after its answer was read."""
        self.begin()
        write: Write | None = None
        if kind == "replace":
            write = self.replace_write(pick, aid, variant, "latest", "edit", False)
        elif kind == "retry":
            write = self.retry_write(pick, variant, False)
        elif kind == "clear":
            write = self.clear_write(pick)
        if write is None:
            write = self.append_write(pick, aid, "turn", variant, precondition)
        before = self.log_bytes()
        self.worker.send(write.cmd)
        if point == "answered":
            write.settle(self.worker.readline(), False)
        elif point == "written":
            self.wait_written(before)
        self.worker.kill()
        fault_stats[f"kill-{point}"] += 1
        self.restart()
        if point != "answered":
            ends = sum(self.observe()["stats"]["end_offsets"])
            answer = self.worker.request(write.cmd)  # the identical retry settles the unknown outcome
            fault_stats[f"in-flight {kind}"] += 1
            if "ok" in answer and isinstance(answer["ok"], dict):
                survived = Receipt.from_dict(answer["ok"]).position.offset < ends
                fault_stats[f"in-flight {kind}: {'accepted before the kill' if survived else 'decided after'}"] += 1
            write.settle(answer, True)

    def wait_written(self, before: int) -> None:
        """Bounded wait until the log grew or the worker answered (a write the fast path
        answers never reaches the log)."""
        deadline = time.monotonic() + 10
        while self.log_bytes() == before and time.monotonic() < deadline:
            if select.select([self.worker.stdout_fd], [], [], 0.001)[0]:
                return

    @rule(point=st.sampled_from(["at once", "replaying"]))
    def kill_while_opening(self, point: str) -> None:
        """SIGKILL the engine while it opens: at once, or once it replays into a scratch state
        (``register`` of the custom projection), or whatever it reached first."""
        self.begin()
        self.worker.close()
        worker = self.zygote.spawn(self.data, wait=False)
        if point == "replaying":
            deadline = time.monotonic() + 10
            while not self.scratch_dirs() and time.monotonic() < deadline:
                if select.select([worker.stdout_fd], [], [], 0.001)[0]:
                    break  # it opened before a scratch state was seen
        worker.kill()
        fault_stats[f"kill while opening ({point})"] += 1
        fault_stats["stale .replay-* scratch states seen"] += len(self.scratch_dirs())
        self.restart()

    def scratch_dirs(self) -> list[Path]:
        return sorted(self.data.glob(".replay-*"))

    @rule(clean=st.booleans())
    def reopen(self, clean: bool) -> None:
        """A clean close and open (or an idle kill -9)."""
        self.begin()
        if clean:
            self.worker.close()
        else:
            self.worker.kill()
        self.restart()

    @rule(clean=st.booleans())
    def delete_state(self, clean: bool) -> None:
        """``rm -rf DIR/state`` while the engine is down: reopening rebuilds the same state."""
        self.begin()
        before = comparable(self.observe())
        if clean:
            self.worker.close()
        else:
            self.worker.kill()
        shutil.rmtree(self.data / "state")
        self.restart()
        assert comparable(self.observe()) == before, "the state rebuilt from the log differs from the one deleted"

    @rule()
    def flush(self) -> None:
        """Flush RocksDB memtables so .sst files exist (and damage rules have one to damage)."""
        self.begin()
        assert self.worker.value({"op": "flush"}) is None

    # -- checks ----------------------------------------------------------------------------------------------
    @invariant()
    def agrees_with_the_model(self) -> None:
        check_observation(self.convs, self.observe(), self.created, self.bounds, [r for _, _, r in self.acked])
        self.check_receipts()
        self.checked = True

    def teardown(self) -> None:
        try:
            if self.checked and self.worker.alive:  # the run so far passed: projections == rebuild
                before = comparable(self.observe())
                self.worker.close()
                shutil.rmtree(self.data / "state")
                self.worker = self.start()
                assert comparable(self.observe()) == before, "projections differ from a rebuild from the log"
        finally:
            self.worker.kill()
            shutil.rmtree(self.tmp, ignore_errors=True)


def run(machine: type[FaultModel]) -> None:
    """Run the search on ``machine`` with one zygote; ``fault_stats`` then counts this run."""
    fault_stats.clear()
    zygote = Zygote()
    try:
        machine.zygote = zygote
        run_state_machine_as_test(machine, settings=settings(
            max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]))
    finally:
        zygote.close()
        print(dict(sorted(fault_stats.items())))


def test_engine_agrees_with_the_model_through_kills_reopens_and_state_deletion() -> None:
    run(FaultModel)
    assert fault_stats["kill-sent"] + fault_stats["kill-written"] + fault_stats["kill-answered"] > 0, \
        "no kill was exercised"
