"""A writer that appends forever from several threads and prints every receipt it gets; one more
thread keeps regenerating the answer of conversation ``turns`` (``replace_turn``, reason retry).

Usage: python -m tests.reliability.crash_writer DATA_DIR ROUND. The parent kills it with
SIGKILL at a random moment; every receipt printed must survive. Stdout is the receipt channel:
"ready", then one line per receipt, "SEQ RECEIPT_JSON" (SEQ = 0, 1, 2...), each written with a
single atomic pipe write.
"""

from __future__ import annotations

import itertools
import os
import select
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
    seq = itertools.count()
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
            # "SEQ RECEIPT_JSON\n": SEQ counts lines from 0, so the parent can prove it read every
            # line printed. One write(2) of at most PIPE_BUF bytes to a pipe is atomic (POSIX):
            # a kill -9 lands before or after it, so the parent sees whole lines only.
            with lock:
                line = b"%d %s\n" % (next(seq), r.to_json())
                written = os.write(1, line) if len(line) <= select.PIPE_BUF else 0
            if written != len(line):  # die loudly: the parent sees "the writer died on its own"
                sys.stderr.write(f"crash_writer: {len(line)}-byte receipt line, {written} written\n")
                os._exit(3)

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
