"""The representations of ``engine.service.wire`` read back what the server writes: each
response form parsed by the client-side converter equals what the engine returns in process."""

from __future__ import annotations

from typing import Any

import pytest

from engine.service import wire
from schemas.batch import Batch
from schemas.errors import InvalidRequest
from schemas.messages import Message
from schemas.positions import HistoryPosition, LogPosition
from tests.service.conftest import Served
from tests.service.server_support import call

C = "/v1/conversations/c"


def msg(role: str, text: str, **metadata: Any) -> dict[str, Any]:
    return {"role": role, "parts": [{"kind": "text", "text": text}], **({"metadata": metadata} if metadata else {})}


@pytest.fixture
def history(served: Served) -> Served:
    call(served.url, "PUT", C + "/appends/a1", {"messages": [msg("user", "hi"), msg("assistant", "yo")]})
    call(served.url, "PUT", C + "/appends/a2", {"messages": [msg("user", "again"),
                                                              msg("assistant", "half", interrupted=True, n=1.50)]})
    call(served.url, "PUT", C + "/appends/a3", {"messages": [msg("user", "again"), msg("assistant", "whole")],
                                                 "replaces": {"turn_id": "a2/0", "reason": "retry"}})
    return served


def test_receipts_and_stored_messages_round_trip(history: Served) -> None:
    _, _, body = call(history.url, "PUT", C + "/appends/a1", {"messages": [msg("user", "hi"), msg("assistant", "yo")]})
    same = Batch("c", "a1", [Message.model_validate(m) for m in (msg("user", "hi"), msg("assistant", "yo"))])
    assert wire.receipt_of(body) == history.engine.append(same)  # the in-process retry: the same receipt
    _, _, rows = call(history.url, "GET", C + "/messages?include_hidden=true")
    assert [wire.stored_of(r) for r in rows["messages"]] == history.engine.entries("c", include_hidden=True)


def test_turns_sources_measure_and_stats_round_trip(history: Served) -> None:
    _, _, latest = call(history.url, "GET", C + "/turns/latest")
    assert wire.turn_of(latest["turn"]) == history.engine.latest_turn("c")
    _, _, sources = call(history.url, "GET", C + "/turn-sources?max_bytes=100000")
    load = history.engine.turn_sources("c", 100000)
    assert [wire.source_of(s) for s in sources["sources"]] == load.messages
    _, _, measure = call(history.url, "GET", C + "/measure?after=1:1")
    assert wire.measure_of(measure) == history.engine.measure("c", HistoryPosition(1, 1))
    _, _, stats = call(history.url, "GET", "/v1/stats")
    assert wire.stats_of(stats) == history.engine.stats()


def test_position_texts_parse_or_name_the_field() -> None:
    assert wire.history_position_of("3:7", "after") == HistoryPosition(3, 7)
    assert wire.log_position_of("0:42", "at_least") == LogPosition(0, 42)
    for bad in ("", "3", "3:", ":7", "-1:2", "1:2:3", "a:b"):
        with pytest.raises(InvalidRequest, match=r"^after: "):
            wire.history_position_of(bad, "after")
        with pytest.raises(InvalidRequest, match=r"^at_least: "):
            wire.log_position_of(bad, "at_least")


def test_a_malformed_response_form_is_an_invalid_request_naming_the_field() -> None:
    with pytest.raises(InvalidRequest, match="position"):
        wire.stored_of({"id": "x", "message": msg("user", "hi"), "position": "x", "append_id": "a",
                        "created_at": "2026-01-01T00:00:00.000Z"})
    with pytest.raises(InvalidRequest, match="turns"):
        wire.measure_of({"messages": 1, "content_bytes": 2})


def test_the_stats_form_has_every_engine_stats_field() -> None:
    """``wire.StatsOut`` spells ``EngineStats`` for the wire: a counter added to the engine must
    reach ``GET /v1/stats`` (and so the clients' ``stats()``) too."""
    import dataclasses

    from engine.facade import EngineStats
    from engine.service.wire import StatsOut

    assert list(StatsOut.model_fields) == [f.name for f in dataclasses.fields(EngineStats)] + ["poison"]
