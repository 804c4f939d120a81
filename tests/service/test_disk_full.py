"""A server whose disk fills: it says so on ``/readyz``, refuses without a ``Retry-After`` (a retry
on this process cannot succeed), exits 4 for its supervisor, and once the disk is enlarged a
restart on the same directory serves every acknowledged append, once.

A real ``histlog serve`` child process on a small tmpfs (mounted here: needs root, as CI has;
skipped elsewhere), filled through HTTP, then enlarged with ``mount -o remount``."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from engine.cli import serve
from tests.service.load_support import START_S, ServerProcess, wait_ready

SMALL, LARGE = "16m", "96m"
TEXT = "x" * 60_000  # about 90 appends fill 16 MiB
MAX_APPENDS = 1000  # bound: the disk is full long before


def _mount(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of ``SMALL`` bytes at ``tmp_path/disk``, unmounted at the end."""
    where = tmp_path / "disk"
    where.mkdir()
    mounted = _mount(["mount", "-t", "tmpfs", "-o", f"size={SMALL}", "tmpfs", str(where)])
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}): this test needs root")
    try:
        yield where
    finally:
        _mount(["umount", "-l", str(where)])


def _body(i: int) -> dict[str, object]:
    return {"messages": [{"role": "user", "parts": [{"kind": "text", "text": f"{i} {TEXT}"}]}]}


def test_a_full_disk_fail_stops_the_server_which_exits_and_recovers_on_restart(disk: Path, tmp_path: Path) -> None:
    data, log = disk / "data", tmp_path / "server.log"

    async def fill(url: str) -> tuple[list[int], httpx.Response, httpx.Response, httpx.Response]:
        acknowledged: list[int] = []
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            await wait_ready(http)
            for i in range(MAX_APPENDS):
                r = await http.put(f"/v1/conversations/c/appends/a{i}", json=_body(i))
                if r.status_code != 200:
                    break
                acknowledged.append(i)
            else:
                raise AssertionError(f"{MAX_APPENDS} appends of 60 kB fitted on a {SMALL} disk")
            after = await http.put("/v1/conversations/c/appends/after", json=_body(-1))
            ready = await http.get("/readyz")
            return acknowledged, r, after, ready

    with ServerProcess(data, log) as server:
        acknowledged, failed, after, ready = asyncio.run(fill(server.url))
        assert failed.status_code in (503, 504), failed.text  # 504: the one whose decision was lost
        assert after.status_code == 503 and after.json()["title"] in ("StateUnavailable", "LogUnavailable")
        assert "retry-after" not in after.headers  # a retry on this process cannot succeed
        assert ready.status_code == 503 and ready.json()["title"] == after.json()["title"]
        assert "no space left" in ready.json()["detail"].lower()
        assert server.wait(timeout=serve.FAIL_STOP_GRACE + START_S) == 4  # for its supervisor to restart it
    assert "fail-stopped" in log.read_text() and "exit 4" in log.read_text()
    assert len(acknowledged) > 10

    assert _mount(["mount", "-o", f"remount,size={LARGE}", str(disk)]).returncode == 0

    async def check(url: str) -> tuple[list[str], int]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            await wait_ready(http)
            rows = (await http.get("/v1/conversations/c/messages")).json()["messages"]
            new = await http.put("/v1/conversations/c/appends/new", json=_body(-2))
            return [row["append_id"] for row in rows], new.status_code

    with ServerProcess(data, log) as again:
        ids, new_status = asyncio.run(check(again.url))
        again.terminate()
        assert again.wait() == 0
    assert new_status == 200
    assert len(ids) == len(set(ids))  # nothing twice
    assert {f"a{i}" for i in acknowledged} <= set(ids)  # every acknowledged append, after the restart
    assert set(ids) - {f"a{i}" for i in acknowledged} <= {f"a{len(acknowledged)}", "new"}  # and the unsettled one
