"""What every route shares (``engine.service.routes`` and its sibling tables): the ``Context`` a
handler gets, the ``Op`` row that routes a request and documents it in ``/openapi.json``, and
the JSON response."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from engine.service.examples import Example
from engine.service.forward import Forwarder
from engine.service.routing import Param, Router

__all__ = ["DEFAULT_MAX_WAITERS", "Context", "Handler", "Op", "Waiters", "json_response"]

DEFAULT_MAX_WAITERS = 1000
"""How many reads may wait for a log position (``at_least``) at once, by default (``--max-waiters``):
a wait holds no thread, only a future and a connection; past the bound a read is a 503 at once."""

@dataclass(slots=True)
class Waiters:
    """The reads waiting for a log position now, and how many may (on the loop: no lock)."""

    limit: int
    count: int = 0


@dataclass(frozen=True, slots=True)
class Context:
    """What every handler may use: the router (which engine), the body limit, the waiting reads,
    and in a cluster the forwarder to the other members."""

    router: Router
    max_body: int
    forwarder: Forwarder | None = None
    waiters: Waiters = field(default_factory=lambda: Waiters(DEFAULT_MAX_WAITERS))


Handler = Callable[[Request, Context, dict[str, Any]], Awaitable[Response]]


@dataclass(frozen=True, slots=True)
class Op:
    """One route: ``handler(request, context, query)`` answers ``ok`` (status, model or None)."""

    method: str
    path: str
    name: str
    summary: str
    handler: Handler
    ok: tuple[int, type[BaseModel] | None]
    query: tuple[Param, ...] = ()
    body: type[BaseModel] | None = None
    errors: tuple[int, ...] = field(default=(400, 401, 404, 503))
    ok_media: str = "application/json"
    """The success body's media type; one other than JSON (``text/event-stream``) is documented
    as a string."""
    examples: tuple[Example, ...] = ()
    """Request bodies the server accepts, shown in ``/openapi.json`` (``engine.service.examples``)."""

    @property
    def routed(self) -> bool:
        """Whether the operation is on one conversation (its path has ``{c}``): in a cluster it is
        served by the conversation's owner, so a member may forward it or answer 421."""
        return "{c}" in self.path


def json_response(tree: Any, status: int = 200) -> Response:
    """A JSON response; ``tree`` may hold ``orjson.Fragment``s (the schemas' own ``to_json``)."""
    return Response(orjson.dumps(tree), status_code=status, media_type="application/json")
