"""Spies and faces shared by the middleware tests.

A *face* drives the middleware either synchronously (``call``/``stream``) or through asyncio
(``acall``/``astream``), so one suite states each behaviour once for both.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Generator, Sequence
from typing import Any

from engine import HistoryEngine, HistoryMiddleware, MiddlewareConfig
from schemas import Batch, ChatDelta, ChatRequest, ChatResponse, Message, Receipt

SYSTEM = Message.system("You are Nova, Parcelly's support assistant.")


class SpyStore:
    """A reader and writer over a real engine that counts calls and can fail the next appends."""

    def __init__(self, engine: HistoryEngine, *, fail_appends: int = 0, error: Exception | None = None,
                 stored: Sequence[object] | None = None) -> None:
        self.engine = engine
        self.reads = 0
        self.appends: list[Batch] = []
        self.fail_appends = fail_appends
        self.error = error
        self.stored = stored  # when set, read() returns this instead of the engine's history
        self.threads: list[int] = []

    def read(self, conversation_id: str) -> list[Message]:
        self.reads += 1
        self.threads.append(threading.get_ident())
        if self.stored is not None:
            return list(self.stored)  # type: ignore[arg-type]
        return self.engine.read(conversation_id)

    def append(self, batch: Batch) -> Receipt:
        self.appends.append(batch)
        self.threads.append(threading.get_ident())
        if self.fail_appends:
            self.fail_appends -= 1
            raise self.error if self.error is not None else OSError("disk full (injected)")
        return self.engine.append(batch)


class SpyModel:
    """A scripted model: returns (or raises) the scripted items in order and records each request."""

    def __init__(self, *script: ChatResponse | BaseException | object) -> None:
        self.script = list(script)
        self.requests: list[ChatRequest] = []

    @property
    def calls(self) -> int:
        return len(self.requests)

    def __call__(self, request: ChatRequest) -> ChatResponse:
        self.requests.append(request)
        item = self.script.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item  # type: ignore[return-value]

    async def acall(self, request: ChatRequest) -> ChatResponse:
        return self(request)


class SpyStreamer:
    """A scripted streamer: yields the scripted chunks (raising any exception among them) and
    records whether it was started, how many chunks it sent, and whether it was closed."""

    def __init__(self, *chunks: object) -> None:
        self.chunks = list(chunks)
        self.requests: list[ChatRequest] = []
        self.sent = 0
        self.closed = False
        self.live: list[object] = []  # keeps each upstream alive, so only an explicit close can close it

    @property
    def calls(self) -> int:
        return len(self.requests)

    def __call__(self, request: ChatRequest) -> Generator[Any, None, None]:
        self.requests.append(request)
        gen = self._gen()
        self.live.append(gen)
        return gen

    def _gen(self) -> Generator[Any, None, None]:
        try:
            for chunk in self.chunks:
                if isinstance(chunk, BaseException):
                    raise chunk
                self.sent += 1
                yield chunk
        finally:
            self.closed = True

    def astream(self, request: ChatRequest) -> AsyncGenerator[Any, None]:
        self.requests.append(request)
        agen = self._agen()
        self.live.append(agen)
        return agen

    async def _agen(self) -> AsyncGenerator[Any, None]:
        try:
            for chunk in self.chunks:
                await asyncio.sleep(0)  # a real await point between chunks
                if isinstance(chunk, BaseException):
                    raise chunk
                self.sent += 1
                yield chunk
        finally:
            self.closed = True


class Stepper:
    """Steps a wrapped stream one ``next()`` at a time (sync generator or async generator)."""

    def __init__(self, stream: Any, runner: asyncio.Runner | None) -> None:
        self.stream = stream
        self.runner = runner

    def next(self) -> ChatDelta:
        if self.runner is None:
            return next(self.stream)  # type: ignore[no-any-return]
        try:
            return self.runner.run(anext(self.stream))  # type: ignore[no-any-return]
        except StopAsyncIteration:
            raise StopIteration from None

    def close(self) -> None:
        if self.runner is None:
            self.stream.close()
        else:
            self.runner.run(self.stream.aclose())

    def rest(self) -> list[ChatDelta]:
        out = []
        while True:
            try:
                out.append(self.next())
            except StopIteration:
                return out


class Face:
    """The sync face: ``call`` and ``stream``."""

    name = "sync"

    def __init__(self) -> None:
        self.runner: asyncio.Runner | None = None

    def call(self, mw: HistoryMiddleware, model: SpyModel, request: object, **kw: Any) -> ChatResponse:
        return mw.call(model)(request, **kw)  # type: ignore[arg-type]

    def open_stream(self, mw: HistoryMiddleware, streamer: SpyStreamer, request: object, **kw: Any) -> Stepper:
        return Stepper(mw.stream(streamer)(request, **kw), None)  # type: ignore[arg-type]

    def stream(self, mw: HistoryMiddleware, streamer: SpyStreamer, request: object, **kw: Any) -> list[ChatDelta]:
        return self.open_stream(mw, streamer, request, **kw).rest()

    def close(self) -> None:
        pass


class AsyncFace(Face):
    """The asyncio face: ``acall`` and ``astream`` driven by one ``asyncio.Runner``."""

    name = "async"

    def __init__(self) -> None:
        self.runner = asyncio.Runner()

    def call(self, mw: HistoryMiddleware, model: SpyModel, request: object, **kw: Any) -> ChatResponse:
        assert self.runner is not None  # Invariant: set in __init__.
        return self.runner.run(mw.acall(model.acall)(request, **kw))  # type: ignore[arg-type]

    def open_stream(self, mw: HistoryMiddleware, streamer: SpyStreamer, request: object, **kw: Any) -> Stepper:
        return Stepper(mw.astream(streamer.astream)(request, **kw), self.runner)  # type: ignore[arg-type]

    def close(self) -> None:
        assert self.runner is not None  # Invariant: set in __init__.
        self.runner.close()


def middleware(store: SpyStore, conversation_id: str = "support-4711") -> HistoryMiddleware:
    return HistoryMiddleware(MiddlewareConfig(store, store, conversation_id))
