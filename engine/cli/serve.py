"""``histlog serve``: one engine behind HTTP (SERVICE.md) on uvicorn.

What it promises: the line ``listening=http://HOST:PORT`` on stdout (flushed, the real port when
``--listen`` says 0) once the socket accepts, and nothing else on stdout; logs on stderr. A
non-loopback ``--listen`` without a token is refused (exit 2, one line) unless ``--insecure``.
SIGTERM or SIGINT stops accepting, lets the requests in flight finish (at most
``DRAIN_TIMEOUT`` seconds), closes the engine and exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from socket import socket
from typing import TextIO

import uvicorn

from engine.cli.exits import OK, UsageError
from engine.cli.target import Target
from engine.service.app import build_app
from engine.service.auth import DEFAULT_MAX_BODY
from engine.service.forward import Forwarder
from engine.service.health import observability

__all__ = ["DEFAULT_LISTEN", "DRAIN_TIMEOUT", "cmd_serve", "listen_address", "token_of"]

DEFAULT_LISTEN = "127.0.0.1:8420"
DRAIN_TIMEOUT = 10
"""Seconds the requests in flight get to finish after SIGTERM before their connections are closed."""


def listen_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) as ``(host, port)``; ``UsageError`` otherwise."""
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"invalid --listen {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8420 (port 0 picks one)")
    return host, int(port)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def token_of(token_file: str | None, env: Mapping[str, str]) -> str | None:
    """The bearer token: ``--token-file``'s content without a trailing newline, else
    ``HISTLOG_TOKEN``, else None. An empty token is refused (it would protect nothing)."""
    if token_file is not None:
        try:
            token = Path(token_file).read_text(encoding="utf-8").removesuffix("\n").removesuffix("\r")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read --token-file {token_file}: {exc}") from None
        if not token:
            raise UsageError(f"--token-file {token_file} is empty: put the token in it")
        return token
    given = env.get("HISTLOG_TOKEN")
    if given is not None and not given:
        raise UsageError("HISTLOG_TOKEN is empty: set the token or unset the variable")
    return given


class _Server(uvicorn.Server):
    """uvicorn that announces itself on stdout once accepting, and whose SIGTERM/SIGINT only
    drain (uvicorn's own handler re-raises the signal after shutdown, which would kill the
    process before the engine is closed)."""

    def __init__(self, config: uvicorn.Config, out: TextIO, on_shutdown: Callable[[], None],
                 forwarder: Forwarder | None = None) -> None:
        super().__init__(config)
        self._out = out
        self._on_shutdown = on_shutdown
        self._forwarder = forwarder

    async def startup(self, sockets: list[socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            shown = f"[{host}]" if ":" in host else host
            print(f"listening=http://{shown}:{port}", file=self._out, flush=True)

    async def shutdown(self, sockets: list[socket] | None = None) -> None:
        self._on_shutdown()  # end the event streams first: uvicorn waits for open connections
        await super().shutdown(sockets)
        if self._forwarder is not None:  # a cluster member's pool of connections to the others
            await self._forwarder.aclose()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def cmd_serve(ns: argparse.Namespace, target: Target, out: TextIO) -> int:
    host, port = listen_address(ns.listen)
    token = token_of(ns.token_file, os.environ)
    if token is None and not _loopback(host) and not ns.insecure:
        raise UsageError(f"refusing to listen on {host} without a token: give --token-file FILE (or HISTLOG_TOKEN), "
                         "or --insecure if the network is yours alone")
    if ns.max_body <= 0:
        raise UsageError(f"invalid --max-body {ns.max_body}: expected a positive number of bytes")
    with target.open() as engine:
        extras = observability(engine)  # events, /metrics, /healthz, /readyz
        app = build_app(engine, token=token, max_body=ns.max_body, extra_ops=extras.ops,
                        extra_routes=[*extras.readiness.routes, *extras.metrics.routes],
                        middleware=[extras.middleware])
        config = uvicorn.Config(app, host=host, port=port, lifespan="off", log_config=None, access_log=False,
                                timeout_graceful_shutdown=DRAIN_TIMEOUT, server_header=False,
                                proxy_headers=False)  # no route uses the client's address: skip its parsing
        print(f"histlog: serving {target.describe()}{' (token required)' if token else ''}", file=sys.stderr,
              flush=True)
        try:
            _Server(config, out, extras.close, app.forwarder).run()
        finally:
            extras.close()
    print("histlog: stopped", file=sys.stderr, flush=True)
    return OK


def add_serve(command: argparse.ArgumentParser, integer: type[int] | object) -> None:
    """The ``serve`` flags (registered by ``engine.cli.parser``)."""
    command.add_argument("--listen", metavar="HOST:PORT", default=DEFAULT_LISTEN,
                         help=f"where to accept HTTP (default {DEFAULT_LISTEN}; port 0 picks a free one)")
    command.add_argument("--token-file", metavar="FILE",
                         help="require Authorization: Bearer <the file's content> (or env HISTLOG_TOKEN)")
    command.add_argument("--insecure", action="store_true",
                         help="allow a non-loopback --listen without a token")
    command.add_argument("--max-body", metavar="BYTES", type=integer, default=DEFAULT_MAX_BODY,  # type: ignore[arg-type]
                         help=f"the largest request body accepted (default {DEFAULT_MAX_BODY}); larger is a 413")
