"""``pip install histlog`` without the server extra: every command but ``serve`` and ``cluster``
runs, and those two say in one line what to install (the CLI once failed to start at all, its
parser importing uvicorn and httpx)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_WITHOUT_SERVER = """
import sys
for name in ("httpx", "starlette", "uvicorn", "prometheus_client"):
    sys.modules[name] = None  # import raises ImportError, as when histlog[server] is not installed
from engine.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _histlog(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _WITHOUT_SERVER, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, check=False, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize("args", [("serve", "--listen", "127.0.0.1:0", "--partitions", "2"), ("serve",),
                                  ("--url", "http://127.0.0.1:9", "cluster")])
def test_serve_and_cluster_say_what_to_install(tmp_path: Path, args: tuple[str, ...]) -> None:
    local = () if "--url" in args else ("--data", str(tmp_path / "d"))
    done = _histlog(*local, *args, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "pip install 'histlog[server]'" in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert not (tmp_path / "d").exists()  # refused before any I/O


def test_the_other_commands_run(tmp_path: Path) -> None:
    assert _histlog("--help", cwd=tmp_path).returncode == 0
    data = str(tmp_path / "d")
    appended = _histlog("--data", data, "append", "c1", "a1", "--text", "hello", cwd=tmp_path)
    assert appended.returncode == 0, appended.stderr
    read = _histlog("--data", data, "read", "c1", cwd=tmp_path)
    assert read.returncode == 0 and "hello" in read.stdout, read.stderr
    unknown = _histlog("bench", "nosuch", cwd=tmp_path)
    assert unknown.returncode == 2 and "choose from" in unknown.stderr and "instructions" in unknown.stderr
