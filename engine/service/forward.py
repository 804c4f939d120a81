"""Forwarding between cluster members: a request for a partition this member does not own is
relayed to the owner, and the owner's answer relayed back (SERVICE.md "Cluster", one hop).

What a relay promises:

- The request goes out as it came: method, the **raw** path (an id's ``%2F`` stays one segment)
  and query string, the body, and the headers that change its meaning (``Authorization``,
  ``Last-Event-ID``, ``Accept``, ``Content-Type``), marked with ``X-Histlog-Forwarded: 1``
  (``wire.FORWARDED_HEADER``) so the owner never forwards it again.
- The answer comes back as it came: status, body, ``Content-Type`` and ``Retry-After``. An event
  stream (``text/event-stream``) is relayed chunk by chunk as it arrives, and the upstream
  connection is closed when the client goes away.
- A forward that cannot connect, or gets no answer in time, is ``NotReady`` (503 with
  ``Retry-After``): the owner is dead or not yet replaced, and clients retry.
- The forwards of one app share a few small pooled ``httpx.AsyncClient``s (keep-alive
  connections to each owner, ``engine.client.pools``: one large httpx pool slows down with the
  square of the requests in flight), made on first use on the app's event loop; relayed event
  streams have a client of their own (a stream holds its connection while it is open).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from engine.client.pools import PER_POOL, Pools
from engine.service.problems import error_of
from engine.service.wire import FORWARDED_HEADER
from schemas.errors import NotReady

__all__ = ["CONNECT_TIMEOUT_S", "READ_TIMEOUT_S", "RELAYED_REQUEST_HEADERS", "Forwarder", "RelayedStream",
           "is_forwarded", "stream_until_disconnected", "until_disconnected"]

CONNECT_TIMEOUT_S = 2.0
"""Seconds to connect to an owner: past that it is taken as down (503, clients retry)."""
READ_TIMEOUT_S = 40.0
"""Seconds an owner may take to answer a forwarded request: more than a read's bounded
``at_least`` wait (10 s) and a commit's, so a slow but live owner is not cut off."""
STALL_TIMEOUT_S = 30.0
"""Seconds one chunk of a relayed stream may wait for a client that stopped reading."""
RELAYED_REQUEST_HEADERS = ("authorization", "last-event-id", "accept", "content-type")
_RELAYED_ANSWER_HEADERS = ("content-type", "retry-after", "cache-control")
_MARK = FORWARDED_HEADER.lower()
_OWNER = "the owner of this conversation's partition"


def is_forwarded(request: Request) -> bool:
    """Whether ``request`` already took its one hop (``X-Histlog-Forwarded: 1``)."""
    return request.headers.get(_MARK) == "1"


async def until_disconnected(receive: Receive) -> None:
    """Return once the client of this connection has gone away."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def stream_until_disconnected(streaming: Coroutine[Any, Any, None], receive: Receive) -> None:
    """Run ``streaming`` (a response body being sent) until it ends or the client goes away,
    whichever comes first; the other is cancelled and awaited."""
    sending = asyncio.ensure_future(streaming)
    watching = asyncio.ensure_future(until_disconnected(receive))
    try:
        await asyncio.wait({sending, watching}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (sending, watching):
            task.cancel()
        await asyncio.gather(sending, watching, return_exceptions=True)


class Forwarder:
    """The app's one pooled HTTP client to the other members, and the relays over it."""

    def __init__(self, *, connect_timeout: float = CONNECT_TIMEOUT_S, read_timeout: float = READ_TIMEOUT_S) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._pools = self._new_pools()
        self._streams: httpx.AsyncClient | None = None
        self.forwarded = 0
        """Requests relayed to an owner (answered or not)."""

    @staticmethod
    def _new_pools() -> Pools[httpx.AsyncClient]:
        """Small pools, leased per request (``engine.client.pools`` says why not one large one)."""
        limits = httpx.Limits(max_connections=PER_POOL, max_keepalive_connections=PER_POOL)
        return Pools(lambda: httpx.AsyncClient(limits=limits, follow_redirects=False))

    def _stream_client(self) -> httpx.AsyncClient:
        """The client of relayed event streams: a stream holds its connection for as long as it
        is open, so streams never take a place in the small pools of ordinary requests."""
        if self._streams is None:
            self._streams = httpx.AsyncClient(limits=httpx.Limits(max_connections=None), follow_redirects=False)
        return self._streams

    def _timeout(self, *, stream: bool) -> httpx.Timeout:
        return httpx.Timeout(connect=self.connect_timeout, read=None if stream else self.read_timeout,
                             write=self.read_timeout, pool=self.connect_timeout)

    async def relay(self, request: Request, owner: str, body: bytes, *, stream: bool = False) -> Response:
        """``request`` (its ``body`` already read) sent to ``owner`` and its answer as a response;
        ``stream``: the answer may be an event stream, relayed as it arrives."""
        raw: bytes = request.scope.get("raw_path") or request.scope["path"].encode("utf-8")
        target = owner.rstrip("/") + raw.decode("latin-1").split("?", 1)[0]
        query: bytes = request.scope.get("query_string", b"")
        if query:
            target += "?" + query.decode("latin-1")
        headers = {name: value for name in RELAYED_REQUEST_HEADERS if (value := request.headers.get(name)) is not None}
        headers[FORWARDED_HEADER] = "1"
        self.forwarded += 1
        if stream:
            return await self._relay_stream(owner, request.method, target, headers, body)
        with self._pools.lease() as http:
            try:
                upstream = await http.request(request.method, target, headers=headers, content=body,
                                              timeout=self._timeout(stream=False))
            except httpx.TransportError as exc:
                raise _unreachable(owner, exc) from None
        answer = {k: v for k in _RELAYED_ANSWER_HEADERS if (v := upstream.headers.get(k)) is not None}
        return Response(upstream.content, status_code=upstream.status_code, headers=answer)

    async def _relay_stream(self, owner: str, method: str, target: str, headers: dict[str, str],
                            body: bytes) -> Response:
        http = self._stream_client()
        outgoing = http.build_request(method, httpx.URL(target), headers=headers, content=body,
                                      timeout=self._timeout(stream=True))
        try:
            upstream = await http.send(outgoing, stream=True)
        except httpx.TransportError as exc:
            raise _unreachable(owner, exc) from None
        answer = {k: v for k in _RELAYED_ANSWER_HEADERS if (v := upstream.headers.get(k)) is not None}
        if upstream.status_code == 200 and answer.get("content-type", "").startswith("text/event-stream"):
            return RelayedStream(upstream, answer)
        try:
            content = await upstream.aread()
        except httpx.TransportError as exc:
            raise _unreachable(owner, exc) from None
        finally:
            await upstream.aclose()
        return Response(content, status_code=upstream.status_code, headers=answer)

    async def get_json(self, owner: str, path: str, params: dict[str, str], authorization: str | None, *,
                       who: str = _OWNER) -> Any:
        """``GET owner+path`` marked forwarded, its JSON on 200; a problem answer raised as its
        error, no answer as ``NotReady`` (naming the member as ``who``). For the fan-outs
        (``GET /v1/conversations``, each member's stats for ``GET /v1/cluster?lag=true``)."""
        return await self._json(owner, "GET", path, authorization, who=who, params=params)

    async def _json(self, owner: str, method: str, path: str, authorization: str | None, *, who: str = _OWNER,
                    **given: Any) -> Any:
        headers = {FORWARDED_HEADER: "1"}
        if authorization is not None:
            headers["Authorization"] = authorization
        with self._pools.lease() as http:
            try:
                answer = await http.request(method, owner.rstrip("/") + path, headers=headers,
                                            timeout=self._timeout(stream=False), **given)
            except httpx.TransportError as exc:
                raise _unreachable(owner, exc, who) from None
        try:
            tree = answer.json()
        except ValueError:
            tree = answer.text[:200]
        if answer.status_code != 200:
            raise error_of(answer.status_code, tree)
        return tree

    async def post_json(self, owner: str, path: str, tree: Any, authorization: str | None) -> Any:
        """``POST owner+path`` with the JSON ``tree``, as ``get_json`` (the fan-out of
        ``POST /v1/conversations:clear``)."""
        return await self._json(owner, "POST", path, authorization, json=tree)

    async def aclose(self) -> None:
        """Close the pooled connections (idempotent; a later relay opens new ones)."""
        pools, self._pools = self._pools, self._new_pools()
        streams, self._streams = self._streams, None
        for http in [*pools.close(), *([streams] if streams is not None else [])]:
            await http.aclose()


def _unreachable(owner: str, exc: Exception, who: str = _OWNER) -> NotReady:
    what = type(exc).__name__
    return NotReady(f"{who} at {owner} did not answer ({what}: {exc}); it may be down or not yet replaced: "
                    "retry shortly")


class RelayedStream(Response):
    """An owner's event stream relayed chunk by chunk; the upstream response is closed when it
    ends, when the client disconnects (watched on ``receive``) or when a send stalls."""

    def __init__(self, upstream: httpx.Response, headers: dict[str, str]) -> None:
        super().__init__(status_code=upstream.status_code)
        self.upstream = upstream
        self.answer_headers = headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": [
                (k.encode("latin-1"), v.encode("latin-1")) for k, v in self.answer_headers.items()]
                + [(b"x-accel-buffering", b"no")]})
            await stream_until_disconnected(self._pump(send), receive)
        finally:
            await self.upstream.aclose()

    async def _pump(self, send: Send) -> None:
        with contextlib.suppress(httpx.TransportError, OSError, TimeoutError):
            async for chunk in self.upstream.aiter_raw():
                await asyncio.wait_for(send({"type": "http.response.body", "body": chunk, "more_body": True}),
                                       STALL_TIMEOUT_S)
        # the owner ended the stream (or it broke): end ours, the client resumes with Last-Event-ID
        with contextlib.suppress(OSError):
            await send({"type": "http.response.body", "body": b"", "more_body": False})
