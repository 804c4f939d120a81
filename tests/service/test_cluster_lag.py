"""``GET /v1/cluster?lag=true`` (the console's Operations page: each member's lag, asked by the
server because the page may only talk to its own origin), on real servers over loopback.

Members are in-process uvicorn servers over FileLog engines given a static ownership map through
``build_app``'s ``ownership=`` (as tests/service/test_cluster_routing.py does, without Kafka):
A owns partition 0, B owns 1 (B needs the bearer token, so its answer proves the token went
along), a dead port owns 2 and a socket that accepts and never answers owns 3. What is proven:

- without ``lag`` (or with ``lag=false``) the answer is byte for byte the map alone;
- ``lag=true`` adds one member per owner URL: this server's lag from its own stats, B's from B's
  ``/v1/stats`` (equal to what B says), the dead and the silent ones ``reachable: false`` with an
  error naming them, and the answer is still a 200 (bounded per member);
- a server without ``--group`` lists one member, itself; a bad ``lag`` is a 400 naming ``lag``;
- the document lists the parameter.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import orjson
import pytest

from engine.client.members import MEMBER_TIMEOUT_S
from engine.cluster import OwnershipMap
from engine.facade import HistoryEngine
from engine.service.app import build_app
from engine.service.wire import ClusterOut, cluster_json
from schemas import Batch, Message
from tests.service.conftest import Served
from tests.service.server_support import call, running

TOKEN = "lag-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DEAD = "http://127.0.0.1:9"  # nothing listens on the discard port
PARTITIONS = 4


@dataclass
class Members:
    a: str
    b: str
    silent: str
    a_engine: HistoryEngine
    b_engine: HistoryEngine


@contextlib.contextmanager
def _silent_listener() -> Iterator[str]:
    """A socket that accepts connections (the kernel's backlog) and never answers a byte."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture(scope="module")
def members(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Members]:
    root = tmp_path_factory.mktemp("lag")
    urls: dict[str, str] = {}

    def owners(me: str) -> OwnershipMap:
        return OwnershipMap("bots", 5, PARTITIONS, urls[me],
                            {0: urls["a"], 1: urls["b"], 2: DEAD, 3: urls["silent"]})

    with contextlib.ExitStack() as stack:
        urls["silent"] = stack.enter_context(_silent_listener())
        engines = {name: stack.enter_context(HistoryEngine.open(root / name, partitions=PARTITIONS, fsync="never"))
                   for name in ("a", "b")}
        for name, engine in engines.items():
            app = build_app(engine, token=TOKEN, ownership=lambda me=name: owners(me))
            urls[name] = stack.enter_context(running(app))
        engines["b"].append(Batch("on-b", "a1", [Message.user("hello b")]))
        yield Members(urls["a"], urls["b"], urls["silent"], engines["a"], engines["b"])


def test_without_lag_the_answer_is_the_map_alone_byte_for_byte(members: Members) -> None:
    plain = _raw(members.a, "/v1/cluster")
    assert plain == orjson.dumps(cluster_json(
        OwnershipMap("bots", 5, PARTITIONS, members.a, {0: members.a, 1: members.b, 2: DEAD, 3: members.silent}),
        partitions=PARTITIONS, here=members.a))
    assert set(orjson.loads(plain)) == {"group", "generation", "partitions", "self", "owners"}
    assert _raw(members.a, "/v1/cluster?lag=false") == plain


def test_lag_true_lists_every_owner_with_its_lag_and_the_unreachable_ones(members: Members) -> None:
    status, _, tree = call(members.a, "GET", "/v1/cluster?lag=true", headers=AUTH, timeout=10 * MEMBER_TIMEOUT_S)
    assert status == 200, tree
    ClusterOut.model_validate(tree)  # the documented model describes it
    assert {k: v for k, v in tree.items() if k != "members"} == orjson.loads(_raw(members.a, "/v1/cluster"))
    by_url = {m["url"]: m for m in tree["members"]}
    assert sorted(by_url) == sorted({members.a, members.b, DEAD, members.silent})
    assert [m["partitions"] for m in (by_url[u] for u in (members.a, members.b, DEAD, members.silent))] == \
        [[0], [1], [2], [3]]

    a, b = by_url[members.a], by_url[members.b]
    assert a["reachable"] is True and "error" not in a
    assert a["lag"] == {str(p): 0 for p in range(PARTITIONS)}  # A's engine applies every partition
    assert b["reachable"] is True and "error" not in b  # B needs the token: it was sent along
    b_stats = call(members.b, "GET", "/v1/stats", headers=AUTH)[2]
    assert b["lag"] == {str(p): b_stats["lag"][p] for p in b_stats["owned_partitions"]}

    dead, silent = by_url[DEAD], by_url[members.silent]
    assert dead["reachable"] is False and dead["lag"] == {} and DEAD in dead["error"]
    assert "did not answer" in dead["error"]
    assert silent["reachable"] is False and silent["lag"] == {}
    assert f"within {MEMBER_TIMEOUT_S:g} s" in silent["error"] and members.silent in silent["error"]


def test_a_bad_lag_value_is_a_400_naming_lag(members: Members) -> None:
    for query in ("lag=yes", "lag=", "lag=true&lag=true"):
        status, head, problem = call(members.a, "GET", f"/v1/cluster?{query}", headers=AUTH)
        assert status == 400 and head["content-type"] == "application/problem+json", (query, problem)
        assert problem["title"] == "InvalidRequest" and "lag" in problem["detail"], problem


def test_the_token_still_guards_it(members: Members) -> None:
    assert call(members.a, "GET", "/v1/cluster?lag=true")[0] == 401


def test_a_single_server_lists_itself_as_its_one_member(served: Served) -> None:
    served.engine.append(Batch("c", "a1", [Message.user("hi")]))
    status, _, tree = call(served.url, "GET", "/v1/cluster?lag=true")
    assert status == 200
    assert tree["members"] == [{"url": served.url, "partitions": [0], "lag": {"0": 0}, "reachable": True}]
    assert "members" not in call(served.url, "GET", "/v1/cluster")[2]


def test_the_document_lists_the_lag_parameter(served: Served) -> None:
    doc = call(served.url, "GET", "/openapi.json")[2]
    op = doc["paths"]["/v1/cluster"]["get"]
    (lag,) = [p for p in op["parameters"] if p["name"] == "lag"]
    assert lag["in"] == "query" and lag["required"] is False and lag["schema"] == {"type": "boolean"}
    assert "400" in op["responses"]
    assert "members" in doc["components"]["schemas"]["ClusterOut"]["properties"]
    assert "MemberOut" in doc["components"]["schemas"]


def _raw(url: str, path: str) -> bytes:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", path, headers=AUTH)
        response = conn.getresponse()
        assert response.status == 200
        return response.read()
    finally:
        conn.close()

