"""``/metrics``: the service's Prometheus metrics (SERVICE.md, "Metrics"), on a registry of its
own per app (never the process-wide default: one process may run many apps, e.g. in tests).

Two sources:

- **Requests**, measured by ``RequestMetrics`` (a pure ASGI middleware) around every request:
  ``histlog_http_requests_total{method,route,status}``, ``histlog_http_request_duration_seconds``
  ``{method,route}`` (a histogram) and ``histlog_http_requests_in_flight``. ``route`` is the
  matched route's *template* (``/v1/conversations/{c}/appends/{a}``), never the raw path, and
  ``unmatched`` for a path no route knows: no label ever holds a conversation or append id, so
  the series stay few whatever the traffic. The append route's answers are also counted by
  outcome, ``histlog_appends_total{outcome}``: ``ok`` (accepted, or an identical retry: the same
  receipt, by design indistinguishable), ``conflict``, ``not_replaceable``, ``closed``,
  ``precondition_failed``, ``fenced``, ``slot_unavailable``, ``invalid``, ``unavailable``,
  ``unconfirmed`` (from the status and the problem's title).
- **The engine**, from ``HistoryEngine.stats()`` read by ``StatsProbe`` and shown by
  ``EngineCollector`` (nothing on the request path): admission's decisions
  ``histlog_admission_decisions_total{outcome}`` (accepted, duplicate, conflict, closed,
  precondition_failed, not_replaceable, cleared, erased: the records decided in log order since the state was
  built, from every writer of the log; an answer the engine gave from its state without writing,
  e.g. a retry of a known batch, is not a decision), ``histlog_applied_records{partition}`` and
  ``histlog_log_end_offset{partition}``, ``histlog_projector_lag_records{partition}``,
  ``histlog_projector_lag_seconds{partition}`` and ``histlog_poison_records_total``.
- **Event streams** (``StreamsCollector``, over the app's ``EventHub``): ``histlog_event_streams``
  open now and ``histlog_event_streams_dropped_total`` (fell behind their buffer).

**A scrape never waits on the log for long** (``StatsProbe``). ``stats()`` asks the log for its
end offsets: on Kafka a network call, which with the broker down blocked the scrape ~30 s and
ended in a 500. So one background thread per app reads ``stats()``; a scrape asks it for a fresh
reading and waits at most ``STATS_WAIT_S``; otherwise it shows the last reading that succeeded,
with ``histlog_log_reachable 0`` and its age in ``histlog_engine_stats_age_seconds`` (every
engine metric above comes from that one reading). However many scrapes wait, there is one
reader: a read blocked on the broker is not repeated until it returns, and a waiting scrape
holds no thread (it waits on the event loop, ``StatsProbe.aread``). The reader exits after
``_IDLE_S`` without a scrape (started again by the next).

**Lag in seconds** is derived from the scrapes themselves: each scrape notes when it first saw
each partition's end offset; the lag is the age of the oldest noted end offset the projector has
not applied yet (0 when caught up). So it is exact to one scrape interval, needs no read of the
log, and keeps at most ``_LAG_SAMPLES`` notes per partition.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine.facade import EngineStats, HistoryEngine

__all__ = ["STATS_WAIT_S", "EngineCollector", "RequestMetrics", "ServiceMetrics", "StatsProbe", "StatsReading",
           "StreamsCollector"]

log = logging.getLogger(__name__)

#: The longest a scrape waits for a fresh ``stats()`` (a healthy read takes milliseconds).
STATS_WAIT_S = 1.0
_IDLE_S = 60.0

UNMATCHED = "unmatched"
APPEND_ROUTE = ("PUT", "/v1/conversations/{c}/appends/{a}")
_OUTCOMES = {"AppendConflict": "conflict", "TurnNotReplaceable": "not_replaceable", "ConversationClosed": "closed",
             "Fenced": "fenced", "SlotUnavailable": "slot_unavailable",
             "PreconditionFailed": "precondition_failed", "CommitUnconfirmed": "unconfirmed"}
_LAG_SAMPLES = 1024
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(frozen=True, slots=True)
class StatsReading:
    """What a scrape shows: the last ``stats()`` that succeeded (``None`` before the first), how
    old it is, and whether it was read for this scrape (the log answered within the bound)."""
    stats: EngineStats | None
    age_s: float
    fresh: bool


class StatsProbe:
    """``stats()`` read on one background thread, so a scrape waits at most ``wait_s`` (the module
    docstring). ``read()`` asks for a fresh reading; ``latest()`` only returns the last one."""

    def __init__(self, stats: Callable[[], EngineStats], *, wait_s: float = STATS_WAIT_S,
                 idle_s: float = _IDLE_S) -> None:
        self._stats, self.wait_s, self._idle_s = stats, wait_s, idle_s
        self._cond = threading.Condition()
        self._asked = 0  # readings asked for (tickets)
        self._answered = 0  # the last ticket a finished read answered
        self._answer_ok = False
        self._last: EngineStats | None = None
        self._last_at = float("-inf")
        self._reader: threading.Thread | None = None
        self._waiters: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self.reads = 0
        """``stats()`` calls made so far (one per burst of scrapes, never one per scrape waiting)."""

    def read(self) -> StatsReading:
        """A fresh reading if the log answers within ``wait_s``, else the last one (not fresh).
        Blocks the calling thread up to ``wait_s``; on an event loop use ``aread``."""
        with self._cond:
            ticket = self._ask()
            answered = self._cond.wait_for(lambda: self._answered >= ticket, self.wait_s)
            return self._reading(answered and self._answer_ok)

    async def aread(self) -> StatsReading:
        """``read`` for a coroutine: it waits on the loop, holding no thread (so scrapes, however
        many, never take the worker threads the server's other requests need)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        with self._cond:
            ticket = self._ask()
            waiter = (ticket, loop, done)
            self._waiters.append(waiter)
        try:
            await asyncio.wait_for(done, self.wait_s)
        except TimeoutError:
            pass
        finally:
            with self._cond:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        with self._cond:
            return self._reading(self._answered >= ticket and self._answer_ok)

    def _ask(self) -> int:
        """A new ticket (under ``_cond``), and the reader started if it is not running."""
        self._asked += 1
        if self._reader is None:
            self._reader = threading.Thread(target=self._run, name="histlog-metrics-stats", daemon=True)
            self._reader.start()
        self._cond.notify_all()
        return self._asked

    def latest(self) -> StatsReading:
        """The last reading, without asking for a new one (never blocks on the log)."""
        with self._cond:
            return self._reading(False)

    def _reading(self, fresh: bool) -> StatsReading:
        age = time.monotonic() - self._last_at if self._last is not None else float("inf")
        return StatsReading(self._last, age, fresh)

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._cond.wait_for(lambda: self._asked > self._answered, self._idle_s):
                    self._reader = None  # idle: the next read() starts another
                    return
                ticket = self._asked  # one read answers every scrape waiting now
            try:
                stats: EngineStats | None = self._stats()
            except Exception as exc:  # the log unreachable, the engine closed: shown as not reachable
                log.debug("metrics: stats() failed: %s", exc)
                stats = None
            with self._cond:
                self.reads += 1
                if stats is not None:
                    self._last, self._last_at = stats, time.monotonic()
                self._answered, self._answer_ok = ticket, stats is not None
                self._cond.notify_all()
                ready = [(loop, done) for t, loop, done in self._waiters if t <= ticket]
            for loop, done in ready:
                with contextlib.suppress(RuntimeError):  # that loop has closed: nobody waits
                    loop.call_soon_threadsafe(_wake, done)


def _wake(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)


#: The reading a scrape already waited for (``ServiceMetrics.endpoint``), so ``EngineCollector``
#: shows it instead of asking again (``asyncio.to_thread`` carries it to the rendering thread).
_SCRAPE_READING: contextvars.ContextVar[StatsReading | None] = contextvars.ContextVar("histlog_scrape_reading",
                                                                                      default=None)


class EngineCollector(Collector):
    """The engine's counters and offsets as metrics, from ``probe``'s reading at each scrape
    (see the module); only ``histlog_log_reachable`` while no reading ever succeeded."""

    def __init__(self, engine: HistoryEngine, probe: StatsProbe | None = None) -> None:
        self.engine = engine
        self.probe = probe or StatsProbe(engine.stats)
        self._lock = threading.Lock()
        self._seen: dict[int, collections.deque[tuple[int, float]]] = {}

    def collect(self) -> Iterator[Metric]:
        reading = _SCRAPE_READING.get() or self.probe.read()
        yield GaugeMetricFamily("histlog_log_reachable", "1 when this scrape read the log's end offsets within "
                                f"{self.probe.wait_s:g} s; 0: the engine metrics are from an older reading",
                                value=1 if reading.fresh else 0)
        s = reading.stats
        if s is None:
            return
        yield GaugeMetricFamily("histlog_engine_stats_age_seconds", "Age of the reading the engine metrics "
                                "(offsets, lag, decisions) come from", value=reading.age_s)
        outcomes = CounterMetricFamily("histlog_admission_decisions", "Records decided by admission, by outcome",
                                       labels=["outcome"])
        for outcome, count in (("accepted", s.accepted), ("duplicate", s.duplicates), ("conflict", s.conflicts),
                               ("closed", s.rejected_closed), ("precondition_failed", s.precondition_failed),
                               ("not_replaceable", s.not_replaceable), ("cleared", s.cleared),
                               ("erased", s.erased), ("fenced", s.fenced)):
            outcomes.add_metric([outcome], count)
        yield outcomes
        poison = CounterMetricFamily("histlog_poison_records", "Poison records skipped (quarantined)")
        poison.add_metric([], s.corrupt)
        yield poison
        applied = GaugeMetricFamily("histlog_applied_records", "Records applied by the projector (its offset)",
                                    labels=["partition"])
        ends = GaugeMetricFamily("histlog_log_end_offset", "The log's end offset", labels=["partition"])
        lag = GaugeMetricFamily("histlog_projector_lag_records", "Records in the log not applied yet",
                                labels=["partition"])
        lag_s = GaugeMetricFamily("histlog_projector_lag_seconds",
                                  "Age of the oldest record not applied yet (at scrape resolution)",
                                  labels=["partition"])
        now = time.monotonic()
        for p, (end, done, behind) in enumerate(zip(s.end_offsets, s.applied_offsets, s.lag, strict=True)):
            label = [str(p)]
            applied.add_metric(label, done)
            ends.add_metric(label, end)
            lag.add_metric(label, behind)
            lag_s.add_metric(label, self._lag_seconds(p, end, done, now))
        yield from (applied, ends, lag, lag_s)

    def _lag_seconds(self, partition: int, end: int, applied: int, now: float) -> float:
        with self._lock:
            seen = self._seen.setdefault(partition, collections.deque(maxlen=_LAG_SAMPLES))
            while seen and seen[0][0] <= applied:
                seen.popleft()
            if end > applied and (not seen or seen[-1][0] < end):
                seen.append((end, now))
            return now - seen[0][1] if seen and end > applied else 0.0


class Streams(Protocol):
    @property
    def streams(self) -> int: ...
    @property
    def dropped(self) -> int: ...


class StreamsCollector(Collector):
    """The open event streams and those dropped for falling behind (``EventHub``'s counts)."""

    def __init__(self, hub: Streams) -> None:
        self.hub = hub

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("histlog_event_streams", "Event streams open now", value=self.hub.streams)
        dropped = CounterMetricFamily("histlog_event_streams_dropped",
                                      "Event streams dropped for falling behind their buffer")
        dropped.add_metric([], self.hub.dropped)
        yield dropped


def route_of(scope: Scope) -> str:
    """The template of the route that matched (Starlette records it in the scope), else
    ``unmatched``: never the raw path."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else UNMATCHED


class RequestMetrics:
    """Counts, times and gauges every HTTP request (pure ASGI, so streaming responses pass
    through untouched; an events stream counts as in flight while it is open)."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        title = b""
        m = self.metrics

        async def sending(message: Message) -> None:
            nonlocal status, title
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and status >= 400 and len(title) < 512:
                title += message.get("body", b"")[:512]  # a problem's head: its title names the outcome
            await send(message)

        m.open_requests += 1
        started = time.perf_counter()
        try:
            await self.app(scope, receive, sending)
        finally:
            m.open_requests -= 1
            route, method = route_of(scope), scope["method"]
            m.observe(method, route, status, time.perf_counter() - started)
            if (method, route) == APPEND_ROUTE:
                m.appends.labels(append_outcome(status, title)).inc()


def append_outcome(status: int, problem_head: bytes) -> str:
    """The ``histlog_appends_total`` outcome of an append answered ``status`` (see the module)."""
    if status < 300:
        return "ok"
    found = re.search(rb'"title":"(\w+)"', problem_head)
    name = found.group(1).decode() if found else ""
    if name in _OUTCOMES:
        return _OUTCOMES[name]
    return "invalid" if status < 500 else "unavailable"


class ServiceMetrics:
    """One app's metrics: its own registry, the request metrics and the engine's collector;
    ``middleware`` and ``routes`` join them to ``build_app``."""

    def __init__(self, engine: HistoryEngine) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("histlog_http_requests", "HTTP requests answered, by route template and status",
                                ["method", "route", "status"], registry=self.registry)
        self.latency = Histogram("histlog_http_request_duration_seconds", "HTTP request latency by route template",
                                 ["method", "route"], buckets=_BUCKETS, registry=self.registry)
        self.appends = Counter("histlog_appends", "Append requests answered, by outcome (ok: accepted or an "
                               "identical retry)", ["outcome"], registry=self.registry)
        self.in_flight = Gauge("histlog_http_requests_in_flight", "HTTP requests being served (open event "
                               "streams included)", registry=self.registry)
        self.open_requests = 0
        """Requests in flight, counted by the middleware on the loop (read at scrape time)."""
        self.in_flight.set_function(lambda: self.open_requests)
        self._series: dict[tuple[str, str, int], tuple[Histogram, Counter]] = {}
        self.probe = StatsProbe(engine.stats)
        """The engine's ``stats()`` as scrapes see them (other collectors read ``probe.latest()``)."""
        self.registry.register(EngineCollector(engine, self.probe))

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        """Count one answered request and time it (its series looked up once, then cached: the
        labels are few, see the module)."""
        series = self._series.get((method, route, status))
        if series is None:
            series = self._series[(method, route, status)] = (
                self.latency.labels(method, route), self.requests.labels(method, route, str(status)))
        series[0].observe(seconds)
        series[1].inc()

    @property
    def middleware(self) -> Middleware:
        return Middleware(RequestMetrics, metrics=self)

    @property
    def routes(self) -> list[BaseRoute]:
        return [Route("/metrics", self.endpoint, methods=["GET"], name="metrics")]

    async def endpoint(self, request: Request) -> Response:
        # The wait for the engine's numbers is on the loop (STATS_WAIT_S at most, no thread held);
        # the rendering, which no longer waits on the log, off it.
        token = _SCRAPE_READING.set(await self.probe.aread())
        try:
            body = await asyncio.to_thread(self.scrape)
        finally:
            _SCRAPE_READING.reset(token)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    def scrape(self) -> bytes:
        """The Prometheus text exposition of every metric (at most one engine ``stats()``, waited
        for ``STATS_WAIT_S`` at most)."""
        return generate_latest(self.registry)
