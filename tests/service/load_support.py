"""The load and fault tests' parts: a real ``histlog serve`` subprocess, a deterministic workload
and raw HTTP drivers (httpx, one pooled client per test) whose calls the tests record in a
``tests.history_checker.History`` and check afterwards against the final histories.

The drivers speak SERVICE.md directly (paths, bodies, statuses), so these tests state the wire
contract independently of ``engine.client``; the clients are exercised on top where the tests ask
for them (the load's bots, resends after a restart). Every wait is bounded and waits on a condition.

What the checker then promises (``tests/history_checker.py``; SERVICE.md "Routes", the facade's
append contract): every acknowledged append (a 200 Receipt) is readable afterwards, whole, in
order, once; nothing is stored that was not sent; a receipt names its batch (ids, the digest
computed here), no two share a log position, and the log's order is the history's; an identical
resend returns the identical receipt; a read never shows a state that did not exist, and a read
``at_least`` a receipt shows that append.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

import httpx
import orjson

from schemas import Batch, HistoryPosition, Message, Receipt, StoredMessage, errors
from schemas.ids import AppendID
from tests.reliability.pipe_lines import PipeLines

__all__ = ["CONVERSATIONS", "START_S", "RawHTTP", "ServerProcess", "append_body", "append_path", "batch_of",
           "conversation_of", "pool", "refuses_connections", "run_clients", "wait_ready"]

REPO = Path(__file__).resolve().parents[2]
START_S = 60.0  # bound on a server start (replay included) and on its exit
CONVERSATIONS = 16  # the clients share these, so appends to one conversation interleave


def conversation_of(client: int) -> str:
    """Client ``client``'s conversation: a ``/`` and a space in it, so every path is percent-encoded."""
    return f"load/conv {client % CONVERSATIONS}"


def batch_of(client: int, i: int) -> Batch:
    """Client ``client``'s ``i``-th batch: a 2-message turn naming its own append id."""
    aid = f"a-{client}-{i}"
    return Batch(conversation_of(client), aid, [Message.user(f"question {aid}"), Message.assistant(f"answer {aid}")])


def _seg(s: str) -> str:
    return quote(s, safe="")


def append_path(b: Batch) -> str:
    return f"/v1/conversations/{_seg(str(b.conversation_id))}/appends/{_seg(str(b.append_id))}"


def append_body(b: Batch) -> bytes:
    """``{"messages":[Message...]}``, each message in its ``model_dump_json()`` form."""
    return orjson.dumps({"messages": [orjson.Fragment(m.model_dump_json()) for m in b.messages]})


class RawHTTP:
    """The calls the load tests make, spoken as SERVICE.md states them on one pooled
    ``httpx.AsyncClient``: the method names of ``AsyncHistoryClient`` (so ``AsyncRecorded`` records
    them), the wire parsed here rather than by ``engine.client``. An error answer raises the
    class its problem+json names, with its detail; an answer that is no histlog problem (a 500, a
    proxy's page) raises ``AssertionError`` naming the status and body; transport errors
    propagate as httpx's own."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    async def append(self, b: Batch) -> Receipt:
        """``PUT .../appends/{a}``: the Receipt of a 200."""
        r = await self.http.put(append_path(b), content=append_body(b), headers={"content-type": "application/json"})
        return Receipt.from_dict(_answer(r, f"append {b.append_id}"))

    async def entries(self, conversation: str) -> list[StoredMessage]:
        """``GET .../messages``: every visible StoredMessage."""
        r = await self.http.get(f"/v1/conversations/{_seg(conversation)}/messages")
        return [_stored(row) for row in _answer(r, f"messages of {conversation!r}")["messages"]]

    async def window(self, conversation: str, limit: int) -> list[Message]:
        """``GET .../window?limit=``: the last ``limit`` messages as Message objects."""
        r = await self.http.get(f"/v1/conversations/{_seg(conversation)}/window", params={"limit": limit})
        return [Message.model_validate(m) for m in _answer(r, f"window of {conversation!r}")["messages"]]

    async def finals(self, conversations: Iterable[str]) -> dict[str, list[StoredMessage]]:
        """The final entries of each conversation: one member's part of ``check``'s ``finals``."""
        return {c: await self.entries(c) for c in conversations}


def _answer(r: httpx.Response, what: str) -> Any:
    """A 200's JSON, else the error the answer names (see ``RawHTTP``)."""
    if r.status_code == 200:
        return r.json()
    problem = r.json() if r.headers.get("content-type", "").startswith("application/problem+json") else {}
    cls = getattr(errors, str(problem.get("title", "")), None)
    assert isinstance(cls, type) and issubclass(cls, errors.HistoryError), \
        f"{what}: {r.status_code} is not a histlog problem: {r.text[:300]}"
    exc = cls.__new__(cls)  # some classes' constructors want more than the message
    Exception.__init__(exc, f"{what}: {r.status_code} {problem.get('detail')}")
    raise exc


def _stored(row: dict[str, Any]) -> StoredMessage:
    """A StoredMessage from its wire form (SERVICE.md "Representations")."""
    return StoredMessage(row["id"], Message.model_validate(row["message"]), HistoryPosition.parse(row["position"]),
                         AppendID(row["append_id"]), datetime.fromisoformat(row["created_at"]),
                         row.get("superseded_by"), row.get("reason"))


async def run_clients(n: int, work: Callable[[int], Awaitable[None]]) -> None:
    """Run ``work(client)`` for ``n`` clients at once; re-raises the first failure."""
    await asyncio.gather(*(work(k) for k in range(n)))


def pool(url: str, clients: int, timeout: float = 30.0) -> httpx.AsyncClient:
    """One keep-alive pool with a connection per client (no queueing inside httpx)."""
    return httpx.AsyncClient(base_url=url, timeout=timeout,
                             limits=httpx.Limits(max_connections=clients, max_keepalive_connections=clients))


class ServerProcess:
    """``python3 -m engine --data DIR serve --listen 127.0.0.1:0`` as a child process.

    ``start()`` returns once the server printed ``listening=URL``; stderr goes to ``log`` (read it
    when a test fails). ``kill()`` is kill -9; ``terminate()`` is SIGTERM; ``wait()`` the exit code.
    A context manager: leaving it kills a server still running, so no test leaks one."""

    def __init__(self, data: Path, log: Path, *extra: str) -> None:
        self.data, self.log_path, self.extra = data, log, extra
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self._log: IO[bytes] | None = None

    def start(self) -> ServerProcess:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine", "--data", str(self.data), "serve", "--listen", "127.0.0.1:0", *self.extra],
            cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._log, bufsize=0)
        assert self.proc.stdout is not None
        line = PipeLines(self.proc.stdout.fileno()).line(time.monotonic() + START_S)
        assert line is not None and line.startswith(b"listening=http://"), \
            f"the server printed {line!r}, not listening=URL; its log: {self.stderr()[-2000:]}"
        self.url = line.decode().strip().removeprefix("listening=")
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, "the server was never started"
        return self.proc.pid

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)

    def terminate(self) -> None:
        os.kill(self.pid, signal.SIGTERM)

    def wait(self, timeout: float = START_S) -> int:
        assert self.proc is not None, "the server was never started"
        return self.proc.wait(timeout=timeout)

    def stderr(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=START_S)
            assert self.proc.stdout is not None
            self.proc.stdout.close()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def wait_ready(http: httpx.AsyncClient, timeout: float = START_S) -> None:
    """Until ``/readyz`` answers 200 (caught up). Polls: readiness has no push channel over HTTP."""
    deadline = time.monotonic() + timeout
    while True:
        r = await http.get("/readyz")
        if r.status_code == 200:
            return
        assert r.status_code == 503, f"/readyz answered {r.status_code}: {r.text[:300]}"
        assert time.monotonic() < deadline, f"/readyz still {r.status_code} after {timeout} s"
        await asyncio.sleep(0.05)


def refuses_connections(url: str) -> bool:
    """True once nothing listens on ``url``'s port any more (the server stopped accepting)."""
    host, port = httpx.URL(url).host, httpx.URL(url).port
    assert port is not None, url
    try:
        socket.create_connection((host, port), timeout=1.0).close()
    except ConnectionRefusedError:
        return True
    return False

