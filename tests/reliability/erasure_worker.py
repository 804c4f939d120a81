"""A worker that appends a token turn to each of many conversations, then clears them one by
one, for the kill -9 tests of ``test_erasure_crash``.

Usage: python -m tests.reliability.erasure_worker DATA_DIR TOKENS.json [POINT K [projection | prefix]]

``TOKENS.json`` maps each conversation id to its token (in clearing order). Stdout: "appended"
once every turn is written (and the engine reopened), then "cleared CONV" after each ``clear`` returned (one write(2)
each, so a kill lands before or after a line). With ``POINT K`` the worker kills itself
(SIGKILL) inside the ``K``-th clear (from 0) at ``POINT``: ``before-destroy`` (the conversation's
rows are deleted and its ``E`` row written; the keys are intact), ``after-destroy`` (keys
destroyed, nothing compacted) or ``after-compact`` (compacted, the ``E`` row not yet deleted).
With ``projection`` it registers ``erasure_support.ContentStore`` (which stores content) first.
With ``prefix`` it clears them all with one ``clear_prefix("conv-")`` instead, its clears written
three at a time, and prints "cleared by prefix N" once it returned; ``K`` then counts the
conversations the key store destroyed (``destroy_many`` destroys a step's together).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import engine.writes as engine_writes
from engine.facade import HistoryEngine
from engine.keys import FileKeyStore
from projections.store import StateStore
from tests.reliability.erasure_support import ContentStore, token_batch

POINTS = ("before-destroy", "after-destroy", "after-compact")


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _inject(point: str, k: int) -> None:
    """Patch the erasure's steps so that the ``k``-th clear dies at ``point``."""
    calls = {"destroy": 0, "compact": 0}
    destroy_many, compact = FileKeyStore.destroy_many, StateStore.compact

    def patched_destroy_many(self: FileKeyStore, erasures: Sequence[tuple[str, Sequence[str]]]) -> None:
        first = calls["destroy"]  # conversations destroyed so far: the clears are one at a time here
        calls["destroy"] += len(erasures)
        hit = first <= k < first + len(erasures)
        if hit and point == "before-destroy":
            _die()
        destroy_many(self, erasures)
        if hit and point == "after-destroy":
            _die()

    def patched_compact(self: StateStore, ranges: Any) -> None:
        n = calls["compact"]
        calls["compact"] += 1
        compact(self, ranges)
        if n == k and point == "after-compact":
            _die()

    FileKeyStore.destroy_many = patched_destroy_many  # type: ignore[method-assign]
    StateStore.compact = patched_compact  # type: ignore[method-assign]


def _say(line: str) -> None:
    os.write(1, (line + "\n").encode())


def main() -> None:
    data, tokens_file = sys.argv[1], sys.argv[2]
    tokens: dict[str, str] = json.loads(Path(tokens_file).read_text())
    if len(sys.argv) > 3:
        point, k = sys.argv[3], int(sys.argv[4])
        if point not in POINTS:
            raise SystemExit(f"erasure_worker: unknown point {point!r}, expected one of {POINTS}")
        _inject(point, k)
    with_projection = sys.argv[5:] == ["projection"]
    by_prefix = sys.argv[5:] == ["prefix"]
    with HistoryEngine.open(data, partitions=2) as engine:
        if with_projection:
            engine.register(ContentStore())
        for conv, token in tokens.items():
            engine.append(token_batch(conv, "a0", token))
    # Closed and reopened: the content is in table files (not only in the WAL and the memtable,
    # where a put and its later delete may meet and vanish together) when the clears start.
    with HistoryEngine.open(data) as engine:
        if with_projection:
            engine.register(ContentStore())
        _say("appended")
        if by_prefix:  # one clear_prefix, its clears written three at a time (so a kill cuts it)
            engine_writes.CLEAR_BATCH = 3
            _say(f"cleared by prefix {engine.clear_prefix('conv-')}")
        else:
            for conv in tokens:
                engine.clear(conv)
                _say(f"cleared {conv}")
    _say("done")


if __name__ == "__main__":
    main()
