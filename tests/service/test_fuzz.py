"""schemathesis against ``/openapi.json``: generated requests for every operation (bounded and
deterministic) never get a 5xx, and every response matches the documented status, content type
and schema.

One 5xx is an answer, not a failure: a 503 ``LogUnavailable`` to a read whose ``at_least`` names a
position this instance has not applied (generated positions are mostly beyond the log's end);
the wait is shortened here so such examples cost milliseconds."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import Case
from schemathesis.checks import CheckContext, not_a_server_error
from schemathesis.core.transport import Response
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from engine.service import routes
from engine.service.openapi import document
from engine.service.routes import OPS
from tests.service.conftest import Served

schema = schemathesis.openapi.from_dict(document(OPS))


def no_server_error(ctx: CheckContext, response: Response, case: Case[Any]) -> bool | None:
    """``not_a_server_error``, but for a 503 LogUnavailable to an ``at_least`` read (see above)."""
    if response.status_code == 503 and case.query and "at_least" in case.query:
        return None if response.json()["title"] == "LogUnavailable" else not_a_server_error(ctx, response, case)
    return not_a_server_error(ctx, response, case)


CHECKS = [no_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(autouse=True)
def short_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(routes, "AT_LEAST_TIMEOUT", 0.02)


@schema.parametrize()
@settings(max_examples=30, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.filter_too_much, HealthCheck.data_too_large])
def test_generated_requests_get_documented_answers_and_no_5xx(case: Case[Any], served: Served) -> None:
    case.call_and_validate(base_url=served.url, checks=CHECKS, timeout=10)


_ONE = b'{"role":"user","parts":[{"kind":"text","text":"a"}]}'
SEEDS = [
    b'{"messages": [' + _ONE + b'], "expected_last": 1e999}',
    b'{"messages": [' + _ONE + b'], "expected_last": -1e999}',
    b'{"messages": [' + _ONE + b'], "expected_last": ' + b"9" * 400 + b"}",
    b'{"messages": [' + _ONE + b'], "replaces": {"turn_id": "t", "reason": 1e999}}',
    b'{"messages": [' + _ONE + b'], "expected_last": {"conversation_id": "c", "append_id": "a", "digest": '
    b'"sha256:' + b"0" * 64 + b'", "position": {"partition": 1e999, "offset": 0}}}',
    b'{"messages": [' + _ONE + b'], "unknown": 1e999}',
]
"""Bodies that once got a 500 (numbers no double holds, in the envelope): the fuzzer's seeds."""


@pytest.mark.parametrize("body", SEEDS, ids=range(len(SEEDS)))
def test_seeded_hostile_bodies_get_documented_answers_and_no_5xx(body: bytes, served: Served) -> None:
    case = schema["/v1/conversations/{c}/appends/{a}"]["PUT"].Case(
        path_parameters={"c": "seeded", "a": "a1"}, body=body, media_type="application/json")
    response = case.call_and_validate(base_url=served.url, checks=CHECKS, timeout=10)
    assert response.status_code == 400 and response.json()["title"] == "InvalidRequest", response.text
