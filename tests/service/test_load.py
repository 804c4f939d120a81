"""Load: 64 concurrent clients (an ``AsyncHistoryClient`` each) append a fixed number of batches
each through a real ``histlog serve`` (loopback, embedded FileLog + RocksDB, fsync "always") and
read their own writes while the others write, every call recorded in a ``History``. Afterwards
the history checker, against the final entries read over raw HTTP: every acknowledged append is
stored once, whole and in order, the receipts agree with each other and with the stored order,
each read ``at_least`` its receipt showed that append on a prefix of the final history, every
window was a run of it; and resending every 4th batch returns the identical receipts."""

from __future__ import annotations

import asyncio
from pathlib import Path

from engine import AsyncHistoryClient
from tests.history_checker import AsyncRecorded, History, Report, check
from tests.service.load_support import RawHTTP, ServerProcess, batch_of, pool, run_clients, wait_ready

CLIENTS = 64
PER_CLIENT = 20  # 1,280 appends in all, 80 per conversation
READ_EVERY = 4  # each client reads its own write back every 4th append (read-your-writes)
RESENT = CLIENTS * PER_CLIENT // 4  # every 4th acknowledged batch again


def test_64_concurrent_clients_every_acknowledged_append_readable_once(tmp_path: Path) -> None:
    history = History()
    with ServerProcess(tmp_path / "data", tmp_path / "server.log") as server:
        report = asyncio.run(_load(server.url, history))
    assert report.outcomes == {"append ok": CLIENTS * PER_CLIENT + RESENT,
                               "read ok": CLIENTS * PER_CLIENT // READ_EVERY,
                               "window ok": CLIENTS * PER_CLIENT // READ_EVERY}, str(report)
    assert len(report.found) == CLIENTS * PER_CLIENT and not report.never_ok
    assert report.reads_checked == 2 * CLIENTS * PER_CLIENT // READ_EVERY


async def _load(url: str, history: History) -> Report:
    async with pool(url, CLIENTS) as http:
        await wait_ready(http)
        raw = RawHTTP(http)

        async def client(k: int) -> None:
            async with AsyncHistoryClient(url) as bot:
                me = AsyncRecorded(bot, history, k)
                for i in range(PER_CLIENT):
                    batch = batch_of(k, i)
                    receipt = await me.append(batch)
                    if i % READ_EVERY == READ_EVERY - 1:
                        conv = str(batch.conversation_id)
                        seen = await me.read(conv, at_least=receipt)  # the checker: holds this batch
                        last = await me.window(conv, 20)
                        assert min(20, len(seen)) <= len(last) <= 20, f"window(20) of {len(seen)}+: {len(last)}"

        await run_clients(CLIENTS, client)
        report = check(history, {"server": await raw.finals(history.conversations())}).assert_valid()
        assert not report.never_ok, f"appends never acknowledged: {sorted(report.never_ok)[:5]}"
        await _resend_some(raw, history)
        return check(history, {"server": await raw.finals(history.conversations())}).assert_valid()


async def _resend_some(raw: RawHTTP, history: History) -> None:
    """Every 4th acknowledged batch again (raw HTTP), 64 at a time, recorded: the checker then
    requires each answer to be the receipt the first send got, and nothing stored twice.
    (test_kill resends everything, after a crash.)"""
    batches = [o.args["batch"] for o in history.ops if o.kind == "append" and o.outcome == "ok"][::4]
    assert len(batches) == RESENT

    async def client(k: int) -> None:
        me = AsyncRecorded(raw, history, f"resend-{k}")
        for batch in batches[k::CLIENTS]:
            await me.append(batch)

    await run_clients(CLIENTS, client)
