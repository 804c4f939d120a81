"""``histlog serve``: one engine behind HTTP (SERVICE.md) on uvicorn.

What it promises: the line ``listening=http://HOST:PORT`` on stdout (flushed, the real port when
``--listen`` says 0) once the socket accepts, and nothing else on stdout; logs on stderr. A
non-loopback ``--listen`` without a token is refused (exit 2, one line) unless ``--insecure``.
SIGTERM or SIGINT stops accepting, lets the requests in flight finish (at most
``DRAIN_TIMEOUT`` seconds), closes the engine and exits 0.

With ``--group NAME`` (Kafka only, with ``--advertise URL``) the server is a cluster member
(``engine.cluster.member``, docs/cluster.md): its engine opens owning no partition and takes
what the group assigns. The socket is bound before joining, so a port 0 in ``--advertise``
(``http://127.0.0.1:0``) stands for the port ``--listen`` got: with ``--listen HOST:0`` that is
how a member advertises the port it really listens on. On SIGTERM the member drains, then leaves
the group (Kafka hands its partitions over at once), then closes the engine.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from socket import AF_INET, AF_INET6, create_server, socket
from typing import TextIO
from urllib.parse import urlsplit, urlunsplit

import uvicorn

from engine.cli.exits import OK, UNAVAILABLE, UsageError
from engine.cli.target import Target
from engine.cluster.member import ClusterCollector, ClusterMember, ClusterReadiness
from engine.cluster.membership import DEFAULT_SESSION_TIMEOUT, MIN_SESSION_TIMEOUT
from engine.cluster.standbys import DEFAULT_WARMUP_LAG, MAX_STANDBYS
from engine.render import one_line
from engine.service.app import build_app
from engine.service.auth import DEFAULT_MAX_BODY
from engine.service.forward import Forwarder
from engine.service.health import Readiness, observability
from engine.service.routes import DEFAULT_MAX_WAITERS
from schemas.errors import HistoryError

__all__ = ["DEFAULT_LISTEN", "DRAIN_TIMEOUT", "Cluster", "advertised_url", "cluster_of", "cmd_serve", "listen_address",
           "token_of"]

DEFAULT_LISTEN = "127.0.0.1:8420"
DRAIN_TIMEOUT = 10
"""Seconds the requests in flight get to finish after SIGTERM before their connections are closed."""
FAIL_STOP_GRACE = 3.0
"""Seconds a fail-stopped server keeps answering (``/readyz`` 503, so a load balancer takes it out)
before it drains and exits 4 for its supervisor to restart it (see ``_Server``)."""


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


@dataclass(frozen=True, slots=True)
class Cluster:
    """``--group``, ``--advertise`` (port 0: the listening port) and ``--session-timeout``, checked."""

    group: str
    advertise: str
    session_timeout: float
    instance_id: str | None = None
    standbys: int = 0
    warmup_lag: int = DEFAULT_WARMUP_LAG
    snapshots: bool = True


def cluster_of(ns: argparse.Namespace, target: Target) -> Cluster | None:
    """The cluster flags checked before anything is opened (``UsageError`` naming what to add)."""
    group, advertise, timeout, instance = ns.group, ns.advertise, ns.session_timeout, ns.instance_id
    standbys, warmup = ns.standbys, ns.warmup_lag
    if group is None:
        if any(v is not None for v in (advertise, timeout, instance, standbys, warmup)) or ns.no_snapshots:
            raise UsageError("--advertise, --session-timeout, --instance-id, --standbys, --warmup-lag and "
                             "--no-snapshots apply to --group NAME (a cluster member): add --group")
        return None
    if not group.strip():
        raise UsageError("--group is empty: name the cluster, e.g. --group histlog")
    if target.kafka is None:
        raise UsageError("--group needs --kafka HOST:PORT (and --topic, --state): a cluster's members share a "
                         "Kafka topic")
    if advertise is None:
        raise UsageError("--group needs --advertise http://HOST:PORT: the URL other members and clients reach "
                         "this one at (port 0: the port --listen got)")
    parts = urlsplit(advertise)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/") or port == -1 \
            or parts.query or parts.fragment:
        raise UsageError(f"invalid --advertise {advertise!r}: expected http://HOST:PORT (no path), "
                         "e.g. http://10.0.0.5:8420")
    timeout = DEFAULT_SESSION_TIMEOUT if timeout is None else timeout
    if not MIN_SESSION_TIMEOUT <= timeout <= 1800:
        raise UsageError(f"invalid --session-timeout {timeout:g}: expected {MIN_SESSION_TIMEOUT:g}..1800 seconds "
                         "(Kafka's group.min.session.timeout.ms is 6 s by default)")
    if instance is not None and not instance.strip():
        raise UsageError("--instance-id is empty: give this member's stable name, or leave it out")
    standbys = 0 if standbys is None else standbys
    if not 0 <= standbys <= MAX_STANDBYS:
        raise UsageError(f"invalid --standbys {standbys}: expected 0..{MAX_STANDBYS} (copies of each partition's "
                         "state kept by other members; 1 is the usual choice)")
    if warmup is not None and not standbys:
        raise UsageError("--warmup-lag applies with --standbys K (a partition is warmed up as a standby): add "
                         "--standbys 1")
    warmup = DEFAULT_WARMUP_LAG if warmup is None else warmup
    if warmup < 0:
        raise UsageError(f"invalid --warmup-lag {warmup}: expected a number of records >= 0")
    return Cluster(group, advertise.rstrip("/"), float(timeout), instance, standbys, warmup, not ns.no_snapshots)


def advertised_url(advertise: str, bound_port: int) -> str:
    """``advertise`` with a port 0 replaced by ``bound_port`` (the port the socket got)."""
    parts = urlsplit(advertise)
    if parts.port != 0:
        return advertise
    host = parts.netloc.rsplit(":", 1)[0]
    return urlunsplit((parts.scheme, f"{host}:{bound_port}", "", "", ""))


def _bind(host: str, port: int) -> socket:
    """A listening TCP socket on ``host:port`` (port 0: a free one), for uvicorn to serve on."""
    family = AF_INET6 if ":" in host else AF_INET
    try:
        return create_server((host, port), family=family, backlog=2048)
    except OSError as exc:
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


class _Server(uvicorn.Server):
    """uvicorn that announces itself on stdout once accepting, and whose SIGTERM/SIGINT only
    drain (uvicorn's own handler re-raises the signal after shutdown, which would kill the
    process before the engine is closed)."""

    def __init__(self, config: uvicorn.Config, out: TextIO, on_shutdown: Callable[[], None],
                 forwarder: Forwarder | None = None,
                 fail_stopped: Callable[[], HistoryError | None] = lambda: None) -> None:
        super().__init__(config)
        self._out = out
        self._on_shutdown = on_shutdown
        self._forwarder = forwarder
        self._fail_stopped = fail_stopped
        self.stopped_by: HistoryError | None = None
        """The engine's fail-stop that ended the server (then ``cmd_serve`` exits 4), or None."""
        self._stopped_at = 0.0

    async def on_tick(self, counter: int) -> bool:
        """uvicorn's tick (every 0.1 s): once a second, whether the engine fail-stopped. A
        fail-stopped engine recovers only by a reopen (the log's torn tail cut, the state
        resumed or rebuilt), which a restart of the process does with nothing acknowledged lost:
        so the server says so on ``/readyz`` for ``FAIL_STOP_GRACE`` seconds, then drains and
        exits 4 for its supervisor (systemd, Kubernetes, a shell loop) to start it again."""
        if counter % 10 == 0 and not self.should_exit:
            if self.stopped_by is None:
                self.stopped_by = self._fail_stopped()
                if self.stopped_by is not None:
                    self._stopped_at = time.monotonic()
                    print(f"histlog: the engine fail-stopped: {one_line(str(self.stopped_by))}; /readyz answers 503, "
                          f"and the server exits (status 4) in {FAIL_STOP_GRACE:g} s for its supervisor to restart "
                          "it, which recovers the log and the state", file=sys.stderr, flush=True)
            elif time.monotonic() - self._stopped_at >= FAIL_STOP_GRACE:
                print("histlog: stopping after the engine fail-stopped (exit 4): start it again once the cause "
                      "is gone (free disk space...)", file=sys.stderr, flush=True)
                self.should_exit = True
        return await super().on_tick(counter)

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
    if ns.max_waiters < 0:
        raise UsageError(f"invalid --max-waiters {ns.max_waiters}: expected 0 or more reads")
    if ns.partitions is not None and ns.partitions <= 0:
        raise UsageError(f"invalid --partitions {ns.partitions}: expected a positive count (the log's, when created)")
    cluster = cluster_of(ns, target)
    with target.open(partitions=ns.partitions, owned=() if cluster else None) as engine:
        sockets = [_bind(host, port)] if cluster else None  # the real port, before the group hears of it
        with contextlib.ExitStack() as stack:
            member: ClusterMember | None = None
            readiness: Readiness | None = None
            described = target.describe()
            if cluster is not None:
                assert sockets is not None and target.kafka is not None  # Invariant: cluster_of checked both.
                url = advertised_url(cluster.advertise, sockets[0].getsockname()[1])
                member = stack.enter_context(ClusterMember(engine, target.kafka, target.topic, cluster.group, url,
                                                           session_timeout=cluster.session_timeout,
                                                           instance_id=cluster.instance_id,
                                                           standbys=cluster.standbys,
                                                           warmup_lag=cluster.warmup_lag, token=token,
                                                           snapshots=cluster.snapshots))
                readiness = ClusterReadiness(member)
                described += f", member of group {cluster.group} as {url}"
            extras = observability(engine, readiness=readiness)  # events, /metrics, /healthz, /readyz
            if member is not None:
                extras.metrics.registry.register(ClusterCollector(member, extras.metrics.probe))
                if isinstance(readiness, ClusterReadiness):
                    readiness.probe = extras.metrics.probe  # /readyz never waits on the broker either
                member.on_revoked.append(extras.hub.revoked)  # streams follow their partition
            app = build_app(engine, token=token, max_body=ns.max_body, max_waiters=ns.max_waiters,
                            extra_ops=extras.ops,
                            extra_routes=[*extras.readiness.routes, *extras.metrics.routes],
                            middleware=[extras.middleware],
                            ownership=None if member is None else member.ownership)
            config = uvicorn.Config(app, host=host, port=port, lifespan="off", log_config=None, access_log=False,
                                    timeout_graceful_shutdown=DRAIN_TIMEOUT, server_header=False,
                                    proxy_headers=False)  # no route uses the client's address: skip its parsing
            print(f"histlog: serving {described}{' (token required)' if token else ''}", file=sys.stderr, flush=True)
            server = _Server(config, out, extras.close, app.forwarder, engine.fail_stopped)
            try:
                server.run(sockets=sockets)
            finally:
                extras.close()
    if server.stopped_by is not None:  # closing a fail-stopped engine may fail too: exit 4 all the same
        return UNAVAILABLE
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
    command.add_argument("--max-waiters", metavar="N", type=integer, default=DEFAULT_MAX_WAITERS,  # type: ignore[arg-type]
                         help=f"how many reads may wait for an at_least position at once (default "
                              f"{DEFAULT_MAX_WAITERS}); one more is a 503 at once")
    command.add_argument("--partitions", metavar="N", type=integer, default=None,  # type: ignore[arg-type]
                         help="the log's partition count when this creates it (default 1); an existing log "
                              "with another count is refused")
    cluster = command.add_argument_group("cluster (Kafka only, docs/cluster.md)")
    cluster.add_argument("--group", metavar="NAME",
                         help="be a member of this cluster: serve only the partitions the Kafka consumer group NAME "
                              "assigns, forward the rest to their owners")
    cluster.add_argument("--advertise", metavar="URL",
                         help="with --group: this member's URL for the others and the clients, http://HOST:PORT "
                              "(port 0: the port --listen got)")
    cluster.add_argument("--session-timeout", metavar="S", type=float, default=None,
                         help=f"with --group: seconds without a heartbeat before Kafka moves this member's "
                              f"partitions (default {DEFAULT_SESSION_TIMEOUT:g}, at least {MIN_SESSION_TIMEOUT:g})")
    cluster.add_argument("--instance-id", metavar="ID",
                         help="with --group: a stable name for this member (Kafka static membership): restarted "
                              "within the session timeout it gets its partitions back without a rebalance; the "
                              "price: a stop hands them over only after the session timeout")
    cluster.add_argument("--standbys", metavar="K", type=integer, default=None,  # type: ignore[arg-type]
                         help="with --group: K other members keep each partition's state current as a standby "
                              "(default 0; give every member the same K), so a failover costs the session "
                              "timeout plus the tail, not a replay")
    cluster.add_argument("--warmup-lag", metavar="N", type=integer, default=None,  # type: ignore[arg-type]
                         help=f"with --standbys: a partition moves to a member (a new one) only once its state "
                              f"of it is within N records of the owner's; until then it stays and is warmed "
                              f"there as a standby (default {DEFAULT_WARMUP_LAG})")
    cluster.add_argument("--no-snapshots", action="store_true",
                         help="with --group: take a partition on with no state here by replaying the log, never "
                              "from a peer's state snapshot (GET /v1/partitions/{p}/snapshot)")
