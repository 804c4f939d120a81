"""The load and fault tests' parts: a real ``histlog serve`` subprocess, a deterministic workload,
raw HTTP drivers (httpx, one pooled client per test) and the ledger that checks what was promised.

The drivers speak SERVICE.md directly (paths, bodies, statuses), so these tests state the wire
contract independently of ``engine.client``; the clients are exercised on top where the brief asks
for them (resends after a restart). Every wait is bounded and waits on a condition.

What the ledger promises to check (SERVICE.md "Routes", the facade's append contract):
* every acknowledged append (a 200 Receipt) is readable afterwards, its messages in order, once;
* no append id appears twice in a conversation, acknowledged or not;
* a receipt names its batch (ids, the digest computed here) and no two receipts share a position;
* an identical resend returns the identical receipt (digest and position).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

import httpx
import orjson

from schemas import Batch, Message, Receipt
from tests.reliability.pipe_lines import PipeLines

__all__ = ["CONVERSATIONS", "Attempt", "Ledger", "ServerProcess", "append", "batch_of", "conversation_of",
           "entries", "pool", "refuses_connections", "run_clients",
           "wait_ready", "window"]

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


async def append(http: httpx.AsyncClient, b: Batch) -> Receipt:
    """PUT the batch; its Receipt on 200, else ``AssertionError`` naming the status and body
    (transport errors propagate as httpx's own)."""
    r = await http.put(append_path(b), content=append_body(b), headers={"content-type": "application/json"})
    assert r.status_code == 200, f"append {b.append_id}: {r.status_code} {r.text[:300]}"
    return Receipt.from_dict(r.json())


async def entries(http: httpx.AsyncClient, conversation: str, at_least: Receipt | None = None) -> list[dict[str, Any]]:
    """``GET .../messages`` (every visible StoredMessage), optionally read-your-writes."""
    params = {} if at_least is None else {"at_least": f"{at_least.position.partition}:{at_least.position.offset}"}
    r = await http.get(f"/v1/conversations/{_seg(conversation)}/messages", params=params)
    assert r.status_code == 200, f"messages of {conversation!r}: {r.status_code} {r.text[:300]}"
    out: list[dict[str, Any]] = r.json()["messages"]
    return out


async def window(http: httpx.AsyncClient, conversation: str, limit: int) -> list[dict[str, Any]]:
    """``GET .../window?limit=`` (the last ``limit`` messages as Message objects)."""
    r = await http.get(f"/v1/conversations/{_seg(conversation)}/window", params={"limit": limit})
    assert r.status_code == 200, f"window of {conversation!r}: {r.status_code} {r.text[:300]}"
    out: list[dict[str, Any]] = r.json()["messages"]
    return out


@dataclass
class Attempt:
    """One append sent: its batch and, once the server answered 200, its receipt."""

    batch: Batch
    receipt: Receipt | None = None


@dataclass
class Ledger:
    """Every append attempted (in send order) and what the server acknowledged."""

    attempts: dict[str, Attempt] = field(default_factory=dict)  # by append id (unique in the workload)

    def sent(self, b: Batch) -> Attempt:
        return self.attempts.setdefault(str(b.append_id), Attempt(b))

    def acknowledged(self) -> list[Attempt]:
        return [a for a in self.attempts.values() if a.receipt is not None]

    def conversations(self) -> list[str]:
        return sorted({str(a.batch.conversation_id) for a in self.attempts.values()})

    def check_receipts(self) -> None:
        """Each receipt names its batch (ids, digest) and holds a log position of its own."""
        positions: Counter[tuple[int, int]] = Counter()
        for a in self.acknowledged():
            r = a.receipt
            assert r is not None  # Invariant: acknowledged() keeps only attempts with receipts.
            assert (str(r.conversation_id), str(r.append_id), r.digest) == (
                str(a.batch.conversation_id), str(a.batch.append_id), a.batch.digest), f"receipt {r} is not its batch's"
            positions[(r.position.partition, r.position.offset)] += 1
        shared = [p for p, n in positions.items() if n > 1]
        assert not shared, f"receipts share log positions {shared[:5]}"

    def check_history(self, histories: dict[str, list[dict[str, Any]]], *, all_present: bool = False) -> set[str]:
        """Every acknowledged append readable once, whole and in order; no append id twice;
        nothing the workload did not send. With ``all_present``, every attempt must be there
        (after resending everything). Returns the append ids found."""
        found: set[str] = set()
        for conv, rows in histories.items():
            runs: list[tuple[str, list[str]]] = []  # consecutive rows of one append id
            for row in rows:
                if runs and runs[-1][0] == row["append_id"]:
                    runs[-1][1].append(row["message"]["parts"][0]["text"])
                else:
                    runs.append((row["append_id"], [row["message"]["parts"][0]["text"]]))
            ids = [aid for aid, _ in runs]
            twice = [aid for aid, n in Counter(ids).items() if n > 1]
            assert not twice, f"{conv!r}: append ids stored twice: {twice[:5]}"
            for aid, texts in runs:
                attempt = self.attempts.get(aid)
                assert attempt is not None, f"{conv!r}: an append nobody sent: {aid!r}"
                assert str(attempt.batch.conversation_id) == conv, f"{aid} stored in {conv!r}"
                assert texts == [m.text() for m in attempt.batch.messages], f"{conv!r}: {aid} torn or changed: {texts}"
            found.update(ids)
        missing = sorted(str(a.batch.append_id) for a in self.acknowledged() if str(a.batch.append_id) not in found)
        assert not missing, f"{len(missing)} acknowledged appends are not readable: {missing[:5]}"
        if all_present:
            absent = sorted(set(self.attempts) - found)
            assert not absent, f"{len(absent)} resent appends are not readable: {absent[:5]}"
        return found

    async def read_all(self, http: httpx.AsyncClient) -> dict[str, list[dict[str, Any]]]:
        return {c: await entries(http, c) for c in self.conversations()}


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

