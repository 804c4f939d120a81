"""The turns conformance suite (issue 7): turn replacement, turn lookup, ``expected_last``
preconditions and agent-step checkpoints, stated once and run by every backend.

Subclass ``TurnsContract`` and provide the ``backend`` fixture (an object with
``open() -> HistoryEngine`` on the same log every time and ``drop_state()``, as for
``FacadeContract``); set ``max_examples`` for the hypothesis tests.

The core is a hypothesis search over random operation sequences — plain appends of random
roles (system, user, assistant, tool rounds, ``interrupted`` metadata true / "true" / false /
absent), valid and invalid ``replace_turn``\\ s (the latest turn, an older one, a hidden one,
a message that is no turn, an unknown id; both reasons; a retry with changed content),
optimistic appends (the right receipt, a stale one, ``EMPTY``, one this conversation never
accepted, one of another conversation), identical and conflicting retries, resends of refused
batches, invalid input and clears — run against the engine and ``turns_model``: every
operation's outcome, and then every read, must equal the reference.

Conversation ids are fresh per example, so one engine serves a whole hypothesis run.
"""

from __future__ import annotations

import itertools
import json
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar, Protocol

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import EMPTY, EngineStats, HistoryEngine
from engine.facade import _Empty
from engine.log.base import record_key
from projections import BatchEvent, ClearEvent, ProjectedEvent, Projection, ProjectionTx, TurnReplacedEvent
from schemas import (
    AppendConflict,
    AppendID,
    Batch,
    ConversationClosed,
    ConversationID,
    HistoryPosition,
    HistoryTurn,
    InvalidBatch,
    InvalidReceipt,
    LogPosition,
    Message,
    NotFound,
    PreconditionFailed,
    RawJSON,
    Receipt,
    Role,
    StoredMessage,
    ToolCallPart,
    ToolOutput,
    ToolResultPart,
    TurnNotReplaceable,
    WindowTooSmall,
)
from schemas.events import TurnReplaced, encode_event
from tests.conformance.turns_model import Expected, RefConversation, RefRow, Verdict, interrupted, total_bytes
from tests.erased_counts import assert_rebuilt_counts

__all__ = ["Backend", "TurnsContract"]


class Backend(Protocol):
    def open(self) -> HistoryEngine: ...
    def drop_state(self) -> None: ...


# -- operations ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class MsgSpec:
    kind: str  # system | user | assistant | tool_round (an assistant tool call + its tool result)
    meta: str  # none | interrupted | interrupted_string | interrupted_false | number
    text: str


@dataclass(frozen=True)
class AppendOp:
    conv: int
    msgs: tuple[MsgSpec, ...]
    precondition: str  # none | right | stale | empty | ghost | foreign
    id_style: int


@dataclass(frozen=True)
class ReplaceOp:
    conv: int
    target: str  # latest | older | hidden | inner | bogus
    reason: str
    same_user: bool  # the new user message has the old one's content (other metadata)
    user: MsgSpec
    rest: tuple[MsgSpec, ...]
    id_style: int


@dataclass(frozen=True)
class ResendOp:
    """Send an accepted batch again, identical: by ``append`` (any precondition) or ``replace_turn``."""

    conv: int
    pick: int
    via: str
    precondition: str


@dataclass(frozen=True)
class ConflictOp:
    """Other content under an accepted append id."""

    conv: int
    pick: int
    via: str


@dataclass(frozen=True)
class ResendRefusedOp:
    """A refused batch (precondition or replacement) sent again as a plain append: refusals
    leave no trace, so its append id is still free."""

    conv: int
    pick: int


@dataclass(frozen=True)
class ClearOp:
    conv: int


@dataclass(frozen=True)
class BadInputOp:
    conv: int
    kind: str  # reason | not_user | empty_turn_id | junk_expected


Op = AppendOp | ReplaceOp | ResendOp | ConflictOp | ResendRefusedOp | ClearOp | BadInputOp

_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=6)
_META = st.sampled_from(("none", "none", "none", "interrupted", "interrupted", "interrupted_string",
                         "interrupted_false", "number"))
_KIND = st.sampled_from(("user", "user", "assistant", "assistant", "assistant", "tool_round", "system"))
_CONV = st.sampled_from((0, 0, 0, 1))
_PRECONDITION = st.sampled_from(("none", "none", "right", "right", "stale", "empty", "ghost", "foreign"))

msg_specs = st.builds(MsgSpec, _KIND, _META, _TEXT)
user_specs = st.builds(MsgSpec, st.just("user"), _META, _TEXT)

_BATCH = st.one_of(st.lists(msg_specs, min_size=1, max_size=4).map(tuple),  # any roles
                   st.tuples(user_specs, st.lists(msg_specs, max_size=3)).map(lambda t: (t[0], *t[1])))  # a turn
append_ops = st.builds(AppendOp, _CONV, _BATCH, _PRECONDITION,
                       st.integers(0, 3))
_TARGET = st.sampled_from(("latest",) * 5 + ("older", "hidden", "inner", "bogus"))
replace_ops = st.builds(ReplaceOp, _CONV, _TARGET, st.sampled_from(("edit", "retry")),
                        st.sampled_from((True, True, True, False)), user_specs,
                        st.lists(msg_specs, max_size=3).map(tuple), st.integers(0, 3))
resend_ops = st.builds(ResendOp, _CONV, st.integers(0, 50), st.sampled_from(("append", "replace")), _PRECONDITION)
conflict_ops = st.builds(ConflictOp, _CONV, st.integers(0, 50), st.sampled_from(("append", "replace")))
resend_refused_ops = st.builds(ResendRefusedOp, _CONV, st.integers(0, 50))
clear_ops = st.builds(ClearOp, st.sampled_from((0, 1, 1, 1)))  # mostly the side conversation
bad_input_ops = st.builds(BadInputOp, _CONV, st.sampled_from(("reason", "not_user", "empty_turn_id", "junk_expected")))

_OPERATIONS = {"append": append_ops, "replace": replace_ops, "resend": resend_ops, "conflict": conflict_ops,
               "resend_refused": resend_refused_ops, "bad_input": bad_input_ops, "clear": clear_ops}
_WEIGHTS = {"append": 14, "replace": 12, "resend": 3, "conflict": 2, "resend_refused": 2, "bad_input": 2, "clear": 1}
operations = st.sampled_from([k for k, w in _WEIGHTS.items() for _ in range(w)]).flatmap(_OPERATIONS.__getitem__)
"""Weighted: appends and replacements dominate, a clear is rare (it ends a conversation)."""

sequences = st.lists(operations, min_size=8, max_size=40)


# -- running a sequence against the engine and the model ----------------------------------------
@dataclass
class Counts:
    """Per-example admission outcomes predicted by the model, for bounding ``stats()`` deltas:
    refusals local state can already decide may be answered without touching the log."""

    accepted: int = 0
    duplicates: int = 0
    conflicts: int = 0
    closed: int = 0
    precondition: int = 0
    precondition_needs_log: int = 0
    not_replaceable: int = 0
    not_replaceable_needs_log: int = 0


_example_ids = itertools.count()


def fresh_prefix() -> str:
    return f"t{next(_example_ids)}-{uuid.uuid4().hex[:8]}"


@dataclass
class Runner:
    """Plays operations on the engine and the model; asserts each outcome as it goes."""

    engine: HistoryEngine
    prefix: str = field(default_factory=fresh_prefix)
    tagged: bool = False  # every message carries a unique "uid" in its metadata
    convs: list[RefConversation] = field(default_factory=list)
    counts: Counts = field(default_factory=Counts)
    refused: list[list[Batch]] = field(default_factory=lambda: [[], []])
    positions: set[LogPosition] = field(default_factory=set)
    _n: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _ids: list[Iterator[int]] = field(default_factory=lambda: [itertools.count(1), itertools.count(1)])

    def __post_init__(self) -> None:
        self.convs = [RefConversation(f"{self.prefix}-0"), RefConversation(f"{self.prefix}-é/1")]

    # -- building batches ----------------------------------------------------------------------
    def token(self) -> str:
        return f"{self.prefix}.{next(self._n)}"

    def append_id(self, conv: int, style: int) -> str:
        n = next(self._ids[conv])
        return (f"a{n}", f"turn/{n}", f"é-{n}", f"{n}")[style]

    def metadata(self, meta: str, uid: str) -> dict[str, Any] | None:
        out: dict[str, Any] = {}
        if meta == "interrupted":
            out["interrupted"] = True
        elif meta == "interrupted_string":
            out["interrupted"] = "true"
        elif meta == "interrupted_false":
            out["interrupted"] = False
        elif meta == "number":
            out["score"] = RawJSON("1.50")
        if self.tagged:
            out["uid"] = uid
        return out or None

    def messages(self, spec: MsgSpec) -> list[Message]:
        uid = self.token()
        text = f"{spec.text}#{uid}"
        meta = self.metadata(spec.meta, uid)
        if spec.kind == "system":
            return [Message.system(text, metadata=meta)]
        if spec.kind == "user":
            return [Message.user(text, metadata=meta)]
        if spec.kind == "assistant":
            return [Message.assistant(text, metadata=meta)]
        call = f"call-{uid}"
        return [Message.assistant(ToolCallPart(call, "lookup", json.dumps({"q": text})), metadata=meta),
                Message.tool(ToolResultPart(call, "lookup", ToolOutput.text(f"found {text}")),
                             metadata=self.metadata("none", uid + "r"))]

    def batch(self, conv: int, specs: tuple[MsgSpec, ...], style: int) -> Batch:
        return Batch(self.convs[conv].cid, self.append_id(conv, style),
                     [m for s in specs for m in self.messages(s)])

    def expected_last(self, conv: int, choice: str) -> object:
        m = self.convs[conv]
        receipts = [m.accepted[a].receipt for a in m.order]
        if choice == "right":
            return receipts[-1] if receipts else EMPTY
        if choice == "stale":
            return receipts[0] if len(receipts) > 1 else (EMPTY if receipts else self.ghost(conv))
        if choice == "empty":
            return EMPTY
        if choice == "ghost":
            return self.ghost(conv)
        if choice == "foreign":
            other = self.convs[1 - conv]
            return other.accepted[other.order[-1]].receipt if other.order else self.ghost(1 - conv)
        return None

    def ghost(self, conv: int) -> Receipt:
        """A receipt of an append id the conversation never accepted."""
        return Receipt(ConversationID(self.convs[conv].cid), AppendID(f"ghost-{self.token()}"), "sha256:" + "0" * 64,
                       LogPosition(0, 0))

    # -- executing ----------------------------------------------------------------------------
    def run(self, ops: list[Op], *, after_each: Callable[[Runner, int], None] | None = None) -> None:
        for op in ops:
            self.step(op)
            if after_each is not None:
                after_each(self, op.conv)

    def step(self, op: Op) -> None:
        m = self.convs[op.conv]
        if isinstance(op, AppendOp):
            b = self.batch(op.conv, op.msgs, op.id_style)
            self.append(op.conv, b, self.expected_last(op.conv, op.precondition), op)
        elif isinstance(op, ReplaceOp):
            self.replace_op(op)
        elif isinstance(op, ResendOp):
            if not m.order:
                return
            prior = m.accepted[m.order[op.pick % len(m.order)]]
            if op.via == "append":
                self.append(op.conv, prior.batch, self.expected_last(op.conv, op.precondition), op)
            else:
                old = prior.old_turn_id or m.latest_turn_id() or "nothing/0"
                self.replace(op.conv, prior.batch, old, prior.reason or "edit", op)
        elif isinstance(op, ConflictOp):
            if not m.order:
                return
            prior = m.accepted[m.order[op.pick % len(m.order)]]
            other = Batch(m.cid, prior.batch.append_id,
                          [Message.user(f"conflict {self.token()}"), *prior.batch.messages])
            if op.via == "append":
                self.append(op.conv, other, None, op)
            else:
                self.replace(op.conv, other, m.latest_turn_id() or "nothing/0", "edit", op)
        elif isinstance(op, ResendRefusedOp):
            refused = self.refused[op.conv]
            if refused:
                self.append(op.conv, refused[op.pick % len(refused)], None, op)
        elif isinstance(op, ClearOp):
            if m.closed:
                self.counts.duplicates += 1  # a repeated clear may reach the log
            self.engine.clear(m.cid)
            m.clear()
        else:
            self.bad_input(op)

    def replace_op(self, op: ReplaceOp) -> None:
        m = self.convs[op.conv]
        latest = m.latest_turn_id()
        visible_turns = m.turn_ids()
        hidden_turns = m.hidden_turn_ids()
        inner = [r.id for r in m.visible_rows() if r.message.role != Role.USER]
        bogus = f"ghost-{self.token()}/0"
        pool = {
            "latest": [latest] if latest else [],
            "older": visible_turns[:-1],
            "hidden": hidden_turns,
            "inner": inner,
        }.get(op.target, []) or [bogus]
        old = pool[len(pool) // 2]
        base = m.row(old)
        if base is None or base.message.role != Role.USER:
            base = m.row(latest) if latest else None
        user = self.messages(op.user)[0]
        if op.same_user and base is not None:
            user = Message(Role.USER, base.message.parts, self.metadata(op.user.meta, self.token()))
        rest = [x for s in op.rest for x in self.messages(s)]
        b = Batch(m.cid, self.append_id(op.conv, op.id_style), [user, *rest])
        self.replace(op.conv, b, old, op.reason, op)

    def bad_input(self, op: BadInputOp) -> None:
        m = self.convs[op.conv]
        b = Batch(m.cid, self.append_id(op.conv, 0), [Message.user(f"bad {self.token()}"), Message.assistant("x")])
        latest = m.latest_turn_id() or "nothing/0"
        if op.kind == "reason":
            self.replace(op.conv, b, latest, "regenerate", op)
        elif op.kind == "not_user":
            self.replace(op.conv, Batch(m.cid, b.append_id, [Message.assistant("no user message")]), latest, "edit", op)
        elif op.kind == "empty_turn_id":
            self.replace(op.conv, b, "", "edit", op)
        else:
            self.append(op.conv, b, str(m.last_append or "a1"), op)

    def append(self, conv: int, b: Batch, expected_last: object, op: Op) -> None:
        m = self.convs[conv]
        expected = m.decide_append(b, expected_last)
        got = self.call(expected, b, lambda: self.engine.append(b, expected_last=expected_last),  # type: ignore[arg-type]
                        op)
        if isinstance(got, Receipt) and expected.verdict is Verdict.ACCEPT:
            m.accept(b, got)

    def replace(self, conv: int, b: Batch, old: str, reason: str, op: Op) -> None:
        m = self.convs[conv]
        expected = m.decide_replace(b, old, reason)
        got = self.call(expected, b, lambda: self.engine.replace_turn(b, old, reason), op)
        if isinstance(got, Receipt) and expected.verdict is Verdict.ACCEPT:
            m.accept(b, got, old_turn_id=old, reason=reason)

    def call(self, expected: Expected, b: Batch, fn: Callable[[], Receipt], op: Op) -> Receipt | None:
        verdict = expected.verdict
        ends = sum(self.engine.stats().end_offsets) if verdict.before_io else None
        try:
            got: Receipt | Exception = fn()
        except Exception as e:  # compared with the model below
            got = e
        error = verdict.error
        if error is None:
            assert isinstance(got, Receipt), f"{op}: the model accepts ({verdict.value}), the engine said {got!r}"
            got.validate_for(b)
            if verdict is Verdict.DUPLICATE:
                original = self.convs[op.conv].accepted[str(b.append_id)].receipt
                assert got == original, f"{op}: an identical retry must return the original receipt"
                self.counts.duplicates += 1
            else:
                assert got.position not in self.positions, f"{op}: a new event reuses {got.position}"
                self.positions.add(got.position)
                self.counts.accepted += 1
        else:
            assert type(got) is error, f"{op}: the model says {error.__name__}, the engine {got!r}"
            if verdict is Verdict.CONFLICT:
                self.counts.conflicts += 1
            elif verdict is Verdict.CLOSED:
                self.counts.closed += 1
            elif verdict is Verdict.PRECONDITION:
                self.counts.precondition += 1
                self.counts.precondition_needs_log += expected.needs_log
                self.refused[op.conv].append(b)
            elif verdict is Verdict.NOT_REPLACEABLE:
                self.counts.not_replaceable += 1
                self.counts.not_replaceable_needs_log += expected.needs_log
                self.refused[op.conv].append(b)
        if ends is not None:
            assert sum(self.engine.stats().end_offsets) == ends, f"{op}: invalid input reached the log"
        return got if isinstance(got, Receipt) else None


# -- comparing every read with the model ----------------------------------------------------------
def stored_key(e: StoredMessage) -> tuple[object, ...]:
    return (e.id, e.position, str(e.append_id), e.message.canonical_json(), e.superseded_by, e.reason)


def turn_key(t: HistoryTurn) -> tuple[object, ...]:
    return (t.id, t.position, t.request_message_id, t.assistant_message_id, [stored_key(e) for e in t.messages])


def keys_of(rows: list[RefRow]) -> list[tuple[object, ...]]:
    return [r.key() for r in rows]


def check_created(m: RefConversation, listed: list[StoredMessage]) -> None:
    """``created_at`` is the event's time: one per append id, stable (also once hidden, after replay)."""
    for e in listed:
        seen = m.created.setdefault(str(e.append_id), e.created_at)
        assert e.created_at == seen, f"{e.id}: created_at changed from {seen} to {e.created_at}"


def check_entries(engine: HistoryEngine, m: RefConversation) -> None:
    """The cheap check run after every operation: the full listing, hidden rows included."""
    listed = engine.entries(m.cid, include_hidden=True)
    assert [stored_key(e) for e in listed] == keys_of(m.entries(include_hidden=True))
    check_created(m, listed)


def check_conversation(engine: HistoryEngine, m: RefConversation) -> None:
    """Every read of one conversation equals the model."""
    c = m.cid
    check_entries(engine, m)
    visible = m.visible_rows()
    assert [stored_key(e) for e in engine.entries(c)] == keys_of(visible)
    assert [x.canonical_json() for x in engine.read(c)] == [r.message.canonical_json() for r in visible]

    cursors = m.cursors()
    for include_hidden in (False, True):
        for p in cursors:
            assert [stored_key(e) for e in engine.entries(c, after=p, include_hidden=include_hidden)] == \
                keys_of(m.entries(after=p, include_hidden=include_hidden)), (p, include_hidden)
            assert [stored_key(e) for e in engine.entries(c, before=p, include_hidden=include_hidden)] == \
                keys_of(m.entries(before=p, include_hidden=include_hidden)), (p, include_hidden)
        lo, hi = cursors[min(1, len(cursors) - 1)], cursors[-2] if len(cursors) > 2 else None
        for limit in (0, 1, 3):
            assert [stored_key(e) for e in engine.entries(c, after=lo, before=hi, limit=limit,
                                                          include_hidden=include_hidden)] == \
                keys_of(m.entries(lo, hi, limit, include_hidden)), (lo, hi, limit, include_hidden)

    for limit in sorted({1, 2, 3, 5, 8, len(visible) + 1}):
        try:
            want = [x.canonical_json() for x in m.window(limit)]
        except WindowTooSmall:
            with pytest.raises(WindowTooSmall):
                engine.window(c, limit)
            continue
        assert [x.canonical_json() for x in engine.window(c, limit)] == want, limit

    total = total_bytes(visible)
    newest = visible[-1].message.content_bytes() if visible else 1
    budgets = sorted({0, 1, newest, max(total // 2, 1), total, total + 1})
    mid = cursors[min(2, len(cursors) - 1)]
    windows: list[tuple[HistoryPosition, HistoryPosition | None]] = [(HistoryPosition.START, None), (mid, None)]
    if len(cursors) > 4:
        windows += [(HistoryPosition.START, cursors[3]), (cursors[4], None)]
    for after, before in windows:
        for unit in ("turn", "message"):
            for budget in budgets:
                rows, truncated = m.within_bytes(budget, unit, after, before)
                load = engine.read_within_bytes(c, budget, after=after, before=before, unit=unit)
                assert ([stored_key(e) for e in load.messages], load.truncated) == (keys_of(rows), truncated), \
                    (budget, unit, after, before)
                check_created(m, load.messages)
                sources = engine.turn_sources(c, budget, after=after, before=before, unit=unit)
                assert [(s.id, s.role.value, s.content, s.interrupted) for s in sources.messages] == \
                    [(r.id, r.message.role.value, r.message.content_json(), interrupted(r.message)) for r in rows], \
                    (budget, unit, after, before)
                assert sources.truncated == truncated
                assert [s.created_at for s in sources.messages] == [m.created[r.append_id] for r in rows]

    for p in cursors:
        got = engine.measure(c, after=p)
        assert (got.messages, got.content_bytes, got.turns) == m.measure(p), p

    latest = engine.latest_turn(c)
    assert (turn_key(latest) if latest is not None else None) == m.latest_turn()
    ids = [r.id for r in m.rows] + ["nope/0", "/0", "", f"{m.order[-1]}" if m.order else "a1",
                                    f"{m.order[-1]}/{len(m.accepted[m.order[-1]].batch)}" if m.order else "a1/9"]
    for mid_ in ids:
        want_turn = m.turn(mid_)
        if want_turn is None:
            with pytest.raises(NotFound):
                engine.turn(c, mid_)
        else:
            assert turn_key(engine.turn(c, mid_)) == want_turn, mid_

    checkpoint = engine.latest_interrupted_checkpoint(c)
    want_checkpoint = m.latest_interrupted_checkpoint()
    assert (stored_key(checkpoint) if checkpoint else None) == (want_checkpoint.key() if want_checkpoint else None)


def check_runner(engine: HistoryEngine, runner: Runner) -> None:
    for m in runner.convs:
        check_conversation(engine, m)
    mine = {m.cid for m in runner.convs}
    listed = [c for c in engine.conversations() if c in mine]
    assert listed == sorted(m.cid for m in runner.convs if not m.closed and m.order)


def check_stats(before: EngineStats, after: EngineStats, counts: Counts) -> None:
    """Exact where every outcome must reach the log; bounded where a fast path may answer first."""
    assert after.accepted - before.accepted == counts.accepted
    assert after.corrupt == before.corrupt
    assert 0 <= after.duplicates - before.duplicates <= counts.duplicates
    assert 0 <= after.conflicts - before.conflicts <= counts.conflicts
    assert 0 <= after.rejected_closed - before.rejected_closed <= counts.closed
    assert counts.precondition_needs_log <= after.precondition_failed - before.precondition_failed \
        <= counts.precondition
    assert counts.not_replaceable_needs_log <= after.not_replaceable - before.not_replaceable \
        <= counts.not_replaceable


def counters(s: EngineStats) -> tuple[int, ...]:
    return (s.accepted, s.duplicates, s.conflicts, s.rejected_closed, s.corrupt, s.precondition_failed,
            s.not_replaceable, s.cleared, s.erased)


# -- a custom projection that mirrors the visible history -----------------------------------------
def _mirror_key(conv: str, seq: int) -> bytes:
    return b"m/" + conv.encode() + b"\x1f" + seq.to_bytes(8, "big")


class TurnsMirror(Projection):
    """Mirrors the visible history (``m/conv seq -> canonical JSON``) and records every
    ``TurnReplacedEvent`` it is given (``r/conv append_id``) with a delivery count and whether
    each hidden seq was a mirrored row."""

    name = "turns-mirror"

    def apply(self, event: ProjectedEvent, tx: ProjectionTx) -> None:
        conv = str(event.conversation_id)
        if isinstance(event, ClearEvent):  # forget the conversation, as a replay of it after its erasure would
            for prefix in (b"m/", b"r/"):
                for key, _ in tx.scan(prefix + conv.encode() + b"\x1f"):
                    tx.delete(key)
            return
        if isinstance(event, TurnReplacedEvent):
            rkey = b"r/" + conv.encode() + b"\x1f" + str(event.append_id).encode()
            prior = tx.get(rkey)
            present = all(tx.get(_mirror_key(conv, s)) is not None for s in event.hidden_seqs)
            tx.put(rkey, json.dumps({
                "old_turn_id": event.old_turn_id, "reason": event.reason, "hidden_seqs": list(event.hidden_seqs),
                "first_seq": event.first_seq, "hidden_were_mirrored": present,
                "deliveries": json.loads(prior)["deliveries"] + 1 if prior else 1}, sort_keys=True).encode())
            for s in event.hidden_seqs:
                tx.delete(_mirror_key(conv, s))
        else:
            assert isinstance(event, BatchEvent)
        for i, message in enumerate(event.messages):
            tx.put(_mirror_key(conv, event.first_seq + i), message.canonical_json())


class LateTurnsMirror(TurnsMirror):
    """The same projection registered after the history was written (the catch-up path)."""

    name = "turns-mirror-late"


def check_mirror(engine: HistoryEngine, name: str, m: RefConversation) -> None:
    view = engine.view(name)
    mirrored = view.scan(b"m/" + m.cid.encode() + b"\x1f")
    assert [(int.from_bytes(k[-8:], "big"), v) for k, v in mirrored] == \
        [(e.position.seq, e.message.canonical_json()) for e in engine.entries(m.cid)]
    delivered = {k.rsplit(b"\x1f", 1)[1].decode(): json.loads(v)
                 for k, v in view.scan(b"r/" + m.cid.encode() + b"\x1f")}
    assert delivered == ({} if m.closed else {
        r.append_id: {"old_turn_id": r.old_turn_id, "reason": r.reason, "hidden_seqs": list(r.hidden_seqs),
                      "first_seq": r.first_seq, "hidden_were_mirrored": True, "deliveries": 1}
        for r in m.replacements})


# -- helpers for the example-based specs --------------------------------------------------------
def race_threads(calls: list[Callable[[], Receipt]]) -> list[Receipt | Exception]:
    """Run the calls from threads released together; each result is a receipt or the error raised."""
    barrier = threading.Barrier(len(calls))
    results: list[Receipt | Exception | None] = [None] * len(calls)

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = calls[i]()
        except Exception as e:  # the outcome under test
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for r in results if r is not None]


def user_turn(conv: str, aid: str, text: str, answer: str | None = None, **meta: Any) -> Batch:
    return Batch(conv, aid, [Message.user(text), Message.assistant(answer or f"answer to {text}",
                                                                   metadata=meta or None)])


def history_of(engine: HistoryEngine, conv: str) -> list[tuple[object, ...]]:
    """Everything ``entries(include_hidden=True)`` shows, ``created_at`` included."""
    return [(*stored_key(e), e.created_at) for e in engine.entries(conv, include_hidden=True)]


def texts(engine: HistoryEngine, conv: str) -> list[str]:
    return [m.text() for m in engine.read(conv)]


class TurnsContract:
    max_examples: ClassVar[int] = 40

    @pytest.fixture
    def backend(self) -> Backend:
        raise NotImplementedError

    @pytest.fixture
    def engine(self, backend: Backend) -> Iterator[HistoryEngine]:
        eng = backend.open()
        yield eng
        eng.close()

    def _settings(self, share: float = 1.0) -> settings:
        return settings(max_examples=max(int(self.max_examples * share), 2), deadline=None,
                        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

    # -- the reference model ---------------------------------------------------------------------
    def test_random_sequences_match_the_reference(self, engine: HistoryEngine) -> None:
        @self._settings()
        @given(ops=sequences)
        def run(ops: list[Op]) -> None:
            runner = Runner(engine)
            before = engine.stats()
            runner.run(ops, after_each=lambda r, k: check_entries(engine, r.convs[k]))
            check_runner(engine, runner)
            check_stats(before, engine.stats(), runner.counts)

        run()

    def test_replay_from_the_log_reproduces_hidden_and_visible_state(self, backend: Backend) -> None:
        runners: list[Runner] = []
        engine = backend.open()
        try:
            @self._settings(0.5)
            @given(ops=sequences)
            def run(ops: list[Op]) -> None:
                runner = Runner(engine)
                runner.run(ops)
                check_runner(engine, runner)
                runners.append(runner)

            run()
            stats = engine.stats()
        finally:
            engine.close()
        for drop in (False, True):  # reopen on the same state, then rebuild it from the log
            if drop:
                backend.drop_state()
            with backend.open() as again:
                for runner in runners:
                    check_runner(again, runner)
                if drop:
                    assert_rebuilt_counts(stats, again.stats())
                else:
                    assert counters(again.stats()) == counters(stats)

    def test_a_replaced_turn_never_reappears_in_any_window(self, engine: HistoryEngine) -> None:
        def no_hidden_anywhere(runner: Runner, k: int) -> None:
            m, c = runner.convs[k], runner.convs[k].cid
            listed = engine.entries(c, include_hidden=True)
            hidden = {e.id for e in listed if e.hidden}
            assert hidden == {r.id for r in m.hidden_rows()}
            uids = {e.id: e.message.metadata["uid"] for e in listed}
            hidden_uids = {uids[i] for i in hidden}
            hidden_system = [e.message.text() for e in listed if e.hidden and e.message.role == Role.SYSTEM]
            visible = [e for e in listed if not e.hidden]
            assert not hidden & {e.id for e in engine.entries(c)}
            assert not hidden_uids & {x.metadata["uid"] for x in engine.read(c)}
            for limit in range(1, len(visible) + 3):
                try:
                    window = engine.window(c, limit)
                except WindowTooSmall:
                    continue
                assert not hidden_uids & {x.metadata.get("uid") for x in window}, limit
                # the merged system message's parts, one per merged message (a substring test would
                # find '#t.2' inside '#t.20')
                merged = {getattr(p, "text", None) for x in window if x.role == Role.SYSTEM for p in x.parts}
                assert not set(hidden_system) & merged, limit
            total = sum(e.message.content_bytes() for e in visible)
            for after in [HistoryPosition.START, *(e.position for e in listed if e.hidden)][:4]:
                for budget in (1, max(total // 3, 1), total + 1, 1 << 40):
                    for unit in ("turn", "message"):
                        load = engine.read_within_bytes(c, budget, after=after, unit=unit)
                        assert not hidden & {e.id for e in load.messages}
                        sources = engine.turn_sources(c, budget, after=after, unit=unit)
                        assert not hidden & {s.id for s in sources.messages}
            assert engine.measure(c).messages == len(visible)
            latest = engine.latest_turn(c)
            assert latest is None or not hidden & {e.id for e in latest.messages}
            checkpoint = engine.latest_interrupted_checkpoint(c)
            assert checkpoint is None or checkpoint.id not in hidden

        @self._settings(0.5)
        @given(ops=sequences)
        def run(ops: list[Op]) -> None:
            runner = Runner(engine, tagged=True)
            runner.run(ops, after_each=no_hidden_anywhere)

        run()

    def test_custom_projections_see_each_accepted_replacement_once(self, engine: HistoryEngine) -> None:
        engine.register(TurnsMirror())
        runners: list[Runner] = []

        @self._settings(0.5)
        @given(ops=sequences)
        def run(ops: list[Op]) -> None:
            runner = Runner(engine)
            runner.run(ops)
            for m in runner.convs:
                check_mirror(engine, TurnsMirror.name, m)
            runners.append(runner)

        run()
        live = engine.view(TurnsMirror.name).scan(b"")
        engine.register(LateTurnsMirror())  # catch-up from offset 0 through a scratch admission
        assert engine.view(LateTurnsMirror.name).scan(b"") == live
        engine.rebuild(TurnsMirror.name)
        assert engine.view(TurnsMirror.name).scan(b"") == live
        for runner in runners:
            for m in runner.convs:
                check_mirror(engine, LateTurnsMirror.name, m)

    def test_malformed_replacements_on_the_log_are_poison_on_every_replay(self, backend: Backend) -> None:
        """A TurnReplaced record another writer put on the log with an unknown reason or without a
        leading user message is quarantined (docs/events.md §6), never admitted or refused."""
        bad = [TurnReplaced.of(user_turn("c", "p1", "x"), 0, "a1/0", "regenerate"),
               TurnReplaced.of(Batch("c", "p2", [Message.assistant("y")]), 0, "a1/0", "edit")]
        with backend.open() as eng:
            eng.append(user_turn("c", "a1", "x"))
            before = eng.stats()
            positions = [eng.log.append(record_key("c", e.append_id), encode_event(e)) for e in bad]
            assert eng.catch_up(timeout=30)
            after = eng.stats()
            assert (after.corrupt - before.corrupt, after.accepted, after.not_replaceable) == \
                (2, before.accepted, before.not_replaceable)
            poison = eng.poison()
            assert [p for p, _ in poison] == positions
            assert "regenerate" in poison[0][1] and "user message" in poison[1][1]
            assert texts(eng, "c") == ["x", "answer to x"]
            eng.replace_turn(user_turn("c", "p1", "x", "fine"), "a1/0", "retry")  # the append id is still free
            listed = history_of(eng, "c")
        backend.drop_state()
        with backend.open() as eng:
            assert eng.poison() == poison
            assert history_of(eng, "c") == listed

    # -- one instance, many threads -------------------------------------------------------------
    def test_threads_racing_to_replace_one_turn_one_wins(self, engine: HistoryEngine) -> None:
        engine.append(user_turn("race", "a0", "question"))
        for round_ in range(3):
            latest = engine.latest_turn("race")
            assert latest is not None
            results = race_threads([
                partial(engine.replace_turn, Batch("race", f"r{round_}-{k}", [
                    Message.user(*latest.messages[0].message.parts), Message.assistant(f"answer {k}")]),
                    latest.id, "retry" if k % 2 else "edit")
                for k in range(8)])
            winner = [r for r in results if isinstance(r, Receipt)]
            assert len(winner) == 1 and all(isinstance(r, TurnNotReplaceable) for r in results if r not in winner)
            now = engine.latest_turn("race")
            assert now is not None and now.id == f"{winner[0].append_id}/0"
        assert len(engine.entries("race")) == 2
        assert len(engine.entries("race", include_hidden=True)) == 8

    def test_threads_racing_with_one_expected_last_one_wins(self, engine: HistoryEngine) -> None:
        last: Receipt | _Empty = EMPTY
        for round_ in range(3):
            results = race_threads([
                partial(engine.append, user_turn("race", f"o{round_}-{k}", f"from {k}"), expected_last=last)
                for k in range(8)])
            winner = [r for r in results if isinstance(r, Receipt)]
            assert len(winner) == 1 and all(isinstance(r, PreconditionFailed) for r in results if r not in winner)
            last = winner[0]
        assert len(engine.entries("race")) == 6

    # -- the rules as examples -----------------------------------------------------------------
    def test_retry_hides_the_old_turn_and_appends_the_new_one_at_a_later_position(
            self, engine: HistoryEngine) -> None:
        engine.append(Batch("c", "s", [Message.system("be brief")]))
        engine.append(user_turn("c", "a1", "one"))
        engine.append(user_turn("c", "a2", "two"))
        old = engine.latest_turn("c")
        assert old is not None and old.id == "a2/0" and old.assistant_message_id == "a2/1"
        r = engine.replace_turn(user_turn("c", "a3", "two", "better answer"), "a2/0", "retry")
        r.validate_for(user_turn("c", "a3", "two", "better answer"))
        assert texts(engine, "c") == ["be brief", "one", "answer to one", "two", "better answer"]
        new = engine.latest_turn("c")
        assert new is not None and new.id == "a3/0" and new.position > old.position
        listed = engine.entries("c", include_hidden=True)
        assert [(e.id, e.superseded_by, e.reason) for e in listed] == [
            ("s/0", None, None), ("a1/0", None, None), ("a1/1", None, None),
            ("a2/0", "a3/0", "retry"), ("a2/1", "a3/0", "retry"), ("a3/0", None, None), ("a3/1", None, None)]
        assert [e.position.seq for e in listed] == list(range(1, 8))
        with pytest.raises(NotFound):
            engine.turn("c", "a2/1")
        assert engine.turn("c", "a3/1").id == "a3/0"
        assert engine.measure("c").messages == 5
        assert [m.text() for m in engine.window("c", 3)] == ["be brief", "two", "better answer"]

    def test_edit_replaces_the_user_message_and_the_answer(self, engine: HistoryEngine) -> None:
        engine.append(user_turn("c", "a1", "wrong question"))
        engine.replace_turn(user_turn("c", "a2", "right question"), "a1/0", "edit")
        assert texts(engine, "c") == ["right question", "answer to right question"]
        assert [e.reason for e in engine.entries("c", include_hidden=True)] == ["edit", "edit", None, None]

    def test_only_the_latest_visible_turn_is_replaceable(self, engine: HistoryEngine) -> None:
        engine.append(Batch("c", "s", [Message.assistant("welcome")]))
        engine.append(user_turn("c", "a1", "one"))
        engine.append(user_turn("c", "a2", "two"))
        engine.replace_turn(user_turn("c", "a3", "two!"), "a2/0", "edit")
        for old in ("a1/0", "a2/0", "a3/1", "s/0", "nope/0"):  # older, hidden, no turn id, turn 0, unknown
            with pytest.raises(TurnNotReplaceable):
                engine.replace_turn(user_turn("c", f"x-{old}", "three"), old, "edit")
        assert texts(engine, "c") == ["welcome", "one", "answer to one", "two!", "answer to two!"]
        with pytest.raises(TurnNotReplaceable):
            engine.replace_turn(user_turn("empty", "a1", "x"), "a1/0", "edit")  # no turn at all
        assert "empty" not in engine.conversations()

    def test_a_retry_must_keep_the_user_message_content(self, engine: HistoryEngine) -> None:
        engine.append(user_turn("c", "a1", "question"))
        with pytest.raises(TurnNotReplaceable):
            engine.replace_turn(user_turn("c", "a2", "question?"), "a1/0", "retry")
        # Message metadata is not content: a retry may carry other metadata.
        same = Batch("c", "a2", [Message.user("question", metadata={"attempt": 2}), Message.assistant("again")])
        engine.replace_turn(same, "a1/0", "retry")
        assert texts(engine, "c") == ["question", "again"]

    def test_replacement_is_idempotent_by_append_id(self, engine: HistoryEngine) -> None:
        engine.append(user_turn("c", "a1", "q"))
        b = user_turn("c", "a2", "q", "second answer")
        r = engine.replace_turn(b, "a1/0", "retry")
        ends = engine.stats().end_offsets
        assert engine.replace_turn(Batch.from_json(b.to_json()), "a1/0", "retry") == r  # its turn is hidden now
        assert engine.append(b) == r
        assert engine.stats().end_offsets == ends
        with pytest.raises(AppendConflict):
            engine.replace_turn(user_turn("c", "a2", "q", "other"), "a2/0", "retry")
        assert texts(engine, "c") == ["q", "second answer"]

    def test_expected_last_fences_the_conversation(self, engine: HistoryEngine) -> None:
        r1 = engine.append(user_turn("c", "a1", "one"), expected_last=EMPTY)
        with pytest.raises(PreconditionFailed):
            engine.append(user_turn("c", "a2", "two"), expected_last=EMPTY)
        r2 = engine.append(user_turn("c", "a2", "two"), expected_last=r1)
        with pytest.raises(PreconditionFailed):
            engine.append(user_turn("c", "a3", "three"), expected_last=r1)  # stale
        r3 = engine.replace_turn(user_turn("c", "a3", "two", "again"), "a2/0", "retry")
        with pytest.raises(PreconditionFailed):
            engine.append(user_turn("c", "a4", "four"), expected_last=r2)  # the replacement is the last append
        engine.append(user_turn("c", "a4", "four"), expected_last=r3)
        assert texts(engine, "c") == ["one", "answer to one", "two", "again", "four", "answer to four"]

    def test_an_identical_retry_returns_its_receipt_whatever_the_precondition(self, engine: HistoryEngine) -> None:
        b = user_turn("c", "a1", "one")
        r1 = engine.append(b, expected_last=EMPTY)
        engine.append(user_turn("c", "a2", "two"))
        assert engine.append(b, expected_last=EMPTY) == r1
        assert engine.append(b, expected_last=r1) == r1

    def test_a_receipt_of_another_conversation_is_refused_before_io(self, engine: HistoryEngine) -> None:
        other = engine.append(user_turn("other", "a1", "x"))
        ends = engine.stats().end_offsets
        with pytest.raises(InvalidReceipt):
            engine.append(user_turn("c", "a1", "x"), expected_last=other)
        with pytest.raises(InvalidReceipt):
            engine.append(user_turn("c", "a1", "x"), expected_last="a1")  # type: ignore[arg-type]
        assert engine.stats().end_offsets == ends
        assert engine.read("c") == []

    def test_invalid_replacements_fail_before_io(self, engine: HistoryEngine) -> None:
        engine.append(user_turn("c", "a1", "x"))
        ends = engine.stats().end_offsets
        with pytest.raises(InvalidBatch):
            engine.replace_turn(user_turn("c", "a2", "x"), "a1/0", "regenerate")
        with pytest.raises(InvalidBatch):
            engine.replace_turn(Batch("c", "a2", [Message.assistant("x")]), "a1/0", "retry")
        with pytest.raises(InvalidBatch):
            engine.replace_turn(user_turn("c", "a2", "x"), "", "edit")
        assert engine.stats().end_offsets == ends

    def test_latest_interrupted_checkpoint(self, engine: HistoryEngine) -> None:
        assert engine.latest_interrupted_checkpoint("c") is None
        engine.append(user_turn("c", "a1", "go", interrupted=True))
        cp = engine.latest_interrupted_checkpoint("c")
        assert cp is not None and cp.id == "a1/1"
        engine.append(Batch("c", "a2", [Message.user("still there?")]))  # a user message does not cancel it
        cp2 = engine.latest_interrupted_checkpoint("c")
        assert cp2 is not None and cp2.id == "a1/1"
        engine.append(Batch("c", "a3", [Message.assistant("done")]))  # a later assistant message does
        assert engine.latest_interrupted_checkpoint("c") is None
        engine.append(user_turn("c", "a4", "x", interrupted="true"))  # a string is not JSON true
        assert engine.latest_interrupted_checkpoint("c") is None
        engine.append(user_turn("c", "a5", "y", interrupted=True))
        cp3 = engine.latest_interrupted_checkpoint("c")
        assert cp3 is not None and cp3.id == "a5/1"
        engine.replace_turn(user_turn("c", "a6", "y", "complete"), "a5/0", "retry")  # hidden: gone
        assert engine.latest_interrupted_checkpoint("c") is None

    def test_clear_removes_hidden_rows_too(self, engine: HistoryEngine) -> None:
        engine.append(user_turn("c", "a1", "x"))
        b = user_turn("c", "a2", "y")
        engine.replace_turn(b, "a1/0", "edit")
        engine.clear("c")
        assert engine.entries("c", include_hidden=True) == []
        assert engine.latest_turn("c") is None
        with pytest.raises(NotFound):
            engine.turn("c", "a2/0")
        with pytest.raises(ConversationClosed):
            engine.replace_turn(b, "a1/0", "edit")
        with pytest.raises(ConversationClosed):
            engine.append(user_turn("c", "a3", "z"), expected_last=EMPTY)

    def test_turn_lookup_knows_only_the_ids_entries_shows(self, engine: HistoryEngine) -> None:
        engine.append(user_turn("c", "a1", "x"))
        assert engine.turn("c", "a1/0").id == "a1/0"
        for spelling in ("a1/00", "a1/+0", "a1/\u0660", "a1/\u00b2", "a1/0 "):
            with pytest.raises(NotFound):
                engine.turn("c", spelling)
