"""The examples of ``/openapi.json`` are requests the server accepts: every request-body example
(``engine.service.examples``) is sent to a real server over loopback, after what it says it
relies on (``after``), and answered 2xx; so is every GET on a conversation built from the
query-parameter examples. The document shows exactly the examples of the route table."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote, urlencode

import orjson

from engine.service.examples import APPEND
from engine.service.routes import OPS
from tests.service.conftest import Served
from tests.service.server_support import call

MESSAGE = "turn-1/1"  # the user's "Hi" of the append example stored as turn-1


def _prepare(url: str, c: str, after: tuple[str, ...]) -> None:
    for step in after:
        if step == "turn-1":
            status, _, body = call(url, "PUT", f"/v1/conversations/{quote(c, safe='')}/appends/turn-1",
                                   orjson.dumps(APPEND[0].value))
        elif step == "run-1":
            status, _, body = call(url, "POST", f"/v1/conversations/{quote(c, safe='')}/runs/run-1")
            assert body["epoch"] == 1, body
        else:
            raise AssertionError(f"an example relies on {step!r}: teach this test how to prepare it")
        assert status == 200, (step, body)


def _path(template: str, c: str, name: str) -> str:
    values = {"c": c, "a": f"ex-{name}", "m": MESSAGE}
    unknown = set(re.findall(r"\{(\w+)\}", template)) - set(values)
    assert not unknown, f"{template}: teach this test a value for {unknown}"
    return re.sub(r"\{(\w+)\}", lambda m: quote(values[m.group(1)], safe=""), template)


def test_every_request_body_example_is_accepted_by_a_real_server(served: Served) -> None:
    doc = call(served.url, "GET", "/openapi.json")[2]
    sent = 0
    for op in OPS:
        body = doc["paths"][op.path][op.method.lower()].get("requestBody")
        shown: dict[str, Any] = body["content"]["application/json"].get("examples", {}) if body else {}
        assert {n: e["value"] for n, e in shown.items()} == {e.name: e.value for e in op.examples}, op.name
        for example in op.examples:
            c = f"examples/{op.name}/{example.name}"
            _prepare(served.url, c, example.after)
            status, _, answer = call(served.url, op.method, _path(op.path, c, example.name),
                                     orjson.dumps(example.value))
            assert 200 <= status < 300, (op.method, op.path, example.name, answer)
            sent += 1
    assert sent >= 8  # append (4), assets, delete, by-ids, clear by prefix
    names = {e.name for e in APPEND}
    assert {"append", "expected_last", "replaces", "fence"} <= names


def test_every_query_parameter_example_is_accepted_on_a_conversation(served: Served) -> None:
    c = "examples/query"
    _prepare(served.url, c, ("turn-1",))
    doc = call(served.url, "GET", "/openapi.json")[2]
    asked = set()
    for path, item in doc["paths"].items():
        op = item.get("get")
        if op is None or set(re.findall(r"\{(\w+)\}", path)) != {"c"}:
            continue
        params = [p for p in op["parameters"] if p["in"] == "query"]
        if not any("example" in p for p in params) or any(p["required"] and "example" not in p for p in params):
            continue
        query = {p["name"]: str(p["example"]).lower() if isinstance(p["example"], bool) else str(p["example"])
                 for p in params if "example" in p}
        status, _, answer = call(served.url, "GET", f"{_path(path, c, 'q')}?{urlencode(query)}")
        assert status == 200, (path, query, answer)
        asked.add(path)
    assert {"/v1/conversations/{c}/window", "/v1/conversations/{c}/messages",
            "/v1/conversations/{c}/budget"} <= asked, asked
