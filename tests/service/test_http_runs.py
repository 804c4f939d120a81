"""The runs' routes over a real socket, by raw HTTP (SERVICE.md, docs/runs.md): a run's fence,
writes that carry it as ``"fence": epoch``, the 409 of a fenced write, what a run wrote, and every
bad input a 400 problem naming the field."""

from __future__ import annotations

import pytest

from tests.service.conftest import Served
from tests.service.server_support import call
from tests.service.test_http_errors import HI, problem

RUNS = "/v1/conversations/c/runs"
ANSWER = {"role": "assistant", "parts": [{"kind": "text", "text": "yo"}]}


def test_a_run_begins_writes_under_its_fence_and_a_later_run_fences_it(served: Served) -> None:
    status, _, first = call(served.url, "POST", f"{RUNS}/run-1")
    assert (status, first) == (200, {"conversation_id": "c", "run_id": "run-1", "epoch": 1})
    assert call(served.url, "POST", f"{RUNS}/run-1")[2] == first  # the same run keeps its epoch
    body = {"messages": [HI, ANSWER], "fence": 1}
    assert call(served.url, "PUT", "/v1/conversations/c/appends/a1", body)[0] == 200
    assert call(served.url, "POST", f"{RUNS}/run%2F2")[2] == {"conversation_id": "c", "run_id": "run/2", "epoch": 2}
    detail = problem(call(served.url, "PUT", "/v1/conversations/c/appends/a2", {"messages": [HI], "fence": 1}),
                     409, "Fenced", "latest run")
    assert "stop this run" in detail
    replace = {"messages": [HI], "replaces": {"turn_id": "a1/0", "reason": "edit"}, "fence": 1}
    problem(call(served.url, "PUT", "/v1/conversations/c/appends/e1", replace), 409, "Fenced")
    assert call(served.url, "PUT", "/v1/conversations/c/appends/e1", {**replace, "fence": 2})[0] == 200
    problem(call(served.url, "PUT", "/v1/conversations/c/appends/a3", {"messages": [HI], "fence": 3}),
            409, "Fenced", "no run of epoch 3")
    status, _, run = call(served.url, "GET", f"{RUNS}/run-1?root_turn=a1/0")
    assert (status, run) == (200, {"wrote_history": True, "request_message_id": None})  # its request is hidden
    assert call(served.url, "GET", f"{RUNS}/run%2F2?root_turn=e1/0")[2] == {
        "wrote_history": True, "request_message_id": "e1/0"}
    assert call(served.url, "GET", f"{RUNS}/never")[2] == {"wrote_history": False, "request_message_id": None}


def test_a_write_names_its_run_for_traceability(served: Served) -> None:
    call(served.url, "POST", f"{RUNS}/r1")
    body = {"messages": [HI], "run_id": "r-other"}
    assert call(served.url, "PUT", "/v1/conversations/c/appends/a1", body)[0] == 200
    assert call(served.url, "GET", f"{RUNS}/r-other?root_turn=a1/0")[2] == {
        "wrote_history": True, "request_message_id": "a1/0"}
    assert call(served.url, "GET", f"{RUNS}/r1")[2]["wrote_history"] is False


@pytest.mark.parametrize(("method", "path", "body", "words"), [
    ("PUT", "/v1/conversations/c/appends/a1", {"messages": [HI], "fence": 0}, ("fence",)),
    ("PUT", "/v1/conversations/c/appends/a1", {"messages": [HI], "fence": "1"}, ("fence",)),
    ("PUT", "/v1/conversations/c/appends/a1", {"messages": [HI], "fence": True}, ("fence",)),
    ("PUT", "/v1/conversations/c/appends/a1", {"messages": [HI], "fence": 1.5}, ("fence",)),
    ("PUT", "/v1/conversations/c/appends/a1", {"messages": [HI], "run_id": ""}, ("run id", "empty")),
    ("PUT", "/v1/conversations/c/appends/a1", {"messages": [HI], "run_id": 7}, ("run_id",)),
    ("POST", f"{RUNS}/%20r", None, ("run id", "whitespace")),
    ("POST", f"{RUNS}/r%07", None, ("run id", "control character")),
    ("GET", f"{RUNS}/r?root_turn=nope", None, ("root_turn",)),
    ("GET", f"{RUNS}/r?root_turn=a/01", None, ("root_turn",)),
])
def test_bad_runs_input_is_a_400_naming_the_field(served: Served, method: str, path: str, body: object,
                                                   words: tuple[str, ...]) -> None:
    problem(call(served.url, method, path, body), 400, "InvalidRequest", *words)
    assert call(served.url, "GET", "/v1/conversations/c/messages")[2] == {"messages": []}  # nothing written


def test_a_cleared_conversation_begins_no_run(served: Served) -> None:
    call(served.url, "POST", f"{RUNS}/r1")
    assert call(served.url, "DELETE", "/v1/conversations/c")[0] == 204
    problem(call(served.url, "POST", f"{RUNS}/r2"), 410, "ConversationClosed")
    problem(call(served.url, "PUT", "/v1/conversations/c/appends/a", {"messages": [HI], "fence": 1}),
            410, "ConversationClosed")
