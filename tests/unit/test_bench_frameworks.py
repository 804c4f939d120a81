"""The framework benchmark compares like with like: every app it serves answers both shapes with
the same bytes, rejects a bad body with a 4xx, and is gone once its stack is stopped."""

from __future__ import annotations

import http.client
import json

import pytest

from bench import bench_frameworks as bf
from bench.fw_apps import ROWS, AppendBody, Receipt, window_out

PRESENT = [f for f, modules in bf.FRAMEWORKS.items() if not bf._missing(modules + bf.SERVERS["uvicorn"])]


def _call(conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    conn.request(method, path, body, {"Content-Type": "application/json"} if body else {})
    r = conn.getresponse()
    return r.status, r.read()


@pytest.mark.parametrize("framework", PRESENT)
def test_every_app_serves_the_same_shapes_and_stops(framework: str) -> None:
    with bf._Served(framework, "uvicorn") as served:
        conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
        try:
            status, body = _call(conn, "GET", bf.WINDOW_PATH)
            assert status == 200
            assert json.loads(body) == window_out("c-1", 20).model_dump()
            assert len(json.loads(body)["messages"]) == 20 and json.loads(body)["messages"][1]["role"] == ROWS[1][0]
            status, body = _call(conn, "PUT", "/v1/conversations/c-1/appends/a-1", bf.PUT_BODY)
            assert status == 200
            receipt = Receipt.model_validate_json(body)
            assert (receipt.conversation_id, receipt.append_id) == ("c-1", "a-1")
            assert receipt.digest.startswith("sha256:") and len(receipt.digest) == 7 + 64
            AppendBody.model_validate_json(bf.PUT_BODY)  # what every app was sent is valid
            status, _ = _call(conn, "PUT", "/v1/conversations/c-1/appends/a-2", b'{"messages":[{"role":"user"}]}')
            assert 400 <= status < 500
        finally:
            conn.close()
        proc = served.proc
    assert proc.poll() is not None


def test_only_present_stacks_are_measured_and_the_rest_are_named() -> None:
    assert "raw" in PRESENT and "starlette" in PRESENT  # the service's own dependencies
    for name, modules in bf.FRAMEWORKS.items():
        assert (name in PRESENT) == (not bf._missing(modules))
