"""``/healthz`` and ``/readyz`` over raw HTTP: alive, ready once caught up with the log end seen
at start on the partitions the engine owns (503 ``NotReady`` with ``Retry-After`` before),
neither needs the token."""

from __future__ import annotations

import http.client
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson

from engine.facade import HistoryEngine
from engine.service.health import observability
from schemas.batch import Batch
from schemas.messages import Message
from tests.service.server_support import serving


@contextmanager
def _server(engine: HistoryEngine, targets: list[int] | None = None) -> Iterator[http.client.HTTPConnection]:
    obs = observability(engine, targets=targets)
    with serving(engine, token="tok", **obs.app_options()) as url:
        host, port = url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            yield conn
        finally:
            conn.close()
            obs.close()


def _get(conn: http.client.HTTPConnection, path: str) -> tuple[int, dict[str, str], bytes]:
    conn.request("GET", path)  # no token: these paths need none
    response = conn.getresponse()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()


def test_healthz_answers_200_without_a_token(engine: HistoryEngine) -> None:
    with _server(engine) as conn:
        status, _, body = _get(conn, "/healthz")
    assert status == 200 and orjson.loads(body) == {"status": "ok"}


def test_readyz_is_200_once_caught_up_at_start(engine: HistoryEngine) -> None:
    engine.append(Batch("c", "a1", [Message.user("hi")]))
    with _server(engine) as conn:
        status, _, body = _get(conn, "/readyz")
    assert status == 200 and orjson.loads(body) == {"status": "ready"}


def test_readyz_is_503_not_ready_until_the_start_offsets_are_applied(engine: HistoryEngine) -> None:
    ahead = [end + 2 for end in engine.log.end_offsets()]  # the end a catching-up server saw at start
    with _server(engine, targets=ahead) as conn:
        status, headers, body = _get(conn, "/readyz")
        assert status == 503 and headers["content-type"] == "application/problem+json"
        assert headers["retry-after"] == "1"
        problem = orjson.loads(body)
        assert problem["title"] == "NotReady" and "partition 0: 2 records" in problem["detail"]
        assert _get(conn, "/healthz")[0] == 200  # alive while not ready
        engine.append(Batch("c", "a1", [Message.user("hi")]))
        assert _get(conn, "/readyz")[0] == 503
        engine.append(Batch("c", "a2", [Message.user("hi")]))
        assert _get(conn, "/readyz")[0] == 200
        assert _get(conn, "/readyz")[0] == 200  # stays ready


def test_readyz_counts_only_the_partitions_the_engine_owns(tmp_path: Path) -> None:
    with HistoryEngine.open(tmp_path / "d", partitions=2) as full:
        for i in range(8):  # both partitions get records
            full.append(Batch(f"c{i}", "a", [Message.user("hi")]))
        ends = full.log.end_offsets()
    assert all(ends)
    shutil.rmtree(tmp_path / "d" / "state")
    with HistoryEngine.open(tmp_path / "d", owned=[0]) as engine, _server(engine) as conn:
        assert engine.stats().applied_offsets == [ends[0], 0]  # partition 1 is never applied here
        status, _, body = _get(conn, "/readyz")
    assert status == 200 and orjson.loads(body) == {"status": "ready"}
