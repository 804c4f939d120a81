"""History navigation conformance (API.md "History navigation"): newest-first pages, time ranges,
``position_of``, ``locate``, prefix pages of conversations and internal feedback, each stated
against a reference written here in plain Python over ``engine.entries(...)`` and run by every
backend (``ReadsContract`` includes it: file, memory, Kafka and the HTTP client).

The reference never calls the code under test beyond ``entries`` (itself checked against the
positions reads_contract computes from what was appended, with the model's turn rule
``turns_model.starts_turn``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

import pytest
from hypothesis import strategies as st

from schemas import (
    Batch,
    HistoryPosition,
    InvalidBatch,
    Located,
    Message,
    NotFound,
    StoredMessage,
    ToolCallPart,
    ToolOutput,
    ToolResultPart,
)
from tests.conformance.turns_model import reference_window

__all__ = ["NavigationContract", "check_navigation", "nav_queries", "reference_locate", "reference_page"]

Order = Literal["asc", "desc"]
_US = timedelta(microseconds=1)
_MS = timedelta(milliseconds=1)


# == the reference ================================================================================
def reference_page(es: Sequence[StoredMessage], after: HistoryPosition | None = None,
                   before: HistoryPosition | None = None, limit: int | None = None, order: Order = "asc",
                   since: datetime | None = None, until: datetime | None = None) -> list[StoredMessage]:
    """``after < position < before`` and ``since <= created_at < until``; ``desc`` reverses the
    run, so ``limit`` keeps the newest."""
    run = [e for e in es
           if (after is None or after < e.position) and (before is None or e.position < before)
           and (since is None or since <= e.created_at) and (until is None or e.created_at < until)]
    if order == "desc":
        run.reverse()
    return run if limit is None else run[:limit]


def external_of(e: StoredMessage) -> str | None:
    """The message's external id when its metadata ``external_id`` is a JSON string."""
    raw = e.message.metadata.get("external_id")
    value = json.loads(raw) if raw is not None else None
    return value if isinstance(value, str) else None


def reference_locate(es: Sequence[StoredMessage], external_id: str, before: int, after: int) -> Located | None:
    """The newest visible message with that external id and its neighbours, or None."""
    at = max((i for i, e in enumerate(es) if external_of(e) == external_id), default=None)
    if at is None:
        return None
    return Located(es[at], list(es[max(at - before, 0):at]), list(es[at + 1:at + 1 + after]))


def reference_listing(open_ids: Sequence[str], prefix: str, after: str | None, limit: int | None) -> list[str]:
    ids = sorted(c for c in open_ids if c.startswith(prefix) and (after is None or c > after))
    return ids if limit is None else ids[:limit]


# == generated queries ============================================================================
@dataclass(frozen=True)
class NavQuery:
    after: HistoryPosition | None
    before: HistoryPosition | None
    limit: int | None
    order: Order
    since: datetime | None
    until: datetime | None
    around: int  # locate's context on each side


def _times(es: Sequence[StoredMessage]) -> st.SearchStrategy[datetime | None]:
    """No bound, a stored time, or just around one (a microsecond, a millisecond either side)."""
    if not es:
        return st.none()
    stored = st.sampled_from([e.created_at for e in es])
    return st.one_of(st.none(), stored, st.builds(lambda t, d: t + d, stored, st.sampled_from([-_MS, -_US, _US, _MS])))


def nav_queries(es: Sequence[StoredMessage], cursor: st.SearchStrategy[HistoryPosition]
                ) -> st.SearchStrategy[list[NavQuery]]:
    one = st.builds(NavQuery, st.one_of(st.none(), cursor), st.one_of(st.none(), cursor),
                    st.one_of(st.none(), st.integers(0, len(es) + 1)), st.sampled_from(["asc", "desc"]),
                    _times(es), _times(es), st.integers(0, 3))
    return st.lists(one, min_size=1, max_size=6)


def check_navigation(engine: Any, conv: str, es: list[StoredMessage], qs: Sequence[NavQuery]) -> None:
    """Every navigation read of ``conv`` equals the reference (``es`` = its ``entries``)."""
    for q in qs:
        got = engine.entries(conv, after=q.after, before=q.before, limit=q.limit, order=q.order,
                             since=q.since, until=q.until)
        assert got == reference_page(es, q.after, q.before, q.limit, q.order, q.since, q.until), (conv, q)
    for e in es:
        assert engine.position_of(conv, e.id) == e.position, (conv, e.id)
    around = qs[0].around
    for external in sorted({x for e in es if (x := external_of(e)) is not None} | {"absent"}):
        want = reference_locate(es, external, around, around)
        if want is None:
            with pytest.raises(NotFound):
                engine.locate(conv, external, around, around)
        else:
            assert engine.locate(conv, external, around, around) == want, (conv, external)


# == the contract =================================================================================
def _feedback(text: str) -> Message:
    return Message.user(text, metadata={"internal_feedback": True})


class NavigationContract:
    """Navigation reads and internal feedback on one backend (the ``engine`` and ``backend``
    fixtures are ``ReadsContract``'s)."""

    @staticmethod
    def check_listing(engine: Any, prefix: str, open_ids: Sequence[str], page: int) -> None:
        """``conversations(prefix=...)`` whole and walked page by page with ``after``."""
        assert engine.conversations(prefix=prefix) == reference_listing(open_ids, prefix, None, None)
        walked: list[str] = []
        after: str | None = None
        while True:
            got = engine.conversations(prefix=prefix, after=after, limit=page)
            assert got == reference_listing(open_ids, prefix, after, page)
            if not got:
                break
            walked.extend(got)
            after = got[-1]
        assert walked == reference_listing(open_ids, prefix, None, None)

    def test_newest_first_pages_walk_the_history_back(self, engine: Any) -> None:
        for i in range(5):
            engine.append(Batch("nav", f"a{i}", [Message.user(f"q{i}"), Message.assistant(f"r{i}")]))
        es = engine.entries("nav")
        walked: list[StoredMessage] = []
        before = None
        while page := engine.entries("nav", before=before, order="desc", limit=3):
            walked.extend(page)
            before = page[-1].position
        assert walked == es[::-1]
        assert engine.entries("nav", order="desc", limit=2, after=es[6].position) == [es[9], es[8]]
        assert engine.entries("nav", since=es[3].created_at, until=es[3].created_at) == []
        assert engine.entries("unknown-nav", order="desc", limit=3) == []

    def test_locate_and_position_of(self, engine: Any) -> None:
        engine.append(Batch("loc", "a0", [Message.user("hi", metadata={"external_id": "m-1"}),
                                          Message.assistant("hello")]))
        engine.append(Batch("loc", "a1", [Message.user("again", metadata={"external_id": "m-2"}),
                                          Message.assistant("yes", metadata={"external_id": "m-1"})]))
        es = engine.entries("loc")
        assert engine.locate("loc", "m-1", before=2, after=5) == Located(es[3], es[1:3], [])
        assert engine.locate("loc", "m-2") == Located(es[2], [], [])
        assert engine.position_of("loc", "a1/1") == es[3].position
        for call in (lambda: engine.locate("loc", "m-3"), lambda: engine.locate("other", "m-1"),
                     lambda: engine.position_of("loc", "a9/0"), lambda: engine.position_of("loc", "a0/7")):
            with pytest.raises(NotFound):
                call()

    def test_prefix_pages_list_open_conversations_only(self, engine: Any) -> None:
        for c in ("p-bot-1/a", "p-bot-1/b", "p-bot-1/c", "p-bot-2/a"):
            engine.append(Batch(c, "a", [Message.user("hi")]))
        engine.clear("p-bot-1/b")
        self.check_listing(engine, "p-bot-1/", ["p-bot-1/a", "p-bot-1/c"], 1)
        assert engine.conversations(prefix="p-bot-", after="p-bot-1/c") == ["p-bot-2/a"]
        assert engine.conversations(prefix="p-none/") == []

    def test_internal_feedback_stays_in_its_turn(self, engine: Any) -> None:
        """A harness's injected feedback is stored and replayed as a user message, but the turn it
        is in keeps its request and tool exchange: positions, windows, budgets, turns, measure."""
        turn = [Message.user("fix the test"),
                Message.assistant(ToolCallPart("c1", "run", "{}")),
                Message.tool(ToolResultPart("c1", "run", ToolOutput.text("1 failed"))),
                _feedback("tests failed, try again"),
                Message.assistant(ToolCallPart("c2", "run", "{}")),
                Message.tool(ToolResultPart("c2", "run", ToolOutput.text("ok"))),
                Message.assistant("fixed")]
        engine.append(Batch("fb", "a0", [Message.user("hello"), Message.assistant("hi")]))
        engine.append(Batch("fb", "a1", turn))
        es = engine.entries("fb")
        assert [e.position.turn for e in es] == [1, 1, 2, 2, 2, 2, 2, 2, 2]
        assert engine.window("fb", 7) == turn  # the whole turn fits; no window starts at the feedback
        assert engine.window("fb", 8) == turn
        assert engine.window("fb", 9) == [e.message for e in es] == reference_window([e.message for e in es], 9)
        latest = engine.latest_turn("fb")
        assert latest is not None and latest.id == "a1/0" and [m.message for m in latest.messages] == turn
        assert engine.turn("fb", "a1/3") == latest
        assert engine.measure("fb").turns == 2
        load = engine.read_within_bytes("fb", 1)  # one unit: the whole turn, feedback included
        assert [e.message for e in load.messages] == turn and load.truncated
        assert [s.id for s in engine.turn_sources("fb", 1).messages] == [e.id for e in es[2:]]
        with pytest.raises(InvalidBatch):  # a replacement turn starts with the user's own message
            engine.replace_turn(Batch("fb", "bad", [_feedback("again"), Message.assistant("x")]), latest.id, "edit")
        engine.replace_turn(Batch("fb", "e", [Message.user("fix it"), _feedback("more"), Message.assistant("ok")]),
                            latest.id, "edit")
        after = engine.entries("fb")
        assert [e.id for e in after] == ["a0/0", "a0/1", "e/0", "e/1", "e/2"]
        assert after[2].position.turn == after[3].position.turn > 2
        assert engine.measure("fb").turns == 2

    def test_feedback_before_any_user_message_is_the_leading_group(self, engine: Any) -> None:
        engine.append(Batch("fb0", "a0", [_feedback("context"), Message.assistant("noted"), Message.user("q")]))
        es = engine.entries("fb0")
        assert [e.position.turn for e in es] == [0, 0, 1]
        assert engine.latest_turn("fb0").id == "a0/2"
        assert engine.measure("fb0").turns == 2
        with pytest.raises(NotFound):
            engine.turn("fb0", "a0/0")  # before the first turn-starting message: no turn
