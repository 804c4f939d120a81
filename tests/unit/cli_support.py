"""What the in-process CLI tests share: run ``engine.cli.main`` and capture its output, with no
``HISTLOG_*`` setting of the developer's shell leaking in."""

from __future__ import annotations

import pytest

from engine.cli import main

Capsys = pytest.CaptureFixture[str]

CLI_ENV = ("HISTLOG_DATA", "HISTLOG_KAFKA", "HISTLOG_TOPIC", "HISTLOG_STATE", "HISTLOG_DEBUG",
           "HISTLOG_MASTER_KEY_FILE", "HISTLOG_URL")


def clean_cli_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in CLI_ENV:
        monkeypatch.delenv(name, raising=False)


def run(capsys: Capsys, *args: str) -> tuple[int, str, str]:
    """``histlog ARGS...`` in process: ``(exit code, stdout, stderr)``."""
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err
