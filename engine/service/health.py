"""``/healthz`` and ``/readyz`` (SERVICE.md), and ``observability``: everything this package adds
to ``build_app`` beyond the route table (events, metrics, health), assembled in one place.

- ``/healthz``: 200 while the process serves requests (it checks nothing else: a liveness probe
  that fails on a slow log would restart a healthy server).
- ``/readyz``: 200 once the engine has applied, on every partition it owns, the log's end offsets as
  they were when the app was built (the startup catch-up), else 503 ``NotReady`` with
  ``Retry-After``. Once ready it stays ready (readiness says "caught up at start", not "lag 0
  now": a busy server always lags a few records and must keep serving), unless the engine
  fail-stops (``HistoryEngine.fail_stopped``: its state store or its file log failed): then 503
  with that error, until the process exits (``histlog serve`` exits 4 for its supervisor to
  restart it). Neither needs a token.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from engine.facade import HistoryEngine
from engine.service.events import HEARTBEAT_S, STALL_TIMEOUT_S, STREAM_BUFFER, EventHub, event_op
from engine.service.metrics import ServiceMetrics, StreamsCollector
from engine.service.routes import Op
from schemas.errors import NotReady

__all__ = ["Observability", "Readiness", "observability"]


class Readiness:
    """Whether the engine has caught up with the log end seen at start (``targets``, by default
    ``engine.log.end_offsets()`` when this is made)."""

    def __init__(self, engine: HistoryEngine, *, targets: Sequence[int] | None = None) -> None:
        self.engine = engine
        self.targets = list(engine.log.end_offsets() if targets is None else targets)
        self._ready = False

    def check(self) -> NotReady | None:
        """None when ready, else the ``NotReady`` saying how far behind (a ``stats()`` call, until ready)."""
        if self._ready:
            return None
        stats = self.engine.stats()
        owned = set(stats.owned_partitions)  # a partition not owned is not this engine's to catch up
        behind = {p: t - a for p, (t, a) in enumerate(zip(self.targets, stats.applied_offsets, strict=True))
                  if a < t and p in owned}
        if not behind:
            self._ready = True
            return None
        shown = ", ".join(f"partition {p}: {n} records" for p, n in sorted(behind.items())[:8])
        return NotReady(f"still catching up with the log ({shown} behind the end seen at start); retry shortly")

    async def healthz(self, request: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    async def readyz(self, request: Request) -> Response:
        from engine.service.app import problem_response  # the one renderer (imported late: app may import us)
        stopped = self.engine.fail_stopped()  # no I/O
        if stopped is not None:
            return problem_response(stopped)
        failure = None if self._ready else await asyncio.to_thread(self.check)
        if failure is not None:
            return problem_response(failure)
        return Response(b'{"status":"ready"}', media_type="application/json")

    @property
    def routes(self) -> list[BaseRoute]:
        return [Route("/healthz", self.healthz, methods=["GET"], name="healthz"),
                Route("/readyz", self.readyz, methods=["GET"], name="readyz")]


@dataclass
class Observability:
    """What to pass to ``build_app``: ``build_app(engine, **obs.app_options())``; ``close()`` on
    shutdown ends the open event streams (uvicorn waits for them before it exits)."""

    hub: EventHub
    metrics: ServiceMetrics
    readiness: Readiness
    ops: tuple[Op, ...] = field(default=())

    def app_options(self) -> dict[str, object]:
        return {"extra_ops": self.ops, "extra_routes": [*self.readiness.routes, *self.metrics.routes],
                "middleware": [self.middleware]}

    @property
    def middleware(self) -> Middleware:
        return self.metrics.middleware

    def close(self) -> None:
        self.hub.close()


def observability(engine: HistoryEngine, *, heartbeat: float = HEARTBEAT_S, stall_timeout: float = STALL_TIMEOUT_S,
                  stream_buffer: int = STREAM_BUFFER, targets: Sequence[int] | None = None,
                  readiness: Readiness | None = None) -> Observability:
    """Events, metrics and health for one app over ``engine``; ``readiness``: another rule for
    ``/readyz`` (a cluster member's, ``engine.cluster.member``), else ``Readiness(engine, targets)``."""
    hub = EventHub(engine, stream_buffer=stream_buffer)
    metrics = ServiceMetrics(engine)
    metrics.registry.register(StreamsCollector(hub))
    return Observability(hub, metrics, readiness or Readiness(engine, targets=targets),
                         (event_op(hub, heartbeat=heartbeat, stall_timeout=stall_timeout),))
