"""The harness's side of fault_worker.py: start engine processes (forked by a zygote), talk to
them one JSON line at a time with bounded reads (``select``, never a sleep), kill -9 them, reap.

Every process started here is killed and reaped by ``Zygote.close`` (also when a test fails):
closing the zygote's socket makes it SIGKILL and reap the workers it forked, and the zygote
itself is killed and waited for.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 60.0
"""Bound of every wait on a worker (an answer, its exit): generous for a loaded 2-core machine."""


class WorkerDied(AssertionError):
    """The worker's stdout closed before a full answer line."""


class Zygote:
    """One ``fault_worker --zygote`` process: it imported the engine once and forks workers."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.reliability.fault_worker", "--zygote", str(theirs.fileno())],
            cwd=REPO, pass_fds=(theirs.fileno(),), env=env)
        theirs.close()
        self._sock = ours
        self._sock.settimeout(TIMEOUT)
        self.workers: dict[int, Worker] = {}

    def _ask(self, msg: dict[str, Any], fds: list[int] | None = None) -> dict[str, Any]:
        socket.send_fds(self._sock, [json.dumps(msg).encode()], fds or [])
        reply = self._sock.recv(65536)
        if not reply:
            raise AssertionError(f"the zygote exited ({self._proc.poll()})")
        answer: dict[str, Any] = json.loads(reply)
        return answer

    def spawn(self, data: Path, *, wait: bool = True) -> Worker:
        """Fork a worker on ``data``; with ``wait``, returns once it printed its first line
        (``ready`` or ``open_error``, in ``Worker.first``)."""
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        try:
            pid = int(self._ask({"spawn": str(data)}, [stdin_r, stdout_w])["pid"])
        finally:
            os.close(stdin_r)
            os.close(stdout_w)
        worker = Worker(self, pid, stdin_w, stdout_r)
        self.workers[pid] = worker
        if wait:
            worker.first = worker.readline()
        return worker

    def reap(self, pid: int) -> int:
        """Wait for a worker that has exited or was killed; returns its wait status."""
        status = int(self._ask({"reap": pid})["status"])
        self.workers.pop(pid, None)
        return status

    def close(self) -> None:
        for worker in list(self.workers.values()):
            worker.kill()
        try:
            self._sock.close()  # the zygote kills and reaps any worker left, then exits
            self._proc.wait(timeout=TIMEOUT)
        finally:
            if self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait(timeout=TIMEOUT)


class Worker:
    """One engine process. ``request`` sends a command and reads its answer; ``send`` and
    ``kill`` split that, to kill with a command in flight."""

    def __init__(self, zygote: Zygote, pid: int, stdin: int, stdout: int) -> None:
        self.zygote = zygote
        self.pid = pid
        self._stdin = stdin
        self.stdout_fd = stdout
        self._buffer = b""
        self.alive = True
        self.first: dict[str, Any] = {}

    def send(self, cmd: dict[str, Any]) -> None:
        os.write(self._stdin, json.dumps(cmd).encode() + b"\n")

    def readline(self, timeout: float = TIMEOUT) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"worker {self.pid} did not answer within {timeout}s")
            ready, _, _ = select.select([self.stdout_fd], [], [], left)
            if ready:
                chunk = os.read(self.stdout_fd, 1 << 16)
                if not chunk:
                    raise WorkerDied(f"worker {self.pid} exited before answering (got {self._buffer!r})")
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        answer: dict[str, Any] = json.loads(line)
        if "crash" in answer:
            raise AssertionError(f"the engine raised {answer['crash']}: {answer['message']}\n{answer['traceback']}")
        return answer

    def request(self, cmd: dict[str, Any]) -> dict[str, Any]:
        self.send(cmd)
        return self.readline()

    def value(self, cmd: dict[str, Any]) -> Any:
        """The ``ok`` value of a command that must succeed."""
        answer = self.request(cmd)
        assert "ok" in answer, f"{cmd['op']} failed: {answer}"
        return answer["ok"]

    def kill(self) -> None:
        """SIGKILL, then reap; idempotent."""
        if not self.alive:
            return
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._finish()

    def close(self) -> None:
        """A clean close: the engine closes, the process exits 0."""
        assert self.value({"op": "close"}) == "closed"
        status = self._finish()
        assert os.waitstatus_to_exitcode(status) == 0, f"worker {self.pid} exited with {status}"

    def _finish(self) -> int:
        self.alive = False
        for fd in (self._stdin, self.stdout_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        return self.zygote.reap(self.pid)
