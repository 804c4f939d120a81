"""``build_app``: the histlog HTTP service (SERVICE.md) as one Starlette application.

The app is the route table of ``engine.service.routes`` (``OPS``), dispatched by
``engine.service.dispatch`` (raw-path segments, the service's hot path) in front of a Starlette app
for the rest, behind ``BearerAuth`` when a token is given. Every error leaves as problem+json through
``problems``: a ``HistoryError`` with its status (``Retry-After`` on 503), a body over the limit as
413 ``InvalidBatch``, an unknown path as 404 ``NotFound``, a wrong method as 405; anything
unexpected as a 500 whose detail is one line (the traceback goes to the ``histlog.service`` log on
stderr, never into a body). Bad input is never a 500.

In a cluster (``ownership``: where the member reads its current ``OwnershipMap``), every
operation on one conversation (a path with ``{c}``) is decided before its handler runs: the
query and the conversation id are checked here (a 400 never travels), then ``Router.serving``
says serve here or forward, and a forward is relayed by the app's one ``Forwarder`` (one hop;
a request already forwarded that meets a non-owner is 421 ``NotOwner``). ``/v1/stats``,
``/v1/cluster``, health, metrics and ``/openapi.json`` are always answered here, and
``GET /v1/conversations`` merges every owner's page.

Adding routes and middleware (``/healthz``, ``/readyz``, ``/metrics``, events): pass them in.
``extra_ops`` are ``routes.Op`` rows (documented in ``/openapi.json`` and guarded like every
other operation); ``extra_routes`` are plain Starlette routes (undocumented: health and metrics);
``middleware`` wraps the whole app inside the auth gate (e.g. request metrics). The marked spot in
``build_app`` is where they join.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from engine.aio import AsyncHistoryEngine
from engine.facade import HistoryEngine
from engine.service import console, openapi
from engine.service.auth import DEFAULT_MAX_BODY, BearerAuth, BodyTooLarge, read_body
from engine.service.dispatch import Dispatch, Endpoint
from engine.service.forward import Forwarder, is_forwarded
from engine.service.problems import CONTENT_TYPE, problem_of, retry_after, status_of
from engine.service.routes import DEFAULT_MAX_WAITERS, OPS, Context, Handler, Op, Waiters
from engine.service.routing import Forward, Ownership, Router, parse_query, segment
from schemas.errors import HistoryError, InvalidRequest, NotFound
from schemas.ids import ConversationID

__all__ = ["Service", "build_app", "problem_response"]

log = logging.getLogger("histlog.service")


def problem_response(exc: BaseException, *, status: int | None = None) -> Response:
    """The problem+json response for ``exc`` (``Retry-After`` when a retry helps)."""
    code = status if status is not None else status_of(exc)
    headers = {}
    if (after := retry_after(exc, code)) is not None:
        headers["Retry-After"] = after
    return Response(orjson.dumps(problem_of(exc, status=code)), status_code=code, media_type=CONTENT_TYPE,
                    headers=headers)


def _method_not_allowed(method: str, path: str, allowed: list[str]) -> Response:
    response = problem_response(InvalidRequest(f"{method} {path}: Method Not Allowed (allowed: {', '.join(allowed)})"),
                                status=405)
    response.headers["Allow"] = ", ".join(allowed)
    return response


def _guarded(op: Op, ctx: Context) -> Endpoint:
    """``op``'s handler with its query parsed, its conversation routed (in a cluster) and every
    failure answered as a problem."""
    handler: Handler = op.handler
    stream = op.ok_media == "text/event-stream"

    async def endpoint(request: Request) -> Response:
        try:
            query = parse_query(request, op.query)
            if op.routed and ctx.forwarder is not None:
                c = str(ConversationID(segment(request, "c")))
                decided = ctx.router.serving(c, forwarded=is_forwarded(request))
                if isinstance(decided, Forward):
                    body = await read_body(request, ctx.max_body)
                    return await ctx.forwarder.relay(request, decided.url, body, stream=stream)
            return await handler(request, ctx, query)
        except BodyTooLarge as exc:
            return problem_response(exc, status=413)
        except HistoryError as exc:
            return problem_response(exc)
        except Exception as exc:  # an unexpected failure: one line out, the traceback to the log
            log.exception("%s %s failed", op.method, op.path)
            return problem_response(exc, status=500)

    return endpoint


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)  # Invariant: registered for HTTPException only.
    if exc.status_code == 404:
        return problem_response(NotFound(f"no route for {request.method} {request.url.path}: see /openapi.json"))
    response = problem_response(InvalidRequest(f"{request.method} {request.url.path}: {exc.detail}"),
                                status=exc.status_code)
    response.headers.update(exc.headers or {})  # a 405's Allow
    return response


async def _crash(request: Request, exc: Exception) -> Response:
    log.error("unexpected failure on %s %s: %s", request.method, request.url.path, exc)
    return problem_response(exc, status=500)


class Service:
    """What ``build_app`` makes: the ASGI app, and the ``Forwarder`` (a cluster member's pool of
    connections to the other members, None otherwise) that its server closes on shutdown."""

    __slots__ = ("app", "forwarder")

    def __init__(self, app: ASGIApp, forwarder: Forwarder | None) -> None:
        self.app, self.forwarder = app, forwarder

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


def build_app(engine: HistoryEngine, *, token: str | None = None, max_body: int = DEFAULT_MAX_BODY,
              max_waiters: int = DEFAULT_MAX_WAITERS, extra_ops: Sequence[Op] = (),
              extra_routes: Sequence[BaseRoute] = (), middleware: Sequence[Middleware] = (),
              ownership: Ownership | None = None) -> Service:
    """The service over ``engine`` (which the caller keeps and closes). ``token``: required as
    ``Authorization: Bearer`` on every path but /healthz, /readyz, /openapi.json and the console's
    static files (``/``, ``/console/...``: the page asks for the token itself). ``ownership``:
    a cluster member's source of its current ``OwnershipMap`` (None: serve every conversation
    here); the app's ``Forwarder`` is ``.forwarder`` (close it with ``aclose`` on shutdown).
    ``max_waiters``: how many reads may wait for an ``at_least`` position at once (then 503).

    The layers, outermost first: ``BearerAuth`` (with a token), ``middleware`` (e.g. the request
    metrics), ``Dispatch`` (every operation of the table), then a Starlette app for the other
    paths (``/openapi.json``, ``extra_routes``, the 404 problem). The operations skip Starlette's
    own middleware and router: measured, they cost more than a small read (see ``dispatch``); an
    operation's failures are answered by its guard, so Starlette's error middleware adds nothing."""
    if max_body <= 0:
        raise ValueError(f"max_body must be positive, got {max_body}")
    if max_waiters < 0:
        raise ValueError(f"max_waiters must be 0 or more, got {max_waiters}")
    forwarder = None if ownership is None else Forwarder()
    ctx = Context(Router(AsyncHistoryEngine(engine), ownership), max_body, forwarder, Waiters(max_waiters))
    ops = (*OPS, *extra_ops)
    document = orjson.dumps(openapi.document(ops))

    async def openapi_json(request: Request) -> Response:
        return Response(document, media_type="application/json")

    routes: list[BaseRoute] = [Route("/openapi.json", openapi_json, methods=["GET"], name="openapi")]
    # ---- extra routes join here (health, readiness, metrics: see the module docstring)
    routes += list(extra_routes)
    routes += console.routes()  # the console's static files, / and /console redirecting to /console/
    rest = Starlette(routes=routes, exception_handlers={HTTPException: _http_error, Exception: _crash})
    app: ASGIApp = Dispatch(rest, [(op.method, op.path, _guarded(op, ctx)) for op in ops], _method_not_allowed)
    stack = list(middleware)
    if token is not None:
        stack.insert(0, Middleware(BearerAuth, token=token))
    for layer in reversed(stack):
        app = layer.cls(app, *layer.args, **layer.kwargs)
    return Service(app, forwarder)
