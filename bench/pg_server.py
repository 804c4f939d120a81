"""A private PostgreSQL for ``bench.bench_postgres``: ``initdb`` into a temporary directory,
loopback and a unix socket only, fsync and synchronous commit on, always stopped (``Server``), and
``missing()``, the one line that says what to install when it cannot run here.

Run as root, ``initdb`` and ``pg_ctl`` run as the ``postgres`` user (``runuser``): ``initdb``
refuses root.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

__all__ = ["INSTALL_PG", "INSTALL_PSYCOPG", "Server", "alive", "du", "missing", "pg_bin"]

SERVER_USER = "postgres"  # who runs initdb/pg_ctl when this process is root (initdb refuses root)
INSTALL_PG = "apt-get install postgresql"
INSTALL_PSYCOPG = "pip install 'histlog[bench]'"


def pg_bin() -> Path | None:
    """The directory of PostgreSQL's server binaries (15 preferred), or None."""
    candidates = [Path("/usr/lib/postgresql/15/bin"),
                  *sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)]
    found = shutil.which("initdb")
    if found:
        candidates.append(Path(found).resolve().parent)
    return next((d for d in candidates if (d / "initdb").is_file() and (d / "pg_ctl").is_file()), None)


def missing() -> str | None:
    """Why this bench cannot run here (one line saying how to fix it), or None."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return (f"skipped: psycopg 3 is not installed; install it with {INSTALL_PSYCOPG} "
                "(or pip install 'psycopg[binary]')")
    if pg_bin() is None:
        return f"skipped: PostgreSQL's server binaries (initdb, pg_ctl) were not found; install them with {INSTALL_PG}"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            return (f"skipped: running as root and there is no {SERVER_USER!r} user to run PostgreSQL as "
                    f"(initdb refuses root); {INSTALL_PG} creates it, or run as a normal user")
        if shutil.which("runuser") is None:
            return "skipped: running as root and runuser (util-linux) is missing to run PostgreSQL as another user"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def du(path: Path) -> int:
    """Apparent bytes of every regular file under ``path``."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:  # a file PostgreSQL removed meanwhile (WAL recycling, temp)
                continue
            total += st.st_size
    return total


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, exited but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def _wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


class Server:
    """A private PostgreSQL: ``start()`` (initdb + pg_ctl start), ``connect()``, ``stop()``
    (idempotent, ``pg_ctl stop -m fast``), ``remove()`` (stops, then deletes the directory)."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="histlog-bench-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.pid: int | None = None
        self.running = False

    def _run(self, *cmd: str) -> subprocess.CompletedProcess[str]:
        argv = [str(self.bindir / cmd[0]), *cmd[1:]]
        if os.geteuid() == 0:
            argv = ["runuser", "-u", SERVER_USER, "--", *argv]
        done = subprocess.run(argv, cwd=self.root, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            tail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["(no output)"]
            log = self.root / "server.log"
            if log.exists():
                tail += log.read_text(errors="replace").strip().splitlines()[-2:]
            raise RuntimeError(f"{cmd[0]} {cmd[1] if len(cmd) > 1 else ''} failed: {' | '.join(tail)}")
        return done

    def start(self) -> None:
        if os.geteuid() == 0:
            user = pwd.getpwnam(SERVER_USER)
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self.root.chmod(0o700)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                  "--locale=C", "--no-sync")
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(f"\n# histlog bench\nlisten_addresses = '127.0.0.1'\nport = {self.port}\n"
                       f"unix_socket_directories = '{self.root}'\nfsync = on\nsynchronous_commit = on\n"
                       "max_connections = 100\n")
        self.running = True  # from here on, stop() is attempted
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-w", "-t", "60",
                  "-s", "start")
        self.pid = int((self.data / "postmaster.pid").read_text().split()[0])

    def connect(self) -> psycopg.Connection[Any]:
        import psycopg

        return psycopg.connect(host=str(self.root), port=self.port, user="postgres", dbname="postgres",
                               autocommit=True)

    def stop(self) -> None:
        """Stop the server if it was started; never raises (a server that refuses ``pg_ctl stop``
        gets SIGQUIT, PostgreSQL's immediate shutdown)."""
        if not self.running:
            return
        self.running = False
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "-s", "stop")
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            if not (self.data / "postmaster.pid").exists():
                return  # it never started (or is gone): nothing to stop
            print(f"  {e}; sending the postmaster SIGQUIT (immediate shutdown)", file=sys.stderr)
            self.pid = self.pid or int((self.data / "postmaster.pid").read_text().split()[0])
            try:
                os.kill(self.pid, signal.SIGQUIT)
            except ProcessLookupError:
                pass
        # pg_ctl returns once postmaster.pid is gone, a moment before the postmaster exits.
        if self.pid is not None and not _wait_gone(self.pid, 10):
            print(f"  the postmaster (pid {self.pid}) is still running 10 s after its stop", file=sys.stderr)

    def remove(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
