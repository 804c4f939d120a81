"""The service's two gates on a request: the bearer token and the body limit.

``BearerAuth`` is a pure ASGI middleware so it covers every route, including the ones added
after this module was written (``/metrics``, events): deny by default, only ``PUBLIC`` paths
(``/healthz``, ``/readyz``, ``/openapi.json``) and the console's static files (``/``,
``/console/...``: code only, the page asks for the token and sends it on its API calls) need no
token. The token comparison is constant-time (``hmac.compare_digest``) so its timing says nothing
about the token.

``read_body`` reads a request body counting bytes as they stream in and stops at the limit: a
client cannot make the server buffer more than ``max_body`` bytes (413 ``InvalidBatch``).
"""

from __future__ import annotations

import hmac
from typing import Final

import orjson
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from engine.service import console
from engine.service.problems import CONTENT_TYPE, problem_of
from schemas.errors import InvalidBatch, Unauthorized

__all__ = ["DEFAULT_MAX_BODY", "PUBLIC", "BearerAuth", "BodyTooLarge", "read_body"]

DEFAULT_MAX_BODY: Final = 16 * 1024 * 1024
PUBLIC: Final = frozenset({"/healthz", "/readyz", "/openapi.json"})
"""The paths that need no token; every other path does when a token is configured."""


class BodyTooLarge(InvalidBatch):
    """A request body over the limit: an ``InvalidBatch`` answered with 413, not 400."""

    status = 413


class BearerAuth:
    """Refuse (401 ``Unauthorized`` problem) every non-public request without
    ``Authorization: Bearer <token>``."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        if not token:
            raise ValueError("an empty token protects nothing: give a token or none")
        self.app = app
        self._expected = token.encode("utf-8")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC or console.is_public(scope["path"]):
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        scheme, _, credential = given.partition(b" ")
        # the scheme is case-insensitive (RFC 9110); the token is compared in constant time
        if scheme.lower() == b"bearer" and hmac.compare_digest(credential, self._expected):
            await self.app(scope, receive, send)
            return
        what = "no Authorization header" if not given else "a wrong token"
        body = orjson.dumps(problem_of(Unauthorized(
            f"this server needs Authorization: Bearer <token>; the request had {what}")))
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", CONTENT_TYPE.encode()), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b'Bearer realm="histlog"')]})
        await send({"type": "http.response.body", "body": body})


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, at most ``limit`` bytes; ``BodyTooLarge`` as soon as it is known to be
    longer (from ``Content-Length``, or while counting the streamed chunks)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"request body of {declared} bytes is over the server's limit of {limit} bytes "
                           "(--max-body): split the batch")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"request body is over the server's limit of {limit} bytes (--max-body): "
                               "split the batch")
        chunks.append(chunk)
    return b"".join(chunks)
