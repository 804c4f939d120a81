"""Try to reproduce kafka-python 3.0.12's stuck join (docs/cluster.md "Known issue"): many cold
starts of three members (``tests/integration/member_runner.py``) on a fresh six-partition topic,
under CPU load. Not a test and not in CI: a bounded experiment.

    PYTHONPATH=$PWD python3 scripts/stuck_join_repro.py BOOTSTRAP --minutes 20 --burners 1 --out /tmp/stuck

A trial succeeds when the three members publish one map of every partition within ``--join-s``.
Otherwise each member not in that map (its last map has generation -1, or it disagrees) is
dumped with ``py-spy dump`` (into ``--out``), and the trial waits up to ``--recover-s`` more for
``Membership._unstick`` to bring it back (``restarted_joins`` in its stats). One line per trial.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from kafka.admin import KafkaAdminClient, NewTopic

REPO = Path(__file__).resolve().parents[1]


class Member:
    def __init__(self, bootstrap: str, topic: str, group: str, i: int, log: Path) -> None:
        self.url = f"http://127.0.0.1:{19000 + i}"
        self.last_map: dict[str, Any] = {}
        self.stats: dict[str, Any] = {}
        self._log = open(log, "ab")  # noqa: SIM115 - closed in stop()
        env = dict(os.environ, PYTHONPATH=str(REPO), HISTLOG_MEMBER_LOG="INFO")
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.integration.member_runner", bootstrap, topic, group,
                                      self.url, "6"], cwd=REPO, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._log, text=True, bufsize=1)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            event = json.loads(line)
            if event["event"] == "map":
                self.last_map = event
            elif event["event"] == "stats":
                self.stats = event

    def ask_stats(self) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write("stats\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self._log.close()


def agreed(members: list[Member]) -> bool:
    maps = [m.last_map for m in members]
    if any(not mp or mp["generation"] < 0 or len(mp["owners"]) != 6 for mp in maps):
        return False
    return all(mp["owners"] == maps[0]["owners"] for mp in maps) and {m.url for m in members} == set(
        maps[0]["owners"].values())


def trial(bootstrap: str, admin: KafkaAdminClient, n: int, args: argparse.Namespace) -> str:
    topic, group = f"stuck-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(topic, 6, 1)])
    time.sleep(0.5)  # the topic's metadata reaches the broker's cache (an experiment, not a test)
    members = [Member(bootstrap, topic, group, i, args.out / f"trial{n}-m{i}.log") for i in range(3)]
    started = time.monotonic()
    try:
        while time.monotonic() - started < args.join_s:
            if agreed(members):
                return f"trial {n}: joined in {time.monotonic() - started:.1f} s"
            time.sleep(0.2)
        lost = [i for i, m in enumerate(members) if not m.last_map or m.last_map["generation"] < 0]
        for i, m in enumerate(members):
            dump = subprocess.run(["py-spy", "dump", "--pid", str(m.proc.pid)], capture_output=True, text=True,
                                  timeout=60)
            (args.out / f"trial{n}-m{i}.pyspy").write_text(dump.stdout + dump.stderr)
        while time.monotonic() - started < args.join_s + args.recover_s:
            if agreed(members):
                break
            time.sleep(0.5)
        for m in members:
            m.ask_stats()
        time.sleep(1.0)
        restarted = [m.stats.get("restarted_joins") for m in members]
        verdict = "recovered" if agreed(members) else "NOT recovered"
        return (f"trial {n}: NOT joined in {args.join_s:g} s (out of the group: {lost}); {verdict} after "
                f"{time.monotonic() - started:.1f} s; restarted_joins {restarted}; dumps in {args.out}")
    finally:
        for m in members:
            m.stop()
        admin.delete_topics([topic])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bootstrap")
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--burners", type=int, default=1, help="busy-loop processes for CPU contention")
    ap.add_argument("--join-s", type=float, default=30.0)
    ap.add_argument("--recover-s", type=float, default=60.0)
    ap.add_argument("--out", type=Path, default=Path("/tmp/stuck-join"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.burners)]
    admin = KafkaAdminClient(bootstrap_servers=args.bootstrap)
    deadline = time.monotonic() + args.minutes * 60
    n = 0
    try:
        while time.monotonic() < deadline:
            n += 1
            print(trial(args.bootstrap, admin, n, args), flush=True)
    finally:
        for b in burners:
            b.kill()
            b.wait()
        admin.close()


if __name__ == "__main__":
    main()
