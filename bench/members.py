"""A ``histlog serve`` member as a subprocess, for the cluster benchmarks (``bench_cluster``,
``bench_failover``, ``bench_join``, ``bench_load``): one home, so none imports another for it."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path

__all__ = ["START_S", "Serve"]

START_S = 120.0
REPO = Path(__file__).resolve().parents[1]


class Serve:
    """A ``histlog serve`` subprocess (``--group`` when given), killed on exit."""

    def __init__(self, bootstrap: str, topic: str, state: Path, *extra: str) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine", "--kafka", bootstrap, "--topic", topic, "--state", str(state), "serve",
             "--listen", "127.0.0.1:0", *extra], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL)
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], START_S)  # as bench_service's server
        line = self.proc.stdout.readline().decode() if ready else ""
        if not line.startswith("listening="):
            self.close()
            raise RuntimeError(f"histlog serve did not start (printed {line!r})")
        self.url = line.strip().removeprefix("listening=")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
