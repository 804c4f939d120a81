"""``histlog``: the command-line face of ``HistoryEngine`` (docs/cli.md).

A command resolves where the history lives, opens the engine, calls one library method and
formats the result. The package, one job per module:

- ``exits``: the exit codes and how an error becomes one line on stderr;
- ``target``: where the history lives (``--data`` or ``--kafka``, over ``HISTLOG_*``);
- ``parser``: every command, flag and help text;
- ``writes`` (append, replace-turn, clear), ``reads`` (read, turns, list), ``ops`` (stats,
  tail, rebuild), ``tools`` (demo, replay, log verify, bench): the commands' handlers;
- ``app``: ``main``, the entry point of ``histlog`` and ``python -m engine``.

Text and JSON output and the progress bar are ``engine.render``'s, shared with the demo.
"""

from engine.cli.app import main
from engine.cli.exits import PIPE_CLOSED, exit_code
from engine.cli.ops import follow
from engine.cli.parser import build_parser, subcommands
from engine.cli.target import DEFAULT_DATA, DEFAULT_TOPIC, Target, resolve
from engine.render import ProgressBar, render_message

__all__ = [
    "DEFAULT_DATA", "DEFAULT_TOPIC", "PIPE_CLOSED", "ProgressBar", "Target", "build_parser", "exit_code", "follow",
    "main", "render_message", "resolve", "subcommands",
]
