"""Everything one face accepts, every face reads back: a JSON number in a message must be a finite
64-bit float (``schemas.canonical``), spelled however it was given. The largest such spelling
round-trips exactly through the HTTP service, ``HistoryClient`` and ``histlog --url``; one past
it (and 4,400 digits, past Python's own limit) is refused: a 400 naming the field."""

from __future__ import annotations

import json

import pytest

from engine.client import HistoryClient
from tests.service.conftest import Served
from tests.service.server_support import call
from tests.service.test_client_cli import ok

AT_LIMIT = "9" * 308  # about 1e308: a double holds it (lossily; the spelling is kept)
PAST = ["9" * 309, "9" * 4_400, "1e999", "-1e999"]


def _body(number: str) -> bytes:
    return ('{"messages": [{"role": "user", "parts": [{"kind": "text", "text": "hi"}], '
            '"metadata": {"n": ' + number + '}}]}').encode()


def test_a_number_at_the_limit_reads_back_through_every_face(served: Served) -> None:
    assert call(served.url, "PUT", "/v1/conversations/m2/appends/a1", _body(AT_LIMIT))[0] == 200
    raw = call(served.url, "GET", "/v1/conversations/m2/messages")[2]  # orjson reads it as a double
    assert raw["messages"][0]["message"]["metadata"]["n"] == float(AT_LIMIT)
    with HistoryClient(served.url, timeout=10) as client:
        [message] = client.read("m2")
        assert str(message.metadata["n"]) == AT_LIMIT  # the exact spelling, as a RawJSON
        assert [str(m.metadata["n"]) for m in client.window("m2", 5)] == [AT_LIMIT]
    [line] = ok("--url", served.url, "read", "m2", "--json").splitlines()
    assert AT_LIMIT in line and json.loads(line)


@pytest.mark.parametrize("number", PAST, ids=["309 nines", "4400 nines", "1e999", "-1e999"])
def test_a_number_out_of_range_is_a_400_naming_the_field_and_nothing_is_written(served: Served, number: str) -> None:
    status, _, problem = call(served.url, "PUT", "/v1/conversations/m2/appends/a1", _body(number))
    assert status == 400 and problem["title"] == "InvalidBatch"
    assert "messages[0].metadata" in problem["detail"] and "out of range" in problem["detail"]
    assert call(served.url, "GET", "/v1/conversations/m2/messages")[2] == {"messages": []}
    assert served.engine.stats().end_offsets == [0]  # refused before any I/O
