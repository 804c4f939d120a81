"""``engine.service.problems``: the one map between histlog's errors and HTTP (SERVICE.md's table),
read back by the clients into the same classes."""

from __future__ import annotations

import pytest

from engine.service.problems import STATUS, error_of, problem_of, retry_after, status_of
from schemas import errors
from schemas.batch import Batch
from schemas.commit import CommitError
from schemas.messages import Message

TABLE = {
    "InvalidConversationID": 400, "InvalidAppendID": 400, "InvalidMessage": 400, "InvalidBatch": 400,
    "InvalidReceipt": 400, "InvalidWindow": 400, "InvalidRequest": 400, "Unauthorized": 401, "NotFound": 404,
    "AppendConflict": 409, "TurnNotReplaceable": 409, "Fenced": 409, "SlotUnavailable": 409,
    "ConversationClosed": 410, "PreconditionFailed": 412,
    "NotOwner": 421, "WindowTooSmall": 422, "LogUnavailable": 503, "StateUnavailable": 503, "NotReady": 503,
    "CommitUnconfirmed": 504,
}


def test_the_table_is_service_md_s() -> None:
    assert {cls.__name__: status for cls, status in STATUS.items()} == TABLE


@pytest.mark.parametrize("name", sorted(TABLE))
def test_a_problem_round_trips_to_the_same_class_and_message(name: str) -> None:
    cls = getattr(errors, name)
    exc = cls("what went wrong;\n  what to do")
    body = problem_of(exc)
    assert body == {"type": f"urn:histlog:error:{name}", "title": name, "status": TABLE[name],
                    "detail": "what went wrong; what to do"}
    back = error_of(body["status"], body)
    assert type(back) is cls and str(back) == "what went wrong; what to do"


def test_a_subclass_maps_through_its_nearest_listed_base_and_others_are_500() -> None:
    assert status_of(errors.DuplicateProjection("x")) == 500  # not a request error: never 4xx by accident
    assert status_of(errors.CorruptLog("damaged")) == 500
    assert status_of(RuntimeError("boom")) == 500
    assert problem_of(RuntimeError("boom"))["title"] == "HistoryError"


def test_an_error_whose_constructor_wants_more_is_still_raised_by_name() -> None:
    batch = Batch("c", "a", [Message.user("hi")])
    body = problem_of(CommitError("persisting failed", batch=batch))
    back = error_of(500, body)
    assert type(back) is CommitError and str(back) == "persisting failed"


@pytest.mark.parametrize(("status", "body", "cls"), [
    (502, "<html>bad gateway</html>", errors.LogUnavailable),
    (400, {"title": "NoSuchError", "detail": "x"}, errors.InvalidRequest),
    (404, None, errors.InvalidRequest),
])
def test_a_response_that_is_not_a_histlog_problem_becomes_a_typed_error(status: int, body: object,
                                                                        cls: type[Exception]) -> None:
    exc = error_of(status, body)
    assert type(exc) is cls and str(status) in str(exc)


def test_only_a_503_that_a_retry_can_get_past_says_retry_after() -> None:
    assert retry_after(errors.LogUnavailable("broker down"), 503) == "1"
    assert retry_after(errors.NotReady("catching up"), 503) == "1"
    stopped = errors.LogUnavailable("fail-stopped")
    stopped.retryable = False
    assert retry_after(stopped, 503) is None  # a reopen recovers it, not a retry
    assert retry_after(errors.StateUnavailable("the store failed"), 503) is None
    assert retry_after(errors.CommitUnconfirmed("resend"), 504) is None
    assert retry_after(errors.AppendConflict.__new__(errors.AppendConflict), 409) is None
