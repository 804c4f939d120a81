"""Reads that wait for a log position (``at_least``) hold no thread: 200 of them waiting for a
position that never comes leave every other read answering, each gets its 503 when its wait
ends, and past ``max_waiters`` a read is refused at once. Over real sockets (httpx), against
``build_app`` on a FileLog engine."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from engine.facade import HistoryEngine
from engine.service import routes
from engine.service.app import build_app
from tests.service.conftest import Served
from tests.service.server_support import serving

WAITERS = 200
WAIT_S = 4.0  # the at_least timeout here (10 s in production)
NEVER = "0:1000000"  # a position the log will not reach in this test
HI = {"messages": [{"role": "user", "parts": [{"kind": "text", "text": "hi"}]}]}


@pytest.fixture
def bounded(engine: HistoryEngine, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    monkeypatch.setattr(routes, "AT_LEAST_TIMEOUT", WAIT_S)
    with serving(engine, max_waiters=WAITERS) as url:
        yield Served(url, engine)


def _waiting(engine: HistoryEngine) -> int:
    """The reads waiting for a position of partition 0 now (the projector's waiter heap)."""
    with engine._projector._cond:
        return len(engine._projector._waiters[0])


async def _until_waiting(engine: HistoryEngine, n: int) -> None:
    deadline = time.monotonic() + 20
    while _waiting(engine) < n:  # bounded: the requests are in flight, not yet all parked
        assert time.monotonic() < deadline, f"only {_waiting(engine)} of {n} reads are waiting"
        await asyncio.sleep(0.01)


async def _timed(http: httpx.AsyncClient, path: str) -> tuple[float, httpx.Response]:
    start = time.monotonic()
    response = await http.get(path)
    return time.monotonic() - start, response


def test_waiting_reads_hold_no_thread_and_every_other_read_answers(bounded: Served) -> None:
    async def scenario() -> dict[str, Any]:
        limits = httpx.Limits(max_connections=WAITERS + 10, max_keepalive_connections=WAITERS + 10)
        async with httpx.AsyncClient(base_url=bounded.url, timeout=WAIT_S + 20, limits=limits) as http:
            assert (await http.put("/v1/conversations/c/appends/a1", json=HI)).status_code == 200
            waiters = [asyncio.ensure_future(_timed(http, f"/v1/conversations/c/window?limit=1&at_least={NEVER}"))
                       for _ in range(WAITERS)]
            await _until_waiting(bounded.engine, WAITERS)
            # While all of them wait: the stats, a plain read, a read whose position is applied.
            stats = await http.get("/v1/stats")
            plain = await http.get("/v1/conversations/c/messages")
            applied = await http.get("/v1/conversations/c/window?limit=1&at_least=0:0")
            over = await http.get(f"/v1/conversations/c/window?limit=1&at_least={NEVER}")
            still = _waiting(bounded.engine)
            done = await asyncio.gather(*waiters)
            return {"stats": stats, "plain": plain, "applied": applied, "over": over, "still": still, "done": done}

    result = asyncio.run(scenario())
    assert result["still"] == WAITERS  # every answer above came while all 200 were still waiting
    assert result["stats"].status_code == 200 and result["plain"].status_code == 200
    assert [m["message"]["parts"][0]["text"] for m in result["plain"].json()["messages"]] == ["hi"]
    assert result["applied"].status_code == 200 and len(result["applied"].json()["messages"]) == 1
    over = result["over"]
    assert over.status_code == 503 and over.json()["title"] == "LogUnavailable"
    assert "--max-waiters" in over.json()["detail"] and over.headers.get("retry-after") == "1"
    for elapsed, response in result["done"]:  # each one its 503 when its own wait ended
        assert response.status_code == 503 and response.json()["title"] == "LogUnavailable"
        assert "has not applied 0:1000000" in response.json()["detail"]
        assert WAIT_S * 0.9 <= elapsed < WAIT_S + 5, elapsed
    assert _waiting(bounded.engine) == 0  # a wait that timed out leaves nothing behind


def test_a_waiting_read_answers_once_its_position_is_applied(bounded: Served) -> None:
    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(base_url=bounded.url, timeout=WAIT_S + 20) as http:
            assert (await http.put("/v1/conversations/c/appends/a1", json=HI)).status_code == 200
            reader = asyncio.ensure_future(http.get("/v1/conversations/c/messages?at_least=0:1"))
            await _until_waiting(bounded.engine, 1)
            second = await http.put("/v1/conversations/c/appends/a2", json=HI)
            return second, await reader

    second, read = asyncio.run(scenario())
    assert second.status_code == 200 and second.json()["position"] == {"partition": 0, "offset": 1}
    assert read.status_code == 200 and len(read.json()["messages"]) == 2
    assert _waiting(bounded.engine) == 0


def test_max_waiters_zero_refuses_every_wait_but_not_an_applied_position(engine: HistoryEngine) -> None:
    with serving(engine, max_waiters=0) as url, httpx.Client(base_url=url, timeout=10) as http:
        assert http.put("/v1/conversations/c/appends/a1", json=HI).status_code == 200
        assert http.get("/v1/conversations/c/messages?at_least=0:0").status_code == 200
        refused = http.get(f"/v1/conversations/c/messages?at_least={NEVER}")
        assert refused.status_code == 503 and "--max-waiters" in refused.json()["detail"]
    with pytest.raises(ValueError, match="max_waiters"):
        build_app(engine, max_waiters=-1)
