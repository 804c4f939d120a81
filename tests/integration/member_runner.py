"""One cluster member in its own process, for the membership tests (kill -9 and SIGSTOP are real).

Usage: python -m tests.integration.member_runner BOOTSTRAP TOPIC GROUP ADVERTISE SESSION_TIMEOUT [INSTANCE_ID]

Prints one JSON line per event on stdout (flushed), each with ``t`` = wall-clock seconds:
``{"event":"assigned"|"revoked","parts":[...]}``, ``{"event":"map","generation","partitions","owners"}``
(owners keyed by partition number as a string, as ``GET /v1/cluster``), and on request
``{"event":"stats","owned","stray","lease","rebalances","restarted_joins"}``. Commands on stdin, one a line:
``stats``, ``close`` (leave the group, print ``{"event":"closed"}``, exit 0). End of stdin
closes too, so a member never outlives its test.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from typing import Any

from engine.cluster import Membership, OwnershipMap

_print_lock = threading.Lock()


def emit(event: str, **fields: Any) -> None:
    line = json.dumps({"event": event, "t": time.time(), **fields})
    with _print_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def on_change(m: OwnershipMap) -> None:
    emit("map", generation=m.generation, partitions=m.partitions,
         owners={str(p): u for p, u in sorted(m.owners.items())})


def main() -> None:
    if os.environ.get("HISTLOG_MEMBER_LOG"):  # debugging aid: kafka-python's and the membership's logs on stderr
        logging.basicConfig(level=os.environ["HISTLOG_MEMBER_LOG"], stream=sys.stderr,
                            format="%(asctime)s %(threadName)s %(name)s %(message)s")
    bootstrap, topic, group, advertise, session = sys.argv[1:6]
    instance_id = sys.argv[6] if len(sys.argv) > 6 else None
    # rebalance_timeout as ClusterMember (histlog serve --group) sets it: a join stuck in kafka-python
    # is started again after two sessions (Membership._unstick), not after 30 s + a session.
    membership = Membership(bootstrap, topic, group, advertise, session_timeout=float(session), instance_id=instance_id,
                            rebalance_timeout=float(session),
                            on_assigned=lambda ps: emit("assigned", parts=sorted(ps)),
                            on_revoked=lambda ps: emit("revoked", parts=sorted(ps)),
                            on_change=on_change)
    emit("started")
    for line in sys.stdin:
        command = line.strip()
        if command == "stats":
            emit("stats", owned=sorted(membership.owned), stray=membership.stray_records,
                 lease=membership.lease_valid(), rebalances=membership.rebalances,
                 restarted_joins=membership.restarted_joins)
        elif command == "close":
            break
    membership.close()
    emit("closed")


if __name__ == "__main__":
    main()
