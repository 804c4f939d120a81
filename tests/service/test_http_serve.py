"""``histlog serve`` as a process: the one ``listening=`` line, the public-bind refusal, the token,
and SIGTERM draining a request in flight before closing the engine and exiting 0."""

from __future__ import annotations

import http.client
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from engine.facade import HistoryEngine
from tests.service.server_support import call

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 20.0
HI = orjson.dumps({"messages": [{"role": "user", "parts": [{"kind": "text", "text": "hi"}]}]})


def start(data: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "engine", "--data", str(data), "serve", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def listening(proc: subprocess.Popen[bytes]) -> str:
    """The URL of the ``listening=`` line (bounded wait)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + TIMEOUT
    line = b""
    while not line.endswith(b"\n"):
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise AssertionError("no listening= line within the timeout")
        byte = os.read(proc.stdout.fileno(), 1)
        if not byte:
            raise AssertionError(f"serve exited: {proc.wait(TIMEOUT)} {proc.stderr.read() if proc.stderr else b''!r}")
        line += byte
    assert line.startswith(b"listening=http://127.0.0.1:"), line
    return line.decode().strip().removeprefix("listening=")


def wait_refused(host: str, port: int) -> None:
    """Return once a new connection to ``host:port`` is refused (bounded)."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=1).close()
        except ConnectionRefusedError:
            return
        select.select([], [], [], 0.01)
    raise AssertionError("the server still accepts connections after SIGTERM")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    proc = start(tmp_path / "data", "--listen", "127.0.0.1:0")
    try:
        yield proc, listening(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(TIMEOUT)


def test_serve_prints_one_listening_line_answers_and_exits_0_on_sigterm(
        server: tuple[subprocess.Popen[bytes], str], tmp_path: Path) -> None:
    proc, url = server
    assert int(url.rsplit(":", 1)[1]) > 0
    assert call(url, "PUT", "/v1/conversations/c/appends/a", HI)[0] == 200
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, err
    assert out == b""  # the listening line was the only one
    assert b"Traceback" not in err
    with HistoryEngine.open(tmp_path / "data") as engine:  # closed cleanly: the data dir opens again
        assert len(engine.entries("c")) == 1


def test_sigint_also_stops_cleanly(server: tuple[subprocess.Popen[bytes], str]) -> None:
    proc, _ = server
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0


def test_a_request_in_flight_during_sigterm_completes(server: tuple[subprocess.Popen[bytes], str]) -> None:
    proc, url = server
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT) as sock:
        sock.sendall(b"PUT /v1/conversations/c/appends/a HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(HI))
        # "100 Continue" comes when the handler starts reading the body: the request is in flight
        assert sock.recv(100).startswith(b"HTTP/1.1 100")
        proc.send_signal(signal.SIGTERM)
        wait_refused(host, int(port))  # shutdown has begun: the server no longer accepts
        sock.sendall(HI)
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 200 "), answer
    proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0


def test_a_public_listen_without_a_token_exits_2_with_one_line(tmp_path: Path) -> None:
    proc = start(tmp_path / "data", "--listen", "0.0.0.0:0")
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 2 and out == b""
    assert len(err.decode().strip().splitlines()) == 1 and b"--insecure" in err


def test_a_token_file_protects_v1(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t0ken\n")
    proc = start(tmp_path / "data", "--listen", "127.0.0.1:0", "--token-file", str(tmp_path / "token"))
    try:
        url = listening(proc)
        assert call(url, "GET", "/v1/stats")[0] == 401
        assert call(url, "GET", "/v1/stats", headers={"Authorization": "Bearer t0ken"})[0] == 200
        assert call(url, "GET", "/healthz")[0] == call(url, "GET", "/readyz")[0] == 200  # probes need no token
        host, port = url.removeprefix("http://").rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT)  # /metrics is text, not JSON
        conn.request("GET", "/metrics")
        assert conn.getresponse().status == 401
        conn.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0


def test_the_token_env_var_and_max_body(tmp_path: Path) -> None:
    proc = start(tmp_path / "data", "--listen", "127.0.0.1:0", "--max-body", "10", env={"HISTLOG_TOKEN": "e"})
    try:
        url = listening(proc)
        status, _, body = call(url, "PUT", "/v1/conversations/c/appends/a", HI, headers={"Authorization": "Bearer e"})
        assert (status, body["title"]) == (413, "InvalidBatch")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=TIMEOUT)
