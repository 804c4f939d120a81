"""History navigation on the embedded engine (API.md "History navigation"): monotonic
``created_at`` whatever the record times, bad arguments refused before any I/O, external ids
through edits, and prefix pages through clears. The reference model of every read is in
tests/conformance/reads_contract.py (run on every backend); the key counts in test_read_costs.py."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from engine import HistoryEngine, WindowReader
from schemas import Batch, InvalidConversationID, InvalidWindow, Message, NotFound, WindowTooSmall
from schemas.events import BatchAppended, encode_event
from schemas.records import record_key
from schemas.times import time_of
from tests.conformance.turns_model import reference_window


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[HistoryEngine]:
    with HistoryEngine.open(tmp_path, partitions=1, fsync="never") as e:
        yield e


def test_created_at_never_decreases_even_when_record_times_do(engine: HistoryEngine) -> None:
    """A record stamped earlier than the one before it (another writer's clock) is stored at the
    previous message's time: the projector decides it from the log alone, so every instance agrees."""
    for i, ms in enumerate([5_000, 9_000, 7_000, 7_000, 12_000]):
        batch = Batch("c", f"a{i}", [Message.user(f"q{i}"), Message.assistant(f"r{i}")])
        engine.log.append(record_key(batch.conversation_id, batch.append_id), encode_event(BatchAppended.of(batch, ms)))
    assert engine.catch_up(timeout=30)
    times = [e.created_at for e in engine.entries("c")]
    assert times == [time_of(ms) for ms in (5_000, 5_000, 9_000, 9_000, 9_000, 9_000, 9_000, 9_000, 12_000, 12_000)]
    # The ranges see the stored times: [9 s, 12 s) is batches 1-3, and `until` is exclusive.
    ids = [e.id for e in engine.entries("c", since=time_of(9_000), until=time_of(12_000))]
    assert ids == ["a1/0", "a1/1", "a2/0", "a2/1", "a3/0", "a3/1"]
    assert [e.id for e in engine.entries("c", since=time_of(9_001))] == ["a4/0", "a4/1"]
    assert engine.entries("c", since=time_of(12_001)) == [] == engine.entries("c", until=time_of(5_000))
    # A bound between milliseconds: created_at >= 8.9995 s is the batch at 9 s.
    assert engine.entries("c", since=time_of(8_999) + timedelta(microseconds=500), limit=1)[0].id == "a1/0"


BAD: list[tuple[str, dict[str, Any], type[Exception]]] = [
    ("entries", {"order": "newest"}, InvalidWindow),
    ("entries", {"since": datetime(2025, 1, 1)}, InvalidWindow),  # naive: no instant
    ("entries", {"until": "2025-01-01"}, InvalidWindow),
    ("entries", {"limit": -1}, InvalidWindow),
    ("locate", {"external_id": 7}, InvalidWindow),
    ("locate", {"external_id": "x", "before": -1}, InvalidWindow),
    ("locate", {"external_id": "x", "after": 1.5}, InvalidWindow),
    ("conversations", {"prefix": 3}, InvalidWindow),
    ("conversations", {"prefix": "bot\x07"}, InvalidConversationID),
    ("conversations", {"after": " x"}, InvalidConversationID),
    ("conversations", {"limit": True}, InvalidWindow),
    ("position_of", {"message_id": "no-slash"}, NotFound),
]


@pytest.mark.parametrize(("method", "kwargs", "error"), BAD, ids=[f"{m}-{sorted(k)}" for m, k, _ in BAD])
def test_bad_arguments_raise_typed_errors_before_any_read(engine: HistoryEngine, method: str, kwargs: dict[str, Any],
                                                          error: type[Exception]) -> None:
    engine.append(Batch("c", "a", [Message.user("hi")]))
    before = engine._store.keys_read
    args: tuple[Any, ...] = () if method == "conversations" else ("c",)
    with pytest.raises(error):
        getattr(engine, method)(*args, **kwargs)
    assert engine._store.keys_read == before


def test_locate_follows_edits_and_the_newest_visible_message(engine: HistoryEngine) -> None:
    def user(text: str, ext: Any) -> Message:
        return Message.user(text, metadata={"external_id": ext})

    engine.append(Batch("c", "a0", [user("first", "tg-1"), Message.assistant("ok")]))
    engine.append(Batch("c", "a1", [user("number", 1), Message.assistant("ok")]))  # not a string: no id
    engine.append(Batch("c", "a2", [user("again", "tg-1"), Message.assistant("ok")]))
    assert engine.locate("c", "tg-1").message.id == "a2/0"
    with pytest.raises(NotFound):
        engine.locate("c", "1")
    latest = engine.latest_turn("c")
    assert latest is not None
    engine.replace_turn(Batch("c", "e", [user("edited", "tg-2"), Message.assistant("ok")]), latest.id, "edit")
    found = engine.locate("c", "tg-1", before=1, after=9)  # the hidden one dropped out: the older wins
    assert (found.message.id, [m.id for m in found.before], [m.id for m in found.after]) == \
        ("a0/0", [], ["a0/1", "a1/0", "a1/1", "e/0", "e/1"])
    assert engine.locate("c", "tg-2").message.id == "e/0"
    assert engine.position_of("c", "e/1") == engine.entries("c")[-1].position
    with pytest.raises(NotFound):
        engine.position_of("c", "a2/0")  # hidden
    engine.clear("c")
    with pytest.raises(NotFound):
        engine.locate("c", "tg-2")


def test_prefix_pages_follow_clears_and_reopening(tmp_path: Path) -> None:
    with HistoryEngine.open(tmp_path, partitions=3, fsync="never") as engine:
        for c in ("bot-1/a", "bot-1/b", "bot-1/c", "bot-10/a", "bot-2/a"):
            engine.append(Batch(c, "a", [Message.user("hi")]))
        engine.clear("bot-1/b")
        engine.clear("bot-1/never-written")
        assert engine.conversations(prefix="bot-1/") == ["bot-1/a", "bot-1/c"]
        assert engine.conversations(prefix="bot-1") == ["bot-1/a", "bot-1/c", "bot-10/a"]
        assert engine.conversations(prefix="bot-1/", after="bot-1/a", limit=1) == ["bot-1/c"]
        assert engine.conversations(after="bot-10/a") == ["bot-2/a"]
        assert engine.conversations(limit=0) == []
    with HistoryEngine.open(tmp_path, partitions=3, fsync="never") as engine:
        assert engine.conversations() == ["bot-1/a", "bot-1/c", "bot-10/a", "bot-2/a"]


def test_newest_first_pages_walk_back_to_the_start(engine: HistoryEngine) -> None:
    for i in range(7):
        engine.append(Batch("c", f"a{i}", [Message.user(f"q{i}"), Message.assistant(f"r{i}")]))
    pages, before = [], None
    while True:
        page = engine.entries("c", before=before, order="desc", limit=4)
        if not page:
            break
        pages.append([m.id for m in page])
        before = page[-1].position
    assert [i for p in pages for i in p] == [m.id for m in reversed(engine.entries("c"))]
    assert [len(p) for p in pages] == [4, 4, 4, 2]
    assert engine.entries("c", order="desc", since=datetime.now(UTC) + timedelta(days=1)) == []


class _PlainReader:
    """A reader with only ``read``: WindowReader applies its own turn rule to the messages."""

    def __init__(self, messages: list[Message]) -> None:
        self.messages = messages

    def read(self, conversation_id: str) -> list[Message]:
        return list(self.messages)


def test_window_reader_keeps_internal_feedback_in_its_turn() -> None:
    feedback = Message.user("try again", metadata={"internal_feedback": True})
    history = [Message.system("be brief"), Message.user("q1"), Message.assistant("a1"),
               Message.user("q2"), Message.assistant("draft"), feedback, Message.assistant("a2")]
    for limit in range(1, 8):
        try:
            want = reference_window(history, limit)
        except WindowTooSmall:
            with pytest.raises(WindowTooSmall):
                WindowReader(_PlainReader(history), limit).read("c")
            continue
        assert WindowReader(_PlainReader(history), limit).read("c") == want
    assert WindowReader(_PlainReader(history), 5).read("c")[1:] == history[3:]  # not cut at the feedback
    with pytest.raises(WindowTooSmall):
        WindowReader(_PlainReader(history), 4).read("c")


def test_hidden_messages_page_newest_first_and_by_time(engine: HistoryEngine) -> None:
    for i in range(3):
        engine.append(Batch("c", f"a{i}", [Message.user(f"q{i}"), Message.assistant(f"r{i}")]))
        latest = engine.latest_turn("c")
        assert latest is not None
        engine.replace_turn(Batch("c", f"e{i}", [Message.user(f"q{i}!"), Message.assistant(f"r{i}!")]), latest.id,
                            "edit")
    every = engine.entries("c", include_hidden=True)
    assert sum(m.hidden for m in every) == 6
    for limit in (None, 1, 3, 7, 20):
        assert engine.entries("c", include_hidden=True, order="desc", limit=limit) == every[::-1][:limit]
        cut = every[5].position
        assert engine.entries("c", include_hidden=True, order="desc", before=cut, limit=limit) == \
            [m for m in every if m.position < cut][::-1][:limit]
    t = every[4].created_at
    assert engine.entries("c", include_hidden=True, since=t) == [m for m in every if m.created_at >= t]
