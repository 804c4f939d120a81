"""Opening this instance's RocksDB state beside its log: the one place that decides whether a
state is used as it is, rebuilt from the log, or refused and kept.

The state is derived from the log, so in doubt it is rebuilt, never patched, with one exception:
a state is also **evidence**. Its checkpoints say how far this instance had applied the log, and
an instance applies only records the log acknowledged. When the log is durable (a FileLog with
``fsync="always"``, Kafka with ``acks=all``) a state ahead of the log therefore proves that
acknowledged records are gone: that is refused with ``CorruptLog`` and the state is kept, until
the log is restored or the loss is accepted explicitly (``accept_log_loss=True``,
``histlog rebuild --accept-log-loss``), which says what is lost and rebuilds.

=====================================================  ==============================================
state found                                            decision
=====================================================  ==============================================
none                                                   a new state (layout version + log identity)
damaged (cannot be opened, or a damage was found       destroyed and rebuilt from the log (warning)
while it was last used: ``DamagedState``)
in use by another process, disk full, permissions      ``StateUnavailable``; the state is kept
another layout version                                 destroyed and rebuilt (warning)
built from another log (identity differs)              ``InvalidConfiguration``; the state is kept
ahead of a durable log                                 ``CorruptLog``; kept (unless ``accept_log_loss``)
ahead of a log that may lose its tail (fsync never)    destroyed and rebuilt (warning)
scratch replay states left by a killed ``register``    deleted
to be deleted (a row above) but the delete fails       ``StateUnavailable`` naming it; not retried
=====================================================  ==============================================
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from engine.keys import FileKeyStore, KafkaKeyStore, KeyStore, MasterKey, keys_topic_of
from engine.log.base import Log
from engine.log.file import FileLog, FsyncPolicy
from projections import keys
from projections.rows import ReceiptRow
from projections.runtime import CORE, checkpoints, scratch_prefix
from projections.store import DamagedState, StateStore
from schemas.errors import CorruptLog, InvalidConfiguration
from schemas.positions import LogPosition

__all__ = ["STATE_FORMAT", "Evidence", "lost_appends", "open_file_parts", "open_kafka_parts", "open_key_store",
           "open_state", "read_evidence"]

log = logging.getLogger("histlog.engine")

STATE_FORMAT = keys.STATE_FORMAT
"""The layout version (defined with the layout in ``projections/keys.py``; re-exported here)."""

L = TypeVar("L", bound=Log)
_LOST_SHOWN = 5


Evidence = Callable[[], "list[int] | None"]
"""Opens the state (once) and returns its checkpoints, or None when it holds no usable evidence."""


def open_state(state_dir: Path, open_log: Callable[[Evidence], L],
               identity_of: Callable[[L], dict[str, Any]], *, durable: bool, rebuild: bool = False,
               accept_log_loss: bool = False) -> tuple[L, StateStore]:
    """Open the log and the state, and decide as the table above says.

    ``open_log(evidence)`` opens the log; a log that can use evidence (the FileLog) calls
    ``evidence()`` once it holds its own lock and before it recovers its tail, which opens the state
    and returns its checkpoints (None after ``accept_log_loss``); a log that cannot ignores it and
    the state is opened after it. ``rebuild`` replaces the state by a new one once the log is known
    to hold everything the old one had applied. Nothing stays open when it raises."""
    opened: list[StateStore] = []

    def evidence() -> list[int] | None:
        if not opened:
            opened.append(_open_store(state_dir))
        return None if accept_log_loss else _evidence(opened[0])

    try:
        log_ = open_log(evidence)
    except BaseException:
        for store in opened:
            store.close()
        raise
    try:
        store = opened[0] if opened else _open_store(state_dir)
        store = _check(store, state_dir, identity_of(log_), log_.end_offsets(), durable=durable,
                       rebuild=rebuild, accept_log_loss=accept_log_loss)
    except BaseException:
        log_.close()
        raise
    return log_, store


def open_kafka_parts(bootstrap: str, topic: str, state_dir: Path, partitions: int | None, replication_factor: int, *,
                      rebuild: bool, accept_log_loss: bool) -> tuple[Log, StateStore]:
    """The Kafka log and its state (``open_state``); the topic is created or checked."""
    from engine.log.kafka import KafkaLog

    def open_kafka(_evidence: Evidence) -> KafkaLog:  # Kafka keeps no tail to cut: no evidence
        return KafkaLog(bootstrap, topic, partitions=partitions, replication_factor=replication_factor)

    def identity(klog: KafkaLog) -> dict[str, Any]:
        # The topic id tells a recreated topic (offsets restart at 0) from the one the state was built from.
        return {"backend": "kafka", "topic": topic, "topic_id": klog.topic_id, "partitions": klog.partitions}

    return open_state(state_dir, open_kafka, identity, durable=True, rebuild=rebuild, accept_log_loss=accept_log_loss)


def open_key_store(path: str | Path | None, kafka: str | None, topic: str, replication_factor: int,
                   master: MasterKey | None) -> KeyStore:
    """The key store beside the log (docs/erasure.md §2): ``path/keys/`` for the embedded log,
    the compacted topic ``<topic>.keys`` (created or checked) for Kafka."""
    if kafka is not None:
        return KafkaKeyStore(kafka, keys_topic_of(topic), master=master, replication_factor=replication_factor)
    assert path is not None  # Invariant: the caller checked that one of the two is given.
    return FileKeyStore(Path(path) / "keys", master=master)


def open_file_parts(root: Path, partitions: int | None, fsync: FsyncPolicy, *, rebuild: bool,
                    accept_log_loss: bool) -> tuple[Log, StateStore]:
    """The embedded file log under ``root/log`` and its state under ``root/state``."""
    def open_file(evidence: Evidence) -> FileLog:
        return FileLog(root / "log", partitions, fsync=fsync, acknowledged=evidence)

    def identity(flog: FileLog) -> dict[str, Any]:
        return {"backend": "file", "partitions": flog.partitions}

    return open_state(root / "state", open_file, identity, durable=fsync == "always", rebuild=rebuild,
                      accept_log_loss=accept_log_loss)


def lost_appends(store: StateStore, ends: list[int]) -> list[tuple[str, str, LogPosition]]:
    """``(conversation, append id, position)`` of every accepted append the state holds at or
    past the log's ``ends`` (what a log that lost its tail no longer has). Reads every receipt:
    for the recovery path only."""
    lost = []
    for k, v in store.iterator().scan(keys.RECEIPT_PREFIX, keys.RECEIPT_END):
        row = ReceiptRow.decode(v)
        if row.partition >= len(ends) or row.offset >= ends[row.partition]:
            conv, append_id = keys.read_receipt_key(k)
            lost.append((conv.decode(), append_id.decode(), LogPosition(row.partition, row.offset)))
    return sorted(lost, key=lambda t: (t[2].partition, t[2].offset))


def _open_store(state_dir: Path) -> StateStore:
    try:
        store = StateStore(state_dir)
    except DamagedState as e:
        log.warning("the state is damaged (%s): rebuilding it from the log", e.detail or e)
        StateStore.destroy(state_dir)
        store = StateStore(state_dir)
    try:
        for scratch in state_dir.parent.glob(scratch_prefix(state_dir) + "*"):
            # Invariant: the state's lock is held, so no live register() of this state owns these.
            StateStore.destroy(scratch)
    except BaseException:
        store.close()
        raise
    return store


def _evidence(store: StateStore) -> list[int] | None:
    """The checkpoints of a state of a layout that keeps them (``keys.EVIDENCE_FORMATS``, this one
    or the one before it, about to be rebuilt): offsets below which the log acknowledged records."""
    raw = store.get(keys.IDENTITY_KEY)
    if raw is None or store.get(keys.FORMAT_KEY) not in keys.EVIDENCE_FORMATS:
        return None
    return checkpoints(store, int(json.loads(raw)["partitions"]))


def _renew(store: StateStore, state_dir: Path) -> StateStore:
    store.close()
    StateStore.destroy(state_dir)
    return StateStore(state_dir)


def _check(store: StateStore, state_dir: Path, identity: dict[str, Any], ends: list[int], *, durable: bool,
           rebuild: bool, accept_log_loss: bool) -> StateStore:
    try:
        raw = store.get(keys.IDENTITY_KEY)
        if raw is not None and store.get(keys.FORMAT_KEY) != STATE_FORMAT:
            log.warning("state in %s has another layout than this version's (%s): rebuilding it from the log",
                        state_dir, STATE_FORMAT.decode())
            store, raw = _renew(store, state_dir), None
        if raw is not None and json.loads(raw) != identity:
            raise InvalidConfiguration(
                f"the state in {state_dir} was built from another log ({raw.decode()}, now {identity}); "
                "use another state directory, or delete this one to rebuild it from the log")
        if raw is not None:
            applied = checkpoints(store, len(ends))
            if any(a > e for a, e in zip(applied, ends, strict=True)):
                store = _ahead(store, state_dir, applied, ends, durable=durable, accept_log_loss=accept_log_loss)
                raw = None
        if rebuild and raw is not None:
            store, raw = _renew(store, state_dir), None
        if raw is None:
            store.put(keys.FORMAT_KEY, STATE_FORMAT)
            store.put(keys.IDENTITY_KEY, json.dumps(identity, sort_keys=True).encode())
    except BaseException:
        store.close()
        raise
    return store


def _ahead(store: StateStore, state_dir: Path, applied: list[int], ends: list[int], *, durable: bool,
           accept_log_loss: bool) -> StateStore:
    """The state has applied records the log no longer has: refuse (durable log) or rebuild."""
    gaps = ", ".join(f"partition {p}: state at offset {a}, log ends at {e}"
                     for p, (a, e) in enumerate(zip(applied, ends, strict=True)) if a > e)
    lost = lost_appends(store, ends)
    shown = ", ".join(f"{c}/{a} at {pos}" for c, a, pos in lost[:_LOST_SHOWN])
    what = f"{len(lost)} accepted append(s) the state holds are gone from the log" + (
        f" ({shown}{', ...' if len(lost) > _LOST_SHOWN else ''})" if lost else "")
    if durable and not accept_log_loss:
        first = next(p for p, (a, e) in enumerate(zip(applied, ends, strict=True)) if a > e)
        raise CorruptLog(
            f"the log lost acknowledged records: the state in {state_dir} has applied more than the log holds "
            f"({gaps}); {what}. The state is kept as evidence. Restore the log from a backup, or accept the "
            "loss with `histlog rebuild --accept-log-loss` (HistoryEngine.open(..., accept_log_loss=True)), "
            "which rebuilds the state from what the log still holds",
            reason="acknowledged records missing", position=LogPosition(first, ends[first]))
    log.warning("state in %s is ahead of the log (%s): %s; rebuilding it from the log", state_dir, gaps, what)
    return _renew(store, state_dir)


def read_evidence(state_dir: Path) -> tuple[list[int] | None, str]:
    """The core checkpoints of the state in ``state_dir`` (the evidence of acknowledged records
    that ``histlog log verify`` checks the log against), or ``None``, and a note saying which.
    Writes nothing to ``state_dir``, and works while an engine holds it.

    rocksdict rewrites its ``rocksdict-config.json`` on every open, even a read-only one, so the
    state is opened read-only through a scratch directory of symbolic links to its files.
    """
    if not (state_dir / "CURRENT").is_file():
        return None, f"no state at {state_dir}: no evidence of acknowledged records"
    from rocksdict import AccessType, Options, Rdict

    with tempfile.TemporaryDirectory(prefix="histlog-verify-") as scratch:
        for entry in state_dir.iterdir():
            if entry.name == "rocksdict-config.json":
                shutil.copyfile(entry, Path(scratch) / entry.name)
            elif entry.name != "LOCK" and not entry.name.startswith("LOG"):
                os.symlink(entry.resolve(), Path(scratch) / entry.name)
        try:
            db = Rdict(scratch, Options(raw_mode=True), access_type=AccessType.read_only())
        except Exception as exc:  # rocksdict raises a plain Exception with RocksDB's status text
            return None, f"the state in {state_dir} cannot be read ({' '.join(str(exc).split())}): no evidence"
        try:
            identity, layout = db.get(keys.IDENTITY_KEY), db.get(keys.FORMAT_KEY)
            if identity is None or layout not in keys.EVIDENCE_FORMATS:
                return None, f"the state in {state_dir} is empty or of another layout: no evidence"
            try:
                partitions = int(json.loads(identity)["partitions"])
            except (ValueError, KeyError, TypeError):
                return None, f"the state in {state_dir} has an unreadable identity: no evidence"
            raw = [db.get(keys.checkpoint_key(CORE, p)) for p in range(partitions)]
        finally:
            db.close()
    return [keys.read_u64(r) if r else 0 for r in raw], f"the checkpoints of the state in {state_dir}"
