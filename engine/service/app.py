"""``build_app``: the histlog HTTP service (SERVICE.md) as one Starlette application.

The app is the route table of ``engine.service.routes`` (``OPS``) mounted on raw-path routes,
behind ``BearerAuth`` when a token is given. Every error leaves as problem+json through
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
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from engine.aio import AsyncHistoryEngine
from engine.facade import HistoryEngine
from engine.service import openapi
from engine.service.auth import DEFAULT_MAX_BODY, BearerAuth, BodyTooLarge, read_body
from engine.service.forward import Forwarder, is_forwarded
from engine.service.problems import CONTENT_TYPE, problem_of, retry_after, status_of
from engine.service.routes import OPS, Context, Handler, Op
from engine.service.routing import Forward, Ownership, RawRoute, Router, parse_query, segment
from schemas.errors import HistoryError, InvalidRequest, NotFound
from schemas.ids import ConversationID

__all__ = ["build_app", "problem_response"]

log = logging.getLogger("histlog.service")


def problem_response(exc: BaseException, *, status: int | None = None) -> Response:
    """The problem+json response for ``exc`` (``Retry-After`` when a retry helps)."""
    code = status if status is not None else status_of(exc)
    headers = {}
    if (after := retry_after(code)) is not None:
        headers["Retry-After"] = after
    return Response(orjson.dumps(problem_of(exc, status=code)), status_code=code, media_type=CONTENT_TYPE,
                    headers=headers)


def _guarded(op: Op, ctx: Context) -> Any:
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


def build_app(engine: HistoryEngine, *, token: str | None = None, max_body: int = DEFAULT_MAX_BODY,
              extra_ops: Sequence[Op] = (), extra_routes: Sequence[BaseRoute] = (),
              middleware: Sequence[Middleware] = (), ownership: Ownership | None = None) -> Starlette:
    """The service over ``engine`` (which the caller keeps and closes). ``token``: required as
    ``Authorization: Bearer`` on every path but /healthz, /readyz, /openapi.json. ``ownership``:
    a cluster member's source of its current ``OwnershipMap`` (None: serve every conversation
    here); the app's ``Forwarder`` is ``app.state.forwarder`` (close it with ``aclose`` on
    shutdown)."""
    if max_body <= 0:
        raise ValueError(f"max_body must be positive, got {max_body}")
    forwarder = None if ownership is None else Forwarder()
    ctx = Context(Router(AsyncHistoryEngine(engine), ownership), max_body, forwarder)
    ops = (*OPS, *extra_ops)
    document = orjson.dumps(openapi.document(ops))

    async def openapi_json(request: Request) -> Response:
        return Response(document, media_type="application/json")

    routes: list[BaseRoute] = [RawRoute(op.path, _guarded(op, ctx), methods=[op.method], name=op.name)
                               for op in ops]
    routes.append(Route("/openapi.json", openapi_json, methods=["GET"], name="openapi"))
    # ---- extra routes join here (health, readiness, metrics: see the module docstring)
    routes += list(extra_routes)
    stack = list(middleware)
    if token is not None:
        stack.insert(0, Middleware(BearerAuth, token=token))
    app = Starlette(routes=routes, middleware=stack,
                    exception_handlers={HTTPException: _http_error, Exception: _crash})
    app.state.context = ctx
    app.state.engine = engine
    app.state.forwarder = forwarder
    return app
