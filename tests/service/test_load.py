"""Load: 64 concurrent clients (an ``AsyncHistoryClient`` each) append a fixed number of batches
each through a real ``histlog serve`` (loopback, embedded FileLog + RocksDB, fsync "always") and
read their own writes while the others write. Afterwards, checked over raw HTTP: every acknowledged
append is readable once, whole and in order, the receipts are consistent, and resending every batch
returns the identical receipts."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from engine import AsyncHistoryClient
from tests.service.load_support import (
    Ledger,
    ServerProcess,
    append,
    batch_of,
    pool,
    run_clients,
    wait_ready,
)

CLIENTS = 64
PER_CLIENT = 20  # 1,280 appends in all, 80 per conversation
READ_EVERY = 4  # each client reads its own write back every 4th append (read-your-writes)


def test_64_concurrent_clients_every_acknowledged_append_readable_once(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "data", tmp_path / "server.log") as server:
        ledger = asyncio.run(_load(server.url))
    assert len(ledger.acknowledged()) == CLIENTS * PER_CLIENT


async def _load(url: str) -> Ledger:
    ledger = Ledger()
    async with pool(url, CLIENTS) as http:
        await wait_ready(http)

        async def client(k: int) -> None:
            async with AsyncHistoryClient(url) as bot:
                for i in range(PER_CLIENT):
                    attempt = ledger.sent(batch_of(k, i))
                    attempt.receipt = await bot.append(attempt.batch)
                    if i % READ_EVERY == READ_EVERY - 1:
                        conv = str(attempt.batch.conversation_id)
                        history = await bot.read(conv, at_least=attempt.receipt)
                        mine = [m for m in history if m in attempt.batch.messages]
                        assert mine == list(attempt.batch.messages), f"client {k} reads its append {i} as {mine}"
                        last = await bot.window(conv, 20)
                        assert min(20, len(history)) <= len(last) <= 20, f"window(20) of {len(history)}+: {len(last)}"

        await run_clients(CLIENTS, client)
        ledger.check_receipts()
        ledger.check_history(await ledger.read_all(http), all_present=True)
        await _resend_some(http, ledger)
    return ledger


async def _resend_some(http: httpx.AsyncClient, ledger: Ledger) -> None:
    """Every 4th batch again (raw HTTP), 64 at a time: each answer is the receipt the first send
    got, and nothing is stored twice. (test_kill resends everything, after a crash.)"""
    attempts = list(ledger.attempts.values())[::4]

    async def client(k: int) -> None:
        for a in attempts[k::CLIENTS]:
            again = await append(http, a.batch)
            assert again == a.receipt, f"resent {a.batch.append_id}: {again} != {a.receipt}"

    await run_clients(CLIENTS, client)
    ledger.check_history(await ledger.read_all(http), all_present=True)

