"""Routing between cluster members (SERVICE.md "Cluster"), on real servers over loopback.

Two full-replica members (each a Kafka engine consuming every partition of ONE topic, each
served by an in-process uvicorn) are given a static ownership map through ``build_app``'s
``ownership=`` (what membership passes in production; no public flag): A owns partitions 0 and 1,
B owns 2 and 3. Both require a bearer token. What is proven, by raw HTTP and by the clients:

- a non-owner forwards (one hop, the owner's receipt; auth relayed; ids with ``/`` intact),
  a forwarded request meeting a non-owner gets 421 (no second hop), an owner that is down or
  unknown gives 503 ``NotReady`` with ``Retry-After``;
- bad input is a 400 before any forward; a body the owner refuses comes back as its 400;
- ``GET /v1/cluster`` (and its no-cluster form), ``GET /v1/conversations`` merging both owners'
  pages, the events stream relayed (``after`` and ``Last-Event-ID``);
- ``HistoryClient([a, b])`` / ``AsyncHistoryClient`` send each request straight to its owner
  (no forward anywhere) and recover from a stale map through the 421.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine import AsyncHistoryClient, HistoryClient
from engine.cluster import OwnershipMap
from engine.facade import HistoryEngine
from engine.service.app import build_app
from engine.service.events import EventHub
from engine.service.forward import Forwarder
from engine.service.health import observability
from engine.service.routes import merge_pages
from engine.service.routing import Router
from engine.service.wire import FORWARDED_HEADER
from schemas.batch import Batch, Receipt
from schemas.errors import LogUnavailable
from schemas.messages import Message
from tests.kafka_broker import unique_topic
from tests.service.conftest import Served
from tests.service.server_support import call, running

PARTITIONS = 4
TOKEN = "cluster-routing-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GROUP = "test-group"


@dataclass
class Owners:
    """The static map both members read (a test swaps it; each member sees it as its own)."""

    owners: dict[int, str] = field(default_factory=dict)
    generation: int = 1

    def source(self, self_url: Callable[[], str]) -> Callable[[], OwnershipMap]:
        return lambda: OwnershipMap(GROUP, self.generation, PARTITIONS, self_url(), dict(self.owners))

    @contextlib.contextmanager
    def swapped(self, owners: Mapping[int, str]) -> Iterator[None]:
        saved, self.owners = self.owners, dict(owners)
        self.generation += 1
        try:
            yield
        finally:
            self.owners = saved
            self.generation += 1


@dataclass
class Member:
    url: str
    engine: HistoryEngine
    forwarder: Forwarder
    hub: EventHub


@dataclass
class Cluster:
    a: Member
    b: Member
    owners: Owners

    def owner(self, c: str) -> Member:
        return self.a if Router.partition_of(c, PARTITIONS) < 2 else self.b

    def other(self, c: str) -> Member:
        return self.b if self.owner(c) is self.a else self.a


@pytest.fixture(scope="module")
def cluster(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    topic = unique_topic("histlog-route")
    root = tmp_path_factory.mktemp("route")
    owners = Owners()
    with contextlib.ExitStack() as stack:
        members: list[Member] = []
        for name in ("a", "b"):
            engine = stack.enter_context(HistoryEngine.open(kafka=kafka_bootstrap, topic=topic,
                                                            state_dir=root / name, partitions=PARTITIONS))
            obs = observability(engine, heartbeat=1.0)
            cell: list[str] = []  # this member's URL, known once it listens
            app = build_app(engine, token=TOKEN, ownership=owners.source(functools.partial(cell.__getitem__, 0)),
                            **obs.app_options())  # type: ignore[arg-type]
            url = stack.enter_context(running(app))
            stack.callback(obs.close)  # first out: ends the streams so the servers can stop
            cell.append(url)
            members.append(Member(url, engine, app.forwarder, obs.hub))
        a, b = members
        owners.owners = {0: a.url, 1: a.url, 2: b.url, 3: b.url}
        yield Cluster(a, b, owners)


def conversation(partition: int, tag: str = "") -> str:
    """A fresh conversation id (with a ``/`` and a non-ASCII letter) on ``partition``."""
    base = f"route/{tag or uuid.uuid4().hex[:8]} é"
    for i in range(10_000):
        c = f"{base}-{i}"
        if Router.partition_of(c, PARTITIONS) == partition:
            return c
    raise AssertionError("no id found")  # pragma: no cover


def path(c: str, rest: str = "") -> str:
    return f"/v1/conversations/{quote(c, safe='')}{rest}"


def put(url: str, c: str, a: str, text: str, *, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    status, _, body = call(url, "PUT", path(c, f"/appends/{quote(a, safe='')}"),
                           {"messages": [{"role": "user", "parts": [{"kind": "text", "text": text}]}]},
                           headers=AUTH if headers is None else headers)
    return status, body


def count(url: str, method: str, route: str, status: int) -> float:
    """``histlog_http_requests_total`` of one server for one route template and status."""
    text = httpx.get(url + "/metrics", headers=AUTH, timeout=10).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "histlog_http_requests_total" and s.labels == {
                    "method": method, "route": route, "status": str(status)}:
                return s.value
    return 0.0


APPEND = "/v1/conversations/{c}/appends/{a}"
WINDOW = "/v1/conversations/{c}/window"


def dead_url() -> str:
    """A loopback URL nothing listens on (a port bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# ----- GET /v1/cluster
def test_cluster_document_names_every_owner_and_itself(cluster: Cluster) -> None:
    for member in (cluster.a, cluster.b):
        status, _, doc = call(member.url, "GET", "/v1/cluster", headers=AUTH)
        assert status == 200
        assert doc == {"group": GROUP, "generation": cluster.owners.generation, "partitions": PARTITIONS,
                       "self": member.url, "owners": {"0": cluster.a.url, "1": cluster.a.url,
                                                      "2": cluster.b.url, "3": cluster.b.url}}
    assert call(cluster.a.url, "GET", "/v1/cluster")[0] == 401


def test_cluster_document_without_a_cluster_is_one_server_owning_all(served: Served) -> None:
    status, _, doc = call(served.url, "GET", "/v1/cluster")
    assert status == 200
    assert doc == {"group": None, "generation": -1, "partitions": 1, "self": served.url,
                   "owners": {"0": served.url}}


# ----- forwarding
def test_a_non_owner_forwards_once_and_relays_the_owners_receipt(cluster: Cluster) -> None:
    c = conversation(0)
    owner, other = cluster.a, cluster.b
    before = count(owner.url, "PUT", APPEND, 200), other.forwarder.forwarded
    status, receipt = put(other.url, c, "a-1", "hello")
    assert status == 200, receipt
    assert receipt["conversation_id"] == c and receipt["position"]["partition"] == 0
    assert count(owner.url, "PUT", APPEND, 200) == before[0] + 1  # the owner served it
    assert other.forwarder.forwarded == before[1] + 1  # one hop
    assert put(owner.url, c, "a-1", "hello") == (200, receipt)  # the owner's own receipt, idempotent
    position = f"{receipt['position']['partition']}:{receipt['position']['offset']}"
    status, _, read = call(other.url, "GET", path(c, f"/messages?at_least={position}"), headers=AUTH)
    assert status == 200 and [m["message"]["parts"][0]["text"] for m in read["messages"]] == ["hello"]


def test_the_token_is_checked_here_and_relayed_to_the_owner(cluster: Cluster) -> None:
    c = conversation(1)
    before = count(cluster.a.url, "PUT", APPEND, 401)
    status, problem = put(cluster.b.url, c, "a-1", "x", headers={})
    assert status == 401 and problem["title"] == "Unauthorized"
    assert count(cluster.a.url, "PUT", APPEND, 401) == before  # refused here, never forwarded
    assert put(cluster.b.url, c, "a-1", "x")[0] == 200  # the owner requires it too: it was relayed


def test_a_forwarded_request_meeting_a_non_owner_gets_421_not_a_second_hop(cluster: Cluster) -> None:
    c = conversation(2)  # owned by B
    forwarded_before = cluster.a.forwarder.forwarded
    windows_before = count(cluster.b.url, "GET", WINDOW, 200)
    status, _, problem = call(cluster.a.url, "GET", path(c, "/window?limit=5"),
                              headers={**AUTH, FORWARDED_HEADER: "1"})
    assert status == 421 and problem["title"] == "NotOwner", problem
    assert cluster.b.url in problem["detail"]
    assert cluster.a.forwarder.forwarded == forwarded_before
    assert count(cluster.b.url, "GET", WINDOW, 200) == windows_before


def test_an_owner_down_or_unknown_is_503_not_ready_with_retry_after(cluster: Cluster) -> None:
    c = conversation(3)
    down = {**cluster.owners.owners, 3: dead_url()}
    with cluster.owners.swapped(down):
        status, head, problem = call(cluster.a.url, "GET", path(c, "/window?limit=5"), headers=AUTH)
        assert (status, problem["title"], head.get("retry-after")) == (503, "NotReady", "1"), problem
        with HistoryClient([cluster.a.url, cluster.b.url], token=TOKEN, timeout=1.0) as client, \
                pytest.raises(LogUnavailable):
            client.window(c, 5)  # routed straight to the dead owner: no answer within the timeout
    unknown = {p: u for p, u in cluster.owners.owners.items() if p != 3}
    with cluster.owners.swapped(unknown):
        status, head, problem = call(cluster.a.url, "GET", path(c, "/window?limit=5"), headers=AUTH)
        assert (status, problem["title"], head.get("retry-after")) == (503, "NotReady", "1"), problem
        status, _, problem = call(cluster.a.url, "GET", "/v1/conversations", headers=AUTH)
        assert (status, problem["title"]) == (503, "NotReady")  # a merged list would miss partition 3


def test_bad_input_is_400_before_any_forward_and_the_owners_400_comes_back(cluster: Cluster) -> None:
    c = conversation(0)
    forwarded = cluster.b.forwarder.forwarded
    status, _, problem = call(cluster.b.url, "GET", path(c, "/window?limit=abc"), headers=AUTH)
    assert (status, problem["title"]) == (400, "InvalidRequest") and "limit" in problem["detail"]
    status, _, problem = call(cluster.b.url, "GET", "/v1/conversations/bad%01id/window?limit=5", headers=AUTH)
    assert (status, problem["title"]) == (400, "InvalidConversationID")
    assert cluster.b.forwarder.forwarded == forwarded  # decided here
    status, _, problem = call(cluster.b.url, "PUT", path(c, "/appends/a-bad"),
                              {"messages": [{"role": "user", "parts": [{"kind": "text"}]}]}, headers=AUTH)
    assert (status, problem["title"]) == (400, "InvalidBatch"), problem
    assert "parts[0].text" in problem["detail"]
    assert cluster.b.forwarder.forwarded == forwarded + 1  # the body is the owner's to judge


# ----- conversations merged
def test_conversations_merge_every_owners_pages(cluster: Cluster) -> None:
    tag = uuid.uuid4().hex[:8]
    ids = sorted(conversation(i % PARTITIONS, f"{tag}/{i}") for i in range(7))
    for c in ids:
        assert put(cluster.owner(c).url, c, "a-1", "x")[0] == 200
    prefix = f"route/{tag}"
    for member in (cluster.a, cluster.b):
        seen: list[str] = []
        after: str | None = None
        for _ in range(10):
            query = f"?prefix={quote(prefix, safe='')}&limit=3" + (f"&after={quote(after, safe='')}" if after else "")
            status, _, page = call(member.url, "GET", "/v1/conversations" + query, headers=AUTH)
            assert status == 200 and len(page["conversations"]) <= 3
            seen += page["conversations"]
            after = page["next"]
            if after is None:
                break
        assert seen == ids
    with HistoryClient([cluster.a.url, cluster.b.url], token=TOKEN) as client:
        assert client.conversations(prefix) == ids


# ----- events relayed
def test_events_stream_is_relayed_with_after_and_last_event_id(cluster: Cluster) -> None:
    c = conversation(1)  # owned by A, streamed through B
    for i in range(2):
        assert put(cluster.a.url, c, f"a-{i}", f"m{i}")[0] == 200
    with httpx.Client(headers=AUTH, timeout=10) as http:
        with http.stream("GET", cluster.b.url + path(c, "/events?after=0:0")) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            got = _messages(response.iter_lines(), 2)
        assert [text for _, text in got] == ["m0", "m1"]
        _until_no_stream(cluster.a.hub)
        with http.stream("GET", cluster.b.url + path(c, "/events"), headers={"Last-Event-ID": got[0][0]}) as response:
            assert response.status_code == 200
            assert put(cluster.a.url, c, "a-2", "m2")[0] == 200  # live, after the stream opened
            lines = response.iter_lines()  # kept: dropping the iterator closes the response
            assert [text for _, text in _messages(lines, 2)] == ["m1", "m2"]
            assert cluster.a.hub.streams == 1  # the relayed stream is the owner's stream
    _until_no_stream(cluster.a.hub)


def _until_no_stream(hub: EventHub) -> None:
    """Bounded wait until the owner has no stream left: the relay closes the owner's stream when
    its own client leaves."""
    deadline = time.monotonic() + 10
    while hub.streams:
        assert time.monotonic() < deadline, "the owner's stream outlived its relayed client"
        time.sleep(0.01)


def _messages(lines: Iterator[str], n: int) -> list[tuple[str, str]]:
    """The first ``n`` ``message`` events: (id, text)."""
    out: list[tuple[str, str]] = []
    event_id = event = None
    for line in lines:
        if line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: ") and event == "message":
            out.append((str(event_id), orjson.loads(line[6:])["message"]["parts"][0]["text"]))
            if len(out) == n:
                return out
    raise AssertionError(f"the stream ended after {out}")


# ----- the routed clients
def _batch(c: str, a: str, text: str) -> Batch:
    return Batch(c, a, [Message.user(text)])


def test_the_routed_client_sends_straight_to_each_owner(cluster: Cluster) -> None:
    cs = [conversation(p) for p in range(PARTITIONS)]
    puts = count(cluster.a.url, "PUT", APPEND, 200), count(cluster.b.url, "PUT", APPEND, 200)
    forwards = cluster.a.forwarder.forwarded, cluster.b.forwarder.forwarded
    with HistoryClient([cluster.a.url, cluster.b.url], token=TOKEN) as client:
        receipts = [client.append(_batch(c, "a-1", c)) for c in cs]
        assert [r.position.partition for r in receipts] == [0, 1, 2, 3]
        assert [client.window(c, 5)[0].text() for c in cs] == cs
    assert (count(cluster.a.url, "PUT", APPEND, 200), count(cluster.b.url, "PUT", APPEND, 200)) == (
        puts[0] + 2, puts[1] + 2)  # each owner got its own two, nobody else's
    assert (cluster.a.forwarder.forwarded, cluster.b.forwarder.forwarded) == forwards  # not one forward


def test_the_async_routed_client_sends_straight_to_each_owner(cluster: Cluster) -> None:
    cs = [conversation(p) for p in range(PARTITIONS)]
    forwards = cluster.a.forwarder.forwarded, cluster.b.forwarder.forwarded

    async def run() -> list[Receipt]:
        async with AsyncHistoryClient([cluster.a.url, cluster.b.url], token=TOKEN) as client:
            receipts = [await client.append(_batch(c, "a-1", "x")) for c in cs]
            for c, r in zip(cs, receipts, strict=True):
                assert [m.text() for m in await client.read(c, at_least=r)] == ["x"]
            return receipts

    receipts = asyncio.run(asyncio.wait_for(run(), 30))
    assert [r.position.partition for r in receipts] == [0, 1, 2, 3]
    assert (cluster.a.forwarder.forwarded, cluster.b.forwarder.forwarded) == forwards


def test_the_routed_client_recovers_from_a_stale_map_through_421(cluster: Cluster) -> None:
    c = conversation(0)
    with HistoryClient([cluster.a.url, cluster.b.url], token=TOKEN) as client:
        first = client.append(_batch(c, "a-1", "one"))  # reads the map: partition 0 -> A
        moved = {0: cluster.b.url, 1: cluster.a.url, 2: cluster.b.url, 3: cluster.b.url}
        refused = count(cluster.a.url, "PUT", APPEND, 421)
        served = count(cluster.b.url, "PUT", APPEND, 200)
        with cluster.owners.swapped(moved):
            second = client.append(_batch(c, "a-2", "two"))  # to A (stale), 421, map again, to B
            assert count(cluster.a.url, "PUT", APPEND, 421) == refused + 1
            assert count(cluster.b.url, "PUT", APPEND, 200) == served + 1
            assert client._endpoints.map is not None and client._endpoints.map.owner_of(0) == cluster.b.url
            assert [m.text() for m in client.read(c, at_least=second)] == ["one", "two"]
    assert second.position.partition == first.position.partition == 0
    assert second.position.offset > first.position.offset


def test_the_routed_client_finds_the_new_owner_of_a_dead_owners_partition(cluster: Cluster) -> None:
    c = conversation(3)
    with HistoryClient([cluster.a.url, cluster.b.url], token=TOKEN, timeout=10) as client:
        with cluster.owners.swapped({**cluster.owners.owners, 3: dead_url()}):
            client.window(conversation(0), 5)  # reads the map naming the dead owner of 3
            assert client._endpoints.map is not None and client._endpoints.map.owner_of(3) != cluster.b.url
        # the partition moved to B: the client's try at the dead owner fails, it reads the map again
        receipt = client.append(_batch(c, "a-1", "after the move"))
        assert client._endpoints.map is not None and client._endpoints.map.owner_of(3) == cluster.b.url
    assert receipt.position.partition == 3


def test_a_single_url_client_never_reads_the_map(cluster: Cluster) -> None:
    before = count(cluster.a.url, "GET", "/v1/cluster", 200)
    c = conversation(2)  # owned by B: A forwards it
    with HistoryClient(cluster.a.url, token=TOKEN) as client:
        client.append(_batch(c, "a-1", "x"))
    assert count(cluster.a.url, "GET", "/v1/cluster", 200) == before


# ----- the merge of pages, and the document
@pytest.mark.parametrize("seed", range(20))
def test_merged_pages_list_every_id_once_in_order_whatever_the_split(seed: int) -> None:
    rng = random.Random(seed)
    ids = sorted({f"c{rng.randrange(10_000):05d}" for _ in range(rng.randrange(0, 60))})
    members = rng.randrange(1, 5)
    owned: list[list[str]] = [[] for _ in range(members)]
    for i in ids:
        owned[rng.randrange(members)].append(i)
    limit = rng.randrange(1, 8)
    seen: list[str] = []
    after: str | None = None
    for _ in range(len(ids) + 2):
        pages = []
        for mine in owned:  # each member's page of the same query, as get_conversations makes it
            past = [i for i in mine if after is None or i > after]
            pages.append((past[:limit], len(past) > limit))
        page, after = merge_pages(pages, limit)
        assert len(page) <= limit
        seen += page
        if after is None:
            break
    assert seen == ids


def test_openapi_documents_the_cluster_route_and_421_on_routed_operations(served: Served) -> None:
    doc = httpx.get(served.url + "/openapi.json", timeout=10).json()
    cluster = doc["paths"]["/v1/cluster"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert cluster == {"$ref": "#/components/schemas/ClusterOut"}
    assert set(doc["components"]["schemas"]["ClusterOut"]["required"]) == {
        "group", "generation", "partitions", "self", "owners"}
    window = doc["paths"]["/v1/conversations/{c}/window"]["get"]
    assert "421" in window["responses"]
    assert any(p["name"] == FORWARDED_HEADER and p["in"] == "header" for p in window["parameters"])
    assert "421" not in doc["paths"]["/v1/stats"]["get"]["responses"]


# ----- clear by prefix
def test_clear_prefix_clears_on_every_owner_once_and_counts_them_all(cluster: Cluster) -> None:
    tag = uuid.uuid4().hex[:8]
    ids = sorted(conversation(i % PARTITIONS, f"{tag}/{i}") for i in range(6))
    for c in ids:
        assert put(cluster.owner(c).url, c, "a-1", "x")[0] == 200
    kept = conversation(1, f"{tag}-other")
    assert put(cluster.owner(kept).url, kept, "a-1", "x")[0] == 200
    status, _, body = call(cluster.a.url, "POST", "/v1/conversations:clear", {"prefix": f"route/{tag}/"},
                           headers=AUTH)
    assert (status, body) == (200, {"cleared": 6})
    for c in ids:  # closed on its owner, whoever was asked
        assert put(cluster.other(c).url, c, "a-2", "y")[0] == 410
    assert put(cluster.owner(kept).url, kept, "a-2", "y")[0] == 200
    with HistoryClient([cluster.a.url, cluster.b.url], token=TOKEN) as client:
        assert client.clear_prefix(f"route/{tag}/") == 0  # idempotent
        assert client.conversations(f"route/{tag}") == [kept]
    status, _, body = call(cluster.b.url, "POST", "/v1/conversations:clear", {"prefix": ""}, headers=AUTH)
    assert status == 400 and body["title"] == "InvalidConversationID" and "prefix" in body["detail"]


def test_a_run_begun_through_a_non_owner_fences_writes_sent_to_either_member(cluster: Cluster) -> None:
    c = conversation(0, f"runs-{uuid.uuid4().hex[:8]}")
    owner, other = cluster.owner(c).url, cluster.other(c).url
    status, _, first = call(other, "POST", path(c, "/runs/r1"), headers=AUTH)
    assert (status, first["epoch"]) == (200, 1)  # decided by the owner, relayed
    hi = {"role": "user", "parts": [{"kind": "text", "text": "hi"}]}
    assert call(other, "PUT", path(c, "/appends/a1"), {"messages": [hi], "fence": 1}, headers=AUTH)[0] == 200
    assert call(owner, "POST", path(c, "/runs/r2"), headers=AUTH)[2]["epoch"] == 2
    for url in (owner, other):
        status, _, body = call(url, "PUT", path(c, "/appends/a2"), {"messages": [hi], "fence": 1}, headers=AUTH)
        assert (status, body["title"]) == (409, "Fenced")
    assert call(other, "GET", path(c, "/runs/r1?root_turn=a1/0"), headers=AUTH)[2] == {
        "wrote_history": True, "request_message_id": "a1/0"}
    with HistoryClient([cluster.a.url, cluster.b.url], token=TOKEN) as client:
        assert client.begin_run(c, "r2").epoch == 2
        assert client.run_wrote_history(c, "r2") is False


def test_a_turn_slot_allocated_through_a_non_owner_is_decided_by_the_owner(cluster: Cluster) -> None:
    c = conversation(2, f"slots-{uuid.uuid4().hex[:8]}")  # owned by B
    owner, other = cluster.owner(c), cluster.other(c)
    hi = {"role": "user", "parts": [{"kind": "text", "text": "hi"}]}
    forwarded = other.forwarder.forwarded
    status, _, slot = call(other.url, "POST", path(c, "/turn-slots"), headers=AUTH)
    assert (status, slot["conversation_id"], slot["position"]) == (200, c, 1), slot  # decided by the owner, relayed
    assert other.forwarder.forwarded == forwarded + 1
    assert call(owner.url, "POST", path(c, "/turn-slots"), headers=AUTH)[2]["position"] == 2  # the owner's count
    turn = {"turn_id": slot["turn_id"], "position": slot["position"]}
    assert call(other.url, "PUT", path(c, "/appends/a1"), {"messages": [hi], "turn": turn}, headers=AUTH)[0] == 200
    for member in (owner, other):  # the slot is spent on the owner, whichever member is asked
        status, _, body = call(member.url, "PUT", path(c, "/appends/a2"), {"messages": [hi], "turn": turn},
                               headers=AUTH)
        assert (status, body["title"]) == (409, "SlotUnavailable"), body
    status, _, body = call(other.url, "PUT", path(c, "/appends/a3"), {"messages": [hi], "turn": {"turn_id": 1}},
                           headers=AUTH)
    assert (status, body["title"]) == (400, "InvalidRequest") and "turn" in body["detail"]
    with HistoryClient([cluster.a.url, cluster.b.url], token=TOKEN) as client:
        routed = client.allocate_turn(c)
        assert routed.position == 3
        client.append(_batch(c, "a4", "routed"), turn=routed)
        assert [(t.id, t.position) for t in client.turns(c)] == [(slot["turn_id"], 1), (routed.turn_id, 3)]
