"""histlog for LangGraph (``pip install 'histlog[langgraph]'``): ``HistlogSaver``, a checkpointer
whose checkpoints are events on histlog's log (``engine.checkpoints``), read back from a
projection rebuilt by replay, shared by every instance on the same log, sealed like messages
and erased by ``delete_thread``.

It implements every method of ``BaseCheckpointSaver`` natively in both faces: the sync ones on a
``HistoryEngine``, the async ones on its ``AsyncHistoryEngine`` (the decision of each write
awaited on the loop, not a thread), including the extended ones (``delete_for_runs``,
``copy_thread``, ``prune``). A thread is a histlog conversation: ``delete_thread`` is ``clear``,
so it erases the thread's messages too (``HistlogMiddleware`` keeps them there) and the thread id
is closed for good (a later write to it raises ``ConversationClosed``: use a new thread id).

Each checkpoint stores only the channel values that changed (``new_versions``): a value is kept
once per version and shared by the checkpoints that keep that version. docs/langgraph.md is the
user's guide.

Over HTTP (``histlog serve``): ``HistlogSaver(HistoryClient(url), aclient=AsyncHistoryClient(url))``
or ``HistlogSaver.connect(url)``; the clients offer the engine's checkpoint calls with the same
arguments and results (``engine.client.checkpoint_calls``), so the same methods run on them: the
sync ones on the ``HistoryClient``, the async ones on the ``AsyncHistoryClient``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from engine.aio import AsyncHistoryEngine
from engine.facade import HistoryEngine
from schemas.checkpoints import StoredCheckpoint, Typed

if TYPE_CHECKING:  # the clients need httpx (histlog[server]): imported when a saver is given one
    from engine.client import AsyncHistoryClient, HistoryClient

__all__ = ["HistlogSaver"]


def _place(config: RunnableConfig) -> tuple[str, str, str | None]:
    """``(thread_id, checkpoint_ns, checkpoint_id)`` of a config."""
    conf = config["configurable"]
    return conf["thread_id"], conf.get("checkpoint_ns", ""), get_checkpoint_id(config)


def _config(thread: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}}


class HistlogSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer on a ``HistoryEngine`` (or a data directory, ``HistlogSaver.open``),
    or on a histlog server through its clients (``HistlogSaver(HistoryClient(url), aclient=...)``,
    ``HistlogSaver.connect(url)``)."""

    engine: HistoryEngine | HistoryClient
    """What the sync methods call: the engine, or the sync client."""
    aengine: AsyncHistoryEngine | AsyncHistoryClient
    """What the async methods call: the engine's asyncio face, or the async client."""

    def __init__(self, engine: HistoryEngine | HistoryClient, *, aclient: AsyncHistoryClient | None = None,
                 serde: SerializerProtocol | None = None, owns_engine: bool = False) -> None:
        super().__init__(serde=serde)
        self._owns = owns_engine
        self._owns_aclient = False
        self._closing: asyncio.Task[None] | None = None
        if isinstance(engine, HistoryEngine):
            if aclient is not None:
                raise TypeError("aclient= goes with a HistoryClient; on a HistoryEngine the async methods run "
                                "on its AsyncHistoryEngine")
            self.engine = engine
            self.aengine = AsyncHistoryEngine(engine)
            return
        from engine.client import AsyncHistoryClient, HistoryClient

        if not isinstance(engine, HistoryClient):
            raise TypeError(f"HistlogSaver takes a HistoryEngine (HistoryEngine.open) or a HistoryClient "
                            f"(HistlogSaver.connect), got {type(engine).__name__}")
        if aclient is None:  # the same servers, token and timeout, for the async methods
            aclient = AsyncHistoryClient(engine.urls, token=engine._token, timeout=engine._timeout)
            self._owns_aclient = True
        elif not isinstance(aclient, AsyncHistoryClient):
            raise TypeError(f"aclient= takes an AsyncHistoryClient, got {type(aclient).__name__}")
        self.engine = engine
        self.aengine = aclient

    @classmethod
    def open(cls, path: str | Path | None = None, *, serde: SerializerProtocol | None = None,
             **options: Any) -> HistlogSaver:
        """A saver over ``HistoryEngine.open(path, **options)`` (a data directory, or Kafka with
        ``kafka=``, ``topic=``, ``state_dir=``), which it closes on ``close``."""
        return cls(HistoryEngine.open(path, **options), serde=serde, owns_engine=True)

    @classmethod
    def connect(cls, url_or_urls: str | Sequence[str], token: str | None = None, *,
                serde: SerializerProtocol | None = None, timeout: float = 30.0) -> HistlogSaver:
        """A saver over a histlog server (``histlog serve``; several URLs: a cluster's members):
        a ``HistoryClient`` for the sync methods and an ``AsyncHistoryClient`` for the async ones
        (which belongs to the event loop that first uses it), both closed on ``close``."""
        from engine.client import AsyncHistoryClient, HistoryClient

        client = HistoryClient(url_or_urls, token=token, timeout=timeout)
        saver = cls(client, aclient=AsyncHistoryClient(url_or_urls, token=token, timeout=timeout), serde=serde,
                    owns_engine=True)
        saver._owns_aclient = True
        return saver

    def close(self) -> None:
        """Close the engine, or the clients, if this saver opened them (``open``, ``connect``). An
        async client is closed on the running loop when there is one (``aclose`` awaits it)."""
        if self._owns:
            self.engine.close()
        if self._owns_aclient:
            self._owns_aclient = False
            closing = self._close_aclient()
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                asyncio.run(closing)
            else:
                self._closing = loop.create_task(closing)

    async def aclose(self) -> None:
        """``close``, the async client's connections closed on this loop."""
        if self._owns_aclient:
            self._owns_aclient = False
            await self._close_aclient()
        self.close()

    async def _close_aclient(self) -> None:
        from engine.client import AsyncHistoryClient

        if isinstance(self.aengine, AsyncHistoryClient):
            try:
                await self.aengine.close()
            except RuntimeError:  # its connections belong to an event loop that is gone: nothing to close
                pass

    def __enter__(self) -> HistlogSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> HistlogSaver:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- the conversions, shared by both faces ---------------------------------------------------
    def _put_args(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
                  new_versions: ChannelVersions) -> tuple[tuple[str, str, str], dict[str, Any]]:
        thread, ns, parent = _place(config)
        stored: dict[str, Any] = dict(checkpoint)
        values: dict[str, Any] = stored.pop("channel_values", {})
        dumps = self.serde.dumps_typed
        md = get_checkpoint_metadata(config, metadata)
        run = md.get("run_id")
        args = {
            "parent_id": parent, "run_id": str(run) if run is not None else None,
            "checkpoint": dumps(stored), "metadata": dumps(md),
            "versions": {k: str(v) for k, v in checkpoint["channel_versions"].items()},
            "blobs": [(k, str(v), dumps(values[k]) if k in values else None) for k, v in new_versions.items()],
        }
        return (thread, ns, checkpoint["id"]), args

    def _writes_args(self, writes: Sequence[tuple[str, Any]]) -> list[tuple[int, str, Typed]]:
        dumps = self.serde.dumps_typed
        return [(WRITES_IDX_MAP.get(channel, idx), channel, dumps(value))
                for idx, (channel, value) in enumerate(writes)]

    def _tuple(self, stored: StoredCheckpoint) -> CheckpointTuple:
        loads = self.serde.loads_typed
        checkpoint = loads(stored.checkpoint)
        checkpoint["channel_values"] = {k: loads(v) for k, v in stored.channel_values.items()}
        thread, ns = stored.thread_id, stored.checkpoint_ns
        parent = stored.parent_checkpoint_id
        return CheckpointTuple(
            config=_config(thread, ns, stored.checkpoint_id), checkpoint=checkpoint, metadata=loads(stored.metadata),
            parent_config=_config(thread, ns, parent) if parent else None,
            pending_writes=[(w.task_id, w.channel, loads(w.value)) for w in stored.pending_writes])

    def _listed(self, stored: Iterable[StoredCheckpoint], config: RunnableConfig | None,
                filter: dict[str, Any] | None, limit: int | None) -> Iterator[CheckpointTuple]:
        wanted = get_checkpoint_id(config) if config else None
        if limit is not None and limit <= 0:
            return
        for cp in stored:
            if wanted and cp.checkpoint_id != wanted:
                continue
            if filter:
                metadata = self.serde.loads_typed(cp.metadata)
                if not all(metadata.get(k) == v for k, v in filter.items()):
                    continue
            yield self._tuple(cp)
            if limit is not None:
                limit -= 1
                if limit <= 0:
                    return  # before the next one is read

    @staticmethod
    def _list_place(config: RunnableConfig | None, before: RunnableConfig | None, filter: dict[str, Any] | None,
                    limit: int | None) -> dict[str, Any]:
        """``list_checkpoints``' arguments: the limit goes down only when every row read is returned."""
        exact = not filter and not (config and get_checkpoint_id(config))
        return {"thread_id": config["configurable"]["thread_id"] if config else None,
                "checkpoint_ns": config["configurable"].get("checkpoint_ns") if config else None,
                "before": get_checkpoint_id(before) if before else None,
                "limit": limit if exact and limit is not None and limit >= 0 else None}

    # -- sync ----------------------------------------------------------------------------------
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        stored = self.engine.get_checkpoint(*_place(config))
        return self._tuple(stored) if stored is not None else None

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None) -> Iterator[CheckpointTuple]:
        stored = self.engine.list_checkpoints(**self._list_place(config, before, filter, limit))
        yield from self._listed(stored, config, filter, limit)

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        place, args = self._put_args(config, checkpoint, metadata, new_versions)
        self.engine.put_checkpoint(*place, **args)
        return _config(*place)

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                   task_path: str = "") -> None:
        thread, ns, cid = _place(config)
        items = self._writes_args(writes)
        if items:
            self.engine.put_checkpoint_writes(thread, ns, str(cid), task_id, items, task_path=task_path)

    def delete_thread(self, thread_id: str) -> None:
        self.engine.clear(thread_id)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self.engine.delete_checkpoint_runs(list(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self.engine.copy_checkpoints(source_thread_id, target_thread_id)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self.engine.prune_checkpoints(list(thread_ids), strategy)

    # -- async ---------------------------------------------------------------------------------
    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        stored = await self.aengine.get_checkpoint(*_place(config))
        return self._tuple(stored) if stored is not None else None

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None, limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        stored = await self.aengine.list_checkpoints(**self._list_place(config, before, filter, limit))
        for tup in self._listed(stored, config, filter, limit):
            yield tup
            await asyncio.sleep(0)  # a long list lets the loop run between tuples

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
                   new_versions: ChannelVersions) -> RunnableConfig:
        place, args = self._put_args(config, checkpoint, metadata, new_versions)
        await self.aengine.put_checkpoint(*place, **args)
        return _config(*place)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                          task_path: str = "") -> None:
        thread, ns, cid = _place(config)
        items = self._writes_args(writes)
        if items:
            await self.aengine.put_checkpoint_writes(thread, ns, str(cid), task_id, items, task_path=task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await self.aengine.clear(thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self.aengine.delete_checkpoint_runs(list(run_ids))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self.aengine.copy_checkpoints(source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self.aengine.prune_checkpoints(list(thread_ids), strategy)

    def get_next_version(self, current: str | None, channel: None) -> str:
        """Versions that sort as they grow (a zero-padded counter, then a random fraction, as
        ``InMemorySaver``'s): a channel's blob keys sort in version order."""
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(current.split(".")[0])
        return f"{current_v + 1:032}.{random.random():016}"
