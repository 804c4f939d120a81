"""A real uvicorn server on 127.0.0.1 (a free port) in a background thread, for tests.

``running(app)`` / ``serving(engine)`` are context managers that yield the base URL once the
server is accepting (bounded wait on uvicorn's ``started`` flag) and stop it on exit (bounded
wait for its thread). The engine is the caller's: the server never closes it.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import uvicorn
from starlette.types import ASGIApp

from engine.facade import HistoryEngine
from engine.service.app import build_app

__all__ = ["STARTUP_TIMEOUT", "call", "running", "serving"]

STARTUP_TIMEOUT = 10.0
STOP_TIMEOUT = 10.0


@contextmanager
def running(app: ASGIApp, **config: Any) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 port 0; yield ``http://127.0.0.1:PORT``."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off",
                                           **config))
    thread = threading.Thread(target=server.run, name="test-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while not server.started:  # uvicorn offers a flag, not an event: poll it, bounded
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError("the test server did not start within the startup timeout")
        time.sleep(0.005)
    try:
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(STOP_TIMEOUT)


@contextmanager
def serving(engine: HistoryEngine, **options: Any) -> Iterator[str]:
    """``build_app(engine, **options)`` served by ``running``; yields its base URL."""
    with running(build_app(engine, **options)) as url:
        yield url


def call(url: str, method: str, path: str, body: bytes | str | dict[str, Any] | None = None, *,
         headers: dict[str, str] | None = None, timeout: float = 10.0) -> tuple[int, dict[str, str], Any]:
    """One raw HTTP/1.1 request (``http.client``, a fresh connection): ``(status, headers with
    lower-case names, parsed JSON body or None when empty)``. A dict body is sent as JSON."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    data = orjson.dumps(body) if isinstance(body, dict) else body.encode() if isinstance(body, str) else body
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request(method, path, body=data, headers=headers or {})
        response = conn.getresponse()
        raw = response.read()
        head = {k.lower(): v for k, v in response.getheaders()}
    finally:
        conn.close()
    return response.status, head, orjson.loads(raw) if raw else None
