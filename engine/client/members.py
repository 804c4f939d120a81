"""Each cluster member's lag, as its own ``GET /v1/stats`` tells it: the one home of the fan-out
that ``GET /v1/cluster?lag=true`` (the server, for the console's Operations page, which may only
talk to its own origin) and ``histlog --url URL cluster`` (the CLI) both make.

What it promises: one entry per distinct owner URL of a ``/v1/cluster`` map (sorted), each asked
concurrently and each bounded by ``timeout`` seconds, so a dead member costs at most that once,
whatever the number of members; an entry is ``{"url", "partitions" (the map's, for that owner),
"lag": {"P": records not yet applied, per partition the member itself applies}, "reachable"}``,
plus ``"error"`` (what went wrong, and ``reachable`` false) when the member did not answer in
time, answered an error, or answered something that is not stats. Nothing here raises for a
member: the map is still worth showing when one is down.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx

from schemas.errors import LogUnavailable

__all__ = ["MEMBER_TIMEOUT_S", "StatsOf", "http_stats", "lag_of", "members_lag", "partitions_by_owner"]

MEMBER_TIMEOUT_S = 1.0
"""Seconds one member's ``/v1/stats`` may take before it is shown as unreachable (the server's
bound: a page refreshing every few seconds must not hang on a dead member)."""

StatsOf = Callable[[str], Awaitable[Any]]
"""How the stats JSON of the member at a URL is had (over HTTP, or the server's own, locally)."""


def partitions_by_owner(owners: Mapping[str, str]) -> dict[str, list[int]]:
    """A ``/v1/cluster`` ``owners`` map (``"P"`` -> URL) turned around: URL -> its partitions, sorted."""
    out: dict[str, list[int]] = {}
    for p, url in sorted(owners.items(), key=lambda item: int(item[0])):
        out.setdefault(url, []).append(int(p))
    return dict(sorted(out.items()))


def lag_of(stats: Any) -> dict[str, int]:
    """``{"P": records not yet applied}`` for each partition a ``/v1/stats`` answer says its member
    applies (``owned_partitions``), in that order. ``ValueError`` when it is not such an answer."""
    try:
        owned, lag = stats["owned_partitions"], stats["lag"]
        return {str(int(p)): int(lag[p]) for p in owned}
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise ValueError(f"its /v1/stats has no owned_partitions and lag per partition ({type(exc).__name__}: "
                         f"{exc}); is it a histlog server of the same version?") from None


def http_stats(http: httpx.AsyncClient, headers: Mapping[str, str] | None = None) -> StatsOf:
    """``StatsOf`` over ``http``: ``GET {url}/v1/stats`` with ``headers`` (the bearer token)."""
    async def stats_of(url: str) -> Any:
        answer = await http.get(url.rstrip("/") + "/v1/stats", headers=dict(headers or {}))
        if answer.status_code != 200:
            raise LogUnavailable(f"{url}/v1/stats answered {answer.status_code}: {answer.text[:200]}")
        return answer.json()

    return stats_of


def _why(exc: BaseException, url: str, timeout: float) -> str:
    if isinstance(exc, TimeoutError):
        return f"{url}/v1/stats did not answer within {timeout:g} s: the member may be down, paused or overloaded"
    if isinstance(exc, httpx.TransportError):
        return f"{url}/v1/stats did not answer ({type(exc).__name__}: {exc}): the member may be down"
    return str(exc) or type(exc).__name__


async def members_lag(owners: Mapping[str, str], stats_of: StatsOf, *,
                      timeout: float = MEMBER_TIMEOUT_S) -> list[dict[str, Any]]:
    """One entry per owner URL of ``owners`` (see the module docstring), asked concurrently."""
    by_owner = partitions_by_owner(owners)

    async def one(url: str, partitions: list[int]) -> dict[str, Any]:
        entry: dict[str, Any] = {"url": url, "partitions": partitions}
        try:
            entry["lag"] = lag_of(await asyncio.wait_for(stats_of(url), timeout))
            entry["reachable"] = True
        except Exception as exc:  # whatever a member does, the others and the map are still answered
            entry.update(lag={}, reachable=False, error=_why(exc, url, timeout))
        return entry

    return list(await asyncio.gather(*(one(url, ps) for url, ps in by_owner.items())))
