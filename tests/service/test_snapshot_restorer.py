"""``engine.cluster.restore.Restorer`` over real loopback sockets: a peer that dies mid-transfer
(it sends half the snapshot, then closes the connection), a peer that is down and a peer that
holds nothing (404) are each skipped, and the partition (owned, or a new standby) is restored
from the next peer that sends a whole one; with no good peer it is replayed. Either way the
state equals a rebuild.

The peers are tiny HTTP servers replaying bytes a real ``histlog serve`` sent for
``GET /v1/partitions/{p}/snapshot`` (one process holds a file log at a time, so the source
engine is closed before the restoring one opens)."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.cluster.restore import Restorer
from engine.service.app import build_app
from schemas.records import partition_for_key, record_key
from tests.conformance.facade_contract import turn
from tests.conformance.owned_contract import PARTITIONS, FileOwned, conversations_by_partition, view_of
from tests.service.server_support import running
from tests.unit.test_snapshots import _comparable, _rows_of

P = 2
CONVS = conversations_by_partition(2)
WAIT_S = 30.0


@contextlib.contextmanager
def _peer(status: int, body: bytes, *, cut: bool = False, applied: int | None = None) -> Iterator[str]:
    """An HTTP server answering every GET with ``status`` and ``body`` (``cut``: half of it,
    then the connection closes, as a peer killed mid-transfer); with ``applied``, ``/v1/stats``
    says its state of every partition is that far."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if applied is not None and self.path == "/v1/stats":
                stats = json.dumps({"applied_offsets": [applied] * PARTITIONS}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(stats)))
                self.end_headers()
                self.wfile.write(stats)
                return
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2] if cut else body)
            self.wfile.flush()
            if cut:
                self.close_connection = True

        def log_message(self, *args: object) -> None:
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(WAIT_S)


def _snapshot_bytes(backend: FileOwned) -> bytes:
    import httpx

    with backend.open() as source:
        for convs in CONVS.values():
            for c in convs:
                for t in range(3):
                    source.append(turn(c, f"{c}-a{t}", f"{c} says {t}"))
        with running(build_app(source)) as url:
            body = httpx.get(f"{url}/v1/partitions/{P}/snapshot", timeout=WAIT_S).content
    backend.drop_state()
    return body


@pytest.mark.parametrize("standby", [False, True], ids=["owned", "standby"])
@pytest.mark.parametrize("good", [True, False])
def test_bad_peers_are_skipped_and_the_partition_is_restored_or_replayed(tmp_path: Path, good: bool,
                                                                         standby: bool) -> None:
    """``take_on`` (an owned partition) and ``add_standbys`` (a new standby) alike."""
    backend = FileOwned(tmp_path / "data")
    body = _snapshot_bytes(backend)
    with contextlib.ExitStack() as stack:
        cut = stack.enter_context(_peer(200, body, cut=True))
        empty = stack.enter_context(_peer(404, b'{"title":"NotFound"}'))
        whole = stack.enter_context(_peer(200, body))
        peers = [cut, "http://127.0.0.1:9", empty, *([whole] if good else [])]
        with backend.open(owned=[]) as eng:
            restorer = Restorer(eng, lambda p: peers, token=None, min_records=1)
            if standby:
                restorer.add_standbys(frozenset({P}))
                assert eng.standbys == {P} and eng.partition_state(P) == "not_owned"
            else:
                restorer.take_on(frozenset({P}))
                assert eng.partition_state(P) == "catching_up"
            threads = [t for t in threading.enumerate() if t.name == "histlog-restore"]
            for t in threads:
                t.join(WAIT_S)
            assert eng.catch_up(timeout=WAIT_S, standbys=True)
            if standby:
                assert eng.applied_offsets()[P] == eng.stats().end_offsets[P]
                eng.assign([P])  # promoted where it stands, to read it
            assert eng.catch_up(timeout=WAIT_S) and eng.partition_state(P) == "ready"
            assert (restorer.restored, restorer.fell_back) == ((1, 0) if good else (0, 1))
            s = eng.stats()
            assert s.applied_since_open[P] == (0 if good else s.end_offsets[P])
            rows, seen = _rows_of(eng, P), view_of(eng, CONVS[P])
    with backend.reference(owned=[P]) as rebuilt:
        assert _comparable(_rows_of(rebuilt, P)) == _comparable(rows)
        assert view_of(rebuilt, CONVS[P]) == seen
    assert all(partition_for_key(record_key(c), PARTITIONS) == P for c in CONVS[P])


def test_the_newest_snapshot_is_restored_whichever_peer_is_listed_first(tmp_path: Path) -> None:
    """Two peers hold snapshots of different ages; the one listed first holds the older: the
    restorer asks each one's ``/v1/stats`` and restores the newer, so only the rest is applied."""
    import httpx

    backend = FileOwned(tmp_path / "data")
    with backend.open() as source:
        for convs in CONVS.values():
            for c in convs:
                source.append(turn(c, f"{c}-a0", f"{c} says 0"))
        with running(build_app(source)) as url:
            old, old_at = httpx.get(f"{url}/v1/partitions/{P}/snapshot", timeout=WAIT_S).content, \
                source.stats().applied_offsets[P]
            for t in range(4):
                source.append(turn(CONVS[P][0], f"later-{t}", f"later {t}"))
            new, new_at = httpx.get(f"{url}/v1/partitions/{P}/snapshot", timeout=WAIT_S).content, \
                source.stats().applied_offsets[P]
            source.append(turn(CONVS[P][1], "tail", "after both"))
    backend.drop_state()
    assert old_at < new_at
    with _peer(200, old, applied=old_at) as older, _peer(200, new, applied=new_at) as newer, \
            backend.open(owned=[]) as eng:
        restorer = Restorer(eng, lambda p: [older, newer], token=None, min_records=1)
        restorer.take_on(frozenset({P}))
        for t in [t for t in threading.enumerate() if t.name == "histlog-restore"]:
            t.join(WAIT_S)
        assert eng.catch_up(timeout=WAIT_S) and restorer.restored == 1
        s = eng.stats()
        assert s.applied_since_open[P] == s.end_offsets[P] - new_at == 1  # only what came after the newer
        rows, seen = _rows_of(eng, P), view_of(eng, CONVS[P])
    with backend.reference(owned=[P]) as rebuilt:
        assert _comparable(_rows_of(rebuilt, P)) == _comparable(rows)
        assert view_of(rebuilt, CONVS[P]) == seen
