"""``histlog clear`` forgets, checked through the CLI as a user would: ``python3 -m engine --data
DIR append ...`` in subprocesses, ``clear``, then read every byte of every file under DIR (the
needles of ``erasure_support``: tokens, canonical JSON, digests). The other conversation reads
back the same, also after ``state/`` is deleted (the next command rebuilds it from the log),
and ``stats`` counts the clear and the erased records."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

from tests.reliability.erasure_support import (
    Written,
    files_holding,
    holds_some_of,
    needles_of,
    token_batch,
    victim_token,
)

ROOT = Path(__file__).resolve().parents[2]


def histlog(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HISTLOG_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "engine", "--data", str(data), *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=120)


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stdout


def stats_of(text: str) -> dict[str, str]:
    return dict(line.split(None, 1) for line in text.splitlines() if len(line.split()) == 2)


def test_histlog_clear_leaves_no_trace_in_any_file(tmp_path: Path) -> None:
    data = tmp_path / "data"
    victim = Written("victim")
    other = Written("other")
    for w, token, a in ((victim, victim_token(), "a1"), (other, secrets.token_hex(16), "o1")):
        batch = token_batch(w.conv, a, token)
        path = tmp_path / f"{w.conv}.json"
        path.write_bytes(batch.canonical_json())
        receipt = json.loads(ok(histlog(data, "append", w.conv, a, "--file", str(path))))
        assert receipt["digest"] == batch.digest
        w.tokens.append(token)
        w.batches.append(batch)
    second = victim_token()  # a --text append: the CLI's own message JSON
    ok(histlog(data, "append", "victim", "a2", "--text", f"also {second}"))
    victim.tokens.append(second)
    other_before = ok(histlog(data, "read", "other", "--json"))
    assert other.tokens[0] in other_before

    assert "cleared victim" in ok(histlog(data, "clear", "victim"))

    refused = histlog(data, "append", "victim", "a3", "--text", "after the clear")
    assert refused.returncode == 3 and "closed" in refused.stderr, refused.stderr
    assert json.loads(ok(histlog(data, "read", "victim", "--json"))) == []
    found = files_holding(data, needles_of(victim))
    assert not found, f"files still holding the cleared conversation: {found}"
    assert holds_some_of(data, other)  # the grep reads the files that hold content

    shutil.rmtree(data / "state")
    counts = stats_of(ok(histlog(data, "stats")))  # rebuilt from the log
    assert counts["cleared"] == "1"
    assert counts["erased"] == "2"  # the victim's two appends, met with their key destroyed
    assert counts["accepted"] == "1"  # the other's append
    assert ok(histlog(data, "read", "other", "--json")) == other_before
    assert not files_holding(data, needles_of(victim))
