"""The service's two hot shapes written once per framework, for ``bench_frameworks``.

Every app serves the same data with the same handler work, each in its framework's idiomatic way:

* ``GET /v1/conversations/{c}/window?limit=20``: 20 ``Msg`` models built per request from the
  same stored rows (as a real handler builds them from the projection), rendered as
  ``{"messages": [...]}`` (about 3 KB);
* ``PUT /v1/conversations/{c}/appends/{a}``: a ``{"messages": [...]}`` body validated into
  ``AppendBody`` (``extra="forbid"``, as ``engine.service.wire``), answered with a small ``Receipt``.

The models are pydantic, as ``engine.service.wire`` is: FastAPI and Litestar generate their
OpenAPI from them, Starlette and raw ASGI validate and render with them by hand. ``raw`` is the
floor: the same models and JSON, no framework. A framework that is not installed fails to import
here; the bench skips it.

``python -m bench.fw_apps FRAMEWORK PORT`` serves one app on uvicorn (httptools + uvloop, one
worker, as ``histlog serve``); granian loads the same factories (``bench.fw_apps:litestar_app``).
No ``from __future__ import annotations``: FastAPI and Litestar read the handlers' annotations at
runtime, and a string annotation naming a locally imported ``Query`` cannot be resolved.
"""

import hashlib
import itertools
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Annotated, Any, Literal, cast
from urllib.parse import parse_qs

import orjson
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["FACTORIES", "AppendBody", "Msg", "Receipt", "WindowOut", "append_receipt", "window_out"]

_STRICT = ConfigDict(extra="forbid")
LIMIT_MAX = 1000


class Part(BaseModel):
    model_config = _STRICT
    kind: Literal["text"]
    text: str


class Msg(BaseModel):
    model_config = _STRICT
    role: Literal["system", "user", "assistant", "tool"]
    parts: list[Part]


class WindowOut(BaseModel):
    model_config = _STRICT
    messages: list[Msg]


class AppendBody(BaseModel):
    model_config = _STRICT
    messages: Annotated[list[Msg], Field(min_length=1)]


class Position(BaseModel):
    model_config = _STRICT
    partition: int
    offset: int


class Receipt(BaseModel):
    model_config = _STRICT
    conversation_id: str
    append_id: str
    digest: str
    position: Position


_ASK = "what is the status of my order 1234, and when exactly will it arrive here? "
_ANSWER = "your order 1234 shipped yesterday by ground freight; it arrives on Friday morning. "
ROWS: list[tuple[Literal["user", "assistant"], str]] = [
    ("user", f"message {i:02d}: {_ASK}") if i % 2 == 0 else ("assistant", f"message {i:02d}: {_ANSWER}")
    for i in range(LIMIT_MAX)]
"""The stored rows every app builds its window from: the same data everywhere."""
_offsets = itertools.count()


def window_out(c: str, limit: int) -> WindowOut:
    """The last ``limit`` messages of ``c``, built as models from the stored rows."""
    return WindowOut(messages=[Msg(role=role, parts=[Part(kind="text", text=text)])
                               for role, text in ROWS[:limit]])


def append_receipt(c: str, a: str, body: AppendBody) -> Receipt:
    """A receipt for a validated batch (the digest is over what was accepted)."""
    digest = hashlib.sha256(f"{c}\0{a}\0{len(body.messages)}".encode()).hexdigest()
    return Receipt(conversation_id=c, append_id=a, digest=f"sha256:{digest}",
                   position=Position(partition=0, offset=next(_offsets)))


def _limit(raw: str | None) -> int:
    n = int(raw) if raw is not None else 20
    if not 1 <= n <= LIMIT_MAX:
        raise ValueError(f"query parameter limit: must be 1..{LIMIT_MAX}")
    return n


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def raw_app() -> ASGIApp:
    """Bare ASGI: path split by hand, the same models and pydantic JSON, no framework."""

    async def reply(send: Send, status: int, body: bytes) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (event := await receive())["type"] != "lifespan.shutdown":
                await send({"type": event["type"] + ".complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        try:
            await route(scope, receive, send)
        except ValueError as e:  # pydantic's ValidationError too: a 4xx, never a 500
            await reply(send, 422, orjson.dumps({"title": "invalid request", "detail": str(e)}))

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        parts = scope["path"].split("/")
        if scope["method"] == "GET" and len(parts) == 5 and parts[:3] == ["", "v1", "conversations"] \
                and parts[4] == "window":
            query = parse_qs(scope["query_string"].decode())
            out = window_out(parts[3], _limit(query.get("limit", [None])[0]))
            await reply(send, 200, out.model_dump_json().encode())
        elif scope["method"] == "PUT" and len(parts) == 6 and parts[4] == "appends":
            chunks = []
            while True:
                event = await receive()
                chunks.append(event.get("body", b""))
                if not event.get("more_body"):
                    break
            body = AppendBody.model_validate_json(b"".join(chunks))
            await reply(send, 200, append_receipt(parts[3], parts[5], body).model_dump_json().encode())
        else:
            await reply(send, 404, b'{"title":"not found"}')

    return app


def starlette_app() -> ASGIApp:
    """Starlette (what ``engine.service`` uses): routes, models validated and dumped by hand."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    async def invalid(request: Request, exc: Exception) -> Response:  # pydantic's ValidationError too
        return JSONResponse({"title": "invalid request", "detail": str(exc)}, status_code=422)

    async def window(request: Request) -> Response:
        out = window_out(request.path_params["c"], _limit(request.query_params.get("limit")))
        return Response(out.model_dump_json(), media_type="application/json")

    async def put_append(request: Request) -> Response:
        body = AppendBody.model_validate_json(await request.body())
        receipt = append_receipt(request.path_params["c"], request.path_params["a"], body)
        return Response(receipt.model_dump_json(), media_type="application/json")

    return Starlette(routes=[Route("/v1/conversations/{c}/window", window, methods=["GET"]),
                             Route("/v1/conversations/{c}/appends/{a}", put_append, methods=["PUT"])],
                     exception_handlers={ValueError: invalid})


def fastapi_app() -> ASGIApp:
    """FastAPI: typed parameters and models, the OpenAPI document generated from them."""
    from fastapi import FastAPI, Query  # type: ignore[import-not-found,unused-ignore]

    app = FastAPI(title="histlog-bench")

    @app.get("/v1/conversations/{c}/window")  # type: ignore[untyped-decorator,unused-ignore]
    async def window(c: str, limit: Annotated[int, Query(ge=1, le=LIMIT_MAX)] = 20) -> WindowOut:
        return window_out(c, limit)

    @app.put("/v1/conversations/{c}/appends/{a}")  # type: ignore[untyped-decorator,unused-ignore]
    async def put_append(c: str, a: str, body: AppendBody) -> Receipt:
        return append_receipt(c, a, body)

    return cast(ASGIApp, app)


def litestar_app() -> ASGIApp:
    """Litestar: typed handlers and the same pydantic models (its plugin), OpenAPI from them."""
    from litestar import Litestar, get, put  # type: ignore[import-not-found,unused-ignore]
    from litestar.params import Parameter  # type: ignore[import-not-found,unused-ignore]

    @get("/v1/conversations/{c:str}/window")  # type: ignore[untyped-decorator,unused-ignore]
    async def window(c: str, limit: Annotated[int, Parameter(ge=1, le=LIMIT_MAX)] = 20) -> WindowOut:
        return window_out(c, limit)

    @put("/v1/conversations/{c:str}/appends/{a:str}", status_code=200)  # type: ignore[untyped-decorator,unused-ignore]
    async def put_append(c: str, a: str, data: AppendBody) -> Receipt:
        return append_receipt(c, a, data)

    return cast(ASGIApp, Litestar(route_handlers=[window, put_append]))


def litestar_msgspec_app() -> ASGIApp:
    """Litestar on its native msgspec Structs instead of pydantic (not what ``engine.service.wire``
    is written in): what Litestar costs once the models are rewritten for it."""
    import msgspec  # type: ignore[import-not-found,unused-ignore]
    from litestar import Litestar, get, put  # type: ignore[import-not-found,unused-ignore]
    from litestar.params import Parameter  # type: ignore[import-not-found,unused-ignore]

    class SPart(msgspec.Struct, forbid_unknown_fields=True):  # type: ignore[misc,call-arg,unused-ignore]
        kind: Literal["text"]
        text: str

    class SMsg(msgspec.Struct, forbid_unknown_fields=True):  # type: ignore[misc,call-arg,unused-ignore]
        role: Literal["system", "user", "assistant", "tool"]
        parts: list[SPart]

    class SWindow(msgspec.Struct):  # type: ignore[misc,unused-ignore]
        messages: list[SMsg]

    class SAppend(msgspec.Struct, forbid_unknown_fields=True):  # type: ignore[misc,call-arg,unused-ignore]
        messages: Annotated[list[SMsg], msgspec.Meta(min_length=1)]

    class SPosition(msgspec.Struct):  # type: ignore[misc,unused-ignore]
        partition: int
        offset: int

    class SReceipt(msgspec.Struct):  # type: ignore[misc,unused-ignore]
        conversation_id: str
        append_id: str
        digest: str
        position: SPosition

    @get("/v1/conversations/{c:str}/window")  # type: ignore[untyped-decorator,unused-ignore]
    async def window(c: str, limit: Annotated[int, Parameter(ge=1, le=LIMIT_MAX)] = 20) -> SWindow:
        return SWindow(messages=[SMsg(role=role, parts=[SPart(kind="text", text=text)]) for role, text in ROWS[:limit]])

    @put("/v1/conversations/{c:str}/appends/{a:str}", status_code=200)  # type: ignore[untyped-decorator,unused-ignore]
    async def put_append(c: str, a: str, data: SAppend) -> SReceipt:
        digest = hashlib.sha256(f"{c}\0{a}\0{len(data.messages)}".encode()).hexdigest()
        return SReceipt(conversation_id=c, append_id=a, digest=f"sha256:{digest}",
                        position=SPosition(partition=0, offset=next(_offsets)))

    return cast(ASGIApp, Litestar(route_handlers=[window, put_append]))


FACTORIES: dict[str, Callable[[], ASGIApp]] = {
    "raw": raw_app, "starlette": starlette_app, "fastapi": fastapi_app, "litestar": litestar_app,
    "litestar_msgspec": litestar_msgspec_app}


def main(argv: list[str]) -> int:
    """``FRAMEWORK PORT``: serve that app on uvicorn (httptools + uvloop, one worker) until SIGTERM."""
    import uvicorn

    framework, port = argv[0], int(argv[1])
    uvicorn.run(FACTORIES[framework](), host="127.0.0.1", port=port, loop="uvloop", http="httptools",
                ws="none", lifespan="auto", access_log=False, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
