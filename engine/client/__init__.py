"""The Python clients of the histlog service (SERVICE.md "The clients"): ``HistoryClient`` and
``AsyncHistoryClient`` offer ``HistoryEngine``'s methods over HTTP, with the same results and
typed errors, so ``WindowReader``, ``HistoryMiddleware`` and the conformance suites run over the
wire unchanged.

- ``calls``: every method once, as a plan of requests and how to read their answers;
- ``policy``: where a request goes, when it is retried, what an unanswered one means;
- ``faces``: the sync and the asyncio client, which only carry out plans.
"""

from engine.client.faces import AsyncHistoryClient, HistoryClient

__all__ = ["AsyncHistoryClient", "HistoryClient"]
