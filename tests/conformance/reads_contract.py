"""The read-projection conformance suite (issue 5): ``read_within_bytes``, ``turn_sources``,
``measure``, ``window`` and the ``entries`` cursors, each stated against a reference model
written in plain Python over ``engine.entries(...)`` and run by every backend.

Subclass ``ReadsContract`` and provide the ``backend`` fixture (the ``Backend`` of
facade_contract: ``open()`` on the same log every time, ``drop_state()``). ``examples`` bounds
the hypothesis tests: every append is a log round trip, so a remote log sets fewer.

The reference never calls the code under test beyond ``entries``, and ``entries`` itself is
checked against positions computed here from what was appended (turn = a counter bumped by
every user message that is not internal feedback, 0 before the first one; seq = 1-based index
in the conversation). The navigation reads (``order``, ``since``/``until``, ``position_of``,
``locate``, prefix pages) are stated in navigation_contract.py and checked on the same histories.
Content bytes are recomputed independently: the canonical JSON of the message rebuilt without
its message metadata (part metadata stays).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import HistoryEngine, WindowReader
from schemas import (
    Batch,
    ConversationClosed,
    HistoryLoad,
    HistoryPosition,
    InvalidConversationID,
    InvalidWindow,
    Measure,
    Media,
    MediaPart,
    Message,
    RawJSON,
    ReasoningPart,
    Receipt,
    RefusalPart,
    StoredMessage,
    TextPart,
    ToolCallPart,
    ToolOutput,
    ToolResultPart,
    TurnSource,
    WindowTooSmall,
)
from tests.conformance.assets_contract import AssetsContract
from tests.conformance.by_ids_contract import ByIdsContract, check_by_ids
from tests.conformance.deletes_contract import DeletesContract
from tests.conformance.facade_contract import Backend
from tests.conformance.navigation_contract import NavigationContract, check_navigation, nav_queries
from tests.conformance.runs_contract import RunsContract
from tests.conformance.slots_contract import SlotsContract
from tests.conformance.turns_model import content_json, is_interrupted, reference_window, starts_turn

START = HistoryPosition.START
Unit = Literal["turn", "message"]

__all__ = [
    "ReadsContract",
    "content_json",
    "expected_positions",
    "is_interrupted",
    "reference_measure",
    "reference_turn_sources",
    "reference_within_bytes",
]


# == the reference model ========================================================================
def expected_positions(messages: Sequence[Message]) -> list[HistoryPosition]:
    """Positions of a conversation's messages in stored order (``HistoryPosition``, docs/design.md §5.3)."""
    turn, out = 0, []
    for seq, m in enumerate(messages, 1):
        if starts_turn(m):
            turn += 1
        out.append(HistoryPosition(turn, seq))
    return out


def select(entries: Sequence[StoredMessage], after: HistoryPosition | None,
           before: HistoryPosition | None) -> list[StoredMessage]:
    """The messages with ``after < position < before`` (both exclusive, ``None`` = unbounded)."""
    return [e for e in entries
            if (after is None or after < e.position) and (before is None or e.position < before)]


def units(window: Sequence[StoredMessage], unit: Unit) -> list[list[StoredMessage]]:
    """The budget units of a window in stored order: runs of one turn position, or messages."""
    groups: list[list[StoredMessage]] = []
    for e in window:
        if unit == "turn" and groups and groups[-1][-1].position.turn == e.position.turn:
            groups[-1].append(e)
        else:
            groups.append([e])
    return groups


def reference_within_bytes(entries: Sequence[StoredMessage], max_bytes: int, after: HistoryPosition = START,
                           before: HistoryPosition | None = None, unit: Unit = "turn") -> HistoryLoad[StoredMessage]:
    """Newest unit first, a unit is kept while the content bytes of the strictly newer kept
    units are below ``max_bytes``; the walk stops at the first unit not kept."""
    window = select(entries, after, before)
    kept: list[list[StoredMessage]] = []
    newer = 0
    for group in reversed(units(window, unit)):
        if newer >= max_bytes:
            break
        kept.append(group)
        newer += sum(len(content_json(e.message)) for e in group)
    messages = [e for group in reversed(kept) for e in group]
    return HistoryLoad(messages, len(messages) < len(window))


def reference_turn_sources(entries: Sequence[StoredMessage], max_bytes: int, after: HistoryPosition = START,
                           before: HistoryPosition | None = None, unit: Unit = "turn") -> HistoryLoad[TurnSource]:
    """The same window narrowed to ``TurnSource``."""
    load = reference_within_bytes(entries, max_bytes, after, before, unit)
    return HistoryLoad([TurnSource(e.id, e.message.role, content_json(e.message), e.created_at,
                                   is_interrupted(e.message)) for e in load.messages], load.truncated)


def reference_measure(entries: Sequence[StoredMessage], after: HistoryPosition = START) -> Measure:
    """Messages, content bytes and distinct turn positions of the messages after ``after``."""
    rest = select(entries, after, None)
    return Measure(len(rest), sum(len(content_json(e.message)) for e in rest), len({e.position.turn for e in rest}))


# == generated histories ========================================================================
_TEXT = st.text(alphabet="ab é\n\"\\\x01💬", max_size=24)  # escapes and multi-byte UTF-8
_NAMES = st.sampled_from(["lookup", "search", "calc"])
_ABSENT = object()
_FLAGS: list[Any] = [_ABSENT, _ABSENT, True, "true", 1, False, RawJSON(" true ")]
_JSON_VALUES = st.one_of(_TEXT, st.integers(-5, 10**6), st.booleans(), st.none())
_EXTERNAL: list[Any] = [_ABSENT, _ABSENT, "tg-1", "tg-2", "tg-\x01é", 7, RawJSON('"tg-\\u0031"')]
"""External ids: repeated strings (the newest visible one wins), a control character, a
non-string (names no platform message), and ``"tg-1"`` spelled with an escape."""
_FEEDBACK: list[Any] = [_ABSENT, _ABSENT, _ABSENT, True, "true", RawJSON(" true "), False]
"""``internal_feedback`` on user messages: only JSON true keeps the message in the current turn."""


@st.composite
def _metadata(draw: st.DrawFn) -> dict[str, Any]:
    """Message metadata: the ``interrupted`` flag as JSON true, the string "true", 1, false or
    a RawJSON ``true`` spelled with spaces; plus other keys (so the canonical JSON is longer
    than the content)."""
    md: dict[str, Any] = {}
    flag = draw(st.sampled_from(_FLAGS))
    if flag is not _ABSENT:
        md["interrupted"] = flag
    md.update(draw(st.dictionaries(st.sampled_from(["model", "trace", "note"]), _JSON_VALUES, max_size=2)))
    external = draw(st.sampled_from(_EXTERNAL))
    if external is not _ABSENT:
        md["external_id"] = external
    return md


_META = st.one_of(st.just({}), _metadata())
_PART_META: st.SearchStrategy[dict[str, Any]] = st.one_of(
    st.just({}), st.dictionaries(st.sampled_from(["lang", "cache"]), _JSON_VALUES, min_size=1, max_size=1))
_TEXT_PART = st.builds(lambda t, md: TextPart(t, metadata=md), _TEXT, _PART_META)
_MEDIA_PART = st.builds(lambda n: MediaPart(Media("image/png", uri=f"https://example.com/{n}.png")),
                        st.integers(0, 99))
_ASSISTANT_PART = st.one_of(
    _TEXT_PART,
    st.builds(ReasoningPart, _TEXT, st.binary(max_size=6)),
    st.builds(lambda i, n, a: ToolCallPart(f"call-{i}", n, a), st.integers(0, 9), _NAMES, _TEXT),
    st.builds(RefusalPart, _TEXT),
)
_TOOL_RESULT = st.builds(
    lambda i, n, t, d, err: ToolResultPart(f"call-{i}", n, ToolOutput.text(t, details=d), err),
    st.integers(0, 9), _NAMES, _TEXT, st.one_of(st.none(), st.integers(), st.dictionaries(st.just("k"), _TEXT)),
    st.booleans())

_SYSTEM = st.builds(lambda t, md: Message.system(t, metadata=md), _TEXT, _META)
_USER = st.builds(lambda ps, md, fb: Message.user(*ps, metadata=md if fb is _ABSENT else {**md,
                                                                                            "internal_feedback": fb}),
                  st.lists(st.one_of(_TEXT_PART, _MEDIA_PART), min_size=1, max_size=2), _META,
                  st.sampled_from(_FEEDBACK))
_ASSISTANT = st.builds(lambda ps, md: Message.assistant(*ps, metadata=md),
                       st.lists(_ASSISTANT_PART, min_size=1, max_size=3), _META)
_TOOL = st.builds(lambda rs, md: Message.tool(*rs, metadata=md), st.lists(_TOOL_RESULT, min_size=1, max_size=2), _META)
_ANY_MESSAGE = st.one_of(_SYSTEM, _USER, _ASSISTANT, _TOOL)


@st.composite
def _tool_round(draw: st.DrawFn) -> list[Message]:
    """Assistant tool calls, their results (one tool message, or one per result), and maybe
    the assistant's answer."""
    calls = [ToolCallPart(f"call-{i}", draw(_NAMES), draw(_TEXT)) for i in range(draw(st.integers(1, 3)))]
    out = [Message.assistant(*calls, metadata=draw(_META))]
    results = [ToolResultPart(c.id, c.name, ToolOutput.text(draw(_TEXT))) for c in calls]
    if draw(st.booleans()):
        out.append(Message.tool(*results))
    else:
        out.extend(Message.tool(r) for r in results)
    if draw(st.booleans()):
        out.append(draw(_ASSISTANT))
    return out


@st.composite
def _user_turn(draw: st.DrawFn) -> list[Message]:
    out = [draw(_USER)]
    for _ in range(draw(st.integers(0, 2))):
        out.extend(draw(_tool_round()))
        if draw(st.booleans()):  # a harness's feedback after a tool round ("tests failed, try again")
            out.append(Message.user(draw(_TEXT) or "try again", metadata={"internal_feedback": True}))
    if draw(st.booleans()):
        out.append(draw(_SYSTEM))  # a system message inside a turn
    out.append(draw(_ASSISTANT))
    return out


_SEGMENT = st.one_of(_ANY_MESSAGE.map(lambda m: [m]), _tool_round(), _user_turn())
_BATCH = st.lists(_SEGMENT, min_size=1, max_size=3).map(lambda segs: [m for s in segs for m in s])

SLOTS = 3  # conversations written per example (one more is read but never written)


@dataclass(frozen=True)
class Op:
    kind: Literal["append", "clear", "retry"]
    slot: int
    messages: tuple[Message, ...] = ()


_OP = st.one_of(
    st.builds(lambda s, ms: Op("append", s, tuple(ms)), st.integers(0, SLOTS - 1), _BATCH),
    st.builds(lambda s, ms: Op("append", s, tuple(ms)), st.integers(0, SLOTS - 1), _BATCH),
    st.builds(lambda s, ms: Op("append", s, tuple(ms)), st.integers(0, SLOTS - 1), _BATCH),
    st.builds(lambda s: Op("clear", s), st.integers(0, SLOTS - 1)),
    st.builds(lambda s: Op("retry", s), st.integers(0, SLOTS - 1)),
)
HISTORIES = st.lists(_OP, min_size=3, max_size=12)


@dataclass
class Model:
    """What was appended, per conversation, as the test saw it."""

    messages: dict[str, list[Message]] = field(default_factory=dict)
    append_ids: dict[str, list[str]] = field(default_factory=dict)
    closed: set[str] = field(default_factory=set)
    last: dict[str, tuple[Batch, Receipt]] = field(default_factory=dict)


def play(engine: HistoryEngine, prefix: str, ops: Sequence[Op]) -> Model:
    """Apply the operations to ``engine`` (conversations ``prefix + c<slot>``) and to a model."""
    model = Model()
    for i, op in enumerate(ops):
        conv = f"{prefix}c{op.slot}"
        if op.kind == "clear":
            engine.clear(conv)
            model.closed.add(conv)
        elif op.kind == "retry":
            if conv in model.last:
                batch, receipt = model.last[conv]
                if conv in model.closed:
                    with pytest.raises(ConversationClosed):
                        engine.append(batch)
                else:
                    assert engine.append(batch) == receipt  # nothing appended again
        else:
            batch = Batch(conv, f"a{i}", op.messages)
            if conv in model.closed:
                with pytest.raises(ConversationClosed):
                    engine.append(batch)
                continue
            model.last[conv] = (batch, engine.append(batch))
            model.messages.setdefault(conv, []).extend(op.messages)
            model.append_ids.setdefault(conv, []).extend([batch.append_id] * len(op.messages))
    return model


def cursors(positions: Sequence[HistoryPosition]) -> st.SearchStrategy[HistoryPosition]:
    """Real positions and positions that match no message (between, past the end, seq 0)."""
    top_turn = max((p.turn for p in positions), default=0) + 2
    top_seq = len(positions) + 2
    bogus = st.one_of(
        st.builds(HistoryPosition, st.integers(0, top_turn), st.integers(0, top_seq)),
        st.builds(HistoryPosition, st.integers(0, top_turn), st.just(999)),
        st.builds(HistoryPosition, st.integers(0, top_turn), st.just(0)),
    )
    real = st.sampled_from(list(positions)) if positions else st.just(START)
    return st.one_of(st.just(START), real, real, bogus)


def budgets(total: int) -> st.SearchStrategy[int]:
    """Zero, negative, tiny, around the history's size, and huge."""
    return st.one_of(st.sampled_from([0, -1, -(2**40), 1, 2**62]), st.integers(1, 60),
                     st.integers(1, max(total, 1) + 50))


@dataclass(frozen=True)
class Query:
    max_bytes: int
    unit: Unit
    after: HistoryPosition
    before: HistoryPosition | None
    limit: int | None


def queries(positions: Sequence[HistoryPosition], total: int) -> st.SearchStrategy[list[Query]]:
    cursor = cursors(positions)
    one = st.builds(Query, budgets(total), st.sampled_from(["turn", "message"]), cursor,
                    st.one_of(st.none(), cursor), st.one_of(st.none(), st.integers(0, len(positions) + 1)))
    return st.lists(one, min_size=1, max_size=8)


# == the contract ===============================================================================
def seqs(load: HistoryLoad[StoredMessage]) -> tuple[list[int], bool]:
    """A load as ``(seqs, truncated)``: what the hand-written expectations compare."""
    return [e.position.seq for e in load.messages], load.truncated


class ReadsContract(NavigationContract, ByIdsContract, RunsContract, SlotsContract, AssetsContract, DeletesContract):
    """Read projections (docs/design.md §5.2: ``read_within_bytes``, ``turn_sources``, ``measure``,
    ``window``, ``entries``) equal the reference model on every backend."""

    examples = 40

    @pytest.fixture
    def backend(self) -> Backend:
        raise NotImplementedError

    @pytest.fixture
    def engine(self, backend: Backend) -> Any:
        eng = backend.open()
        yield eng
        eng.close()

    # -- helpers -------------------------------------------------------------------------------
    @staticmethod
    def check_entries(engine: HistoryEngine, conv: str, model: Model) -> list[StoredMessage]:
        """``entries`` holds exactly what was appended, at the positions the rule gives."""
        es = engine.entries(conv)
        if conv in model.closed:
            assert es == []
            return es
        messages = model.messages.get(conv, [])
        assert [e.message for e in es] == messages
        assert [e.position for e in es] == expected_positions(messages)
        assert [e.append_id for e in es] == model.append_ids.get(conv, [])
        assert len({e.id for e in es}) == len(es)
        assert all(a.created_at <= b.created_at for a, b in itertools.pairwise(es))  # never decreases
        return es

    @staticmethod
    def check_reads(engine: HistoryEngine, conv: str, es: list[StoredMessage], qs: Sequence[Query]) -> None:
        """Every projection equals the reference for the given queries, every cursor and limit."""
        positions = [e.position for e in es]
        for q in qs:
            where = (conv, q)
            assert engine.read_within_bytes(conv, q.max_bytes, after=q.after, before=q.before, unit=q.unit) == \
                reference_within_bytes(es, q.max_bytes, q.after, q.before, q.unit), where
            assert engine.turn_sources(conv, q.max_bytes, after=q.after, before=q.before, unit=q.unit) == \
                reference_turn_sources(es, q.max_bytes, q.after, q.before, q.unit), where
            assert engine.entries(conv, after=q.after, before=q.before, limit=q.limit) == \
                select(es, q.after, q.before)[:q.limit], where
            assert engine.measure(conv, after=q.after) == reference_measure(es, q.after), where
        budget = qs[0].max_bytes
        for p in [START, *positions]:
            for unit in ("turn", "message"):
                assert engine.read_within_bytes(conv, budget, after=p, unit=unit) == \
                    reference_within_bytes(es, budget, p, None, unit), (conv, budget, "after", p, unit)
                assert engine.read_within_bytes(conv, budget, before=p, unit=unit) == \
                    reference_within_bytes(es, budget, START, p, unit), (conv, budget, "before", p, unit)
            assert engine.measure(conv, after=p) == reference_measure(es, p), (conv, p)
        messages = [e.message for e in es]
        for limit in range(1, len(es) + 3):
            try:
                want = reference_window(messages, limit)
            except WindowTooSmall:
                with pytest.raises(WindowTooSmall):
                    engine.window(conv, limit)
                with pytest.raises(WindowTooSmall):
                    WindowReader(engine, limit).read(conv)
                continue
            assert engine.window(conv, limit) == want, (conv, limit)
            assert WindowReader(engine, limit).read(conv) == want, (conv, limit)

    # -- generated histories -------------------------------------------------------------------
    def test_every_read_equals_the_reference_on_generated_histories(self, engine: HistoryEngine) -> None:
        prefixes = itertools.count()

        @settings(max_examples=self.examples, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(ops=HISTORIES, data=st.data())
        def run(ops: list[Op], data: st.DataObject) -> None:
            prefix = f"h{next(prefixes)}-"  # fresh conversations: one engine serves every example
            model = play(engine, prefix, ops)
            for slot in range(SLOTS + 1):
                conv = f"{prefix}c{slot}"
                es = self.check_entries(engine, conv, model)
                total = sum(len(content_json(e.message)) for e in es)
                self.check_reads(engine, conv, es, data.draw(queries([e.position for e in es], total),
                                                             label=conv))
                check_navigation(engine, conv, es, data.draw(nav_queries(es, cursors([e.position for e in es])),
                                                             label=f"{conv} navigation"))
                check_by_ids(engine, conv, data)
            opened = sorted(c for c in model.messages if c not in model.closed)
            self.check_listing(engine, prefix, opened, data.draw(st.integers(1, 3), label="page size"))

        run()

    def test_one_long_conversation_with_random_cursors(self, engine: HistoryEngine) -> None:
        """Many turns in one conversation, so cursors and budgets land in every shape of window."""
        prefixes = itertools.count()

        @settings(max_examples=max(self.examples // 2, 5), deadline=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(batches=st.lists(_BATCH, min_size=6, max_size=16), data=st.data())
        def run(batches: list[list[Message]], data: st.DataObject) -> None:
            conv = f"long{next(prefixes)}"
            model = play(engine, conv + "-", [Op("append", 0, tuple(b)) for b in batches])
            conv += "-c0"
            es = self.check_entries(engine, conv, model)
            total = sum(len(content_json(e.message)) for e in es)
            self.check_reads(engine, conv, es, data.draw(queries([e.position for e in es], total)))
            check_navigation(engine, conv, es, data.draw(nav_queries(es, cursors([e.position for e in es]))))
            check_by_ids(engine, conv, data)

        run()

    # -- a hand-written conversation ------------------------------------------------------------
    @staticmethod
    def sample(engine: HistoryEngine, conv: str = "d") -> list[StoredMessage]:
        """seq: 1 system, 2 assistant (turn 0) | 3 user, 4 tool call, 5 tool result, 6 answer
        (turn 1) | 7 user, 8 system, 9 answer (turn 2) | 10 user, 11 interrupted answer (turn 3)."""
        engine.append(Batch(conv, "a0", [Message.system("be brief"), Message.assistant("welcome")]))
        engine.append(Batch(conv, "a1", [
            Message.user("q1"),
            Message.assistant(ToolCallPart("call-1", "lookup", '{"q": "q1"}')),
            Message.tool(ToolResultPart("call-1", "lookup", ToolOutput.text("found it"))),
            Message.assistant("a1"),
        ]))
        engine.append(Batch(conv, "a2", [Message.user("q2"), Message.system("mid-turn rule, quite long"),
                                         Message.assistant("a2")]))
        engine.append(Batch(conv, "a3", [Message.user("q3"),
                                         Message.assistant("a3", metadata={"interrupted": True, "why": "x" * 40})]))
        es = engine.entries(conv)
        assert [e.position for e in es] == [HistoryPosition(t, s) for t, s in [
            (0, 1), (0, 2), (1, 3), (1, 4), (1, 5), (1, 6), (2, 7), (2, 8), (2, 9), (3, 10), (3, 11)]]
        return es

    @staticmethod
    def size(es: Sequence[StoredMessage], *seq: int) -> int:
        return sum(len(content_json(es[s - 1].message)) for s in seq)

    def test_max_bytes_zero_or_negative_loads_nothing(self, engine: HistoryEngine) -> None:
        self.sample(engine)
        for budget in (0, -1, -(2**70)):
            for unit in ("turn", "message"):
                assert engine.read_within_bytes("d", budget, unit=unit) == HistoryLoad([], True)
                assert engine.turn_sources("d", budget, unit=unit) == HistoryLoad[TurnSource]([], True)
        # An empty window left nothing out.
        assert engine.read_within_bytes("d", 0, after=HistoryPosition(3, 11)) == HistoryLoad([], False)

    def test_the_unit_crossing_the_budget_is_kept_and_the_walk_stops_after_it(self, engine: HistoryEngine) -> None:
        es = self.sample(engine)
        t3, t2, t1 = self.size(es, 10, 11), self.size(es, 7, 8, 9), self.size(es, 3, 4, 5, 6)
        assert seqs(engine.read_within_bytes("d", 1)) == ([10, 11], True)
        assert seqs(engine.read_within_bytes("d", t3)) == ([10, 11], True)  # newer bytes == budget: stop
        assert seqs(engine.read_within_bytes("d", t3 + 1)) == ([7, 8, 9, 10, 11], True)
        assert seqs(engine.read_within_bytes("d", t3 + t2 + 1)) == ([3, 4, 5, 6, 7, 8, 9, 10, 11], True)
        assert seqs(engine.read_within_bytes("d", t3 + t2 + t1 + 1)) == (list(range(1, 12)), False)
        assert seqs(engine.read_within_bytes("d", 2**62)) == (list(range(1, 12)), False)

    def test_a_turn_with_tool_rounds_is_never_split(self, engine: HistoryEngine) -> None:
        es = self.sample(engine)
        budget = self.size(es, 7, 8, 9, 10, 11) + 1  # turn 1 crosses it: kept whole
        got = engine.read_within_bytes("d", budget)
        assert seqs(got) == ([3, 4, 5, 6, 7, 8, 9, 10, 11], True)
        assert [m.message.role for m in got.messages[:4]] == ["user", "assistant", "tool", "assistant"]

    def test_message_unit_counts_each_message(self, engine: HistoryEngine) -> None:
        es = self.sample(engine)
        assert seqs(engine.read_within_bytes("d", 1, unit="message")) == ([11], True)
        assert seqs(engine.read_within_bytes("d", self.size(es, 11), unit="message")) == ([11], True)
        assert seqs(engine.read_within_bytes("d", self.size(es, 11) + 1, unit="message")) == ([10, 11], True)
        budget = self.size(es, 6, 7, 8, 9, 10, 11)
        assert seqs(engine.read_within_bytes("d", budget, unit="message")) == ([6, 7, 8, 9, 10, 11], True)
        assert seqs(engine.read_within_bytes("d", budget + 1, unit="message")) == ([5, 6, 7, 8, 9, 10, 11], True)

    def test_system_messages_count_in_their_turn(self, engine: HistoryEngine) -> None:
        es = self.sample(engine)
        # Without the system message (seq 8), turn 1 would still fit under this budget.
        budget = self.size(es, 10, 11, 7, 9) + 1
        assert seqs(engine.read_within_bytes("d", budget)) == ([7, 8, 9, 10, 11], True)
        assert [m.message.role for m in engine.read_within_bytes("d", budget).messages][1] == "system"
        # Turn 0 is the system message and the assistant greeting: one unit.
        everything_after_0 = self.size(es, *range(3, 12))
        assert seqs(engine.read_within_bytes("d", everything_after_0 + 1)) == (list(range(1, 12)), False)
        assert seqs(engine.read_within_bytes("d", everything_after_0 + 1, unit="message")) == ([2, *range(3, 12)],
                                                                                             True)

    def test_before_cutting_a_turn_counts_its_part_inside_as_one_unit(self, engine: HistoryEngine) -> None:
        es = self.sample(engine)
        assert seqs(engine.read_within_bytes("d", 1, before=HistoryPosition(1, 5))) == ([3, 4], True)
        assert seqs(engine.read_within_bytes("d", self.size(es, 3, 4) + 1, before=HistoryPosition(1, 5))) == \
            ([1, 2, 3, 4], False)
        assert seqs(engine.read_within_bytes("d", 1, before=HistoryPosition(1, 5), unit="message")) == ([4], True)
        # before = the first message of a turn: that turn is out entirely.
        assert seqs(engine.read_within_bytes("d", 1, before=HistoryPosition(2, 7))) == ([3, 4, 5, 6], True)
        assert seqs(engine.read_within_bytes("d", 1, before=HistoryPosition(2, 0))) == ([3, 4, 5, 6], True)
        assert seqs(engine.read_within_bytes("d", 1, before=HistoryPosition(0, 1))) == ([], False)

    def test_after_inside_a_turn_counts_the_rest_of_it_as_one_unit(self, engine: HistoryEngine) -> None:
        es = self.sample(engine)
        after = HistoryPosition(1, 4)
        assert seqs(engine.read_within_bytes("d", 2**40, after=after)) == (list(range(5, 12)), False)
        assert seqs(engine.read_within_bytes("d", 1, after=after)) == ([10, 11], True)
        budget = self.size(es, *range(7, 12)) + 1
        assert seqs(engine.read_within_bytes("d", budget, after=after)) == (list(range(5, 12)), False)
        assert seqs(engine.read_within_bytes("d", 1, after=HistoryPosition(1, 4), before=HistoryPosition(2, 9))) \
            == ([7, 8], True)
        assert seqs(engine.read_within_bytes("d", 2**40, after=HistoryPosition(1, 4), before=HistoryPosition(2, 9))) \
            == ([5, 6, 7, 8], False)

    def test_cursors_that_match_no_message(self, engine: HistoryEngine) -> None:
        es = self.sample(engine)
        cases: list[tuple[HistoryPosition, HistoryPosition | None, list[int]]] = [
            (HistoryPosition(2, 999), None, [10, 11]),  # past every seq of turn 2
            (HistoryPosition(7, 0), None, []),  # past the last turn
            (HistoryPosition(1, 0), None, list(range(3, 12))),  # before turn 1's first message
            (HistoryPosition(0, 999), None, list(range(3, 12))),
            (HistoryPosition(2, 1), None, list(range(7, 12))),  # turn 2 with a seq below its own
            (HistoryPosition(1, 11), None, list(range(7, 12))),  # turn 1 with a seq of turn 3
            (START, HistoryPosition(2, 999), list(range(1, 10))),
            (START, HistoryPosition(7, 0), list(range(1, 12))),
            (START, HistoryPosition(3, 0), list(range(1, 10))),
            (START, START, []),
            (HistoryPosition(3, 11), None, []),
            (HistoryPosition(2, 8), HistoryPosition(2, 8), []),
            (HistoryPosition(3, 0), HistoryPosition(1, 0), []),  # crossed cursors: an empty window
        ]
        for after, before, want in cases:
            assert seqs(engine.read_within_bytes("d", 2**40, after=after, before=before)) == (want, False), \
                (after, before)
            assert [e.position.seq for e in engine.entries("d", after=after, before=before)] == want
            if before is None:
                assert engine.measure("d", after=after) == reference_measure(es, after), after
            got = engine.turn_sources("d", 1, after=after, before=before)
            assert got == reference_turn_sources(es, 1, after, before), (after, before)

    def test_cursors_with_negative_or_huge_components(self, engine: HistoryEngine) -> None:
        """``HistoryPosition`` accepts any ints; the order is still ``(turn, seq)``."""
        es = self.sample(engine)
        cases: list[tuple[HistoryPosition, HistoryPosition | None, list[int]]] = [
            (HistoryPosition(-1, 0), None, list(range(1, 12))),
            (HistoryPosition(0, -5), None, list(range(1, 12))),
            (HistoryPosition(-2, 7), None, list(range(1, 12))),
            (HistoryPosition(2**63, 0), None, []),
            (HistoryPosition(1, 2**64), None, list(range(7, 12))),
            (START, HistoryPosition(0, -1), []),
            (START, HistoryPosition(1, 2**64), list(range(1, 7))),
            (START, HistoryPosition(2**63, 0), list(range(1, 12))),
        ]
        for after, before, want in cases:
            assert seqs(engine.read_within_bytes("d", 2**40, after=after, before=before)) == (want, False), \
                (after, before)
            assert engine.turn_sources("d", 1, after=after, before=before) == \
                reference_turn_sources(es, 1, after, before), (after, before)
            assert [e.position.seq for e in engine.entries("d", after=after, before=before)] == want
            assert engine.measure("d", after=after) == reference_measure(es, after), after

    def test_a_before_cursor_with_a_negative_turn_selects_nothing(self, engine: HistoryEngine) -> None:
        self.sample(engine)
        for before in (HistoryPosition(-1, 0), HistoryPosition(-1, 5), HistoryPosition(-2, 0)):
            assert engine.entries("d", before=before) == []
            assert engine.read_within_bytes("d", 2**40, before=before) == HistoryLoad([], False)
            assert engine.turn_sources("d", 2**40, before=before) == HistoryLoad[TurnSource]([], False)

    def test_cursors_past_the_u64_turn_range(self, engine: HistoryEngine) -> None:
        self.sample(engine)
        for far in (HistoryPosition(2**64 - 1, 0), HistoryPosition(2**64, 0)):
            assert engine.entries("d", after=far) == []
            assert engine.read_within_bytes("d", 2**40, after=far) == HistoryLoad([], False)
            assert engine.turn_sources("d", 2**40, after=far) == HistoryLoad[TurnSource]([], False)
            assert engine.measure("d", after=far) == Measure(0, 0, 0)
        far = HistoryPosition(2**64, 0)
        assert seqs(engine.read_within_bytes("d", 2**40, before=far)) == (list(range(1, 12)), False)

    def test_turn_sources_narrow_the_same_window(self, engine: HistoryEngine) -> None:
        es = self.sample(engine)
        for budget in (1, 100, 400, 2**40):
            load = engine.read_within_bytes("d", budget)
            sources = engine.turn_sources("d", budget)
            assert sources.truncated == load.truncated
            assert [s.id for s in sources.messages] == [e.id for e in load.messages]
            assert [s.role for s in sources.messages] == [e.message.role for e in load.messages]
            assert [s.created_at for s in sources.messages] == [e.created_at for e in load.messages]
            assert [s.content for s in sources.messages] == [content_json(e.message) for e in load.messages]
        last = engine.turn_sources("d", 1).messages[-1]
        assert isinstance(last.content, bytes) and b"why" not in last.content and b"metadata" not in last.content
        assert last.interrupted is True
        assert len(last.content) == es[-1].message.content_bytes() < len(es[-1].message.canonical_json())

    @pytest.mark.parametrize(("flag", "interrupted"), [
        (True, True),
        (RawJSON(" true "), True),  # JSON true, however it was spelled
        ("true", False),
        (1, False),
        (False, False),
        ({"at": 3}, False),
        (None, False),
    ])
    def test_interrupted_only_for_json_true(self, engine: HistoryEngine, flag: Any, interrupted: bool) -> None:
        engine.append(Batch("f", "a1", [
            Message.user("q", metadata={"interrupted": flag}),
            Message.assistant("partial", metadata={"interrupted": flag, "other": "x"}),
            Message.assistant("plain"),
        ]))
        got = engine.turn_sources("f", 2**20).messages
        assert [s.interrupted for s in got] == [interrupted, interrupted, False]
        assert got == reference_turn_sources(engine.entries("f"), 2**20).messages

    def test_measure_after_positions(self, engine: HistoryEngine) -> None:
        es = self.sample(engine)
        total = self.size(es, *range(1, 12))
        assert engine.measure("d") == Measure(11, total, 4)
        assert engine.measure("d", after=START) == Measure(11, total, 4)
        assert engine.measure("d", after=HistoryPosition(0, 1)) == Measure(10, total - self.size(es, 1), 4)
        assert engine.measure("d", after=HistoryPosition(1, 4)) == Measure(7, self.size(es, *range(5, 12)), 3)
        assert engine.measure("d", after=HistoryPosition(2, 999)) == Measure(2, self.size(es, 10, 11), 1)
        assert engine.measure("d", after=HistoryPosition(3, 11)) == Measure(0, 0, 0)
        assert engine.measure("d", after=HistoryPosition(7, 0)) == Measure(0, 0, 0)
        assert total == sum(e.message.content_bytes() for e in es) < sum(len(e.message.canonical_json()) for e in es)

    def test_measure_counts_the_leading_turn_only_when_it_exists(self, engine: HistoryEngine) -> None:
        engine.append(Batch("u", "a1", [Message.user("q1"), Message.assistant("a1"), Message.user("q2")]))
        assert engine.measure("u") == Measure(3, self.size(engine.entries("u"), 1, 2, 3), 2)
        engine.append(Batch("s", "a1", [Message.system("rule")]))
        assert engine.measure("s") == Measure(1, self.size(engine.entries("s"), 1), 1)

    def test_a_cleared_conversation_reads_empty(self, engine: HistoryEngine) -> None:
        self.sample(engine)
        self.sample(engine, "keep")
        engine.clear("d")
        self.assert_reads_empty(engine, "d")
        assert engine.measure("keep").messages == 11  # the neighbour keeps its rows

    def test_an_unknown_conversation_reads_empty(self, engine: HistoryEngine) -> None:
        self.sample(engine)
        self.assert_reads_empty(engine, "nobody")
        self.assert_reads_empty(engine, "d\u00e9")  # a neighbour in key order
        self.assert_reads_empty(engine, "c")

    @staticmethod
    def assert_reads_empty(engine: HistoryEngine, conv: str) -> None:
        for budget in (0, 1, 2**40):
            for unit in ("turn", "message"):
                assert engine.read_within_bytes(conv, budget, unit=unit) == HistoryLoad([], False)
                assert engine.turn_sources(conv, budget, unit=unit) == HistoryLoad[TurnSource]([], False)
        assert engine.read_within_bytes(conv, 10, after=HistoryPosition(1, 3),
                                        before=HistoryPosition(9, 0)) == HistoryLoad([], False)
        assert engine.measure(conv) == Measure(0, 0, 0)
        assert engine.measure(conv, after=HistoryPosition(1, 1)) == Measure(0, 0, 0)
        assert engine.window(conv, 20) == []
        assert engine.entries(conv) == []

    @pytest.mark.parametrize("call", [
        lambda e: e.read_within_bytes("d", "8192"),
        lambda e: e.read_within_bytes("d", 8192.0),
        lambda e: e.read_within_bytes("d", True),
        lambda e: e.read_within_bytes("d", None),
        lambda e: e.read_within_bytes("d", 10, unit="turns"),
        lambda e: e.read_within_bytes("d", 10, unit="Message"),
        lambda e: e.read_within_bytes("d", 10, unit=None),
        lambda e: e.read_within_bytes("d", 10, after=(1, 2)),
        lambda e: e.read_within_bytes("d", 10, after="1:2"),
        lambda e: e.read_within_bytes("d", 10, before=(1, 2)),
        lambda e: e.read_within_bytes("d", 10, before=3),
        lambda e: e.turn_sources("d", "10"),
        lambda e: e.turn_sources("d", False),
        lambda e: e.turn_sources("d", 10, unit="all"),
        lambda e: e.turn_sources("d", 10, after=(0, 0)),
        lambda e: e.turn_sources("d", 10, before="3:4"),
        lambda e: e.measure("d", after=(1, 2)),
        lambda e: e.measure("d", after="1:2"),
        lambda e: e.entries("d", after=(1, 2)),
        lambda e: e.window("d", 0),
        lambda e: e.window("d", "20"),
    ])
    def test_bad_arguments_raise_invalid_window_before_any_io(self, engine: HistoryEngine, call: Any) -> None:
        self.sample(engine)
        keys, ends = engine._store.keys_read, engine.stats().end_offsets
        with pytest.raises(InvalidWindow):
            call(engine)
        assert engine._store.keys_read == keys and engine.stats().end_offsets == ends

    @pytest.mark.parametrize("bad", ["", " padded", "ctl\x07", "x" * 1025])
    def test_invalid_conversation_ids_raise_before_any_io(self, engine: HistoryEngine, bad: str) -> None:
        keys = engine._store.keys_read
        for call in (lambda: engine.read_within_bytes(bad, 10), lambda: engine.turn_sources(bad, 10),
                     lambda: engine.measure(bad), lambda: engine.window(bad, 5), lambda: engine.entries(bad)):
            with pytest.raises(InvalidConversationID):
                call()
        assert engine._store.keys_read == keys

    def test_reads_are_the_same_after_reopen_and_after_a_rebuild(self, backend: Backend) -> None:
        def observe(eng: HistoryEngine) -> list[object]:
            out: list[object] = []
            for conv in ("d", "e"):
                for budget in (0, 1, 150, 600, 2**40):
                    for unit in ("turn", "message"):
                        out.append(eng.read_within_bytes(conv, budget, unit=unit))
                        out.append(eng.turn_sources(conv, budget, after=HistoryPosition(1, 4), unit=unit))
                out.extend(eng.measure(conv, after=p) for p in [START, HistoryPosition(1, 4), HistoryPosition(2, 999)])
                out.append(eng.window(conv, 6))
            return out

        with backend.open() as eng:
            self.sample(eng, "d")
            self.sample(eng, "e")
            eng.clear("e")
            before = observe(eng)
        with backend.open() as eng:
            assert observe(eng) == before
        backend.drop_state()
        with backend.open() as eng:
            assert observe(eng) == before
