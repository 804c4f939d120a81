"""A writer that appends forever from several threads and prints every receipt it gets; one more
thread keeps regenerating the answer of conversation ``turns`` (``replace_turn``, reason retry).

Usage: python -m tests.reliability.crash_writer DATA_DIR ROUND. The parent kills it with
SIGKILL at a random moment; every receipt printed must survive.
"""

from __future__ import annotations

import sys
import threading

from engine import HistoryEngine
from schemas import Batch, Message, Receipt

THREADS = 4
TURNS = "turns"


def batch(round_: str, t: int, i: int) -> Batch:
    aid = f"{round_}-{t}-{i}"
    return Batch(f"conv-{i % 3}", aid, [Message.user(f"q {aid}"), Message.assistant(f"a {aid}")])


def main() -> None:
    data, round_ = sys.argv[1], sys.argv[2]
    lock = threading.Lock()
    with HistoryEngine.open(data) as engine:
        print("ready", flush=True)

        def loop(t: int) -> None:
            i = 0
            while True:
                b = batch(round_, t, i)
                r = engine.append(b)
                if i % 5 == 4:  # an idempotent retry of an earlier batch
                    engine.append(batch(round_, t, i - 2))
                print_receipt(r)
                i += 1

        def print_receipt(r: Receipt) -> None:
            with lock:
                sys.stdout.write(r.to_json().decode() + "\n")
                sys.stdout.flush()

        def retries() -> None:
            i = 0
            while True:
                aid = f"{round_}-r-{i}"
                b = Batch(TURNS, aid, [Message.user("q"), Message.assistant(f"a {aid}")])
                latest = engine.latest_turn(TURNS)
                r = engine.append(b) if latest is None else engine.replace_turn(b, latest.id, "retry")
                print_receipt(r)
                i += 1

        threads = [threading.Thread(target=loop, args=(t,), daemon=True) for t in range(THREADS)]
        threads.append(threading.Thread(target=retries, daemon=True))
        for th in threads:
            th.start()
        for th in threads:
            th.join()


if __name__ == "__main__":
    main()
