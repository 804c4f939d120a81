"""``HistlogSaver`` (engine.integrations.langgraph): LangGraph's checkpointer conformance suite
(langgraph-checkpoint-conformance, all eight capabilities) through its async face and, through
a wrapper whose coroutines call the sync methods, its sync face; real ``StateGraph`` runs that
resume from the log; a rebuild equals the live state; ``delete_thread`` erases the thread from
every file; reads cost what they return. The Kafka run is tests/integration/test_kafka_langgraph.py."""

from __future__ import annotations

import asyncio
import operator
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES
from langgraph.graph import END, START, StateGraph

from engine import HistoryEngine
from engine.integrations.langgraph import HistlogSaver
from projections import keys
from schemas import InvalidRequest
from schemas.errors import ConversationClosed, CorruptLog
from schemas.events import Checkpointed, decode_event, encode_event
from schemas.records import record_key


class SyncFace(BaseCheckpointSaver[str]):
    """The conformance suite calls coroutines: these call ``HistlogSaver``'s sync methods, so
    the suite checks the sync face too."""

    def __init__(self, saver: HistlogSaver) -> None:
        super().__init__(serde=saver.serde)
        self.saver = saver

    async def aget_tuple(self, config: Any) -> CheckpointTuple | None:
        return self.saver.get_tuple(config)

    async def alist(self, config: Any, *, filter: Any = None, before: Any = None,
                    limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        for tup in self.saver.list(config, filter=filter, before=before, limit=limit):
            yield tup

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        return self.saver.put(config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: Any, writes: Sequence[tuple[str, Any]], task_id: str,
                          task_path: str = "") -> None:
        self.saver.put_writes(config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        self.saver.delete_thread(thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        self.saver.delete_for_runs(run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self.saver.copy_thread(source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self.saver.prune(thread_ids, strategy=strategy)

    def get_next_version(self, current: Any, channel: None) -> str:
        return self.saver.get_next_version(current, channel)


def _full_conformance(make: Any, name: str) -> None:
    @checkpointer_test(name=name)
    async def factory() -> AsyncIterator[BaseCheckpointSaver[str]]:
        saver, wrapped = make()
        try:
            yield wrapped
        finally:
            saver.close()

    report = asyncio.run(validate(factory))
    failures = {cap: r.failures for cap, r in report.results.items() if r.failures}
    assert failures == {}
    assert {cap for cap, r in report.results.items() if r.detected and r.passed} == {c.value for c in ALL_CAPABILITIES}
    assert report.conformance_level() == "FULL"


@pytest.mark.parametrize("partitions", [1, 3])
def test_the_async_face_passes_all_eight_capabilities(tmp_path: Path, partitions: int) -> None:
    counter = iter(range(100))

    def make() -> tuple[HistlogSaver, HistlogSaver]:
        saver = HistlogSaver.open(tmp_path / f"d{next(counter)}", partitions=partitions)
        return saver, saver

    _full_conformance(make, f"HistlogSaver-async-{partitions}")


def test_the_sync_face_passes_all_eight_capabilities(tmp_path: Path) -> None:
    counter = iter(range(100))

    def make() -> tuple[HistlogSaver, SyncFace]:
        saver = HistlogSaver.open(tmp_path / f"d{next(counter)}")
        return saver, SyncFace(saver)

    _full_conformance(make, "HistlogSaver-sync")


class Chat(TypedDict):
    messages: Annotated[list[str], operator.add]


def _graph(saver: BaseCheckpointSaver[str]) -> Any:
    builder = StateGraph(Chat)
    builder.add_node("bot", lambda state: {"messages": [f"reply {len(state['messages'])}"]})
    builder.add_edge(START, "bot")
    builder.add_edge("bot", END)
    return builder.compile(checkpointer=saver)


def test_a_graph_resumes_from_the_log_after_a_reopen(tmp_path: Path) -> None:
    config = {"configurable": {"thread_id": "customer-42"}}
    with HistlogSaver.open(tmp_path / "d") as saver:
        graph = _graph(saver)
        graph.invoke({"messages": ["hi"]}, config)
        graph.invoke({"messages": ["again"]}, config)
    with HistlogSaver.open(tmp_path / "d") as saver:
        graph = _graph(saver)
        assert graph.get_state(config).values["messages"] == ["hi", "reply 1", "again", "reply 3"]
        out = graph.invoke({"messages": ["third"]}, config)
        assert out["messages"][-1] == "reply 5"
        history = list(graph.get_state_history(config))
        assert len(history) == 9 and history[0].values == out  # 3 steps a run, newest first


def test_an_async_graph_runs_on_the_async_face(tmp_path: Path) -> None:
    async def run() -> list[str]:
        with HistlogSaver.open(tmp_path / "d") as saver:
            graph = _graph(saver)
            config = {"configurable": {"thread_id": "t"}}
            await graph.ainvoke({"messages": ["hi"]}, config)
            state = await graph.aget_state(config)
            return list(state.values["messages"])

    assert asyncio.run(run()) == ["hi", "reply 1"]


def _rows(engine: HistoryEngine) -> list[tuple[bytes, bytes]]:
    return list(engine._projector.store.iterator().scan(b"", b"\xff" * 16))


def test_checkpoints_survive_a_rebuild_and_delete_thread_erases_every_file(tmp_path: Path) -> None:
    secret = "my IBAN is DE89 3704 0044 0532 0130 00"
    config = {"configurable": {"thread_id": "c-7f3a"}}
    with HistlogSaver.open(tmp_path / "d", partitions=2) as saver:
        graph = _graph(saver)
        graph.invoke({"messages": [secret]}, config)
        graph.invoke({"messages": ["keep going"]}, {"configurable": {"thread_id": "other"}})
        saver.prune(["other"], strategy="keep_latest")
        live = (saver.engine._projector.stats(), _rows(saver.engine))
    with HistlogSaver.open(tmp_path / "d", rebuild=True) as saver:
        assert saver.engine.catch_up(timeout=30)
        assert (saver.engine._projector.stats(), _rows(saver.engine)) == live
        log_files = [p for p in (tmp_path / "d" / "log").rglob("*") if p.is_file()]
        assert not [p for p in log_files if secret.encode() in p.read_bytes()]  # sealed in the log
        saver.delete_thread("c-7f3a")
        assert saver.get_tuple(config) is None
        with pytest.raises(ConversationClosed):
            _graph(saver).invoke({"messages": ["back?"]}, config)
        assert _graph(saver).get_state({"configurable": {"thread_id": "other"}}).values["messages"][-1] == "reply 1"
    holding = [p for p in (tmp_path / "d").rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert holding == []
    with HistlogSaver.open(tmp_path / "d", rebuild=True) as saver:  # a replay after the delete reads nothing of it
        assert saver.engine.catch_up(timeout=30)
        assert saver.get_tuple(config) is None and list(saver.list(config)) == []
        assert saver.engine.stats().erased > 0


def test_reads_cost_what_they_return(tmp_path: Path) -> None:
    """``get_tuple`` visits the same keys after 6 checkpoints as after 186; a list of 3 the same,
    in one namespace or across them."""
    with HistlogSaver.open(tmp_path / "d") as saver:
        graph = _graph(saver)
        config = {"configurable": {"thread_id": "t"}}
        store = saver.engine._projector.store

        def visits(read: Any) -> int:
            before = store.keys_read
            read()
            return store.keys_read - before

        root = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}

        def reads() -> tuple[int, int, int]:
            return (visits(lambda: saver.get_tuple(config)), visits(lambda: list(saver.list(root, limit=3))),
                    visits(lambda: list(saver.list(config, limit=3))))

        for k in range(2):  # from the second run on, each run's three checkpoints have the same shape
            graph.invoke({"messages": [str(k)]}, config)
        early = reads()
        for k in range(60):
            graph.invoke({"messages": [str(k)]}, config)
        assert reads() == early and early[0] > 0


def test_bad_input_is_refused_before_any_write(tmp_path: Path) -> None:
    with HistoryEngine.open(tmp_path / "d") as engine:
        end = engine.log.end_offsets()
        good = {"parent_id": None, "run_id": None, "checkpoint": ("json", b"{}"), "metadata": ("json", b"{}"),
                "versions": {}}
        for bad, field in (({"checkpoint": "x"}, "checkpoint"), ({"versions": {"a\x00": "1"}}, "channel"),
                           ({"run_id": ""}, "run_id"), ({"blobs": [("a", "1", ("json", "str"))]}, "blob")):
            with pytest.raises(InvalidRequest, match=field):
                engine.put_checkpoint("t", "", "c1", **{**good, **bad})
        with pytest.raises(InvalidRequest, match="checkpoint_ns"):
            engine.put_checkpoint("t", "ns\x1f", "c1", **good)
        with pytest.raises(InvalidRequest, match="strategy"):
            engine.prune_checkpoints(["t"], "everything")
        with pytest.raises(InvalidRequest, match="writes"):
            engine.put_checkpoint_writes("t", "", "c1", "task", [])
        with pytest.raises(InvalidRequest, match="index"):
            engine.put_checkpoint_writes("t", "", "c1", "task", [(1 << 31, "ch", ("json", b"1"))])
        with pytest.raises(InvalidRequest, match="strategy"):
            engine.prune_checkpoints(["t"], "runs")  # a delete of runs names its runs: delete_checkpoint_runs
        assert engine.log.end_offsets() == end


def test_the_widest_write_indexes_round_trip(tmp_path: Path) -> None:
    with HistoryEngine.open(tmp_path / "d") as engine:
        writes = [(-(1 << 31), "low", ("json", b"1")), ((1 << 31) - 1, "high", ("json", b"2"))]
        engine.put_checkpoint("t", "", "c1", parent_id=None, run_id=None, checkpoint=("json", b"{}"),
                              metadata=("json", b"{}"), versions={})
        engine.put_checkpoint_writes("t", "", "c1", "task", writes)
        stored = engine.get_checkpoint("t")
        assert stored is not None and [(w.idx, w.channel) for w in stored.pending_writes] == [
            (-(1 << 31), "low"), ((1 << 31) - 1, "high")]
        assert engine.stats().corrupt == 0


def test_a_broken_checkpoint_record_is_poison(tmp_path: Path) -> None:
    with HistoryEngine.open(tmp_path / "d", seal=False) as engine:
        for kind, content in (("put", b"\x05abc"), ("writes", b""), ("prune", b"\x03all\x00"), ("merge", b"")):
            with pytest.raises(CorruptLog):
                decode_event(encode_event(Checkpointed("t", "ckp-1", kind, content, 1_767_225_600_000)))
            position = engine.log.append(record_key("t", f"ckp-{kind}"),
                                         encode_event(Checkpointed("t", f"ckp-{kind}", kind, content,
                                                                   1_767_225_600_000)))
            engine.wait_applied(position, timeout=30)
        assert engine.stats().corrupt == 4
        assert not [k for k, _ in _rows(engine) if k.startswith(keys.GRAPH_CHECKPOINT)]


def _listing(saver: HistlogSaver, thread: str) -> Iterator[str]:
    return (t.checkpoint["id"] for t in saver.list({"configurable": {"thread_id": thread}}))


def test_copy_keeps_ids_and_a_list_spans_namespaces(tmp_path: Path) -> None:
    with HistlogSaver.open(tmp_path / "d") as saver:
        graph = _graph(saver)
        for k in range(3):
            graph.invoke({"messages": [str(k)]}, {"configurable": {"thread_id": "src"}})
        saver.copy_thread("src", "dst")
        assert list(_listing(saver, "dst")) == list(_listing(saver, "src"))
        dst = _graph(saver).get_state({"configurable": {"thread_id": "dst"}})
        assert dst.values["messages"][-1] == "reply 5"


def test_tail_shows_a_checkpoint_record_without_its_content() -> None:
    from engine.log.base import Record
    from engine.render import record_line

    value = encode_event(Checkpointed("t", "ckp-1", "prune", b"\x06delete\x00", 1_767_225_600_000))
    line = record_line(Record(0, 7, 1_767_225_600_000, record_key("t", "ckp-1"), value))
    assert "graph   t  checkpoint prune  (plain)" in line and "delete" not in line.split("prune")[1]


def test_a_list_without_a_config_spans_every_thread(tmp_path: Path) -> None:
    with HistlogSaver.open(tmp_path / "d", partitions=2) as saver:
        graph = _graph(saver)
        for thread in ("a", "b", "c"):
            graph.invoke({"messages": [thread]}, {"configurable": {"thread_id": thread}})
        every = list(saver.list(None))
        assert sorted({t.config["configurable"]["thread_id"] for t in every}) == ["a", "b", "c"]
        assert len(every) == 9
        assert len(list(saver.list(None, limit=4))) == 4
        assert [t.metadata["step"] for t in saver.list(None, filter={"step": 1})] == [1, 1, 1]
