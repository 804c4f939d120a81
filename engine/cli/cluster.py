"""``histlog --url URL cluster``: a cluster's ownership map as one member knows it, and each
owner's lag on the partitions it owns (docs/cluster.md).

What it promises: one ``GET /v1/cluster`` from the member at ``--url`` (any member), then one
``GET /v1/stats`` from each owner the map names, concurrently (``engine.client.members``, which
the server's ``GET /v1/cluster?lag=true`` uses too); a table (or ``--json``) of partition -> owner ->
records not yet applied by that owner. An owner that does not answer is shown as ``unreachable``
and the exit status is 4 (the map was still printed); a ``--url`` that does not answer is exit 4
with one line, as every command.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import TYPE_CHECKING, Any, TextIO

from engine.cli.exits import OK, UNAVAILABLE, UsageError
from engine.cli.target import Target
from engine.render import print_lines
from schemas.errors import LogUnavailable

if TYPE_CHECKING:  # httpx comes with histlog[server]: imported when the command runs
    import httpx

__all__ = ["cluster_report", "cmd_cluster"]


async def cluster_report(http: httpx.AsyncClient, url: str, timeout: float) -> dict[str, Any]:
    """The map of the member at ``url`` plus, per owner, its owned partitions and lag (or its
    error), each owner asked concurrently within ``timeout`` (``engine.client.members``, as the
    server's ``GET /v1/cluster?lag=true``)."""
    import httpx

    from engine.client.members import http_stats, members_lag

    try:
        answer = await http.get(url.rstrip("/") + "/v1/cluster")
    except httpx.TransportError as exc:
        raise LogUnavailable(f"no histlog server answered at {url} ({exc}); check --url") from None
    if answer.status_code != 200:
        raise LogUnavailable(f"{url}/v1/cluster answered {answer.status_code}: {answer.text[:200]}")
    tree: dict[str, Any] = answer.json()
    entries = await members_lag(tree["owners"], http_stats(http), timeout=timeout)
    members = {e["url"]: ({"owned": [int(p) for p in e["lag"]], "lag": e["lag"]} if e["reachable"]
                          else {"error": e["error"]}) for e in entries}
    return {**tree, "members": members}


def _lines(report: dict[str, Any]) -> list[str]:
    owners: dict[str, str] = report["owners"]
    lines = [f"group {report['group']}  generation {report['generation']}  partitions {report['partitions']}  "
             f"(as {report['self']} knows it)",
             f"{'partition':>9}  {'lag':>8}  owner"]
    for p in range(report["partitions"]):
        owner = owners.get(str(p))
        member = report["members"].get(owner, {}) if owner else {}
        lag = "-" if owner is None else ("unreachable" if "error" in member else member["lag"].get(str(p), "?"))
        lines.append(f"{p:>9}  {lag:>8}  {owner or '(no owner right now)'}")
    lines.extend(f"{owner}: {m['error']}" for owner, m in report["members"].items() if "error" in m)
    return lines


def cmd_cluster(ns: argparse.Namespace, target: Target, out: TextIO) -> int:
    if target.url is None:
        raise UsageError("cluster asks a running server: give --url http://HOST:PORT (any member of the cluster)")
    try:
        import httpx
    except ImportError:
        raise UsageError("histlog cluster asks the members over HTTP, which needs httpx: "
                         "pip install 'histlog[server]'") from None
    headers = {} if target.token is None else {"Authorization": f"Bearer {target.token}"}
    timeout = min(target.timeout, 10.0)

    async def ask(url: str) -> dict[str, Any]:
        async with httpx.AsyncClient(headers=headers, timeout=timeout) as http:
            return await cluster_report(http, url, timeout)

    report = asyncio.run(ask(target.url))
    if ns.json:
        print_lines(out, json.dumps(report, ensure_ascii=False))
    else:
        print_lines(out, *_lines(report))
    return UNAVAILABLE if any("error" in m for m in report["members"].values()) else OK
