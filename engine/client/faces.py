"""``HistoryClient`` and ``AsyncHistoryClient``: ``HistoryEngine``'s methods over HTTP.

Each method is one plan of ``engine.client.calls`` (the graph checkpoints' of
``engine.client.checkpoint_calls``) bound to a face by ``_sync`` or ``_async``; a
plan's requests go through ``engine.client.policy.exchange`` (where to send, when to retry,
what a failure means). The faces differ only at the I/O edge: ``_run``/``_send`` here with an
``httpx.Client``, ``_arun``/``_asend`` with an ``httpx.AsyncClient``, each one pooled client
with keep-alive connections for the client's lifetime (as httpx separates one core from its two
faces), as a few small pools (``engine.client.pools``: httpx's pool slows down with the square of
the requests in flight on it). So both faces have the same methods, arguments, results, typed errors and retries.

A ``HistoryClient`` is safe to share between threads (httpx's pool is); an
``AsyncHistoryClient`` belongs to one event loop.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Callable, Coroutine, Sequence
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar

import httpx

from engine.arguments import EMPTY, check_timeout
from engine.client import calls, checkpoint_calls
from engine.client.calls import Plan
from engine.client.policy import Answer, Endpoints, Failure, Pause, Request, Send, exchange
from engine.client.pools import PER_POOL, Pools
from schemas.canonical import _Num
from schemas.errors import InvalidRequest

__all__ = ["AsyncHistoryClient", "HistoryClient"]

P = ParamSpec("P")
T = TypeVar("T")

_LIMITS = httpx.Limits(max_connections=PER_POOL, max_keepalive_connections=PER_POOL)
"""One small pool's connections (``engine.client.pools`` says why several small pools)."""

_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)
"""Transport failures after which the request cannot have reached the server."""


def _exact_int(text: str) -> object:
    return _Num(text) if text == "-0" else int(text)


_DECODER = json.JSONDecoder(parse_int=_exact_int, parse_float=_Num)
"""Answers' JSON with every float (and ``-0``) kept as spelled, as the server keeps a request's:
a message read back has the very metadata numbers it was appended with."""


def _tree(answer: Answer) -> Any:
    if not answer.body:
        return None
    try:
        return _DECODER.decode(answer.body.decode("utf-8"))
    except ValueError as exc:
        raise InvalidRequest(f"the service answered {answer.status} with a body that is not JSON ({exc}); "
                             "is the URL a histlog server?") from None


class _Face:
    """What both faces share: the servers, the default timeout, the headers."""

    EMPTY = EMPTY

    def __init__(self, url_or_urls: str | Sequence[str], *, token: str | None = None, timeout: float = 30.0) -> None:
        check_timeout(timeout)
        self._endpoints = Endpoints(url_or_urls)
        self._timeout = float(timeout)
        self._token = token
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}

    @property
    def urls(self) -> tuple[str, ...]:
        return self._endpoints.urls

    def _exchange(self, request: Request) -> Any:
        timeout = self._timeout if request.timeout is None else request.timeout
        return exchange(request, self._endpoints, timeout)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(self.urls)})"


def _answer(response: httpx.Response) -> Answer:
    return Answer(response.status_code, response.headers.get("retry-after"), response.content)


def _failure(exc: httpx.TransportError) -> Failure:
    return Failure(exc, maybe_sent=not isinstance(exc, _NOT_SENT))


def _sync(plan: Callable[P, Plan[T]]) -> Callable[Concatenate[HistoryClient, P], T]:
    @functools.wraps(plan)
    def method(self: HistoryClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._run(plan(*args, **kwargs))

    return method


def _async(plan: Callable[P, Plan[T]]) -> Callable[Concatenate[AsyncHistoryClient, P], Coroutine[Any, Any, T]]:
    @functools.wraps(plan)
    async def method(self: AsyncHistoryClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._arun(plan(*args, **kwargs))

    return method


class HistoryClient(_Face):
    """``HistoryEngine``'s methods against a histlog server (``histlog serve``): the same
    arguments, results and typed errors; retryable failures are retried within ``timeout``
    seconds (per call: the methods' own ``timeout`` when they take one). A context manager."""

    def __init__(self, url_or_urls: str | Sequence[str], *, token: str | None = None, timeout: float = 30.0) -> None:
        super().__init__(url_or_urls, token=token, timeout=timeout)
        self._http = Pools(lambda: httpx.Client(headers=self._headers, timeout=self._timeout, limits=_LIMITS))

    append = _sync(calls.append)
    replace_turn = _sync(calls.replace_turn)
    clear = _sync(calls.clear)
    clear_prefix = _sync(calls.clear_prefix)
    begin_run = _sync(calls.begin_run)
    allocate_turn = _sync(calls.allocate_turn)
    link_assets = _sync(calls.link_assets)
    delete_messages = _sync(calls.delete_messages)
    run_wrote_history = _sync(calls.run_wrote_history)
    run_request_message = _sync(calls.run_request_message)
    read = _sync(calls.read)
    entries = _sync(calls.entries)
    entries_by_ids = _sync(calls.entries_by_ids)
    turn_sources_by_ids = _sync(calls.turn_sources_by_ids)
    position_of = _sync(calls.position_of)
    locate = _sync(calls.locate)
    window = _sync(calls.window)
    window_entries = _sync(calls.window_entries)
    read_within_bytes = _sync(calls.read_within_bytes)
    turn_sources = _sync(calls.turn_sources)
    measure = _sync(calls.measure)
    turn = _sync(calls.turn)
    turns = _sync(calls.turns)
    latest_turn = _sync(calls.latest_turn)
    latest_interrupted_checkpoint = _sync(calls.latest_interrupted_checkpoint)
    conversations = _sync(calls.conversations)
    stats = _sync(calls.stats)
    poison = _sync(calls.poison)
    put_checkpoint = _sync(checkpoint_calls.put_checkpoint)
    put_checkpoint_writes = _sync(checkpoint_calls.put_checkpoint_writes)
    get_checkpoint = _sync(checkpoint_calls.get_checkpoint)
    list_checkpoints = _sync(checkpoint_calls.list_checkpoints)
    prune_checkpoints = _sync(checkpoint_calls.prune_checkpoints)
    delete_checkpoint_runs = _sync(checkpoint_calls.delete_checkpoint_runs)
    copy_checkpoints = _sync(checkpoint_calls.copy_checkpoints)

    def close(self) -> None:
        """Close the pooled connections. Idempotent."""
        for pool in self._http.close():
            pool.close()

    def __enter__(self) -> HistoryClient:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # ----- the sync driver
    def _run(self, plan: Plan[T]) -> T:
        try:
            request = next(plan)
            while True:
                request = plan.send(_tree(self._try(request)))
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        finally:
            plan.close()

    def _try(self, request: Request) -> Answer:
        steps = self._exchange(request)
        outcome: Answer | Failure | None = None
        try:
            while True:
                step = steps.send(outcome)
                if isinstance(step, Pause):
                    time.sleep(step.seconds)
                    outcome = None
                else:
                    outcome = self._send(step)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def _send(self, step: Send) -> Answer | Failure:
        r = step.request
        try:
            with self._http.lease() as http:
                return _answer(http.request(r.method, step.base + r.path, params=r.params, content=r.body,
                                            headers=step.headers, timeout=step.timeout))
        except httpx.TransportError as exc:
            return _failure(exc)


class AsyncHistoryClient(_Face):
    """``HistoryClient``'s methods as coroutines, on one ``httpx.AsyncClient`` (one event loop).
    An async context manager (``async with``); ``await client.close()``."""

    def __init__(self, url_or_urls: str | Sequence[str], *, token: str | None = None, timeout: float = 30.0) -> None:
        super().__init__(url_or_urls, token=token, timeout=timeout)
        self._http = Pools(lambda: httpx.AsyncClient(headers=self._headers, timeout=self._timeout, limits=_LIMITS))

    append = _async(calls.append)
    replace_turn = _async(calls.replace_turn)
    clear = _async(calls.clear)
    clear_prefix = _async(calls.clear_prefix)
    begin_run = _async(calls.begin_run)
    allocate_turn = _async(calls.allocate_turn)
    link_assets = _async(calls.link_assets)
    delete_messages = _async(calls.delete_messages)
    run_wrote_history = _async(calls.run_wrote_history)
    run_request_message = _async(calls.run_request_message)
    read = _async(calls.read)
    entries = _async(calls.entries)
    entries_by_ids = _async(calls.entries_by_ids)
    turn_sources_by_ids = _async(calls.turn_sources_by_ids)
    position_of = _async(calls.position_of)
    locate = _async(calls.locate)
    window = _async(calls.window)
    window_entries = _async(calls.window_entries)
    read_within_bytes = _async(calls.read_within_bytes)
    turn_sources = _async(calls.turn_sources)
    measure = _async(calls.measure)
    turn = _async(calls.turn)
    turns = _async(calls.turns)
    latest_turn = _async(calls.latest_turn)
    latest_interrupted_checkpoint = _async(calls.latest_interrupted_checkpoint)
    conversations = _async(calls.conversations)
    stats = _async(calls.stats)
    poison = _async(calls.poison)
    put_checkpoint = _async(checkpoint_calls.put_checkpoint)
    put_checkpoint_writes = _async(checkpoint_calls.put_checkpoint_writes)
    get_checkpoint = _async(checkpoint_calls.get_checkpoint)
    list_checkpoints = _async(checkpoint_calls.list_checkpoints)
    prune_checkpoints = _async(checkpoint_calls.prune_checkpoints)
    delete_checkpoint_runs = _async(checkpoint_calls.delete_checkpoint_runs)
    copy_checkpoints = _async(checkpoint_calls.copy_checkpoints)

    async def close(self) -> None:
        """Close the pooled connections. Idempotent."""
        for pool in self._http.close():
            await pool.aclose()

    async def __aenter__(self) -> AsyncHistoryClient:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    # ----- the asyncio driver
    async def _arun(self, plan: Plan[T]) -> T:
        try:
            request = next(plan)
            while True:
                request = plan.send(_tree(await self._atry(request)))
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        finally:
            plan.close()

    async def _atry(self, request: Request) -> Answer:
        steps = self._exchange(request)
        outcome: Answer | Failure | None = None
        try:
            while True:
                step = steps.send(outcome)
                if isinstance(step, Pause):
                    await asyncio.sleep(step.seconds)
                    outcome = None
                else:
                    outcome = await self._asend(step)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    async def _asend(self, step: Send) -> Answer | Failure:
        r = step.request
        try:
            with self._http.lease() as http:
                return _answer(await http.request(r.method, step.base + r.path, params=r.params, content=r.body,
                                                  headers=step.headers, timeout=step.timeout))
        except httpx.TransportError as exc:
            return _failure(exc)
