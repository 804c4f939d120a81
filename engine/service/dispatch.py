"""``Dispatch``: the route table's own ASGI router, the service's hot path.

Every operation of ``engine.service.routes`` (``OPS`` and the extra ones) is found here by a
walk of its path segments in a trie (a few dict lookups, whatever the number of routes) on
``scope["raw_path"]``, not the decoded ``path``: an id is one percent-encoded segment (``/`` is
``%2F``), so decoding before splitting would cut it in two. Each ``{name}`` segment stays encoded
in ``path_params`` and is decoded by ``routing.segment``. A path that names an operation with
another method is a 405 problem with ``Allow``; any other path goes on to ``fallback`` (the
Starlette app: ``/openapi.json``, health, metrics, and the 404 problem).

Why not Starlette's router: measured on the development VM (2 cores, one keep-alive client,
``window(20)`` of a 100-message conversation), Starlette's exception middleware, router and
``request_response`` wrapper cost more than the handler itself; dispatching here saved about a
third of the service's time per request (numbers in the commit and the README).

``scope["route"]`` is set to the operation, so the request metrics label by its template.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["Dispatch", "Endpoint"]

Endpoint = Callable[[Request], Awaitable[Response]]
_PARAM = "{}"


class _Node:
    __slots__ = ("children", "methods", "names", "path")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.methods: dict[str, Endpoint] = {}
        self.names: tuple[str, ...] = ()
        self.path = ""


class _Route:
    """What the metrics read from ``scope["route"]``: the template."""

    __slots__ = ("path",)

    def __init__(self, path: str) -> None:
        self.path = path


class Dispatch:
    """Route ``(method, path template, endpoint)`` rows; everything else to ``app`` (the
    fallback). An ASGI middleware, so Starlette's ``Middleware(Dispatch, rows=..., ...)`` puts it
    inside the auth gate and the request metrics."""

    def __init__(self, app: ASGIApp, rows: Sequence[tuple[str, str, Endpoint]],
                 method_not_allowed: Callable[[str, str, list[str]], Response]) -> None:
        self.fallback = app
        self._not_allowed = method_not_allowed
        self._root = _Node()
        self._routes: dict[str, _Route] = {}
        for method, path, endpoint in rows:
            node, names = self._root, []
            for part in path[1:].split("/"):
                if part.startswith("{") and part.endswith("}"):
                    names.append(part[1:-1])
                    part = _PARAM
                node = node.children.setdefault(part, _Node())
            if method in node.methods:
                raise ValueError(f"two operations for {method} {path}")
            if node.methods and tuple(names) != node.names:
                raise ValueError(f"{path}: its parameters are named unlike the other methods' of this path")
            node.methods[method], node.names, node.path = endpoint, tuple(names), path
            self._routes.setdefault(path, _Route(path))

    def _find(self, raw: str) -> tuple[_Node, list[str]] | None:
        node, values = self._root, []
        if not raw.startswith("/"):
            return None
        for part in raw[1:].split("/"):
            child = node.children.get(part)
            if child is None:
                child = node.children.get(_PARAM) if part else None
                if child is None:
                    return None
                values.append(part)
            node = child
        return (node, values) if node.methods else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            raw = scope.get("raw_path")
            text = raw.decode("latin-1").split("?", 1)[0] if raw is not None else scope["path"]
            found = self._find(text)
            if found is not None:
                node, values = found
                endpoint = node.methods.get(scope["method"])
                scope["route"] = self._routes[node.path]
                if endpoint is None:
                    response = self._not_allowed(scope["method"], text, sorted(node.methods))
                else:
                    scope["path_params"] = dict(zip(node.names, values, strict=True))
                    response = await endpoint(Request(scope, receive))
                await response(scope, receive, send)
                return
        await self.fallback(scope, receive, send)

    def __repr__(self) -> str:
        return f"Dispatch({sorted(self._routes)!r})"
