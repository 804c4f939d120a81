"""How one request is tried: where it goes, when it is sent again, and what a failure means.
No I/O: ``exchange`` is a generator of ``Send`` and ``Pause`` actions that the clients' two
drivers (``engine/client/faces.py``, one sync, one asyncio) carry out, so both faces retry by
the same rules (as httpx runs one auth flow through two drivers).

The rules (SERVICE.md "The clients"):

* ``LogUnavailable`` and ``NotReady`` (503), ``NotOwner`` (421), a ``CommitUnconfirmed`` (504)
  answer to a write, and connection failures are tried again until the call's timeout runs
  out, after a bounded exponential backoff (50 ms doubling to 1 s) or the ``Retry-After`` the
  server asked for, whichever is longer, never past the deadline. A write is resent as the
  same request (the same batch under the same append id): admission answers a resend with the
  original receipt, so a retry never appends twice.
* Every other answer is final: a success is decoded, an error raised as the class its
  problem+json names (``engine.service.problems.error_of``).
* Out of time: the last error answer is raised as it came; with no answer at all, a write
  (append, replace_turn, clear) raises ``CommitUnconfirmed`` when a try may have reached the
  server (resend the same batch to learn the outcome), and every call raises ``LogUnavailable``
  when nothing could be sent.
* With several URLs, a connection failure or a 503/421 moves the next try to the next URL
  (``Endpoints``: the one home of "where does this request go").
* Routing (several URLs): before its first request the client reads ``GET /v1/cluster`` from one
  of them. A cluster's map (``group`` set) sends each request on one conversation straight to
  its partition's owner, marked ``X-Histlog-Forwarded: 1`` (it took its one hop: a member that
  no longer owns the partition answers 421 instead of forwarding). A 421, a 503 or a connection
  failure from an owner makes the map stale: it is read again before the next try. Requests on
  no conversation (``conversations``, ``stats``), and every request when the answer is no
  cluster (``group`` null: full replicas) or no map could be read, go to the URLs in turn, as
  with one URL. A single URL never reads the map: today's behaviour, one server.
"""

from __future__ import annotations

import json
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.cluster.ownership import OwnershipMap
from engine.service.problems import error_of
from engine.service.wire import FORWARDED_HEADER, cluster_of
from schemas.errors import CommitUnconfirmed, HistoryError, InvalidConfiguration, LogUnavailable
from schemas.records import partition_for_key, record_key

__all__ = ["Answer", "Endpoints", "Exchange", "Failure", "Pause", "Request", "Send", "exchange"]

_RETRY_STATUSES = frozenset({421, 503})
_FIRST_BACKOFF_S = 0.05
_MAX_BACKOFF_S = 1.0


@dataclass(frozen=True, slots=True)
class Request:
    """One HTTP request of a client call: ``path`` already percent-encoded, ``params`` the query,
    ``body`` JSON bytes. ``write`` marks an append, replace_turn or clear (whose unanswered
    timeout is ``CommitUnconfirmed``); ``ok`` the success statuses."""

    method: str
    path: str
    params: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None
    write: bool = False
    ok: tuple[int, ...] = (200,)
    timeout: float | None = None
    """This call's own timeout (seconds), else the client's."""
    conversation: str | None = None
    """The conversation the request is on (routed to its partition's owner), None for others."""


@dataclass(frozen=True, slots=True)
class Answer:
    """An HTTP answer: status, the ``Retry-After`` header (None if absent) and the body bytes."""

    status: int
    retry_after: str | None
    body: bytes


@dataclass(frozen=True, slots=True)
class Failure:
    """No answer: the transport failed. ``maybe_sent`` is False only when the request cannot
    have reached the server (the connection was never made)."""

    error: Exception
    maybe_sent: bool


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``request`` to ``base`` (a server URL) within ``timeout`` seconds; the driver sends
    back an ``Answer`` or a ``Failure``."""

    base: str
    request: Request
    timeout: float
    headers: dict[str, str] = field(default_factory=dict)
    """Headers for this try only (the routing mark)."""


@dataclass(frozen=True, slots=True)
class Pause:
    """Sleep ``seconds`` before the next try; the driver sends back None."""

    seconds: float


Exchange = Generator[Send | Pause, Answer | Failure | None, Answer]


_CLUSTER = Request("GET", "/v1/cluster")
_MAP_TIMEOUT_S = 5.0
"""The longest one read of ``/v1/cluster`` may take out of a call's timeout."""


class Endpoints:
    """The servers a client talks to, which one it tries next, and (several URLs) the cluster's
    ownership map as last read. Thread-safe enough for its job: a race between two threads only
    changes which server the next try picks or makes one more read of the map."""

    __slots__ = ("_current", "_map", "_stale", "urls")

    def __init__(self, url_or_urls: str | Sequence[str]) -> None:
        urls = [url_or_urls] if isinstance(url_or_urls, str) else list(url_or_urls)
        if not urls or not all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls):
            raise InvalidConfiguration(f"invalid service URL(s) {url_or_urls!r}: give http://HOST:PORT "
                                       "(or a list of them), e.g. HistoryClient('http://127.0.0.1:8420')")
        self.urls = tuple(u.rstrip("/") for u in urls)
        self._current = 0
        self._map: OwnershipMap | None = None
        self._stale = len(self.urls) > 1

    @property
    def map(self) -> OwnershipMap | None:
        """The cluster's map as last read (None: no cluster, or not read yet)."""
        return self._map

    def pick(self) -> str:
        return self.urls[self._current % len(self.urls)]

    def failed(self, base: str) -> None:
        """``base`` did not serve: the next try goes to the next URL."""
        if self.pick() == base:
            self._current += 1

    @property
    def stale(self) -> bool:
        """Whether the map should be read (again) before the next try."""
        return self._stale

    def learn(self, owners: OwnershipMap | None) -> None:
        """The map just read (None: the servers are no cluster, route nothing)."""
        self._map = owners
        self._stale = False

    def outdated(self) -> None:
        """The map proved wrong (a 421, an owner that failed): read it again before the next try."""
        if len(self.urls) > 1:
            self._stale = True

    def route(self, request: Request) -> tuple[str, bool]:
        """Where ``request`` goes and whether it goes to its owner (so it is marked as routed)."""
        owners = self._map
        if owners is not None and request.conversation is not None:
            owner = owners.owner_of(partition_for_key(record_key(request.conversation), owners.partitions))
            if owner is not None:
                return owner, True
        return self.pick(), False


def _refresh(endpoints: Endpoints, deadline: float) -> Generator[Send, Answer | Failure | None, None]:
    """One read of ``/v1/cluster`` into ``endpoints`` (a failure leaves the map stale and moves
    on to the next URL; an answer that is no map, e.g. an older server's 404, routes nothing)."""
    base = endpoints.pick()
    left = max(deadline - time.monotonic(), 0.001)
    outcome = yield Send(base, _CLUSTER, min(left, _MAP_TIMEOUT_S))
    if isinstance(outcome, Answer) and outcome.status == 200:
        try:
            endpoints.learn(cluster_of(json.loads(outcome.body)))
        except (ValueError, HistoryError):
            endpoints.learn(None)
    elif isinstance(outcome, Answer) and outcome.status not in _RETRY_STATUSES:
        endpoints.learn(None)
    else:
        endpoints.failed(base)


def _retry_after(value: str | None) -> float:
    if value is None:
        return 0.0
    try:
        return max(float(value), 0.0)
    except ValueError:
        return 0.0  # an HTTP-date: histlog servers send seconds; the backoff applies


def _parsed(body: bytes) -> Any:
    """An error answer's body for ``error_of``: its JSON, or the start of its text."""
    try:
        return json.loads(body)
    except ValueError:
        return body[:200].decode("utf-8", "replace")


def exchange(request: Request, endpoints: Endpoints, timeout: float) -> Exchange:
    """Try ``request`` until it is answered for good or ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    backoff = _FIRST_BACKOFF_S
    last_error: HistoryError | None = None
    maybe_sent = False
    failure: Exception | None = None
    while True:
        if endpoints.stale:
            yield from _refresh(endpoints, deadline)
        base, routed = endpoints.route(request)
        outcome = yield Send(base, request, max(deadline - time.monotonic(), 0.001),
                             {FORWARDED_HEADER: "1"} if routed else {})
        wait = backoff
        if isinstance(outcome, Answer):
            if outcome.status in request.ok:
                return outcome
            error = error_of(outcome.status, _parsed(outcome.body))
            retryable = outcome.status in _RETRY_STATUSES or (outcome.status == 504 and request.write)
            if not retryable:
                raise error
            if outcome.status == 504:
                maybe_sent = True
            last_error = error
            wait = max(wait, _retry_after(outcome.retry_after))
            if outcome.status != 504:
                endpoints.failed(base)
            if routed or outcome.status == 421:
                endpoints.outdated()
            if outcome.status == 421:
                wait = 0.0  # the owner moved: ask the map and go there at once
        else:
            assert isinstance(outcome, Failure)  # Invariant: drivers answer a Send with an Answer or a Failure.
            maybe_sent = maybe_sent or outcome.maybe_sent
            last_error = None
            endpoints.failed(base)
            if routed:
                endpoints.outdated()
            failure = outcome.error
        left = deadline - time.monotonic()
        if left <= 0.0:
            break
        yield Pause(min(wait, left))
        backoff = min(backoff * 2, _MAX_BACKOFF_S)
        if deadline - time.monotonic() <= 0.0:
            break
    what = f"{request.method} {request.path}"
    if last_error is not None:  # the last try was answered: that answer stands
        raise last_error
    if request.write and maybe_sent:
        raise CommitUnconfirmed(f"the service did not answer {what} within {timeout}s ({failure}); the write may "
                                "have been stored: resend the same batch (a retry returns the original receipt)")
    raise LogUnavailable(f"the service at {', '.join(endpoints.urls)} could not be reached for {what} within "
                         f"{timeout}s ({failure}); check that `histlog serve` runs there, then retry")
