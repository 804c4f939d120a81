"""The facade conformance suite: every rule of ``HistoryEngine`` (README, docs/design.md) and of the reference
design, stated once and run by every backend (subclass ``FacadeContract`` and provide the
``backend`` fixture: an object with ``open() -> HistoryEngine`` on the same log every time, and
``drop_state()`` that deletes this instance's state so the next ``open`` rebuilds it)."""

from __future__ import annotations

import threading
from typing import Any, Protocol

import pytest

from engine import HistoryEngine, WindowReader
from projections import BatchEvent, ClearEvent, ProjectedEvent, Projection, ProjectionTx
from projections.runtime import checkpoints
from schemas import (
    AppendConflict,
    Batch,
    ConversationClosed,
    HistoryError,
    HistoryPosition,
    InvalidAppendID,
    InvalidBatch,
    InvalidConversationID,
    InvalidWindow,
    LogPosition,
    Message,
    NotFound,
    Receipt,
    ToolCallPart,
    ToolOutput,
    ToolResultPart,
    WindowTooSmall,
)
from tests.conformance.turns_model import reference_window
from tests.erased_counts import assert_rebuilt_counts


class Backend(Protocol):
    def open(self) -> HistoryEngine: ...
    def drop_state(self) -> None: ...


def turn(conv: str, aid: str, text: str, *, tool: bool = False, system: str | None = None) -> Batch:
    msgs: list[Message] = []
    if system is not None:
        msgs.append(Message.system(system))
    msgs.append(Message.user(text))
    if tool:
        msgs.append(Message.assistant(ToolCallPart("call-1", "lookup", '{"q": "' + text + '"}')))
        msgs.append(Message.tool(ToolResultPart("call-1", "lookup", ToolOutput.text("found"))))
    msgs.append(Message.assistant(f"answer to {text}"))
    return Batch(conv, aid, msgs)


def snapshot(engine: HistoryEngine) -> dict[str, Any]:
    """Everything a reader can observe, for state-equality checks."""
    convs = engine.conversations()
    return {
        "conversations": list(convs),
        "entries": {c: [(e.id, e.position, e.append_id, e.created_at, e.message.canonical_json())
                        for e in engine.entries(c)] for c in convs},
    }


class FacadeContract:
    @pytest.fixture
    def backend(self) -> Backend:
        raise NotImplementedError

    @pytest.fixture
    def engine(self, backend: Backend) -> Any:
        eng = backend.open()
        yield eng
        eng.close()

    # -- append --------------------------------------------------------------------------------
    def test_append_returns_a_receipt_for_that_batch(self, engine: HistoryEngine) -> None:
        b = turn("c1", "a1", "hello")
        r = engine.append(b)
        assert isinstance(r, Receipt)
        r.validate_for(b)
        assert r.digest == b.digest and r.conversation_id == "c1" and r.append_id == "a1"
        assert engine.read("c1") == list(b.messages)

    def test_identical_retry_returns_the_identical_receipt_without_appending(self, engine: HistoryEngine) -> None:
        b = turn("c1", "a1", "hello")
        r1 = engine.append(b)
        ends = engine.stats().end_offsets
        r2 = engine.append(Batch.from_json(b.to_json()))
        assert r2 == r1
        assert engine.stats().end_offsets == ends  # answered from local state
        assert engine.read("c1") == list(b.messages)

    def test_different_content_under_the_same_append_id_conflicts(self, engine: HistoryEngine) -> None:
        engine.append(turn("c1", "a1", "hello"))
        with pytest.raises(AppendConflict):
            engine.append(turn("c1", "a1", "bye"))
        assert [m.text() for m in engine.read("c1")] == ["hello", "answer to hello"]

    def test_same_append_id_in_another_conversation_is_independent(self, engine: HistoryEngine) -> None:
        r1 = engine.append(turn("c1", "a1", "x"))
        r2 = engine.append(turn("c2", "a1", "y"))
        assert r1 != r2

    def test_batches_keep_their_order_and_messages_stay_together(self, engine: HistoryEngine) -> None:
        for i in range(5):
            engine.append(turn("c1", f"a{i}", f"q{i}", tool=i % 2 == 0))
        texts = [m.text() for m in engine.read("c1") if m.role == "user"]
        assert texts == [f"q{i}" for i in range(5)]

    def test_sixteen_threads_racing_one_append_id_one_wins(self, engine: HistoryEngine) -> None:
        barrier = threading.Barrier(16)
        results: list[Any] = [None] * 16

        def race(i: int) -> None:
            b = turn("race", "same-id", f"content {i}")
            barrier.wait()
            try:
                results[i] = engine.append(b)
            except AppendConflict as e:
                results[i] = e

        threads = [threading.Thread(target=race, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        receipts = [r for r in results if isinstance(r, Receipt)]
        conflicts = [r for r in results if isinstance(r, AppendConflict)]
        assert len(receipts) == 1 and len(conflicts) == 15
        winner = results.index(receipts[0])
        assert [m.text() for m in engine.read("race")] == [f"content {winner}", f"answer to content {winner}"]

    def test_many_threads_appending_different_ids_all_land(self, engine: HistoryEngine) -> None:
        def work(t: int) -> None:
            for i in range(10):
                engine.append(turn(f"conv-{t % 4}", f"t{t}-{i}", f"m{t}-{i}"))

        threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sum(len(engine.read(f"conv-{k}")) for k in range(4)) == 8 * 10 * 2
        assert engine.stats().accepted == 80

    # -- validation before I/O -----------------------------------------------------------------
    @pytest.mark.parametrize("bad", ["", " padded", "ctl\x07", "x" * 1025])
    def test_invalid_ids_fail_before_any_io(self, engine: HistoryEngine, bad: str) -> None:
        ends = engine.stats().end_offsets
        with pytest.raises(InvalidConversationID):
            engine.read(bad)
        with pytest.raises(InvalidConversationID):
            engine.clear(bad)
        with pytest.raises(InvalidConversationID):
            engine.append(Batch(bad, "a", [Message.user("x")]))
        with pytest.raises(InvalidAppendID):
            engine.append(Batch("ok", bad, [Message.user("x")]))
        assert engine.stats().end_offsets == ends

    def test_append_rejects_what_is_not_a_batch(self, engine: HistoryEngine) -> None:
        ends = engine.stats().end_offsets
        with pytest.raises(InvalidBatch):
            engine.append([Message.user("x")])  # type: ignore[arg-type]
        assert engine.stats().end_offsets == ends

    # -- clear / closure -----------------------------------------------------------------------
    def test_clear_closes_forever_and_hides_the_conversation(self, engine: HistoryEngine) -> None:
        b = turn("c1", "a1", "hello")
        engine.append(b)
        engine.append(turn("c2", "a1", "other"))
        engine.clear("c1")
        assert engine.read("c1") == []
        assert engine.conversations() == ["c2"]
        with pytest.raises(ConversationClosed):
            engine.append(turn("c1", "a2", "again"))
        with pytest.raises(ConversationClosed):
            engine.append(b)  # a retry of an accepted batch too
        engine.clear("c1")  # idempotent

    def test_a_never_written_conversation_can_be_closed(self, engine: HistoryEngine) -> None:
        engine.clear("never")
        with pytest.raises(ConversationClosed):
            engine.append(turn("never", "a1", "x"))
        assert engine.conversations() == []

    def test_closure_and_receipts_survive_reopen_and_rebuild(self, backend: Backend) -> None:
        with backend.open() as eng:
            r = eng.append(turn("keep", "a1", "x"))
            b = turn("gone", "a1", "y")
            eng.append(b)
            eng.clear("gone")
            before = snapshot(eng)
        with backend.open() as eng:
            assert snapshot(eng) == before
            with pytest.raises(ConversationClosed):
                eng.append(b)
            assert eng.append(turn("keep", "a1", "x")) == r
        backend.drop_state()
        with backend.open() as eng:
            assert snapshot(eng) == before
            with pytest.raises(ConversationClosed):
                eng.append(b)
            assert eng.append(turn("keep", "a1", "x")) == r
            with pytest.raises(AppendConflict):
                eng.append(turn("keep", "a1", "changed"))

    # -- reads ---------------------------------------------------------------------------------
    def test_unknown_conversation_reads_empty(self, engine: HistoryEngine) -> None:
        assert engine.read("nobody") == []
        assert engine.entries("nobody") == []
        assert engine.window("nobody", 5) == []

    def test_listing_is_unique_lexical_and_empty_when_empty(self, engine: HistoryEngine) -> None:
        assert engine.conversations() == []
        for c in ["b", "a", "é", "B", "a"]:
            engine.append(turn(c, f"id-{len(engine.read(c))}", "x"))
        assert engine.conversations() == sorted({"b", "a", "é", "B"})

    def test_results_are_detached(self, engine: HistoryEngine) -> None:
        engine.append(turn("c1", "a1", "x"))
        first = engine.read("c1")
        first.clear()
        assert len(engine.read("c1")) == 2
        listing = engine.conversations()
        listing.append("zzz")  # type: ignore[arg-type]
        assert engine.conversations() == ["c1"]

    def test_entries_have_positions_ids_and_cursors(self, engine: HistoryEngine) -> None:
        engine.append(Batch("c", "s", [Message.system("be brief")]))
        engine.append(turn("c", "a1", "one", tool=True))
        engine.append(turn("c", "a2", "two"))
        es = engine.entries("c")
        assert [e.position for e in es] == sorted(e.position for e in es)
        assert [e.position.seq for e in es] == list(range(1, 8))
        assert [e.position.turn for e in es] == [0, 1, 1, 1, 1, 2, 2]
        assert len({e.id for e in es}) == len(es)
        assert es[1].append_id == "a1" and es[1].id != es[2].id
        mid = es[3].position
        assert [e.position for e in engine.entries("c", after=mid)] == [e.position for e in es[4:]]
        assert [e.position for e in engine.entries("c", before=mid)] == [e.position for e in es[:3]]
        assert [e.position for e in engine.entries("c", after=es[0].position, before=es[5].position)] == \
            [e.position for e in es[1:5]]
        assert [e.position for e in engine.entries("c", after=HistoryPosition(1, 0))] == \
            [e.position for e in es[1:]]
        assert [e.position for e in engine.entries("c", after=HistoryPosition(2, 0))] == \
            [e.position for e in es[5:]]
        assert len(engine.entries("c", limit=2)) == 2
        assert engine.entries("c", after=HistoryPosition.START) == es
        again = engine.entries("c")
        assert [(e.id, e.position, e.created_at) for e in again] == [(e.id, e.position, e.created_at) for e in es]

    def test_read_at_least_a_receipt(self, engine: HistoryEngine) -> None:
        r = engine.append(turn("c1", "a1", "x"))
        assert len(engine.read("c1", at_least=r)) == 2

    # -- windows -------------------------------------------------------------------------------
    def test_window_matches_window_reader(self, engine: HistoryEngine) -> None:
        """``engine.window`` and ``WindowReader`` (over the engine and over a plain reader) all
        equal the reference model's window of what was appended, for every limit."""
        appended = [Batch("w", "s0", [Message.system("rule one")])]
        for i in range(6):
            system = f"rule {i}" if i == 3 else None
            appended.append(turn("w", f"a{i}", f"q{i}", tool=i % 2 == 1, system=system))
        for b in appended:
            engine.append(b)
        messages = [m for b in appended for m in b.messages]
        plain = _ListReader(messages)
        fitted = 0
        for limit in range(1, 25):
            try:
                expected = reference_window(messages, limit)
            except WindowTooSmall:
                with pytest.raises(WindowTooSmall):
                    engine.window("w", limit)
                with pytest.raises(WindowTooSmall):
                    WindowReader(engine, limit).read("w")
                with pytest.raises(WindowTooSmall):
                    WindowReader(plain, limit).read("w")
                continue
            fitted += 1
            assert engine.window("w", limit) == expected, limit
            assert WindowReader(engine, limit).read("w") == expected, limit
            assert WindowReader(plain, limit).read("w") == expected, limit
            assert len(expected) <= limit
        assert 0 < fitted < 24  # both outcomes were met

    def test_window_keeps_whole_turns_and_merges_system_messages(self, engine: HistoryEngine) -> None:
        engine.append(Batch("w", "s0", [Message.system("A"), Message.system("B")]))
        engine.append(turn("w", "a1", "one", tool=True))  # 4 messages
        engine.append(turn("w", "a2", "two"))  # 2 messages
        got = engine.window("w", 5)
        assert got[0].role == "system" and got[0].text() == "A\n\nB"
        assert [m.text() for m in got[1:]] == ["two", "answer to two"]
        assert len(engine.window("w", 7)) == 7
        with pytest.raises(WindowTooSmall):
            engine.window("w", 2)

    @pytest.mark.parametrize("limit", [0, -1])
    def test_window_limit_must_be_positive(self, engine: HistoryEngine, limit: int) -> None:
        with pytest.raises(InvalidWindow):
            engine.window("w", limit)
        with pytest.raises(InvalidWindow):
            WindowReader(engine, limit)

    # -- stats and rebuild ---------------------------------------------------------------------
    def test_stats_count_outcomes(self, engine: HistoryEngine) -> None:
        b = turn("c1", "a1", "x")
        engine.append(b)
        with pytest.raises(AppendConflict):
            engine.append(turn("c1", "a1", "y"))
        engine.clear("c1")
        s = engine.stats()
        assert s.accepted == 1
        assert s.lag == [0] * len(s.end_offsets)
        assert s.applied_offsets == s.end_offsets or all(
            a >= e for a, e in zip(s.applied_offsets, s.end_offsets, strict=True))

    def test_state_equals_a_rebuild_from_the_log(self, backend: Backend) -> None:
        with backend.open() as eng:
            for i in range(30):
                eng.append(turn(f"c{i % 5}", f"a{i}", f"m{i}", tool=i % 3 == 0))
            eng.clear("c2")
            before = snapshot(eng)
            stats_before = eng.stats()
        backend.drop_state()
        with backend.open() as eng:
            assert snapshot(eng) == before
            s = eng.stats()
            assert_rebuilt_counts(stats_before, s)
            # c2's six batches: erased where they were sealed under the keys its clear destroyed
            # (HistoryEngine.open), accepted again where they are plain (an engine without a key store).
            assert s.cleared == 1 and s.erased in (0, 6), s


# -- custom projections ------------------------------------------------------------------------
class _ListReader:
    """A ``Reader`` that is not an engine: ``WindowReader`` windows its ``read`` itself."""

    def __init__(self, messages: list[Message]) -> None:
        self.messages = messages

    def read(self, conversation_id: str) -> list[Message]:
        return list(self.messages)


class Recorder(Projection):
    """Counts messages per conversation and records the order of every event it sees."""

    name = "recorder"

    def apply(self, event: ProjectedEvent, tx: ProjectionTx) -> None:
        n = int(tx.get(b"events") or b"0")
        tx.put(b"events", str(n + 1).encode())
        conv = event.conversation_id.encode()
        if isinstance(event, BatchEvent):
            count = int(tx.get(b"count/" + conv) or b"0") + len(event.messages)
            tx.put(b"count/" + conv, str(count).encode())
            tx.put(b"seq/" + conv + b"/" + event.append_id.encode(), str(event.first_seq).encode())
        else:
            assert isinstance(event, ClearEvent)
            for key, _ in tx.scan(b"seq/" + conv + b"/"):
                tx.delete(key)
            tx.put(b"count/" + conv, b"cleared")


class Fragile(Recorder):
    """Fails on any batch whose first message says 'boom' while ``armed``."""

    name = "fragile"
    armed = True

    def apply(self, event: ProjectedEvent, tx: ProjectionTx) -> None:
        if self.armed and isinstance(event, BatchEvent) and event.messages[0].text() == "boom":
            raise RuntimeError("boom")
        super().apply(event, tx)


class FragileAfterWriting(Fragile):
    """Like ``Fragile``, but fails only after writing its rows for the event: those writes must
    be dropped with the step."""

    def apply(self, event: ProjectedEvent, tx: ProjectionTx) -> None:
        Recorder.apply(self, event, tx)
        if self.armed and isinstance(event, BatchEvent) and event.messages[0].text() == "boom":
            raise RuntimeError("boom")


def _projection_state(engine: HistoryEngine, name: str) -> list[tuple[bytes, bytes]]:
    return engine.view(name).scan(b"")


Delivery = tuple[str, str, str, LogPosition]
"""``(kind, conversation, append id or "", position)`` of one ``apply`` call."""


class Tape(Projection):
    """Writes one row per delivered event, keyed by its log position, and appends every
    ``apply`` call to ``calls`` (a list that may outlive the engine: what "delivered once" is
    counted on across a reopen)."""

    name = "tape"

    def __init__(self, calls: list[Delivery] | None = None) -> None:
        self.calls: list[Delivery] = [] if calls is None else calls

    def apply(self, event: ProjectedEvent, tx: ProjectionTx) -> None:
        p = event.position
        if isinstance(event, BatchEvent):
            self.calls.append(("batch", event.conversation_id, event.append_id, p))
            value = f"batch {event.conversation_id} {event.append_id} {event.first_seq} {len(event.messages)}"
        else:
            self.calls.append(("clear", event.conversation_id, "", p))
            value = f"clear {event.conversation_id}"
        tx.put(f"ev/{p.partition:04d}/{p.offset:020d}".encode(), value.encode())


def _in_log_order_per_partition(calls: list[Delivery]) -> bool:
    last: dict[int, int] = {}
    for *_, p in calls:
        if last.get(p.partition, -1) >= p.offset:
            return False
        last[p.partition] = p.offset
    return True


class ProjectionContract:
    """Custom projections (docs/design.md §5.4): the same rules on every backend."""

    @pytest.fixture
    def backend(self) -> Backend:
        raise NotImplementedError

    def test_a_new_projection_catches_up_with_accepted_events_only(self, backend: Backend) -> None:
        with backend.open() as eng:
            eng.append(turn("a", "1", "x"))
            eng.append(turn("a", "1", "x"))  # duplicate: not delivered
            with pytest.raises(AppendConflict):
                eng.append(turn("a", "1", "y"))
            eng.append(turn("b", "1", "y", tool=True))
            eng.clear("b")
            with pytest.raises(ConversationClosed):
                eng.append(turn("b", "2", "z"))
            eng.register(Recorder())
            view = eng.view("recorder")
            # two batches and one clear; b's batch is erased when sealed: only its clear is replayed
            assert view.get(b"events") == (b"2" if eng.sealing else b"3")
            assert view.get(b"count/a") == b"2" and view.get(b"count/b") == b"cleared"
            assert view.get(b"seq/a/1") == b"1"
            eng.append(turn("a", "2", "more"))  # live from now on
            assert eng.view("recorder").get(b"count/a") == b"4"
            assert eng.view("recorder").get(b"seq/a/2") == b"3"

    def test_a_registered_projection_resumes_from_its_checkpoint(self, backend: Backend) -> None:
        with backend.open() as eng:
            eng.append(turn("a", "1", "x"))
            eng.register(Recorder())
            eng.append(turn("a", "2", "x"))
            before = _projection_state(eng, "recorder")
        with backend.open() as eng:
            eng.register(Recorder())  # nothing is delivered twice
            assert _projection_state(eng, "recorder") == before
            eng.append(turn("a", "3", "x"))
            assert eng.view("recorder").get(b"events") == b"3"

    def test_rebuild_replays_from_offset_zero_to_the_same_state(self, backend: Backend) -> None:
        with backend.open() as eng:
            eng.register(Recorder())
            for i in range(10):
                eng.append(turn(f"c{i % 3}", f"a{i}", f"m{i}"))
            eng.clear("c1")
            live = dict(_projection_state(eng, "recorder"))
            eng.rebuild("recorder")
            rebuilt = dict(_projection_state(eng, "recorder"))
            if eng.sealing:  # c1's three batches are erased: the replay gives only its clear
                assert int(rebuilt.pop(b"events")) == int(live.pop(b"events")) - 3
            assert rebuilt == live

    def test_a_failing_projection_stops_alone_and_resumes_when_fixed(self, backend: Backend) -> None:
        with backend.open() as eng:
            fragile = Fragile()
            eng.register(fragile)
            eng.append(turn("a", "1", "fine"))
            eng.append(turn("a", "2", "boom"))  # the history goes on
            eng.append(turn("a", "3", "after"))
            assert len(eng.read("a")) == 6
            with pytest.raises(HistoryError):
                eng.view("fragile")
            fragile.armed = False
            eng.register(fragile)  # resumes from before the failing event
            assert eng.view("fragile").get(b"events") == b"3"
            assert eng.view("fragile").get(b"count/a") == b"6"

    def test_view_of_an_unknown_projection_and_bad_names(self, backend: Backend) -> None:
        with backend.open() as eng:
            with pytest.raises(NotFound):
                eng.view("nope")
            with pytest.raises(NotFound):
                eng.rebuild("nope")

            class Unnamed(Recorder):
                name = ""

            with pytest.raises(HistoryError):
                eng.register(Unnamed())

    # -- delivery: once each, accepted only, in log order per partition ---------------------------
    @staticmethod
    def _mixed_history(eng: HistoryEngine, tag: str) -> tuple[list[Receipt], list[str]]:
        """Accepted batches over several conversations (so several partitions), a duplicate, a
        conflict, clears (one of a never-written conversation, one repeated) and a rejected
        append. Returns the receipts of the accepted batches and the conversations cleared."""
        receipts = [eng.append(turn(f"{tag}{i % 5}", f"a{i}", f"m{i}", tool=i % 3 == 0)) for i in range(12)]
        assert eng.append(turn(f"{tag}0", "a0", "m0", tool=True)) == receipts[0]  # duplicate
        with pytest.raises(AppendConflict):
            eng.append(turn(f"{tag}1", "a1", "changed"))
        eng.clear(f"{tag}2")
        eng.clear(f"{tag}2")
        eng.clear(f"{tag}never")
        with pytest.raises(ConversationClosed):
            eng.append(turn(f"{tag}2", "late", "x"))
        receipts.append(eng.append(turn(f"{tag}3", "b1", "after the clears")))
        return receipts, [f"{tag}2", f"{tag}never"]

    @staticmethod
    def _assert_delivered_once(calls: list[Delivery], receipts: list[Receipt], cleared: list[str],
                               erased: frozenset[str] = frozenset()) -> None:
        """Each accepted event once, in log order; ``erased``: conversations cleared before the
        replay whose sealed batches it cannot give (their content is gone), only their clear."""
        batches = [(c, a, p) for kind, c, a, p in calls if kind == "batch"]
        assert sorted(batches) == sorted((r.conversation_id, r.append_id, r.position) for r in receipts
                                         if r.conversation_id not in erased)
        assert sorted(c for kind, c, _, _ in calls if kind == "clear") == sorted(cleared)
        assert len({p for *_, p in calls}) == len(calls), "an event was delivered twice"
        assert _in_log_order_per_partition(calls)

    def test_catch_up_from_zero_delivers_each_accepted_event_once_in_log_order(self, backend: Backend) -> None:
        with backend.open() as eng:
            receipts, cleared = self._mixed_history(eng, "c")
            tape = Tape()
            eng.register(tape)
            self._assert_delivered_once(tape.calls, receipts, cleared, frozenset(cleared if eng.sealing else ()))
            assert len(_projection_state(eng, "tape")) == len(tape.calls)
            r = receipts[-1]
            first_seq = next(e for e in eng.entries(r.conversation_id) if e.append_id == r.append_id).position.seq
            key = f"ev/{r.position.partition:04d}/{r.position.offset:020d}".encode()
            assert eng.view("tape").get(key) == f"batch {r.conversation_id} {r.append_id} {first_seq} 2".encode()

    def test_live_events_are_in_the_view_when_the_append_returns(self, backend: Backend) -> None:
        with backend.open() as eng:
            tape = Tape()
            eng.register(tape)
            assert tape.calls == [] and _projection_state(eng, "tape") == []
            for i in range(6):
                r = eng.append(turn(f"live{i % 3}", f"a{i}", f"m{i}"))
                key = f"ev/{r.position.partition:04d}/{r.position.offset:020d}".encode()
                assert eng.view("tape").get(key) == f"batch live{i % 3} a{i} {i // 3 * 2 + 1} 2".encode()
                assert len(tape.calls) == i + 1
            eng.clear("live1")
            assert tape.calls[-1][:2] == ("clear", "live1")
            assert len(_projection_state(eng, "tape")) == 7

    def test_resume_after_reopen_delivers_no_event_twice(self, backend: Backend) -> None:
        calls: list[Delivery] = []
        receipts: list[Receipt] = []
        with backend.open() as eng:
            receipts += [eng.append(turn("r", f"a{i}", f"m{i}")) for i in range(3)]
            eng.register(Tape(calls))  # catch-up
            receipts += [eng.append(turn(f"r{i % 2}", f"b{i}", f"m{i}")) for i in range(3)]  # live
            eng.clear("r1")
        with backend.open() as eng:  # written while the projection is not registered
            receipts += [eng.append(turn("r", f"c{i}", f"m{i}")) for i in range(3)]
        with backend.open() as eng:
            eng.register(Tape(calls))  # resumes from its checkpoint
            receipts += [eng.append(turn(f"r{2 * (i % 2)}", f"d{i}", f"m{i}")) for i in range(3)]  # live again
            self._assert_delivered_once(calls, receipts, ["r1"])
            assert len(_projection_state(eng, "tape")) == len(calls)

    def test_rebuild_delivers_every_event_again_once_and_yields_identical_state(self, backend: Backend) -> None:
        with backend.open() as eng:
            tape = Tape()
            eng.register(tape)
            receipts, cleared = self._mixed_history(eng, "rb")
            live = _projection_state(eng, "tape")
            first = list(tape.calls)
            tape.calls.clear()
            eng.rebuild("tape")
            erased = frozenset(cleared if eng.sealing else ())  # their batches are not replayed
            assert _projection_state(eng, "tape") == [
                (k, v) for k, v in live if not (v.startswith(b"batch ") and v.split()[1].decode() in erased)]
            self._assert_delivered_once(tape.calls, receipts, cleared, erased)
            assert sorted(tape.calls, key=lambda c: (c[3].partition, c[3].offset)) == \
                sorted((c for c in first if not (c[0] == "batch" and c[1] in erased)),
                       key=lambda c: (c[3].partition, c[3].offset))

    # -- failures: one projection stops, alone, before the failing event ----------------------------
    def test_a_projection_failing_live_stops_alone_with_its_checkpoint_before_the_event(
            self, backend: Backend) -> None:
        with backend.open() as eng:
            eng.register(Recorder())
            fragile = FragileAfterWriting()
            eng.register(fragile)
            fine = eng.append(turn("a", "1", "fine"))
            boom = eng.append(turn("a", "2", "boom"))
            eng.append(turn("a", "3", "after"))
            with pytest.raises(HistoryError, match=r"'fragile'.*boom"):
                eng.view("fragile")
            p = boom.position.partition
            assert fine.position.partition == p
            checkpoint = checkpoints(eng._store, eng.log.partitions, "fragile")[p]
            assert fine.position.offset < checkpoint <= boom.position.offset
            # Only it stopped: the history, the built-in reads and the other projection go on.
            assert [m.text() for m in eng.read("a")][::2] == ["fine", "boom", "after"]
            assert eng.view("recorder").get(b"events") == b"3"
            assert eng.stats().lag == [0] * eng.log.partitions
            fragile.armed = False
            eng.register(fragile)  # resumes from its checkpoint: each event applied once
            assert _projection_state(eng, "fragile") == _projection_state(eng, "recorder")

    def test_a_projection_failing_during_catch_up_raises_and_keeps_its_checkpoint(self, backend: Backend) -> None:
        with backend.open() as eng:
            eng.register(Recorder())
            eng.append(turn("a", "1", "fine"))
            boom = eng.append(turn("a", "2", "boom"))
            eng.append(turn("a", "3", "after"))
            fragile = FragileAfterWriting()
            with pytest.raises(HistoryError, match=r"'fragile'.*boom"):
                eng.register(fragile)
            with pytest.raises(HistoryError, match="fragile"):
                eng.view("fragile")
            p = boom.position.partition
            assert checkpoints(eng._store, eng.log.partitions, "fragile")[p] <= boom.position.offset
            eng.append(turn("a", "4", "later"))  # the others go on
            assert eng.view("recorder").get(b"events") == b"4"
            fragile.armed = False
            eng.register(fragile)
            assert _projection_state(eng, "fragile") == _projection_state(eng, "recorder")
