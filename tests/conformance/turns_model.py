"""A reference model of turns (issue 7) in plain Python: what every backend must show.

It re-implements the rules of docs/design.md §4-§5 and docs/events.md independently of ``projections/``
(no import from there): turn positions, turn replacement, ``expected_last`` preconditions,
clears, and every read (``entries``, ``window``, ``read_within_bytes``, ``turn_sources``,
``measure``, ``turn``, ``latest_turn``, ``latest_interrupted_checkpoint``). Only the data model
(``schemas``) is shared: ``Message.content_json()`` is what byte budgets and retries compare.

Rules in one place:

* Every accepted message gets ``seq`` = a per-conversation counter over all accepted messages
  (hidden ones keep theirs) and ``turn`` = a counter that grows at every user message that is
  not internal feedback (``starts_turn``; 0 before the first one), never reset, also across
  replacements.
* A turn is a position ``p > 0`` of the visible messages; its id is the id (``APPEND_ID/INDEX``)
  of its user message, its messages are the visible messages with ``turn == p``.
* ``replace_turn``: validation (reason, user message first) → closed → append id known
  (duplicate / conflict) → ``old_turn_id`` is the latest visible turn, and for a retry the new
  user message has the old one's content (``content_json``) → hide everything from the old
  turn's user message to the end, then append the batch.
* ``append(expected_last=...)``: a receipt of another conversation is refused before I/O;
  closed → duplicate / conflict → the precondition names the last accepted append (a plain
  append or a replacement), ``EMPTY`` = none yet.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from engine import EMPTY
from schemas import (
    AppendConflict,
    Batch,
    ConversationClosed,
    HistoryPosition,
    InvalidBatch,
    InvalidReceipt,
    Message,
    PreconditionFailed,
    Receipt,
    Role,
    TextPart,
    TurnNotReplaceable,
    WindowTooSmall,
)

__all__ = ["Expected", "RefConversation", "RefRow", "Verdict", "content_json", "interrupted", "is_interrupted",
           "reference_window", "starts_turn"]

START = HistoryPosition(0, 0)


def starts_turn(message: Message) -> bool:
    """The model's turn rule: a user message starts a turn unless its metadata
    ``internal_feedback`` is the JSON value ``true`` (a harness's injected feedback stays in the
    current turn)."""
    raw = message.metadata.get("internal_feedback")
    return message.role == Role.USER and not (raw is not None and json.loads(raw) is True)


class Verdict(enum.Enum):
    """What the model decides for one write."""

    ACCEPT = "accept"
    DUPLICATE = "duplicate"  # the original receipt
    CONFLICT = "conflict"
    CLOSED = "closed"
    PRECONDITION = "precondition"
    NOT_REPLACEABLE = "not_replaceable"
    INVALID_BATCH = "invalid_batch"  # before any I/O
    INVALID_RECEIPT = "invalid_receipt"  # before any I/O

    @property
    def error(self) -> type[Exception] | None:
        return _ERRORS.get(self)

    @property
    def before_io(self) -> bool:
        return self in (Verdict.INVALID_BATCH, Verdict.INVALID_RECEIPT)


_ERRORS: dict[Verdict, type[Exception]] = {
    Verdict.CONFLICT: AppendConflict,
    Verdict.CLOSED: ConversationClosed,
    Verdict.PRECONDITION: PreconditionFailed,
    Verdict.NOT_REPLACEABLE: TurnNotReplaceable,
    Verdict.INVALID_BATCH: InvalidBatch,
    Verdict.INVALID_RECEIPT: InvalidReceipt,
}


@dataclass(frozen=True)
class Expected:
    """A verdict, and whether local state could never decide it (the event must reach the log:
    what the admission counters of ``stats()`` are bounded below by)."""

    verdict: Verdict
    needs_log: bool = False


def interrupted(message: Message) -> bool:
    """Metadata ``interrupted`` is JSON ``true`` (not the string "true", not 1)."""
    raw = message.metadata.get("interrupted")
    return raw is not None and json.loads(raw) is True


@dataclass
class RefRow:
    """One accepted message; ``superseded_by``/``reason`` once its turn was replaced."""

    id: str
    message: Message
    position: HistoryPosition
    append_id: str
    superseded_by: str | None = None
    reason: str | None = None

    @property
    def visible(self) -> bool:
        return self.superseded_by is None

    def key(self) -> tuple[object, ...]:
        """What ``StoredMessage`` must show (``created_at`` is checked apart: the writer's clock)."""
        return (self.id, self.position, self.append_id, self.message.canonical_json(), self.superseded_by,
                self.reason)


@dataclass
class Accepted:
    batch: Batch
    receipt: Receipt | None = None
    old_turn_id: str | None = None  # set for replacements
    reason: str | None = None


@dataclass(frozen=True)
class Replacement:
    """An accepted replacement as a custom projection must see it."""

    append_id: str
    old_turn_id: str
    reason: str
    hidden_seqs: tuple[int, ...]
    first_seq: int


@dataclass
class RefConversation:
    cid: str
    rows: list[RefRow] = field(default_factory=list)
    closed: bool = False
    ever_cleared: bool = False
    turn_counter: int = 0
    next_seq: int = 1
    accepted: dict[str, Accepted] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # accepted append ids, in log order
    replacements: list[Replacement] = field(default_factory=list)
    created: dict[str, datetime] = field(default_factory=dict)  # by append id, as first observed

    # -- state ------------------------------------------------------------------------------
    @property
    def last_append(self) -> str | None:
        return self.order[-1] if self.order else None

    def visible_rows(self) -> list[RefRow]:
        return [] if self.closed else [r for r in self.rows if r.visible]

    def hidden_rows(self) -> list[RefRow]:
        return [] if self.closed else [r for r in self.rows if not r.visible]

    def all_rows(self) -> list[RefRow]:
        return [] if self.closed else list(self.rows)

    def turn_positions(self) -> list[int]:
        return sorted({r.position.turn for r in self.visible_rows() if r.position.turn > 0})

    def turn_rows(self, position: int) -> list[RefRow]:
        return [r for r in self.visible_rows() if r.position.turn == position]

    def latest_turn_id(self) -> str | None:
        positions = self.turn_positions()
        return self.turn_rows(positions[-1])[0].id if positions else None

    def turn_ids(self) -> list[str]:
        return [self.turn_rows(p)[0].id for p in self.turn_positions()]

    def hidden_turn_ids(self) -> list[str]:
        return [r.id for r in self.hidden_rows() if starts_turn(r.message)]

    def row(self, message_id: str) -> RefRow | None:
        return next((r for r in self.rows if r.id == message_id), None)

    # -- decisions ---------------------------------------------------------------------------
    def _known(self, batch: Batch) -> Expected | None:
        if self.closed:
            return Expected(Verdict.CLOSED)
        prior = self.accepted.get(str(batch.append_id))
        if prior is None:
            return None
        return Expected(Verdict.DUPLICATE if prior.batch.digest == batch.digest else Verdict.CONFLICT)

    def decide_append(self, batch: Batch, expected_last: object) -> Expected:
        """``expected_last`` exactly as given to the engine: None, ``EMPTY``, a Receipt (or junk)."""
        if isinstance(expected_last, Receipt) and expected_last.conversation_id != self.cid:
            return Expected(Verdict.INVALID_RECEIPT)
        if expected_last is not None and expected_last is not EMPTY and not isinstance(expected_last, Receipt):
            return Expected(Verdict.INVALID_RECEIPT)
        known = self._known(batch)
        if known is not None:
            return known
        if expected_last is EMPTY and self.last_append is not None:
            return Expected(Verdict.PRECONDITION)
        if isinstance(expected_last, Receipt) and self.last_append != expected_last.append_id:
            # An append id this conversation never accepted may still be in flight elsewhere:
            # only the log can refuse it.
            return Expected(Verdict.PRECONDITION, needs_log=expected_last.append_id not in self.accepted)
        return Expected(Verdict.ACCEPT)

    def decide_replace(self, batch: Batch, old_turn_id: str, reason: str) -> Expected:
        if reason not in ("edit", "retry") or not old_turn_id or not starts_turn(batch.messages[0]):
            return Expected(Verdict.INVALID_BATCH)
        known = self._known(batch)
        if known is not None:
            return known
        latest = self.latest_turn_id()
        # A message id this conversation does not know may belong to an append in flight.
        needs_log = self.row(old_turn_id) is None
        if latest is None or old_turn_id != latest:
            return Expected(Verdict.NOT_REPLACEABLE, needs_log)
        old_user = self.turn_rows(self.turn_positions()[-1])[0].message
        if reason == "retry" and batch.messages[0].content_json() != old_user.content_json():
            return Expected(Verdict.NOT_REPLACEABLE)
        return Expected(Verdict.ACCEPT)

    # -- effects ------------------------------------------------------------------------------
    def accept(self, batch: Batch, receipt: Receipt, *, old_turn_id: str | None = None,
               reason: str | None = None) -> None:
        aid = str(batch.append_id)
        hidden: list[int] = []
        if old_turn_id is not None:
            assert reason is not None
            start = self.row(old_turn_id)
            assert start is not None and start.visible
            by = f"{aid}/0"
            for r in self.rows:
                if r.position >= start.position:
                    assert r.visible  # the latest turn is the visible tail
                    r.superseded_by, r.reason = by, reason
                    hidden.append(r.position.seq)
        first_seq = self.next_seq
        for index, message in enumerate(batch.messages):
            if starts_turn(message):
                self.turn_counter += 1
            self.rows.append(RefRow(f"{aid}/{index}", message, HistoryPosition(self.turn_counter, self.next_seq), aid))
            self.next_seq += 1
        self.accepted[aid] = Accepted(batch, receipt, old_turn_id, reason)
        self.order.append(aid)
        if old_turn_id is not None:
            assert reason is not None
            self.replacements.append(Replacement(aid, old_turn_id, reason, tuple(hidden), first_seq))

    def clear(self) -> None:
        self.closed = True
        self.ever_cleared = True

    # -- reads ---------------------------------------------------------------------------------
    def entries(self, after: HistoryPosition | None = None, before: HistoryPosition | None = None,
                limit: int | None = None, include_hidden: bool = False) -> list[RefRow]:
        rows = self.all_rows() if include_hidden else self.visible_rows()
        out = [r for r in rows if (after is None or after < r.position) and (before is None or r.position < before)]
        return out if limit is None else out[:limit]

    def window(self, limit: int) -> list[Message]:
        """``engine.window`` of the visible messages: ``reference_window``."""
        return reference_window([r.message for r in self.visible_rows()], limit)

    def within_bytes(self, max_bytes: int, unit: str, after: HistoryPosition = START,
                     before: HistoryPosition | None = None) -> tuple[list[RefRow], bool]:
        """Newest first: a unit is kept while the bytes of the strictly newer kept units are
        below ``max_bytes``; returns the kept rows in stored order and ``truncated``."""
        rows = self.entries(after, before)
        units: list[list[RefRow]] = []
        for r in rows:
            if unit == "message" or not units or units[-1][0].position.turn != r.position.turn:
                units.append([r])
            else:
                units[-1].append(r)
        kept: list[list[RefRow]] = []
        spent = 0
        for u in reversed(units):
            if spent >= max_bytes:
                return [r for k in reversed(kept) for r in k], True
            kept.append(u)
            spent += sum(r.message.content_bytes() for r in u)
        return [r for k in reversed(kept) for r in k], False

    def measure(self, after: HistoryPosition = START) -> tuple[int, int, int]:
        rows = self.entries(after)
        return len(rows), sum(r.message.content_bytes() for r in rows), len({r.position.turn for r in rows})

    def turn(self, message_id: str) -> tuple[object, ...] | None:
        """The visible turn holding ``message_id`` as a comparable tuple; None = NotFound."""
        r = self.row(message_id)
        if self.closed or r is None or not r.visible or r.position.turn == 0:
            return None
        return self.turn_key(r.position.turn)

    def turn_key(self, position: int) -> tuple[object, ...]:
        rows = self.turn_rows(position)
        assistants = [r.id for r in rows if r.message.role == Role.ASSISTANT]
        return (rows[0].id, position, rows[0].id, assistants[-1] if assistants else None, [r.key() for r in rows])

    def latest_turn(self) -> tuple[object, ...] | None:
        positions = self.turn_positions()
        return self.turn_key(positions[-1]) if positions else None

    def latest_interrupted_checkpoint(self) -> RefRow | None:
        assistants = [r for r in self.visible_rows() if r.message.role == Role.ASSISTANT]
        if assistants and interrupted(assistants[-1].message):
            return assistants[-1]
        return None

    def cursors(self) -> list[HistoryPosition]:
        """A few cursor positions worth probing: START, visible and hidden positions, the start
        of the latest turn, past the end."""
        rows = self.all_rows()
        out = [START]
        if rows:
            out += [rows[0].position, rows[len(rows) // 2].position, rows[-1].position]
        hidden = self.hidden_rows()
        if hidden:
            h = hidden[len(hidden) // 2].position
            out += [h, HistoryPosition(h.turn, 0)]
        positions = self.turn_positions()
        if positions:
            # The start of the latest turn; a seq before its first message; a seq past all of it.
            out += [HistoryPosition(positions[-1], 0), HistoryPosition(positions[-1], 1),
                    HistoryPosition(positions[0], 1 << 40)]
        out.append(HistoryPosition(self.turn_counter + 5, 0))
        return list(dict.fromkeys(out))


def total_bytes(rows: Sequence[RefRow]) -> int:
    return sum(r.message.content_bytes() for r in rows)


def reference_window(messages: Sequence[Message], limit: int) -> list[Message]:
    """The window of ``messages`` (the suite's one window oracle; ``WindowReader``'s rule written
    out): every system message merged into one leading message (one alone is kept as it is;
    several are joined, text parts only, by a ``"\\n\\n"`` part, metadata merged, later keys
    winning), then the longest suffix of whole turns (a turn starts at each user message that is
    not internal feedback, or at the first non-system message) that fits ``limit`` with it; the
    walk stops at the first turn that does not fit. ``WindowTooSmall`` when not even the newest turn fits."""
    system = [m for m in messages if m.role == Role.SYSTEM]
    groups: list[list[Message]] = []
    for m in messages:
        if m.role == Role.SYSTEM:
            continue
        if starts_turn(m) or not groups:
            groups.append([m])
        else:
            groups[-1].append(m)
    budget = limit - (1 if system else 0)
    chosen: list[list[Message]] = []
    for g in reversed(groups):
        if len(g) > budget:
            break
        chosen.append(g)
        budget -= len(g)
    if groups and not chosen:
        raise WindowTooSmall("model: the newest turn does not fit")
    head: list[Message] = []
    if len(system) == 1:
        head = [system[0]]
    elif system:
        parts: list[TextPart] = []
        metadata: dict[str, object] = {}
        for i, m in enumerate(system):
            if i:
                parts.append(TextPart("\n\n"))
            parts.extend(p for p in m.parts if isinstance(p, TextPart))
            metadata.update(m.metadata)
        head = [Message(Role.SYSTEM, parts, metadata)]
    return head + [m for g in reversed(chosen) for m in g]


def content_json(message: Message) -> bytes:
    """What budgets count and turn sources carry: the message rebuilt without its message
    metadata, as canonical JSON (part metadata stays)."""
    return Message(message.role, message.parts).canonical_json()


def is_interrupted(message: Message) -> bool:
    """Message metadata ``interrupted`` is the JSON value ``true`` (not ``"true"``, not ``1``)."""
    raw = message.metadata.get("interrupted")
    return raw is not None and json.loads(raw) is True
