"""A Jepsen-style history checker for histlog's fault and load tests (a reusable test helper).

A test records every client operation in a ``History`` while the load runs (``Recorded`` /
``AsyncRecorded`` around an engine or client, or ``History.invoke`` and ``ok`` / ``fail`` /
``unknown`` by hand; ``tests/history_record.py``, re-exported here), reads every member's final
``entries()`` of every conversation afterwards, and calls ``check(history, finals)`` with
``finals``: member name -> conversation -> its final visible entries. The ``Report`` names each
anomaly; ``Report.assert_valid`` raises ``AssertionError`` listing all of them.

The anomalies (``Anomaly.kind``), for histories of appends and reads (``replace_turn`` and
``clear`` hide rows on purpose, so histories using them are out of scope):

* ``lost``: an ok append whose messages are not all, in order, in a member's final history;
* ``duplicated``: a message id twice in a final history, or one append's rows in separate runs;
* ``receipts``: an ok receipt that does not name its batch (ids, digest); two ok results for one
  (conversation, append id) with different receipts; two appends with one log position; one
  conversation in two partitions; appends stored in another order than their receipts' offsets
  (the log's order is the history's order);
* ``failed-but-present``: a batch whose every send failed definitely, found in a final history;
* ``phantom``: stored rows of an append id nobody invoked in that conversation;
* ``torn``: stored rows of an append that match none of the batches sent under its id;
* ``order``: members' final histories of a conversation differ, or positions do not increase;
* ``impossible-read``: a read returning a state that never existed. Every state is a prefix of
  the final history (appends only add at the end), so ``read`` must be a prefix of the final
  messages, ``entries`` a prefix of the final rows its cursors and limit select, ``window`` a
  contiguous run of the final messages no longer than its limit. A read with ``at_least=R`` must
  also hold every acknowledged append of its conversation whose receipt is at or before R's log
  position, R's own included (the server had applied the log through R). Plain reads may be
  stale: only the prefix rules apply to them.

Unknown outcomes are never anomalies by themselves: an unknown append may be stored once or not
at all (``Report.landed`` says which were). ``Report.never_ok`` lists the appends never
acknowledged, so a test that resent everything can require it empty.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from schemas import Batch, HistoryPosition, LogPosition, Message, Receipt, Role, StoredMessage
from tests.history_record import DEFINITE, AsyncRecorded, History, Op, Outcome, Recorded, outcome_of

__all__ = ["DEFINITE", "KINDS", "Anomaly", "AsyncRecorded", "Finals", "History", "Op", "Outcome", "Recorded",
           "Report", "check", "outcome_of"]

Finals = Mapping[str, Mapping[str, Sequence[StoredMessage]]]
Key = tuple[str, str]  # (conversation, append id)
KINDS = ("lost", "duplicated", "receipts", "failed-but-present", "phantom", "torn", "order", "impossible-read")


@dataclass(frozen=True, slots=True)
class Anomaly:
    """One violation: its ``kind`` (one of ``KINDS``), the conversation, what was seen, and the
    indexes of the operations involved (``Op.index``)."""

    kind: str
    conversation: str
    detail: str
    ops: tuple[int, ...] = ()

    def __str__(self) -> str:
        where = f" (ops {', '.join(f'#{i}' for i in self.ops)})" if self.ops else ""
        return f"{self.kind}: {self.conversation!r}: {self.detail}{where}"


@dataclass(frozen=True)
class Report:
    """What ``check`` found: the anomalies, how the operations ended (``"append ok": n``...), the
    appends stored whole in some final history (``found``), those never acknowledged
    (``never_ok``) and, of those, the ones stored anyway (``landed``), and how many reads were checked."""

    anomalies: tuple[Anomaly, ...]
    outcomes: Mapping[str, int]
    found: frozenset[Key]
    never_ok: frozenset[Key]
    reads_checked: int

    @property
    def valid(self) -> bool:
        return not self.anomalies

    @property
    def landed(self) -> frozenset[Key]:
        return self.never_ok & self.found

    def kinds(self) -> set[str]:
        return {a.kind for a in self.anomalies}

    def of(self, kind: str) -> list[Anomaly]:
        return [a for a in self.anomalies if a.kind == kind]

    def __str__(self) -> str:
        counts = ", ".join(f"{k} {n}" for k, n in sorted(self.outcomes.items()))
        head = (f"history: {counts}; {self.reads_checked} reads checked; {len(self.found)} appends found, "
                f"{len(self.landed)} of them never acknowledged")
        if not self.anomalies:
            return head + "; no anomaly"
        kinds = Counter(a.kind for a in self.anomalies)
        by_kind = ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
        lines = [f"{head}; {len(self.anomalies)} anomalies ({by_kind}):"]
        return "\n".join(lines + [f"  {a}" for a in sorted(self.anomalies, key=lambda a: (a.kind, a.conversation))])

    def assert_valid(self) -> Report:
        """Raise ``AssertionError`` listing every anomaly; the report itself when there is none."""
        if self.anomalies:
            raise AssertionError(str(self))
        return self


@dataclass(frozen=True, slots=True)
class _Placed:
    """Where one append's rows sit in a final history: rows ``[start, end)``, and the digest of
    the batch they match (None: they match none)."""

    digest: str | None
    start: int
    end: int


def _row(r: StoredMessage) -> tuple[str, HistoryPosition, str, Message]:
    """What two reads of one stored message must agree on (``created_at`` is spelled to the
    millisecond on the wire, so it is left out)."""
    return r.id, r.position, str(r.append_id), r.message


class _Check:
    """One run of ``check``: the history's appends indexed, the finals laid out, the anomalies."""

    def __init__(self, history: History, finals: Finals) -> None:
        if not finals:
            raise ValueError("check() needs the final entries of at least one member")
        self.ops = history.ops
        self.members = sorted(finals)
        self.out: list[Anomaly] = []
        self.sent: dict[Key, dict[str, Batch]] = defaultdict(dict)  # by digest
        self.sends: dict[tuple[str, str, str], list[Op]] = defaultdict(list)  # by (conversation, append id, digest)
        for o in self.ops:
            if o.kind == "append":
                b = o.args["batch"]
                self.sent[(str(b.conversation_id), str(b.append_id))][b.digest] = b
                self.sends[(str(b.conversation_id), str(b.append_id), b.digest)].append(o)
        self.conversations = sorted({c for c, _ in self.sent} | {c for m in finals.values() for c in m}
                                    | {o.conversation for o in self.ops})
        self.rows = {m: {c: list(finals[m].get(c, ())) for c in self.conversations} for m in self.members}
        self.placed = {m: {c: self._layout(m, c, self.rows[m][c]) for c in self.conversations} for m in self.members}
        self.receipts = self._receipts()

    def flag(self, kind: str, conversation: str, detail: str, ops: Iterable[Op] = ()) -> None:
        self.out.append(Anomaly(kind, conversation, detail, tuple(sorted({o.index for o in ops}))))

    # ----- the final histories
    def _layout(self, member: str, conv: str, rows: Sequence[StoredMessage]) -> dict[str, _Placed]:
        """Each append id's run of rows; flags repeated ids, split runs, decreasing positions,
        rows nobody sent and rows that match no batch sent under their id."""
        for mid, n in Counter(r.id for r in rows).items():
            if n > 1:
                self.flag("duplicated", conv, f"{member}: message id {mid!r} stored {n} times")
        for i in range(1, len(rows)):
            if not rows[i - 1].position < rows[i].position:
                self.flag("order", conv, f"{member}: position {rows[i].position} (row {i}) does not follow "
                                         f"{rows[i - 1].position}")
                break
        runs: list[tuple[str, int, int]] = []
        for i, r in enumerate(rows):
            if runs and runs[-1][0] == str(r.append_id):
                runs[-1] = (runs[-1][0], runs[-1][1], i + 1)
            else:
                runs.append((str(r.append_id), i, i + 1))
        for aid, n in Counter(aid for aid, _, _ in runs).items():
            if n > 1:
                starts = [s for a, s, _ in runs if a == aid]
                self.flag("duplicated", conv, f"{member}: append {aid!r} stored in {n} separate runs of rows "
                                              f"(from rows {starts}): not contiguous, or stored twice")
        placed: dict[str, _Placed] = {}
        for aid, start, end in runs:
            if aid in placed:
                continue
            batches = self.sent.get((conv, aid), {})
            messages = [r.message for r in rows[start:end]]
            digest = next((d for d, b in batches.items() if list(b.messages) == messages), None)
            placed[aid] = _Placed(digest, start, end)
            if not batches:
                self.flag("phantom", conv, f"{member}: rows {start}..{end - 1} are append {aid!r}, which no "
                                           "operation sent to this conversation")
            elif digest is None:
                sizes = sorted({len(b) for b in batches.values()})
                self.flag("torn", conv, f"{member}: the {end - start} rows of append {aid!r} match none of the "
                                        f"{len(batches)} batch(es) sent under that id ({sizes} messages)",
                          (o for d in batches for o in self.sends[(conv, aid, d)]))
        return placed

    def _stored(self, member: str, conv: str, aid: str, digest: str) -> bool:
        p = self.placed[member][conv].get(aid)
        return p is not None and p.digest == digest

    # ----- receipts
    def _receipts(self) -> dict[Key, tuple[Receipt, Op]]:
        """The first ok receipt of each append; flags the ones that disagree with their batch,
        each other, or the conversation's partition."""
        first: dict[Key, tuple[Receipt, Op]] = {}
        at: dict[LogPosition, tuple[Key, Op]] = {}
        partitions: dict[str, dict[int, Op]] = defaultdict(dict)
        for o in self.ops:
            if o.kind != "append" or o.outcome != "ok":
                continue
            b: Batch = o.args["batch"]
            conv, aid, r = str(b.conversation_id), str(b.append_id), o.value
            if not isinstance(r, Receipt):
                self.flag("receipts", conv, f"append {aid!r} returned {r!r}, not a Receipt", [o])
                continue
            if (str(r.conversation_id), str(r.append_id), r.digest) != (conv, aid, b.digest):
                self.flag("receipts", conv, f"append {aid!r} ({b.digest[:15]}...) got a receipt for "
                                            f"{str(r.append_id)!r} ({r.digest[:15]}...)", [o])
            earlier = first.setdefault((conv, aid), (r, o))
            if earlier[0] != r:
                self.flag("receipts", conv, f"append {aid!r} acknowledged twice with different receipts: "
                                            f"{earlier[0].position} {earlier[0].digest[:15]}... then {r.position} "
                                            f"{r.digest[:15]}...", [earlier[1], o])
            owner = at.setdefault(r.position, ((conv, aid), o))
            if owner[0] != (conv, aid):
                self.flag("receipts", conv, f"appends {owner[0][1]!r} ({owner[0][0]!r}) and {aid!r} have the same "
                                            f"log position {r.position}", [owner[1], o])
            partitions[conv].setdefault(r.position.partition, o)
        for conv, parts in partitions.items():
            if len(parts) > 1:
                self.flag("receipts", conv, f"receipts in partitions {sorted(parts)}: a conversation has one",
                          parts.values())
        return first

    def receipt_order(self, member: str) -> None:
        """Acknowledged appends are stored in the order of their receipts' offsets."""
        for conv in self.conversations:
            stored = sorted((p.start, aid, self.receipts[(conv, aid)])
                            for aid, p in self.placed[member][conv].items()
                            if (conv, aid) in self.receipts and p.digest == self.receipts[(conv, aid)][0].digest)
            for (s1, a1, (r1, o1)), (s2, a2, (r2, o2)) in itertools.pairwise(stored):
                if r1.position.partition == r2.position.partition and r1.position.offset >= r2.position.offset:
                    self.flag("receipts", conv, f"{member}: append {a1!r} is stored before {a2!r} (rows {s1}, {s2}) "
                                                f"but its receipt {r1.position} is not before {r2.position}", [o1, o2])

    # ----- acknowledged, failed, and the members' agreement
    def appends(self) -> None:
        for (conv, aid, digest), sends in sorted(self.sends.items()):
            outcomes = {o.outcome for o in sends}
            if "ok" in outcomes:
                missing = [m for m in self.members if not self._stored(m, conv, aid, digest)]
                if missing:
                    r = next(o.value for o in sends if o.outcome == "ok")
                    where = r.position if isinstance(r, Receipt) else r
                    self.flag("lost", conv, f"append {aid!r}, acknowledged at {where}, is not stored whole in "
                                            f"{', '.join(missing)}", [o for o in sends if o.outcome == "ok"])
            elif outcomes == {"fail"}:
                present = [m for m in self.members if self._stored(m, conv, aid, digest)]
                if present:
                    errors = sorted({type(o.error).__name__ for o in sends})
                    self.flag("failed-but-present", conv, f"append {aid!r} failed definitely ({', '.join(errors)}) "
                                                          f"but is stored in {', '.join(present)}", sends)

    def agreement(self) -> None:
        ref = self.members[0]
        for conv in self.conversations:
            mine = [_row(r) for r in self.rows[ref][conv]]
            for m in self.members[1:]:
                theirs = [_row(r) for r in self.rows[m][conv]]
                if theirs != mine:
                    i = next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b),
                             min(len(mine), len(theirs)))
                    self.flag("order", conv, f"{m} ({len(theirs)} rows) and {ref} ({len(mine)} rows) differ from "
                                             f"row {i} on")

    # ----- reads (against the first member's final history)
    def reads(self) -> int:
        ref, checked = self.members[0], 0
        for o in self.ops:
            if o.outcome != "ok" or o.kind not in ("read", "entries", "window"):
                continue
            if o.kind == "entries" and o.args.get("include_hidden"):
                continue  # hidden rows are not in the finals (replace_turn is out of scope)
            checked += 1
            conv = o.conversation
            rows, value = self.rows[ref][conv], list(o.value)
            if o.kind == "read":
                self._read(o, conv, ref, [r.message for r in rows], value)
            elif o.kind == "entries":
                self._entries(o, conv, rows, value)
            else:
                self._window(o, conv, rows, value)
        return checked

    def _read(self, o: Op, conv: str, ref: str, final: list[Message], value: list[Message]) -> None:
        if value != final[:len(value)]:
            i = next((i for i, (a, b) in enumerate(zip(value, final, strict=False)) if a != b), len(final))
            self.flag("impossible-read", conv, f"read by {o.process!r} returned {len(value)} messages, not a prefix "
                                               f"of the final {len(final)} (they differ at message {i})", [o])
            return
        wanted = o.args.get("at_least")
        if not isinstance(wanted, Receipt):
            return
        needed = {(aid, ro) for (c, aid), (r, ro) in self.receipts.items() if c == conv
                  and r.position.partition == wanted.position.partition and r.position.offset <= wanted.position.offset}
        if str(wanted.conversation_id) == conv:
            needed.add((str(wanted.append_id), o))
        for aid, ro in sorted(needed, key=lambda n: n[0]):
            p = self.placed[ref][conv].get(aid)
            if p is not None and p.digest is not None and p.end > len(value):
                self.flag("impossible-read", conv, f"read at_least={wanted.position} by {o.process!r} returned "
                                                   f"{len(value)} messages, without append {aid!r} (rows {p.start}.."
                                                   f"{p.end - 1}), acknowledged at or before that position", [o, ro])

    def _entries(self, o: Op, conv: str, rows: list[StoredMessage], value: list[StoredMessage]) -> None:
        after: HistoryPosition | None = o.args.get("after")
        before: HistoryPosition | None = o.args.get("before")
        limit: int | None = o.args.get("limit")
        selected = [_row(r) for r in rows if (after is None or r.position > after)
                    and (before is None or r.position < before)][:limit]
        got = [_row(r) for r in value]
        if got != selected[:len(got)] or len(got) > len(selected):
            self.flag("impossible-read", conv, f"entries(after={after}, before={before}, limit={limit}) by "
                                               f"{o.process!r} returned {len(got)} rows, not a prefix of the "
                                               f"{len(selected)} the final history selects", [o])

    def _window(self, o: Op, conv: str, rows: list[StoredMessage], value: list[Message]) -> None:
        before: HistoryPosition | None = o.args.get("before")
        limit: int = o.args["limit"]
        final = [r.message for r in rows
                 if (before is None or r.position < before) and r.message.role is not Role.SYSTEM]
        got = [m for m in value if m.role is not Role.SYSTEM]
        run = not got or any(final[i:i + len(got)] == got for i, m in enumerate(final) if m == got[0])
        if not run or len(value) > limit:
            self.flag("impossible-read", conv, f"window({limit}, before={before}) by {o.process!r} returned "
                                               f"{len(value)} messages, not a run of at most {limit} of the final "
                                               f"{len(final)}", [o])


def check(history: History, finals: Finals) -> Report:
    """Check ``history`` against ``finals`` (member -> conversation -> final visible entries, each
    member's own read after the load); see the module's docstring for every rule."""
    c = _Check(history, finals)
    c.appends()
    c.agreement()
    c.receipt_order(c.members[0])
    checked = c.reads()
    outcomes = Counter(f"{o.kind} {o.outcome or 'pending'}" for o in c.ops)
    found = frozenset((conv, aid) for m in c.members for conv, placed in c.placed[m].items()
                      for aid, p in placed.items() if p.digest is not None)
    acknowledged = {(str(o.args["batch"].conversation_id), str(o.args["batch"].append_id))
                    for o in c.ops if o.kind == "append" and o.outcome == "ok"}
    return Report(tuple(c.out), dict(outcomes), found, frozenset(set(c.sent) - acknowledged), checked)

