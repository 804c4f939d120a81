"""Child processes for the state fault tests (tests/reliability/test_state_faults.py).

``python -m tests.reliability.state_worker fill DATA LIMIT``: under ``RLIMIT_FSIZE=LIMIT`` (no
file may grow past LIMIT bytes: the state's write-ahead log fails as on a full disk, for real),
append until the engine refuses, then a few more, then close; one JSON line per outcome:
``{"append_id": ..., "receipt": ...}`` or ``{"append_id": ..., "error": TYPE, "end": [...]}``
(``end``: the log's end offsets after the call), then ``{"close": TYPE or null}`` and
``{"reopen": TYPE or null}`` (a reopen under the same limit).

``python -m tests.reliability.state_worker register DATA``: register a projection whose first
event blocks forever; prints ``inside`` once it is replaying, for the parent to kill -9.
"""

from __future__ import annotations

import json
import resource
import sys
import threading

from engine import HistoryEngine
from projections import BatchEvent, ClearEvent, Projection, ProjectionTx, TurnReplacedEvent
from schemas import Batch, HistoryError, Message


def batch(i: int) -> Batch:
    return Batch(f"c{i % 4}", f"a{i}", [Message.user(f"question {i} " + "x" * 300), Message.assistant(f"answer {i}")])


def fill(data: str, limit: int) -> None:
    with HistoryEngine.open(data) as engine:  # prepare the directory before the limit applies
        engine.append(batch(-1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    engine = HistoryEngine.open(data)
    refused = 0
    i = 0
    while refused < 3 and i < 100_000:
        try:
            receipt = engine.append(batch(i), timeout=10.0)
            print(json.dumps({"append_id": f"a{i}", "receipt": receipt.to_json().decode()}), flush=True)
        except HistoryError as e:
            refused += 1
            print(json.dumps({"append_id": f"a{i}", "error": type(e).__name__,
                              "end": engine.stats().end_offsets}), flush=True)
        i += 1
    close_error: str | None = None
    try:
        engine.close()
    except Exception as e:
        close_error = type(e).__name__
    print(json.dumps({"close": close_error}), flush=True)
    reopen_error: str | None = None
    try:
        HistoryEngine.open(data).close()
    except Exception as e:
        reopen_error = type(e).__name__
    print(json.dumps({"reopen": reopen_error}), flush=True)


class Blocking(Projection):
    name = "blocking"

    def apply(self, event: BatchEvent | ClearEvent | TurnReplacedEvent, tx: ProjectionTx) -> None:
        print("inside", flush=True)
        threading.Event().wait()  # forever: the parent kills this process here


def register(data: str) -> None:
    with HistoryEngine.open(data) as engine:
        engine.register(Blocking())


if __name__ == "__main__":
    if sys.argv[1] == "fill":
        fill(sys.argv[2], int(sys.argv[3]))
    else:
        register(sys.argv[2])
