"""Faults under load, on a real ``histlog serve`` subprocess over an embedded data dir (fsync
"always"): kill -9 mid-load and restart, and SIGTERM mid-load (it drains). Every append is
recorded in a ``History`` and the history checker judges the final entries.

kill -9: every receipt the server gave before it died stays readable, none duplicated (the
checker, before and after the resends); then every client resends every batch it sent
(acknowledged or not) and gets, for the acknowledged ones, the identical receipt, and the
unacknowledged ones land once (a commit the kill hid is deduplicated): nothing left unacknowledged.

SIGTERM: the server stops accepting, answers every request it had read (200), exits 0; a request
that got no answer was never read, so it is not in the history (none of the unknowns landed).
"""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from collections.abc import Callable, Hashable
from pathlib import Path

import httpx

from engine import AsyncHistoryClient
from schemas import Batch, Receipt
from tests.history_checker import AsyncRecorded, History, Report, check
from tests.service.load_support import (
    START_S,
    RawHTTP,
    ServerProcess,
    append_body,
    append_path,
    batch_of,
    pool,
    refuses_connections,
    run_clients,
    wait_ready,
)

CLIENTS = 64
PER_CLIENT = 8  # 512 appends at most
KILL_AFTER = 160  # acknowledged appends before the signal: by count, never by time


async def _load_until_signal(server: ServerProcess, history: History, send_signal: Callable[[], None]) -> int:
    """64 clients append (raw HTTP, recorded) until each meets a dead connection or sent its
    batches; after ``KILL_AFTER`` acknowledgements, ``send_signal()`` once. Returns how many
    appends got no answer (recorded as unknown)."""
    acks = 0
    unanswered = 0
    signalled = False
    async with pool(server.url, CLIENTS) as http:
        await wait_ready(http)

        async def client(k: int) -> None:
            nonlocal acks, unanswered, signalled
            me = AsyncRecorded(RawHTTP(http), history, k)
            for i in range(PER_CLIENT):
                batch = batch_of(k, i)
                try:
                    await me.append(batch)
                except httpx.TimeoutException:
                    raise AssertionError(f"append {batch.append_id} hung: no answer, no disconnect") from None
                except httpx.TransportError:
                    unanswered += 1
                    return  # the server went away under this request: its fate is unknown to us
                acks += 1
                if acks >= KILL_AFTER and not signalled:
                    signalled = True
                    send_signal()

        await run_clients(CLIENTS, client)
    assert signalled, f"the load ended after {acks} acknowledgements, before the signal"
    return unanswered


async def _checked(url: str, history: History) -> Report:
    """The checker's report on the server at ``url`` (its final entries, read over raw HTTP)."""
    async with pool(url, 4) as http:
        await wait_ready(http)
        return check(history, {"server": await RawHTTP(http).finals(history.conversations())}).assert_valid()


def test_kill9_mid_load_then_restart_keeps_every_receipt_and_resends_match(tmp_path: Path) -> None:
    data, history = tmp_path / "data", History()
    with ServerProcess(data, tmp_path / "server.log") as server:
        unanswered = asyncio.run(_load_until_signal(server, history, server.kill))
        assert server.wait() == -signal.SIGKILL
    assert unanswered > 0, "the kill landed after the load, not in the middle of it"
    acknowledged = [o for o in history.ops if o.outcome == "ok"]
    assert len(acknowledged) >= KILL_AFTER

    with ServerProcess(data, tmp_path / "server-2.log") as again:
        before = asyncio.run(_checked(again.url, history))  # every receipt readable, before any resend
        assert len(before.never_ok) == unanswered
        asyncio.run(_resend_everything(again.url, history))
        after = asyncio.run(_checked(again.url, history))
    assert not after.never_ok, f"resent appends still unacknowledged: {sorted(after.never_ok)[:5]}"
    sent = {(str(o.args["batch"].conversation_id), str(o.args["batch"].append_id)) for o in history.ops}
    assert after.found == sent, "every batch sent is stored after the resends"


async def _resend_everything(url: str, history: History) -> None:
    """Each client resends what it sent, in its order, through an ``AsyncHistoryClient`` (which
    retries); the checker then requires the acknowledged ones' receipts to be the first ones."""
    sent_by: dict[Hashable, list[Batch]] = {}
    for o in history.ops:
        sent_by.setdefault(o.process, []).append(o.args["batch"])

    async def resend(k: int) -> None:
        async with AsyncHistoryClient(url) as bot:
            me = AsyncRecorded(bot, history, f"resend-{k}")
            for batch in sent_by.get(k, []):
                await me.append(batch)

    await run_clients(CLIENTS, resend)


class SlowAppend:
    """One append on a raw socket whose body is sent in two halves: between them the server has
    read the request (its handler waits for the body), so it is in flight by construction."""

    def __init__(self, url: str) -> None:
        self.batch = batch_of(CLIENTS, 0)  # a client of its own: no load client sends it
        self.body = append_body(self.batch)
        u = httpx.URL(url)
        assert u.port is not None
        self.sock = socket.create_connection((u.host, u.port), timeout=START_S)
        head = (f"PUT {append_path(self.batch)} HTTP/1.1\r\nHost: {u.host}:{u.port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(self.body)}\r\n\r\n").encode()
        self.sock.sendall(head + self.body[: len(self.body) // 2])

    def finish(self) -> tuple[int, bytes]:
        """Send the rest of the body; the status and body of the answer (the server closes after)."""
        self.sock.sendall(self.body[len(self.body) // 2:])
        raw = b""
        while chunk := self.sock.recv(65536):
            raw += chunk
            head, sep, rest = raw.partition(b"\r\n\r\n")
            if sep and b"content-length:" in head.lower():
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                if len(rest) >= length:
                    break
        self.sock.close()
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 "), f"no HTTP answer to the in-flight append: {raw[:200]!r}"
        return int(head.split()[1]), body


async def _answered_probe(url: str) -> None:
    """A request on a new connection answered: the loop has handled what reached it before."""
    async with httpx.AsyncClient(base_url=url, timeout=START_S) as http:
        assert (await http.get("/healthz")).status_code == 200


def test_sigterm_under_load_drains_in_flight_requests_and_exits_0(tmp_path: Path) -> None:
    data, history = tmp_path / "data", History()
    with ServerProcess(data, tmp_path / "server.log") as server:
        in_flight = history.invoke("slow", "append", {"batch": batch_of(CLIENTS, 0)})
        slow = SlowAppend(server.url)
        asyncio.run(_answered_probe(server.url))  # the slow append's headers are read: it is in flight
        unanswered = asyncio.run(_load_until_signal(server, history, server.terminate))
        deadline = time.monotonic() + START_S
        while not refuses_connections(server.url):  # the signal is handled: no new connections
            assert time.monotonic() < deadline, "the server still accepts connections after SIGTERM"
            time.sleep(0.02)
        status, body = slow.finish()
        assert status == 200, f"the append in flight at SIGTERM got {status}: {body[:300]!r}"
        history.ok(in_flight, Receipt.from_json(body))
        assert server.wait() == 0, f"exit after SIGTERM; log: {server.stderr()[-2000:]}"

    with ServerProcess(data, tmp_path / "server-2.log") as again:
        report = asyncio.run(_checked(again.url, history))
    assert len(report.never_ok) == unanswered
    assert not report.landed, f"appends stored but never answered (not drained): {sorted(report.landed)[:5]}"
