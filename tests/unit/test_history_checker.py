"""The history checker (tests/history_checker.py) on synthetic histories: each anomaly it promises
is detected and named, a valid history with retries, unknown outcomes and concurrent appends
passes, and the recording wrappers record a real engine's calls (threads and asyncio)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Hashable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.aio import AsyncHistoryEngine
from engine.facade import HistoryEngine
from schemas import (
    AppendConflict,
    Batch,
    CommitError,
    CommitUnconfirmed,
    ConversationClosed,
    HistoryPosition,
    InvalidBatch,
    InvalidRequest,
    LogPosition,
    LogUnavailable,
    Message,
    NotOwner,
    NotReady,
    PreconditionFailed,
    Receipt,
    StoredMessage,
    Unauthorized,
)
from schemas.ids import AppendID
from tests.history_checker import KINDS, AsyncRecorded, History, Op, Recorded, Report, check, outcome_of

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def batch(conv: str, aid: str, *, text: str = "") -> Batch:
    return Batch(conv, aid, [Message.user(f"q {aid} {text}"), Message.assistant(f"a {aid} {text}")])


def stored(*batches: Batch) -> list[StoredMessage]:
    """The rows an engine stores for ``batches`` appended in this order (turn +1 per user message)."""
    rows, turn, seq = [], 0, 0
    for b in batches:
        for i, m in enumerate(b.messages):
            seq += 1
            turn += m.role == "user"
            rows.append(StoredMessage(f"{b.append_id}/{i}", m, HistoryPosition(turn, seq), AppendID(b.append_id), T0))
    return rows


def receipt(b: Batch, offset: int, partition: int = 0) -> Receipt:
    return Receipt(b.conversation_id, b.append_id, b.digest, LogPosition(partition, offset))


def op(h: History, process: Hashable, kind: str, args: Mapping[str, Any], outcome: str,
       value: Any = None, error: BaseException | None = None) -> Op:
    handle = h.invoke(process, kind, args)
    if outcome == "ok":
        h.ok(handle, value)
    elif outcome == "fail":
        assert error is not None
        h.fail(handle, error)
    elif outcome == "unknown":
        assert error is not None
        h.unknown(handle, error)
    return handle


def appended(h: History, *pairs: tuple[Batch, int]) -> None:
    """Each batch appended ok by a process of its own, with a receipt at the given offset."""
    for k, (b, offset) in enumerate(pairs):
        op(h, f"p{k}", "append", {"batch": b}, "ok", receipt(b, offset))


def finals(rows: Mapping[str, Sequence[StoredMessage]], members: Iterable[str] = ("m1",)
           ) -> dict[str, dict[str, list[StoredMessage]]]:
    return {m: {c: list(r) for c, r in rows.items()} for m in members}


def only(report: Report, kind: str) -> str:
    """The report names ``kind`` and nothing else; the text of its anomalies."""
    assert report.kinds() == {kind}, str(report)
    return "\n".join(str(a) for a in report.of(kind))


A1, A2, A3, A4 = (batch("c1", f"a{i}") for i in range(1, 5))
B1, B2 = batch("c2", "b1"), batch("c2", "b2")


def test_a_valid_history_with_retries_unknowns_and_concurrent_appends_passes() -> None:
    h = History()
    op(h, "p1", "append", {"batch": A1}, "ok", receipt(A1, 0))
    op(h, "p2", "append", {"batch": A2}, "unknown", error=CommitUnconfirmed("no decision"))
    op(h, "p2", "append", {"batch": A2}, "ok", receipt(A2, 1))  # the retry of the same batch
    op(h, "p3", "append", {"batch": A3}, "unknown", error=httpx.ReadError("reset"))  # landed, never acknowledged
    op(h, "p4", "append", {"batch": A4}, "unknown", error=LogUnavailable("down"))  # did not land
    op(h, "p5", "append", {"batch": batch("c1", "a1", text="other")}, "fail", error=AppendConflict("taken"))
    x, y = h.invoke("p1", "append", {"batch": B1}), h.invoke("p2", "append", {"batch": B2})  # concurrent
    h.ok(y, receipt(B2, 5))
    h.ok(x, receipt(B1, 4))
    op(h, "p6", "read", {"conversation": "c1"}, "ok", [])  # stale: plain reads may be
    op(h, "p6", "read", {"conversation": "c1", "at_least": receipt(A2, 1)}, "ok", list(A1) + list(A2))
    op(h, "p6", "entries", {"conversation": "c1", "after": HistoryPosition(1, 2)}, "ok", stored(A1, A2)[2:3])
    op(h, "p6", "entries", {"conversation": "c2", "limit": 3}, "ok", stored(B1, B2)[:3])
    op(h, "p7", "window", {"conversation": "c1", "limit": 2}, "ok", list(A2))
    pending = h.invoke("p8", "append", {"batch": batch("c2", "b3")})  # never completed: unknown
    final = {"c1": stored(A1, A2, A3), "c2": stored(B1, B2)}

    report = check(h, finals(final, ["m1", "m2"])).assert_valid()

    assert report.valid and pending.outcome is None
    assert report.landed == {("c1", "a3")}
    assert report.never_ok == {("c1", "a3"), ("c1", "a4"), ("c2", "b3")}
    assert report.reads_checked == 5
    assert report.outcomes["append ok"] == 4 and report.outcomes["append pending"] == 1


def test_lost_an_acknowledged_append_missing_from_one_member() -> None:
    h = History()
    appended(h, (A1, 0), (A2, 1))
    assert check(h, finals({"c1": stored(A1, A2)}, ["m1", "m2"])).valid
    report = check(h, {"m1": {"c1": stored(A1, A2)}, "m2": {"c1": stored(A1)}})
    assert report.kinds() == {"lost", "order"}, str(report)  # m2 also disagrees with m1
    assert "'a2', acknowledged at 0:1, is not stored whole in m2" in str(report.of("lost")[0])


def test_lost_an_acknowledged_append_stored_torn() -> None:
    h = History()
    appended(h, (A1, 0))
    report = check(h, finals({"c1": stored(A1)[:1]}))
    assert report.kinds() == {"lost", "torn"}, str(report)


def test_duplicated_a_message_id_twice() -> None:
    h = History()
    appended(h, (A1, 0), (A2, 1))
    rows = stored(A1, A2)
    twice = [*rows[:2], StoredMessage("a1/0", rows[2].message, rows[2].position, rows[2].append_id, T0), rows[3]]
    assert "'a1/0' stored 2 times" in only(check(h, finals({"c1": twice})), "duplicated")


def test_duplicated_an_append_stored_twice_is_not_contiguous() -> None:
    h = History()
    appended(h, (A1, 0), (A2, 1))
    rows = stored(A1, A2, A1)  # a resend applied again: its ids are equal too
    text = only(check(h, finals({"c1": rows})), "duplicated")
    assert "separate runs" in text and "'a1/0' stored 2 times" in text


def test_receipts_two_ok_results_for_one_append_differ() -> None:
    h = History()
    appended(h, (A1, 0))
    op(h, "p9", "append", {"batch": A1}, "ok", receipt(A1, 7))
    assert "acknowledged twice with different receipts" in only(check(h, finals({"c1": stored(A1)})), "receipts")


def test_receipts_a_receipt_that_names_another_batch() -> None:
    h = History()
    op(h, "p1", "append", {"batch": A1}, "ok", receipt(A2, 0))
    assert "got a receipt for 'a2'" in only(check(h, finals({"c1": stored(A1)})), "receipts")


def test_receipts_two_appends_at_one_log_position() -> None:
    h = History()
    appended(h, (A1, 3), (B1, 3))
    text = only(check(h, finals({"c1": stored(A1), "c2": stored(B1)})), "receipts")
    assert "the same log position 0:3" in text


def test_receipts_stored_order_disagrees_with_the_offsets() -> None:
    h = History()
    appended(h, (A1, 5), (A2, 2))
    assert "stored before 'a2'" in only(check(h, finals({"c1": stored(A1, A2)})), "receipts")


def test_receipts_one_conversation_in_two_partitions() -> None:
    h = History()
    op(h, "p1", "append", {"batch": A1}, "ok", receipt(A1, 0, partition=0))
    op(h, "p2", "append", {"batch": A2}, "ok", receipt(A2, 1, partition=1))
    assert "partitions [0, 1]" in only(check(h, finals({"c1": stored(A1, A2)})), "receipts")


def test_failed_but_present_a_definitely_failed_append_is_stored() -> None:
    h = History()
    appended(h, (A1, 0))
    op(h, "p2", "append", {"batch": A2}, "fail", error=PreconditionFailed("expected_last"))
    text = only(check(h, finals({"c1": stored(A1, A2)})), "failed-but-present")
    assert "'a2' failed definitely (PreconditionFailed)" in text
    op(h, "p2", "append", {"batch": A2}, "unknown", error=NotReady("catching up"))  # a later send may have landed it
    assert check(h, finals({"c1": stored(A1, A2)})).valid


def test_phantom_rows_nobody_sent() -> None:
    h = History()
    appended(h, (A1, 0))
    assert "'b1', which no operation sent" in only(check(h, finals({"c1": stored(A1, B1)})), "phantom")


def test_order_members_disagree() -> None:
    h = History()
    op(h, "p1", "append", {"batch": A1}, "unknown", error=CommitUnconfirmed("?"))
    op(h, "p2", "append", {"batch": A2}, "unknown", error=CommitUnconfirmed("?"))
    text = only(check(h, {"m1": {"c1": stored(A1, A2)}, "m2": {"c1": stored(A2, A1)}}), "order")
    assert "m2 (4 rows) and m1 (4 rows) differ from row 0" in text


def test_order_positions_that_do_not_increase() -> None:
    h = History()
    appended(h, (A1, 0))
    rows = stored(A1)
    swapped = [rows[0], StoredMessage(rows[1].id, rows[1].message, HistoryPosition(0, 1), rows[1].append_id, T0)]
    assert "does not follow" in only(check(h, finals({"c1": swapped})), "order")


def test_impossible_read_not_a_prefix_of_the_final_history() -> None:
    h = History()
    appended(h, (A1, 0), (A2, 1))
    op(h, "r", "read", {"conversation": "c1"}, "ok", list(A2))
    assert "not a prefix" in only(check(h, finals({"c1": stored(A1, A2)})), "impossible-read")


def test_impossible_read_at_least_a_receipt_without_its_append() -> None:
    h = History()
    appended(h, (A1, 0), (A2, 1))
    op(h, "r", "read", {"conversation": "c1", "at_least": receipt(A2, 1)}, "ok", list(A1))  # a stale state
    text = only(check(h, finals({"c1": stored(A1, A2)})), "impossible-read")
    assert "at_least=0:1" in text and "without append 'a2'" in text


def test_impossible_read_at_least_lacks_an_earlier_acknowledged_append() -> None:
    h = History()
    appended(h, (A1, 0), (A2, 1))
    op(h, "r", "read", {"conversation": "c1", "at_least": receipt(A1, 0)}, "ok", list(A1))
    assert check(h, finals({"c1": stored(A1, A2)})).valid  # a2 is after the position asked for
    op(h, "r", "read", {"conversation": "c1", "at_least": receipt(B1, 4)}, "ok", list(A1))  # another conversation's
    assert "without append 'a2'" in only(check(h, finals({"c1": stored(A1, A2)})), "impossible-read")


def test_impossible_read_entries_outside_what_the_cursors_select() -> None:
    h = History()
    appended(h, (A1, 0), (A2, 1))
    rows = stored(A1, A2)
    op(h, "r", "entries", {"conversation": "c1", "after": HistoryPosition(1, 2), "limit": 1}, "ok", rows[1:2])
    assert "entries(after=1:2, before=None, limit=1)" in only(check(h, finals({"c1": rows})), "impossible-read")


def test_impossible_read_a_window_that_is_no_run_or_too_long() -> None:
    h = History()
    appended(h, (A1, 0), (A2, 1))
    op(h, "r", "window", {"conversation": "c1", "limit": 2}, "ok", [A1.messages[0], A2.messages[0]])
    op(h, "r", "window", {"conversation": "c1", "limit": 3}, "ok", [*A1, *A2])
    report = check(h, finals({"c1": stored(A1, A2)}))
    assert len(report.of("impossible-read")) == 2 and report.kinds() == {"impossible-read"}, str(report)


def test_assert_valid_lists_every_anomaly() -> None:
    h = History()
    appended(h, (A1, 0), (B1, 0))
    op(h, "r", "read", {"conversation": "c1"}, "ok", list(A2))
    report = check(h, finals({"c1": [], "c2": stored(B2)}))
    with pytest.raises(AssertionError) as raised:
        report.assert_valid()
    lines = str(raised.value).splitlines()
    assert len(lines) == 1 + len(report.anomalies) and len(report.anomalies) >= 4
    assert {"lost", "receipts", "phantom", "impossible-read"} <= report.kinds() <= set(KINDS)
    assert all(str(a) in lines[1:][i].strip() for i, a in enumerate(sorted(report.anomalies,
                                                                            key=lambda a: (a.kind, a.conversation))))


@pytest.mark.parametrize("error", [InvalidBatch("x"), InvalidRequest("x"), AppendConflict("x"),
                                   ConversationClosed("x"), PreconditionFailed("x"), Unauthorized("x")])
def test_definite_failures(error: BaseException) -> None:
    assert outcome_of(error) == "fail"


@pytest.mark.parametrize("error", [CommitUnconfirmed("x"), LogUnavailable("x"), NotReady("x"), NotOwner("x"),
                                   CommitError("x", batch=A1), httpx.ReadTimeout("x"), httpx.RemoteProtocolError("x"),
                                   ConnectionResetError(), asyncio.CancelledError(), AssertionError("500")])
def test_unknown_outcomes(error: BaseException) -> None:
    assert outcome_of(error) == "unknown"


def test_an_operation_completes_once() -> None:
    h = History()
    handle = h.invoke("p", "append", {"batch": A1})
    h.ok(handle, receipt(A1, 0))
    with pytest.raises(ValueError, match="already completed"):
        h.unknown(handle, LogUnavailable("late"))


def test_recorded_threads_and_coroutines_on_a_real_engine(tmp_path: Path) -> None:
    h = History()
    with HistoryEngine.open(tmp_path / "data") as engine:
        def thread(k: int) -> None:
            me = Recorded(engine, h, k)
            for i in range(5):
                r = me.append(batch(f"t{k % 2}", f"t{k}-{i}"))
                me.read(f"t{k % 2}", at_least=r)
                me.entries(f"t{k % 2}", limit=3)
                me.window(f"t{k % 2}", 4)

        threads = [threading.Thread(target=thread, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads)

        async def coroutines() -> None:
            async def one(k: int) -> None:
                me = AsyncRecorded(AsyncHistoryEngine(engine), h, f"async-{k}")
                r = await me.append(batch("t0", f"async-{k}"))
                await me.read("t0", at_least=r)
                with pytest.raises(AppendConflict):
                    await me.append(batch("t0", f"async-{k}", text="changed"))
            await asyncio.gather(*(one(k) for k in range(4)))

        asyncio.run(coroutines())
        final = {"m": {c: engine.entries(c) for c in h.conversations()}}

    report = check(h, final).assert_valid()
    assert report.outcomes == {"append ok": 24, "append fail": 4, "read ok": 24, "entries ok": 20, "window ok": 20}
    assert report.reads_checked == 64 and not report.never_ok and len(report.found) == 24
    conflicts = [o for o in h.ops if o.outcome == "fail"]
    assert all(isinstance(o.error, AppendConflict) and o.completed_ns is not None and o.completed_ns >= o.invoked_ns
               for o in conflicts)
