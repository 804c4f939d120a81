"""What a fenced write counts over HTTP (SERVICE.md, docs/runs.md): ``GET /v1/stats`` ``fenced``
counts the records admission refused *in the log*; a write this server refuses before writing
(its state already knows the later run: the fast path) writes no record and counts nothing
there, while ``/metrics``' ``histlog_appends_total{outcome="fenced"}`` counts every 409 Fenced
answer either way. Also: the event of a fenced write names its fence's run when the body gives
no ``run_id``, and a bare ``"fence"`` works without one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.facade import HistoryEngine
from engine.service.health import observability
from schemas import Batch, Fence, Message
from schemas.events import BatchAppended, encode_event
from schemas.records import record_key
from tests.service.server_support import call, serving
from tests.service.test_http_errors import HI, problem

RUNS = "/v1/conversations/c/runs"


@pytest.fixture
def url(engine: HistoryEngine) -> Iterator[str]:
    obs = observability(engine)
    try:
        with serving(engine, **obs.app_options()) as base:
            yield base
    finally:
        obs.close()


def _stats(url: str) -> dict[str, Any]:
    status, _, stats = call(url, "GET", "/v1/stats")
    assert status == 200
    assert isinstance(stats, dict)
    return stats


def _metric(url: str, name: str, outcome: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == name and s.labels.get("outcome") == outcome)


def _raw(engine: HistoryEngine, batch: Batch, fence: Fence) -> None:
    """Write ``batch`` under ``fence`` straight to the served engine's log, as a run on another
    instance that has not learned of its successor yet would, and wait for its decision."""
    event = BatchAppended.of(batch, 1_767_225_600_000, None, fence)
    position = engine.log.append(record_key(batch.conversation_id, batch.append_id), encode_event(event))
    engine.wait_applied(position, timeout=30)


def test_a_refusal_before_the_write_counts_no_fenced_record_but_one_in_the_log_does(
        engine: HistoryEngine, url: str) -> None:
    assert call(url, "POST", f"{RUNS}/r1")[2]["epoch"] == 1
    assert call(url, "PUT", "/v1/conversations/c/appends/a1", {"messages": [HI], "fence": 1})[0] == 200
    assert call(url, "POST", f"{RUNS}/r2")[2]["epoch"] == 2
    before = _stats(url)
    assert before["fenced"] == 0 and before["accepted"] == 1
    # The server's state knows run 2: the write is refused before it is written.
    problem(call(url, "PUT", "/v1/conversations/c/appends/a2", {"messages": [HI], "fence": 1, "run_id": "r1"}),
            409, "Fenced", "latest run", "epoch 2")
    after = _stats(url)
    assert (after["fenced"], after["end_offsets"]) == (0, before["end_offsets"])  # no record, nothing counted
    assert _metric(url, "histlog_appends_total", "fenced") == 1
    assert _metric(url, "histlog_admission_decisions_total", "fenced") == 0
    # A record under fence 1 that reached the log after run 2 began: admission refuses it there.
    _raw(engine, Batch("c", "a3", [Message.user("late")]), Fence("c", "r1", 1))
    counted = _stats(url)
    assert (counted["fenced"], counted["accepted"]) == (1, 1)
    assert _metric(url, "histlog_admission_decisions_total", "fenced") == 1
    assert [m["id"] for m in call(url, "GET", "/v1/conversations/c/messages")[2]["messages"]] == ["a1/0"]
    # Its retry over HTTP is the same 409, from this state (no second record).
    problem(call(url, "PUT", "/v1/conversations/c/appends/a3", {
        "messages": [{"role": "user", "parts": [{"kind": "text", "text": "late"}]}], "fence": 1}), 409, "Fenced")
    assert _stats(url)["fenced"] == 1 and _metric(url, "histlog_appends_total", "fenced") == 2


def test_a_bare_fence_records_its_runs_write_and_a_run_id_overrides_it(url: str) -> None:
    call(url, "POST", f"{RUNS}/r1")
    assert call(url, "PUT", "/v1/conversations/c/appends/a1", {"messages": [HI], "fence": 1})[0] == 200
    body = {"messages": [HI], "replaces": {"turn_id": "a1/0", "reason": "retry"}, "fence": 1, "run_id": "r-tool"}
    assert call(url, "PUT", "/v1/conversations/c/appends/b1", body)[0] == 200
    assert call(url, "GET", f"{RUNS}/r1?root_turn=a1/0")[2] == {"wrote_history": True, "request_message_id": None}
    assert call(url, "GET", f"{RUNS}/r1?root_turn=b1/0")[2] == {"wrote_history": False, "request_message_id": "b1/0"}
    assert call(url, "GET", f"{RUNS}/r-tool?root_turn=b1/0")[2] == {
        "wrote_history": True, "request_message_id": "b1/0"}
    assert call(url, "GET", f"{RUNS}/r-tool")[2] == {"wrote_history": True, "request_message_id": None}
    # A retry of the same write under the same fence is the same receipt, fenced or not.
    first = call(url, "PUT", "/v1/conversations/c/appends/b1", body)
    assert first[0] == 200 and first[2]["append_id"] == "b1"
