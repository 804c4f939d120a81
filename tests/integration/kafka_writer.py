"""A separate-process instance for multi-instance tests.

Usage: python -m tests.integration.kafka_writer BOOTSTRAP TOPIC STATE_DIR NAME COUNT
Appends COUNT batches whose append ids are shared with the other processes (content names this
process), and prints one JSON line per outcome: {"append_id", "receipt"} or {"append_id", "conflict"}.
Starts appending only after reading a line on stdin (so every process races).
"""

from __future__ import annotations

import json
import sys

from engine import HistoryEngine
from schemas import AppendConflict, Batch, Message


def main() -> None:
    bootstrap, topic, state, name, count = sys.argv[1:6]
    with HistoryEngine.open(kafka=bootstrap, topic=topic, state_dir=state) as engine:
        print("ready", flush=True)
        sys.stdin.readline()
        for i in range(int(count)):
            aid = f"shared-{i}"
            batch = Batch(f"conv-{i % 3}", aid, [Message.user(f"q{i} from {name}"), Message.assistant(f"a{i}")])
            try:
                r = engine.append(batch)
                print(json.dumps({"append_id": aid, "receipt": r.to_dict()}), flush=True)
            except AppendConflict as e:
                print(json.dumps({"append_id": aid, "conflict": e.existing_digest}), flush=True)


if __name__ == "__main__":
    main()
