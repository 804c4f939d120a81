"""``GET /v1/partitions/{p}/snapshot`` over a real loopback socket (raw HTTP): the token guards
it, a bad ``p`` is a 400 naming it, a partition this server holds nothing of is a 404, and the
bytes that arrive are a snapshot that verifies (``projections.snapshots.receive``) with every
row of the partition. The restore on a member is ``tests/unit/test_snapshots.py`` and, between
real members, ``tests/integration/test_cluster_snapshots.py``."""

from __future__ import annotations

import http.client
from pathlib import Path

from engine.facade import HistoryEngine
from engine.service.app import build_app
from projections import snapshots
from projections.store import StateStore
from schemas import Batch, Message
from schemas.records import partition_for_key, record_key
from tests.service.server_support import call, running

TOKEN = "snapshot-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _get(url: str, path: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", path, headers=headers)
        r = conn.getresponse()
        return r.status, r.getheader("content-type") or "", r.read()
    finally:
        conn.close()


def test_the_snapshot_route(tmp_path: Path) -> None:
    convs = [c for c in (f"c{i}" for i in range(40)) if partition_for_key(record_key(c), 2) == 0][:5]
    with HistoryEngine.open(tmp_path / "data", partitions=2) as engine:
        for c in convs:
            for i in range(3):
                engine.append(Batch(c, f"a{i}", [Message.user(f"q{i}"), Message.assistant(f"r{i}")]))
        with running(build_app(engine, token=TOKEN)) as url:
            assert call(url, "GET", "/v1/partitions/0/snapshot")[0] == 401
            status, _, problem = call(url, "GET", "/v1/partitions/x/snapshot", headers=AUTH)
            assert status == 400 and "path segment p" in problem["detail"]
            assert call(url, "GET", "/v1/partitions/2/snapshot", headers=AUTH)[0] == 400  # the log has 2
            status, _, problem = call(url, "GET", "/v1/partitions/1/snapshot", headers=AUTH)
            assert status == 404 and "holds no state of partition 1" in problem["detail"]
            status, media, body = _get(url, "/v1/partitions/0/snapshot", AUTH)
            assert status == 200 and media == "application/vnd.histlog.partition-snapshot"
        scratch = StateStore(tmp_path / "scratch")
        try:
            received = snapshots.receive(scratch, [body], partition=0, partitions=2, core="core")
        finally:
            scratch.close()
        assert received.offset == engine.stats().applied_offsets[0] == 15
        assert received.rows > 5 * 3
