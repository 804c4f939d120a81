"""The histlog console: the static web page ``histlog serve`` ships (docs/console.md).

``GET /console/`` is ``index.html``, ``GET /console/<file>`` one of the files shipped directly in
the package folder ``engine/service/console/`` (ES modules, the style sheet), anything else under
``/console/`` a 404 problem; ``GET /`` and ``GET /console`` redirect (307) to ``/console/``. The
files are read once, when the app is built, and served from memory: no path from the request
ever reaches the file system.

The console's files are public (``is_public``: the auth gate lets them through) because they hold
nothing but code: the page asks for the token itself and sends it with every API call, which
stay guarded as before. Every response carries a Content-Security-Policy that allows this origin
only, so the page cannot load or send anything elsewhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import orjson
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from engine.service.problems import CONTENT_TYPE, problem_of
from schemas.errors import NotFound

__all__ = ["FOLDER", "PREFIX", "is_public", "load", "routes"]

FOLDER: Final = Path(__file__).resolve().parent / "console"
PREFIX: Final = "/console/"
_TYPES: Final = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".json": "application/json",
}
_HEADERS: Final = {
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                                "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def is_public(path: str) -> bool:
    """Whether ``path`` is the console's (no token needed: its files hold only code)."""
    return path in ("/", "/console") or path.startswith(PREFIX)


def load(folder: Path = FOLDER) -> dict[str, tuple[bytes, str]]:
    """Every servable file directly in ``folder``: its name -> (bytes, content type)."""
    files: dict[str, tuple[bytes, str]] = {}
    if folder.is_dir():
        for item in sorted(folder.iterdir()):
            kind = _TYPES.get(item.suffix)
            if kind is not None and item.is_file() and not item.name.startswith("."):
                files[item.name] = (item.read_bytes(), kind)
    return files


def routes(folder: Path = FOLDER) -> list[BaseRoute]:
    """The console's Starlette routes (``GET``, and ``HEAD`` with it), over ``folder``'s files."""
    files = load(folder)

    def file_response(name: str) -> Response:
        found = files.get(name)
        if found is None:
            problem = problem_of(NotFound(f"the console has no file {name!r}: see {PREFIX}"), status=404)
            return Response(orjson.dumps(problem), status_code=404, media_type=CONTENT_TYPE)
        body, kind = found
        return Response(body, media_type=kind, headers=_HEADERS)

    async def index(request: Request) -> Response:
        return file_response("index.html")

    async def asset(request: Request) -> Response:
        return file_response(request.path_params["name"])

    async def to_console(request: Request) -> Response:
        return RedirectResponse(PREFIX, status_code=307)

    return [Route("/", to_console, methods=["GET"], name="console-root"),
            Route("/console", to_console, methods=["GET"], name="console-redirect"),
            Route(PREFIX, index, methods=["GET"], name="console-index"),
            Route(PREFIX + "{name}", asset, methods=["GET"], name="console-file")]
