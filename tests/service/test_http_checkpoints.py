"""Graph checkpoints over a real socket, by raw HTTP (docs/service.md "Checkpoints"): each route of
``/v1/threads/{thread}/checkpoints...`` and ``/v1/checkpoints...`` answers what the engine's call
returns (typed values as ``{"type", "data": base64}``), a checkpoint that is not there is a 404
problem, a cleared thread refuses writes as ``410 ConversationClosed``, every bad body or query is
a 400 problem naming the field with nothing written, and the routes are in ``/openapi.json``. The
last test runs a copy between two members that own different partitions (the target's puts are
sent to its owner)."""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.cluster.ownership import OwnershipMap
from engine.facade import HistoryEngine
from engine.service.app import build_app
from engine.service.routing import Router
from tests.service.conftest import Served
from tests.service.server_support import call, running
from tests.service.test_http_errors import problem

T = "/v1/threads/t%2F1/checkpoints"
IDS = ("1ef-0001", "1ef-0002", "1ef-0003")


def typed(data: bytes, type_: str = "msgpack") -> dict[str, str]:
    return {"type": type_, "data": base64.b64encode(data).decode()}


def put_body(cid: str, *, ns: str = "", parent: str | None = None, run: str | None = None,
             blobs: list[dict[str, Any]] | None = None, versions: dict[str, str] | None = None) -> dict[str, Any]:
    return {"checkpoint_ns": ns, "checkpoint_id": cid, "parent_id": parent, "run_id": run,
            "checkpoint": typed(b"cp-" + cid.encode()), "metadata": typed(b"{}", "json"),
            "versions": {"messages": cid} if versions is None else versions,
            "blobs": [{"channel": "messages", "version": cid, "value": typed(b"v-" + cid.encode())}]
            if blobs is None else blobs}


def put(served: Served, body: dict[str, Any], thread: str = T) -> tuple[int, dict[str, str], Any]:
    return call(served.url, "POST", thread, body)


def three(served: Served, thread: str = T, ns: str = "", run: str | None = None) -> None:
    parent = None
    for cid in IDS:
        assert put(served, put_body(cid, ns=ns, parent=parent, run=run), thread)[::2] == (200, {"checkpoint_id": cid})
        parent = cid


def listed(served: Served, query: str = "", thread: str = T) -> list[tuple[str, str]]:
    status, _, body = call(served.url, "GET", f"{thread}{query}")
    assert status == 200, body
    return [(c["checkpoint_ns"], c["checkpoint_id"]) for c in body["checkpoints"]]


def test_a_put_is_read_back_whole_by_id_and_as_the_latest(served: Served) -> None:
    three(served, run="run-1")
    status, head, body = call(served.url, "GET", f"{T}/latest")
    assert (status, head["content-type"]) == (200, "application/json")
    assert body == {"thread_id": "t/1", "checkpoint_ns": "", "checkpoint_id": "1ef-0003",
                    "parent_checkpoint_id": "1ef-0002", "run_id": "run-1", "checkpoint": typed(b"cp-1ef-0003"),
                    "metadata": typed(b"{}", "json"), "channel_versions": {"messages": "1ef-0003"},
                    "channel_values": {"messages": typed(b"v-1ef-0003")}, "pending_writes": []}
    first = call(served.url, "GET", f"{T}/1ef-0001")[2]
    assert (first["checkpoint_id"], first["parent_checkpoint_id"], first["channel_values"]) == (
        "1ef-0001", None, {"messages": typed(b"v-1ef-0001")})
    assert put(served, put_body("1ef-0001"))[::2] == (200, {"checkpoint_id": "1ef-0001"})  # again: a no-op
    assert served.engine.get_checkpoint("t/1", "", "1ef-0001") is not None


def test_a_channel_without_a_value_and_a_value_shared_by_later_versions(served: Served) -> None:
    body = put_body("1ef-0001", versions={"a": "1", "b": "1"},
                    blobs=[{"channel": "a", "version": "1", "value": typed(b"\x00\xff")},
                           {"channel": "b", "version": "1", "value": None}])
    assert put(served, body)[0] == 200
    later = put_body("1ef-0002", versions={"a": "1", "b": "2"},
                     blobs=[{"channel": "b", "version": "2", "value": typed(b"")}])
    assert put(served, later)[0] == 200
    got = call(served.url, "GET", f"{T}/latest")[2]
    assert got["channel_versions"] == {"a": "1", "b": "2"}
    assert got["channel_values"] == {"a": typed(b"\x00\xff"), "b": typed(b"")}
    assert call(served.url, "GET", f"{T}/1ef-0001")[2]["channel_values"] == {"a": typed(b"\x00\xff")}


def test_writes_are_kept_per_task_and_index_and_special_ones_replaced(served: Served) -> None:
    three(served)
    writes = f"{T}/1ef-0002/writes"
    body = {"task_id": "task-b", "task_path": "p", "writes": [{"idx": 0, "channel": "x", "value": typed(b"1")},
                                                              {"idx": -1, "channel": "__error__",
                                                               "value": typed(b"e1")}]}
    status, head, answer = call(served.url, "POST", writes, body)
    assert (status, head["content-type"], answer) == (200, "application/json", {})
    again = {"task_id": "task-b", "task_path": "p", "writes": [{"idx": 0, "channel": "x", "value": typed(b"2")},
                                                               {"idx": -1, "channel": "__error__",
                                                                "value": typed(b"e2")}]}
    assert call(served.url, "POST", writes, again)[0] == 200
    assert call(served.url, "POST", writes, {"task_id": "task-a", "writes": [
        {"idx": 0, "channel": "y", "value": typed(b"3")}]})[0] == 200
    pending = call(served.url, "GET", f"{T}/1ef-0002")[2]["pending_writes"]
    assert pending == [
        {"task_id": "task-a", "channel": "y", "value": typed(b"3"), "task_path": "", "idx": 0},
        {"task_id": "task-b", "channel": "__error__", "value": typed(b"e2"), "task_path": "p", "idx": -1},
        {"task_id": "task-b", "channel": "x", "value": typed(b"1"), "task_path": "p", "idx": 0}]
    assert call(served.url, "GET", f"{T}/1ef-0003")[2]["pending_writes"] == []


def test_namespaces_lists_before_and_limit(served: Served) -> None:
    three(served)
    three(served, ns="child:1")
    assert listed(served, "?ns=") == [("", "1ef-0003"), ("", "1ef-0002"), ("", "1ef-0001")]
    assert listed(served, "?ns=child%3A1&limit=2") == [("child:1", "1ef-0003"), ("child:1", "1ef-0002")]
    assert listed(served, "?before=1ef-0003&limit=3") == [("", "1ef-0002"), ("", "1ef-0001"), ("child:1", "1ef-0002")]
    assert listed(served) == [(ns, c) for ns in ("", "child:1") for c in reversed(IDS)]
    assert listed(served, "?limit=0") == []
    assert call(served.url, "GET", f"{T}/latest?ns=child%3A1")[2]["checkpoint_ns"] == "child:1"
    three(served, thread="/v1/threads/other/checkpoints")
    everything = call(served.url, "GET", "/v1/checkpoints")[2]["checkpoints"]
    assert [(c["thread_id"], c["checkpoint_id"]) for c in everything] == (
        [("other", c) for c in reversed(IDS)] + [("t/1", c) for c in reversed(IDS)] * 2)
    page = call(served.url, "GET", "/v1/checkpoints?before=1ef-0002&limit=2")[2]["checkpoints"]
    assert [(c["thread_id"], c["checkpoint_id"]) for c in page] == [("other", "1ef-0001"), ("t/1", "1ef-0001")]


def test_what_is_not_there_is_a_404(served: Served) -> None:
    problem(call(served.url, "GET", f"{T}/latest"), 404, "NotFound", "no checkpoint", "thread 't/1'")
    assert listed(served) == []
    three(served)
    problem(call(served.url, "GET", f"{T}/1ef-9999"), 404, "NotFound", "'1ef-9999'")
    problem(call(served.url, "GET", f"{T}/latest?ns=elsewhere"), 404, "NotFound", "'elsewhere'")
    problem(call(served.url, "GET", f"{T}/1ef-0001?ns=elsewhere"), 404, "NotFound")


def test_an_id_spelled_latest_is_sent_encoded(served: Served) -> None:
    assert put(served, put_body("latest"))[0] == 200
    assert call(served.url, "GET", f"{T}/%6Catest")[2]["checkpoint_id"] == "latest"
    assert call(served.url, "POST", f"{T}/%6Catest/writes", {"task_id": "t", "writes": [
        {"idx": 0, "channel": "x", "value": typed(b"1")}]})[0] == 200
    assert len(call(served.url, "GET", f"{T}/latest")[2]["pending_writes"]) == 1  # the newest is it too
    assert call(served.url, "POST", f"{T}/latest/writes", {})[0] == 404  # the raw name is the route's


def test_prune_keep_latest_then_delete(served: Served) -> None:
    three(served)
    three(served, ns="child")
    assert call(served.url, "POST", f"{T}:prune", {"strategy": "keep_latest"})[::2] == (200, {})
    assert listed(served) == [("", "1ef-0003"), ("child", "1ef-0003")]
    assert call(served.url, "GET", f"{T}/latest")[2]["channel_values"] == {"messages": typed(b"v-1ef-0003")}
    assert call(served.url, "POST", f"{T}:prune", {"strategy": "delete"})[::2] == (200, {})
    assert listed(served) == []
    three(served)  # the thread stays open
    assert len(listed(served)) == 3


def test_delete_runs_removes_those_runs_in_every_thread(served: Served) -> None:
    three(served, run="r1")
    three(served, thread="/v1/threads/u/checkpoints", run="r1")
    three(served, ns="kept", run="r2")
    status, _, body = call(served.url, "POST", "/v1/checkpoints:delete-runs", {"run_ids": ["r1", "never"]})
    assert (status, body) == (200, {})
    assert listed(served) == [("kept", c) for c in reversed(IDS)]
    assert listed(served, thread="/v1/threads/u/checkpoints") == []
    assert call(served.url, "POST", "/v1/checkpoints:delete-runs", {"run_ids": []})[::2] == (200, {})


def test_copy_keeps_ids_values_and_writes(served: Served) -> None:
    three(served)
    three(served, ns="child")
    assert call(served.url, "POST", f"{T}/1ef-0003/writes", {"task_id": "t", "writes": [
        {"idx": 0, "channel": "x", "value": typed(b"w")}]})[0] == 200
    assert call(served.url, "POST", f"{T}:copy", {"target": "copy/1"})[::2] == (200, {})
    source = call(served.url, "GET", T)[2]["checkpoints"]
    copied = call(served.url, "GET", "/v1/threads/copy%2F1/checkpoints")[2]["checkpoints"]
    assert [{**c, "thread_id": "t/1"} for c in copied] == source
    assert call(served.url, "POST", "/v1/threads/empty/checkpoints:copy", {"target": "copy/2"})[::2] == (200, {})
    assert listed(served, thread="/v1/threads/copy%2F2/checkpoints") == []


def test_a_cleared_thread_refuses_writes_as_closed_and_reads_nothing(served: Served) -> None:
    three(served)
    assert call(served.url, "DELETE", "/v1/conversations/t%2F1")[0] == 204
    problem(put(served, put_body("1ef-0004")), 410, "ConversationClosed")
    problem(call(served.url, "POST", f"{T}/1ef-0003/writes", {"task_id": "t", "writes": [
        {"idx": 0, "channel": "x", "value": typed(b"1")}]}), 410, "ConversationClosed")
    problem(call(served.url, "POST", f"{T}:prune", {"strategy": "delete"}), 410, "ConversationClosed")
    problem(call(served.url, "GET", f"{T}/latest"), 404, "NotFound")
    assert listed(served) == []
    three(served, thread="/v1/threads/src/checkpoints")
    problem(call(served.url, "POST", "/v1/threads/src/checkpoints:copy", {"target": "t/1"}), 410,
            "ConversationClosed")


_W = {"idx": 0, "channel": "x", "value": {"type": "json", "data": "e30="}}


@pytest.mark.parametrize(("body", "words"), [
    ("{not json", ("request body", "not JSON")),
    ("[]", ("expected a JSON object",)),
    ("", ("request body",)),
    ({**put_body("c1"), "extra": 1}, ("extra", "unknown member")),
    ({k: v for k, v in put_body("c1").items() if k != "checkpoint"}, ("checkpoint", "missing")),
    ({**put_body("c1"), "checkpoint_id": ""}, ("checkpoint_id",)),
    ({**put_body("c1"), "checkpoint_id": 7}, ("checkpoint_id",)),
    ({**put_body("c1"), "checkpoint_ns": "a\u0000b"}, ("checkpoint_ns", "control character U+0000")),
    ({**put_body("c1"), "parent_id": ""}, ("parent_id",)),
    ({**put_body("c1"), "run_id": "r" * 1025}, ("run_id", "longer than 1024 bytes")),
    ({**put_body("c1"), "checkpoint": {"type": "json", "data": "not base64!"}}, ("checkpoint.data",)),
    ({**put_body("c1"), "checkpoint": {"type": "json", "data": "abc"}}, ("checkpoint.data",)),
    ({**put_body("c1"), "metadata": {"type": "", "data": ""}}, ("metadata.type",)),
    ({**put_body("c1"), "metadata": ["json", ""]}, ("metadata",)),
    ({**put_body("c1"), "versions": {"a\u0001": "1"}}, ("versions", "channel", "U+0001")),
    ({**put_body("c1"), "versions": {"a": ""}}, ("versions['a']", "empty")),
    ({**put_body("c1"), "versions": {"a": 1}}, ("versions.a",)),
    ({**put_body("c1"), "blobs": [{"channel": "a", "version": "1"}]}, ("blobs[0].value", "missing")),
    ({**put_body("c1"), "blobs": [{"channel": "a", "version": "1", "value": {"type": "t\u007f", "data": ""}}]},
     ("blobs[0].value.type", "U+007F")),
    ({**put_body("c1"), "blobs": {"a": 1}}, ("blobs",)),
])
def test_a_bad_put_is_a_400_naming_the_field_and_writes_nothing(served: Served, body: Any,
                                                                 words: tuple[str, ...]) -> None:
    end = served.engine.log.end_offsets()
    problem(put(served, body), 400, "InvalidRequest", *words)
    assert served.engine.log.end_offsets() == end


@pytest.mark.parametrize(("path", "body", "words"), [
    (f"{T}/c1/writes", {"task_id": "t", "writes": []}, ("writes",)),
    (f"{T}/c1/writes", {"task_id": "t"}, ("writes", "missing")),
    (f"{T}/c1/writes", {"task_id": "", "writes": [_W]}, ("task_id",)),
    (f"{T}/c1/writes", {"task_id": "t", "writes": [{**_W, "idx": 1.0}]}, ("writes[0].idx",)),
    (f"{T}/c1/writes", {"task_id": "t", "writes": [{**_W, "idx": 2**31}]}, ("writes[0].idx",)),
    (f"{T}/c1/writes", {"task_id": "t", "writes": [{**_W, "idx": 2**31}]}, ("writes[0].idx", "2147483647")),
    (f"{T}/c1/writes", {"task_id": "t", "writes": [{**_W, "idx": -(2**31) - 1}]}, ("writes[0].idx",)),
    (f"{T}/c1/writes", {"task_id": "t", "writes": [{**_W, "idx": True}]}, ("writes[0].idx",)),
    (f"{T}/c1/writes", {"task_id": "t", "writes": [{**_W, "channel": "\n"}]}, ("writes[0].channel",)),
    (f"{T}/c1/writes", {"task_id": "t", "task_path": None, "writes": [_W]}, ("task_path",)),
    (f"{T}/c%00/writes", {"task_id": "t", "writes": [_W]}, ("checkpoint_id", "U+0000")),
    (f"{T}/c1/writes?ns=%1F", {"task_id": "t", "writes": [_W]}, ("query parameter ns", "U+001F")),
    (f"{T}/c1/writes?namespace=", {"task_id": "t", "writes": [_W]}, ("'namespace'", "unknown")),
    (f"{T}:prune", {"strategy": "runs"}, ("strategy",)),
    (f"{T}:prune", {"strategy": "everything"}, ("strategy",)),
    (f"{T}:prune", {}, ("strategy", "missing")),
    (f"{T}:copy", {"target": ""}, ("conversation",)),
    (f"{T}:copy", {"target": 5}, ("target",)),
    (f"{T}:copy", {"to": "x"}, ("to", "unknown member")),
    ("/v1/checkpoints:delete-runs", {"run_ids": "r1"}, ("run_ids",)),
    ("/v1/checkpoints:delete-runs", {"run_ids": ["r1", ""]}, ("run_ids[1]",)),
    ("/v1/checkpoints:delete-runs", {"run_ids": ["r1", 2]}, ("run_ids[1]",)),
    ("/v1/threads/%20t/checkpoints", put_body("c1"), ("conversation",)),
])
def test_a_bad_write_is_a_400_naming_the_field_and_writes_nothing(served: Served, path: str, body: Any,
                                                                  words: tuple[str, ...]) -> None:
    end = served.engine.log.end_offsets()
    status, _, answer = call(served.url, "POST", path, body)
    assert status == 400 and answer["title"] in ("InvalidRequest", "InvalidConversationID"), answer
    problem((status, {"content-type": "application/problem+json"}, answer), 400, answer["title"], *words)
    assert served.engine.log.end_offsets() == end


@pytest.mark.parametrize(("path", "words"), [
    (f"{T}?limit=-1", ("query parameter limit",)),
    (f"{T}?limit=x", ("query parameter limit",)),
    (f"{T}?before=", ("query parameter before", "empty")),
    (f"{T}?ns=a%00", ("query parameter ns", "U+0000")),
    (f"{T}?ns=a&ns=b", ("ns", "twice")),
    (f"{T}?after=1", ("'after'", "unknown")),
    (f"{T}/latest?before=1", ("'before'", "unknown")),
    (f"{T}/latest?ns=%FF", ("query string", "UTF-8")),
    (f"{T}/c%0A", ("checkpoint_id", "U+000A")),
    ("/v1/checkpoints?ns=", ("'ns'", "unknown")),
    ("/v1/checkpoints?limit=1.5", ("query parameter limit",)),
    ("/v1/threads/%20t/checkpoints/latest", ("conversation",)),
])
def test_a_bad_read_is_a_400_naming_the_parameter(served: Served, path: str, words: tuple[str, ...]) -> None:
    status, head, answer = call(served.url, "GET", path)
    assert status == 400, answer
    problem((status, head, answer), 400, answer["title"], *words)


def test_a_route_of_another_method_is_a_405(served: Served) -> None:
    assert call(served.url, "DELETE", T)[0] == 405
    assert call(served.url, "POST", f"{T}/latest", {})[0] == 405
    assert call(served.url, "GET", f"{T}:prune")[0] == 405


def test_openapi_documents_the_routes(served: Served) -> None:
    doc = call(served.url, "GET", "/openapi.json")[2]
    paths = doc["paths"]
    expected = {
        ("/v1/threads/{c}/checkpoints", "post"): "put_checkpoint",
        ("/v1/threads/{c}/checkpoints", "get"): "list_checkpoints",
        ("/v1/threads/{c}/checkpoints/latest", "get"): "latest_checkpoint",
        ("/v1/threads/{c}/checkpoints/{k}", "get"): "get_checkpoint",
        ("/v1/threads/{c}/checkpoints/{k}/writes", "post"): "put_checkpoint_writes",
        ("/v1/threads/{c}/checkpoints:prune", "post"): "prune_checkpoints",
        ("/v1/threads/{c}/checkpoints:copy", "post"): "copy_checkpoints",
        ("/v1/checkpoints", "get"): "list_all_checkpoints",
        ("/v1/checkpoints:delete-runs", "post"): "delete_checkpoint_runs",
    }
    assert {k: paths[k[0]][k[1]]["operationId"] for k in expected} == expected
    put_op = paths["/v1/threads/{c}/checkpoints"]["post"]
    assert put_op["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/PutBody"}
    assert {"200", "400", "410", "421", "503", "504"} <= set(put_op["responses"])
    assert "404" in paths["/v1/threads/{c}/checkpoints/latest"]["get"]["responses"]
    schemas = doc["components"]["schemas"]
    assert schemas["TypedModel"]["properties"]["data"]["pattern"].startswith("^")
    assert schemas["PruneBody"]["properties"]["strategy"]["enum"] == ["keep_latest", "delete"]
    assert set(schemas["StoredCheckpointModel"]["required"]) == {
        "thread_id", "checkpoint_ns", "checkpoint_id", "parent_checkpoint_id", "run_id", "checkpoint", "metadata",
        "channel_versions", "channel_values", "pending_writes"}
    listing = paths["/v1/threads/{c}/checkpoints"]["get"]
    assert [p["name"] for p in listing["parameters"] if p["in"] == "query"] == ["ns", "before", "limit"]
    assert "served here" in paths["/v1/checkpoints:delete-runs"]["post"]["summary"]
    assert "X-Histlog-Forwarded" not in [p["name"] for p in paths["/v1/checkpoints"]["get"]["parameters"]]


# ----- two members: the copy's target on another owner
def _on(partition: int, tag: str) -> str:
    return next(c for i in range(1000) if Router.partition_of(c := f"{tag}-{i}", 2) == partition)


@contextlib.contextmanager
def _members(tmp_path: Path) -> Iterator[tuple[str, str, HistoryEngine, HistoryEngine]]:
    """Two servers, each over its own engine of two partitions: A owns partition 0, B partition 1."""
    urls: dict[str, str] = {}

    def source(name: str) -> Any:
        return lambda: OwnershipMap("g", 1, 2, urls[name], {0: urls["a"], 1: urls["b"]})

    with contextlib.ExitStack() as stack:
        ea = stack.enter_context(HistoryEngine.open(tmp_path / "a", partitions=2))
        eb = stack.enter_context(HistoryEngine.open(tmp_path / "b", partitions=2))
        urls["a"] = stack.enter_context(running(build_app(ea, ownership=source("a"))))
        urls["b"] = stack.enter_context(running(build_app(eb, ownership=source("b"))))
        yield urls["a"], urls["b"], ea, eb


def test_in_a_cluster_a_copy_sends_the_targets_records_to_its_owner(tmp_path: Path) -> None:
    src, dst = _on(0, "src"), _on(1, "dst")
    with _members(tmp_path) as (a, b, ea, eb):
        for cid in IDS:
            assert call(b, "POST", f"/v1/threads/{src}/checkpoints", put_body(cid))[0] == 200  # forwarded to A
        assert call(a, "POST", f"/v1/threads/{src}/checkpoints/1ef-0003/writes", {"task_id": "t", "writes": [
            {"idx": 0, "channel": "x", "value": typed(b"w")}]})[0] == 200
        assert len(list(ea.list_checkpoints(src))) == 3 and list(eb.list_checkpoints()) == []
        assert call(b, "POST", f"/v1/threads/{src}/checkpoints:copy", {"target": dst})[::2] == (200, {})
        assert [c.checkpoint_id for c in eb.list_checkpoints(dst)] == list(reversed(IDS))  # on the owner
        assert list(ea.list_checkpoints(dst)) == []
        copied = call(a, "GET", f"/v1/threads/{dst}/checkpoints")[2]["checkpoints"]  # forwarded to B
        source = call(b, "GET", f"/v1/threads/{src}/checkpoints")[2]["checkpoints"]
        assert [{**c, "thread_id": src} for c in copied] == source
        assert source[0]["pending_writes"][0]["value"] == typed(b"w")
        assert call(a, "POST", f"/v1/threads/{src}/checkpoints:copy", {"target": _on(0, "near")})[0] == 200
        assert len(list(ea.list_checkpoints(_on(0, "near")))) == 3
