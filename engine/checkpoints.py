"""Graph checkpoints on ``HistoryEngine`` (LangGraph persistence: the saver is
``engine.integrations.langgraph.HistlogSaver``; the rows and the admission rule are
``projections.checkpoints``, the values and the record's content ``schemas.checkpoints``).

A thread is a conversation. Each change is a ``Checkpointed`` record of that conversation,
decided in log order like every write (a put is read back, on every instance, once its record
is applied) and sealed under the conversation's data key like its messages, so ``clear``
(LangGraph's ``delete_thread``) erases the thread's checkpoints with it; a cleared thread id is
closed forever, as a cleared conversation is. The values are opaque here: the saver's serde
types them (``Typed``), the engine stores and returns the bytes.

``CheckpointPlan`` builds each record's content, checked before any I/O (``InvalidRequest``
naming the field); the thread face below and the asyncio face (``engine.aio``) both write it
with ``Writes.submit_checkpointed``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from engine.reading import EngineReads
from projections import checkpoints
from projections.store import StateStore
from schemas.checkpoints import (
    PruneContent,
    PutContent,
    StoredCheckpoint,
    Typed,
    WritesContent,
    check_name,
)
from schemas.errors import InvalidRequest
from schemas.ids import ConversationID

if TYPE_CHECKING:  # pragma: no cover
    from engine.writes import Concluded, Submitted, Writes

__all__ = ["AsyncCheckpoints", "EngineCheckpoints", "copy_plan", "prune_content", "put_content", "runs_content",
           "writes_content"]


def _typed(value: object, field: str) -> Typed:
    if (not isinstance(value, tuple) or len(value) != 2 or not isinstance(value[0], str)
            or not isinstance(value[1], bytes)):
        raise InvalidRequest(f"invalid {field}: expected a (type, bytes) pair as a serde's dumps_typed gives it")
    return check_name(value[0], f"{field} type"), value[1]


def put_content(checkpoint_ns: str, checkpoint_id: str, parent_id: str | None, run_id: str | None,
                checkpoint: Typed, metadata: Typed, versions: Mapping[str, str],
                blobs: Iterable[tuple[str, str, Typed | None]]) -> bytes:
    """A put's content, every field checked."""
    if not isinstance(versions, Mapping):
        raise InvalidRequest("invalid versions: expected a mapping of channel to version str")
    put = PutContent(
        check_name(checkpoint_ns, "checkpoint_ns", empty=True), check_name(checkpoint_id, "checkpoint_id"),
        None if parent_id is None else check_name(parent_id, "parent_id"),
        None if run_id is None else check_name(run_id, "run_id"),
        _typed(checkpoint, "checkpoint"), _typed(metadata, "metadata"),
        tuple((check_name(c, "channel"), check_name(v, "version")) for c, v in versions.items()),
        tuple((check_name(c, "channel"), check_name(v, "version"), None if t is None else _typed(t, "blob"))
              for c, v, t in blobs))
    return put.encode()


def writes_content(checkpoint_ns: str, checkpoint_id: str, task_id: str, task_path: str,
                   writes: Sequence[tuple[int, str, Typed]]) -> bytes:
    """A task's writes' content, every field checked (at least one write)."""
    checked = []
    for index, channel, value in writes:
        if type(index) is not int or not -(1 << 31) <= index < (1 << 31):
            raise InvalidRequest(f"invalid write index {index!r}: expected an int of 32 bits")
        checked.append((index, check_name(channel, "channel"), _typed(value, "write value")))
    if not checked:
        raise InvalidRequest("invalid writes: none (a task's writes hold at least one)")
    return WritesContent(check_name(checkpoint_ns, "checkpoint_ns", empty=True),
                         check_name(checkpoint_id, "checkpoint_id"), check_name(task_id, "task_id"),
                         check_name(task_path, "task_path", empty=True), tuple(checked)).encode()


def prune_content(strategy: str) -> bytes:
    """A prune's content: ``keep_latest`` or ``delete`` (``runs_content`` is a delete of runs)."""
    if strategy not in ("keep_latest", "delete"):
        raise InvalidRequest(f"invalid strategy {strategy!r}: expected keep_latest or delete")
    return PruneContent(strategy).encode()


def runs_content(run_ids: Sequence[str]) -> bytes:
    """The content of a delete of runs' checkpoints (``delete_for_runs``): at least one run id."""
    runs = tuple(check_name(r, "run_id") for r in run_ids)
    if not runs:
        raise InvalidRequest("invalid run_ids: none")
    return PruneContent("runs", runs).encode()


def copy_plan(stored: Iterable[StoredCheckpoint]) -> Iterator[tuple[str, bytes]]:
    """The ``(kind, content)`` records that copy ``stored`` to another thread: each checkpoint with
    every blob of its versions (so the copy reads alone), then its writes, task by task."""
    for cp in stored:
        blobs = [(c, v, cp.channel_values.get(c)) for c, v in cp.channel_versions.items()]
        yield "put", PutContent(cp.checkpoint_ns, cp.checkpoint_id, cp.parent_checkpoint_id, cp.run_id,
                                cp.checkpoint, cp.metadata, tuple(cp.channel_versions.items()),
                                tuple(blobs)).encode()
        tasks: dict[tuple[str, str], list[tuple[int, str, Typed]]] = {}
        for w in cp.pending_writes:
            tasks.setdefault((w.task_id, w.task_path), []).append((w.idx, w.channel, w.value))
        for (task, path), writes in tasks.items():
            yield "writes", WritesContent(cp.checkpoint_ns, cp.checkpoint_id, task, path, tuple(writes)).encode()


class EngineCheckpoints(EngineReads):
    """The graph-checkpoint calls of ``HistoryEngine``."""

    _writes: Writes
    _store: StateStore

    def _settle_all(self, records: Iterable[tuple[str, str, bytes]], timeout: float) -> None:
        """Write ``(thread, kind, content)`` records, all before waiting on any (``Writes.settle_all``)."""
        writes = self._writes

        def submit(thread: str, kind: str, content: bytes) -> Callable[[], Submitted]:
            return lambda: writes.submit_checkpointed(thread, kind, content, timeout)

        writes.settle_all([submit(*record) for record in records])

    def put_checkpoint(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str, *, parent_id: str | None,
                       run_id: str | None, checkpoint: Typed, metadata: Typed, versions: Mapping[str, str],
                       blobs: Iterable[tuple[str, str, Typed | None]] = (), timeout: float = 30.0) -> None:
        """Store a checkpoint of thread ``thread_id`` (its namespace, id and parent; the serde's
        checkpoint without channel values and its metadata; its channel versions) and the channel
        values it adds (``blobs``: channel, version, value or None). Returns once applied, so a
        read after it sees it. The same put again changes nothing. ``ConversationClosed`` once
        the thread was deleted."""
        content = put_content(checkpoint_ns, checkpoint_id, parent_id, run_id, checkpoint, metadata, versions, blobs)
        self._writes.settle(self._writes.submit_checkpointed(thread_id, "put", content, timeout))

    def put_checkpoint_writes(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str, task_id: str,
                              writes: Sequence[tuple[int, str, Typed]], *, task_path: str = "",
                              timeout: float = 30.0) -> None:
        """Store a task's pending writes to a checkpoint (index, channel, value each); a write at
        an index >= 0 the task wrote already is kept as it was, a negative (special) one replaced."""
        content = writes_content(checkpoint_ns, checkpoint_id, task_id, task_path, writes)
        self._writes.settle(self._writes.submit_checkpointed(thread_id, "writes", content, timeout))

    def get_checkpoint(self, thread_id: str, checkpoint_ns: str = "",
                       checkpoint_id: str | None = None) -> StoredCheckpoint | None:
        """The checkpoint ``checkpoint_id`` of the namespace, or its newest; None when there is
        none. O(its channels + its writes) point reads."""
        c = ConversationID(thread_id)
        ns = check_name(checkpoint_ns, "checkpoint_ns", empty=True)
        cid = None if checkpoint_id is None else check_name(checkpoint_id, "checkpoint_id")
        self._ready(c)
        return checkpoints.get(self._store.iterator(), str(c).encode(), ns.encode(),
                               None if cid is None else cid.encode())

    def list_checkpoints(self, thread_id: str | None = None, checkpoint_ns: str | None = None, *,
                         before: str | None = None, limit: int | None = None) -> Iterator[StoredCheckpoint]:
        """The checkpoints of a namespace (or of every namespace of the thread, or of every
        thread), newest first in each namespace, only those before checkpoint id ``before``, at
        most ``limit``; read lazily (``projections.checkpoints.listed``)."""
        if limit is not None and (type(limit) is not int or limit < 0):
            raise InvalidRequest(f"invalid limit {limit!r}: expected an int >= 0 or None")
        c = None if thread_id is None else ConversationID(thread_id)
        ns = None if checkpoint_ns is None else check_name(checkpoint_ns, "checkpoint_ns", empty=True)
        cut = None if before is None else check_name(before, "before")
        if c is None:
            self._check_open()
        else:
            self._ready(c)
        return checkpoints.listed(self._store.iterator(), None if c is None else str(c).encode(),
                                  None if ns is None else ns.encode(), None if cut is None else cut.encode(),
                                  limit)

    def prune_checkpoints(self, thread_ids: Sequence[str], strategy: str = "keep_latest",
                          timeout: float = 30.0) -> None:
        """Prune each thread's checkpoints: ``keep_latest`` keeps each namespace's newest (with its
        writes), ``delete`` removes them all (the thread stays open); decided in log order."""
        content = prune_content(strategy)
        threads = [ConversationID(t) for t in _thread_ids(thread_ids)]
        self._settle_all([(t, "prune", content) for t in threads], timeout)

    def delete_checkpoint_runs(self, run_ids: Sequence[str], timeout: float = 30.0) -> None:
        """Remove the checkpoints (and their writes) of the runs ``run_ids`` (their metadata's
        ``run_id``), in every thread this engine holds: one prune record per thread that has any."""
        runs = [check_name(r, "run_id") for r in _thread_ids(run_ids, "run_ids")]
        if runs:
            content = runs_content(runs)
            self._settle_all([(t, "prune", content) for t in self.checkpoint_threads_of_runs(runs)], timeout)

    def checkpoint_threads_of_runs(self, run_ids: Sequence[str]) -> list[str]:
        """The threads this engine holds checkpoints of the runs ``run_ids`` in (one seek per
        partition and run)."""
        self._check_open()
        snap = self._store.iterator()
        threads: list[str] = []
        for run in run_ids:
            for t in checkpoints.run_checkpoints(snap, self._log.partitions, run.encode()):
                if t.decode() not in threads:
                    threads.append(t.decode())
        return threads

    def copy_checkpoints(self, source_thread_id: str, target_thread_id: str, timeout: float = 30.0) -> None:
        """Copy every checkpoint of ``source_thread_id`` (each namespace, with its channel values and
        pending writes, ids kept) to ``target_thread_id``; a source without checkpoints copies nothing."""
        target = ConversationID(target_thread_id)
        stored = list(self.list_checkpoints(source_thread_id))
        self._settle_all([(target, kind, content) for kind, content in copy_plan(reversed(stored))], timeout)


class AsyncCheckpoints:
    """``EngineCheckpoints``' calls as coroutines (a base of ``engine.aio.AsyncHistoryEngine``): each
    write's decision awaited on the loop, the reads direct (point reads and a lazy scan)."""

    __slots__ = ()
    engine: EngineCheckpoints  # AsyncHistoryEngine's HistoryEngine
    _write: Callable[[Callable[[], Submitted], str], Awaitable[Concluded]]

    async def _write_all(self, records: Iterable[tuple[str, str, bytes]], timeout: float) -> None:
        writes = self.engine._writes

        def submit(thread: str, kind: str, content: bytes) -> Callable[[], Submitted]:
            return lambda: writes.submit_checkpointed(thread, kind, content, timeout)

        jobs = [self._write(submit(thread, kind, content), thread) for thread, kind, content in records]
        for result in await asyncio.gather(*jobs, return_exceptions=True):
            if isinstance(result, BaseException):
                raise result

    async def put_checkpoint(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str, *, parent_id: str | None,
                             run_id: str | None, checkpoint: Typed, metadata: Typed, versions: Mapping[str, str],
                             blobs: Iterable[tuple[str, str, Typed | None]] = (), timeout: float = 30.0) -> None:
        content = put_content(checkpoint_ns, checkpoint_id, parent_id, run_id, checkpoint, metadata, versions, blobs)
        await self._write_all([(thread_id, "put", content)], timeout)

    async def put_checkpoint_writes(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str, task_id: str,
                                    writes: Sequence[tuple[int, str, Typed]], *, task_path: str = "",
                                    timeout: float = 30.0) -> None:
        content = writes_content(checkpoint_ns, checkpoint_id, task_id, task_path, writes)
        await self._write_all([(thread_id, "writes", content)], timeout)

    async def get_checkpoint(self, thread_id: str, checkpoint_ns: str = "",
                             checkpoint_id: str | None = None) -> StoredCheckpoint | None:
        return self.engine.get_checkpoint(thread_id, checkpoint_ns, checkpoint_id)

    async def list_checkpoints(self, thread_id: str | None = None, checkpoint_ns: str | None = None, *,
                               before: str | None = None, limit: int | None = None) -> Iterator[StoredCheckpoint]:
        return self.engine.list_checkpoints(thread_id, checkpoint_ns, before=before, limit=limit)

    async def prune_checkpoints(self, thread_ids: Sequence[str], strategy: str = "keep_latest",
                                timeout: float = 30.0) -> None:
        content = prune_content(strategy)
        await self._write_all([(ConversationID(t), "prune", content) for t in _thread_ids(thread_ids)], timeout)

    async def delete_checkpoint_runs(self, run_ids: Sequence[str], timeout: float = 30.0) -> None:
        runs = [check_name(r, "run_id") for r in _thread_ids(run_ids, "run_ids")]
        if runs:
            threads = self.engine.checkpoint_threads_of_runs(runs)
            await self._write_all([(t, "prune", runs_content(runs)) for t in threads], timeout)

    async def copy_checkpoints(self, source_thread_id: str, target_thread_id: str, timeout: float = 30.0) -> None:
        target = ConversationID(target_thread_id)
        stored = list(self.engine.list_checkpoints(source_thread_id))
        await self._write_all([(target, kind, content) for kind, content in copy_plan(reversed(stored))], timeout)


def _thread_ids(ids: object, field: str = "thread_ids") -> list[str]:
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise InvalidRequest(f"invalid {field}: expected a list of str, got {type(ids).__name__}")
    return list(ids)
