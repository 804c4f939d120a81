"""The engine process of the model-based fault harness (test_fault_model.py): one embedded
``HistoryEngine`` (real FileLog + real RocksDB, ``fsync="always"``) driven by JSON commands.

Protocol, one JSON object a line: on start the worker opens ``DATA_DIR``, registers
``VisibleMirror`` and prints ``{"ready": ...}`` (or ``{"open_error": TYPE, "message": ...}`` and
exits 3). Then it answers each command on stdin with one line, ``{"ok": VALUE}`` or
``{"error": TYPE, "message": ...}`` for a ``HistoryError`` (the outcome under test)::

    {"op": "append", "batch": BATCH_JSON, "expected_last": null | "EMPTY" | RECEIPT}
    {"op": "replace", "batch": BATCH_JSON, "old_turn_id": ID, "reason": "edit" | "retry"}
    {"op": "clear", "conv": CONV}
    {"op": "resend", "batches": [BATCH_JSON, ...]}      -> a list of results, one per batch
    {"op": "observe", "convs": [CONV, ...]}             -> everything a reader can see (``observe``)
    {"op": "flush"}                                     -> RocksDB memtables flushed to .sst files
    {"op": "close"}                                     -> a clean close, then exit 0

The parent kills it with SIGKILL at any moment, also between reading a command and answering.

Run alone for a reproduction: ``python -m tests.reliability.fault_worker DATA_DIR``. The harness
starts it through ``serve_forks`` instead: a zygote that imported everything once and forks one
worker per start (a real process, killed for real), which makes a start cost milliseconds
instead of a fresh interpreter's ~0.6 s.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import traceback
from typing import Any

from engine import EMPTY, HistoryEngine
from projections import BatchEvent, ClearEvent, ProjectedEvent, Projection, ProjectionTx, TurnReplacedEvent
from schemas import Batch, HistoryError, Receipt, StoredMessage, WindowTooSmall

WINDOWS = (1, 2, 3, 5)
"""The ``window`` limits observed for every conversation."""


class VisibleMirror(Projection):
    """A custom projection mirroring the visible history: ``m/CONV\\x1f SEQ -> canonical JSON``.
    It also counts deliveries, which must be exactly one per accepted event, also across kills,
    rebuilds and registrations: ``n/CONV\\x1f APPEND_ID`` per batch or replacement,
    ``r/CONV\\x1f APPEND_ID`` per replacement, ``x/CONV`` per clear."""

    name = "fault-mirror"

    def apply(self, event: ProjectedEvent, tx: ProjectionTx) -> None:
        conv = str(event.conversation_id).encode()
        if isinstance(event, ClearEvent):
            bump(tx, b"x/" + conv)
            for key, _ in tx.scan(b"m/" + conv + b"\x1f"):
                tx.delete(key)
            return
        bump(tx, b"n/" + conv + b"\x1f" + str(event.append_id).encode())
        if isinstance(event, TurnReplacedEvent):
            bump(tx, b"r/" + conv + b"\x1f" + str(event.append_id).encode())
            for seq in event.hidden_seqs:
                tx.delete(mirror_key(conv, seq))
        else:
            assert isinstance(event, BatchEvent)
        for i, message in enumerate(event.messages):
            tx.put(mirror_key(conv, event.first_seq + i), message.canonical_json())


def bump(tx: ProjectionTx, key: bytes) -> None:
    tx.put(key, str(int(tx.get(key) or b"0") + 1).encode())


def mirror_key(conv: bytes, seq: int) -> bytes:
    return b"m/" + conv + b"\x1f" + seq.to_bytes(8, "big")


def stored(e: StoredMessage) -> list[Any]:
    return [e.id, e.position.turn, e.position.seq, str(e.append_id), e.message.canonical_json().decode(),
            e.superseded_by, e.reason, e.created_at.isoformat()]


def observe(engine: HistoryEngine, convs: list[str]) -> dict[str, Any]:
    """Every read the harness compares with the model, as JSON."""
    view = engine.view(VisibleMirror.name)
    out: dict[str, Any] = {}
    for c in convs:
        windows: dict[str, Any] = {}
        for n in WINDOWS:
            try:
                windows[str(n)] = [m.canonical_json().decode() for m in engine.window(c, n)]
            except WindowTooSmall:
                windows[str(n)] = "WindowTooSmall"
        latest = engine.latest_turn(c)
        out[c] = {
            "all": [stored(e) for e in engine.entries(c, include_hidden=True)],
            "visible": [stored(e) for e in engine.entries(c)],
            "read": [m.canonical_json().decode() for m in engine.read(c)],
            "window": windows,
            "latest_turn": None if latest is None else [
                latest.id, latest.position, latest.request_message_id, latest.assistant_message_id,
                [stored(e) for e in latest.messages]],
            "mirror": [[int.from_bytes(k[-8:], "big"), v.decode()] for k, v in view.scan(b"m/" + c.encode() + b"\x1f")],
            "mirror_replacements": counts(view.scan(b"r/" + c.encode() + b"\x1f")),
            "mirror_deliveries": counts(view.scan(b"n/" + c.encode() + b"\x1f")),
            "mirror_clears": int(view.get(b"x/" + c.encode()) or b"0"),
        }
    s = engine.stats()
    return {"convs": out, "conversations": [str(c) for c in engine.conversations()],
            "stats": {"accepted": s.accepted, "duplicates": s.duplicates, "conflicts": s.conflicts,
                      "rejected_closed": s.rejected_closed, "corrupt": s.corrupt,
                      "precondition_failed": s.precondition_failed, "not_replaceable": s.not_replaceable,
                      "cleared": s.cleared, "erased": s.erased, "lag": s.lag, "end_offsets": s.end_offsets}}


def counts(pairs: list[tuple[bytes, bytes]]) -> dict[str, int]:
    return {k.rsplit(b"\x1f", 1)[1].decode(): int(v) for k, v in pairs}


def _expected(raw: Any) -> Receipt | object | None:
    if raw is None:
        return None
    if raw == "EMPTY":
        return EMPTY
    return Receipt.from_dict(raw)


def execute(engine: HistoryEngine, cmd: dict[str, Any]) -> Any:
    """One command's value; a ``HistoryError`` propagates (it is the answer)."""
    op = cmd["op"]
    if op == "append":
        return engine.append(Batch.from_json(cmd["batch"]),
                             expected_last=_expected(cmd.get("expected_last"))).to_dict()  # type: ignore[arg-type]
    if op == "replace":
        return engine.replace_turn(Batch.from_json(cmd["batch"]), cmd["old_turn_id"], cmd["reason"]).to_dict()
    if op == "clear":
        engine.clear(cmd["conv"])
        return None
    if op == "resend":
        return [answer(lambda b=b: engine.append(Batch.from_json(b)).to_dict()) for b in cmd["batches"]]
    if op == "observe":
        return observe(engine, cmd["convs"])
    if op == "flush":
        engine._store.db.flush()  # test code: force .sst files so damage rules have something to damage
        return None
    raise ValueError(f"unknown command {op!r}")


def answer(call: Any) -> dict[str, Any]:
    try:
        return {"ok": call()}
    except HistoryError as e:
        return {"error": type(e).__name__, "message": str(e)}


def main(data: str) -> int:
    try:
        engine = HistoryEngine.open(data, fsync="always")
        engine.register(VisibleMirror())
    except BaseException as e:  # reported to the parent, which decides whether it is a defect
        emit({"open_error": type(e).__name__, "message": str(e), "traceback": traceback.format_exc()})
        return 3
    emit({"ready": os.getpid()})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "close":
            engine.close()
            emit({"ok": "closed"})
            return 0
        try:
            emit(answer(lambda cmd=cmd: execute(engine, cmd)))
        except BaseException as e:  # not a HistoryError: an engine defect, reported with its traceback
            emit({"crash": type(e).__name__, "message": str(e), "traceback": traceback.format_exc()})
    engine.close()  # stdin closed: the parent is gone
    return 0


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def serve_forks(sock_fd: int) -> None:
    """The zygote: on ``{"spawn": DATA_DIR}`` with two file descriptors attached (the worker's
    stdin and stdout), fork a worker and answer ``{"pid": PID}``; on ``{"reap": PID}`` wait for
    it and answer ``{"status": WAITSTATUS}``. When the socket closes, kill and reap every worker
    still running, then exit."""
    sock = socket.socket(fileno=sock_fd)  # AF_UNIX, SOCK_SEQPACKET: one message a packet
    children: set[int] = set()
    try:
        while True:
            msg, fds, _, _ = socket.recv_fds(sock, 65536, 2)
            if not msg:
                break
            cmd = json.loads(msg)
            if "spawn" in cmd:
                pid = os.fork()
                if pid == 0:  # the worker
                    os.dup2(fds[0], 0)
                    os.dup2(fds[1], 1)
                    for fd in (*fds, sock_fd):
                        os.close(fd)
                    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
                    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
                    os._exit(main(cmd["spawn"]))
                for fd in fds:
                    os.close(fd)
                children.add(pid)
                sock.send(json.dumps({"pid": pid}).encode())
            else:
                pid = cmd["reap"]
                _, status = os.waitpid(pid, 0)
                children.discard(pid)
                sock.send(json.dumps({"status": status}).encode())
    finally:
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


if __name__ == "__main__":
    if sys.argv[1] == "--zygote":
        serve_forks(int(sys.argv[2]))
    else:
        sys.exit(main(sys.argv[1]))
