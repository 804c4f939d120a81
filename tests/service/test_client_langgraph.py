"""``HistlogSaver`` over HTTP (docs/langgraph.md "Over HTTP"): the saver on a ``HistoryClient`` and
an ``AsyncHistoryClient`` against real servers on loopback. LangGraph's conformance suite gives
FULL (8/8) through its async face (the async client) and, through ``SyncFace``, its sync face (the
sync client); a ``StateGraph`` interrupted through one ``histlog serve`` process resumes through
another over the same data; the clients' checkpoint calls return what the engine's return and
refuse bad arguments before any request, with the engine's classes."""

from __future__ import annotations

import asyncio
import contextlib
import operator
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from engine import AsyncHistoryClient, HistoryClient
from engine.facade import HistoryEngine
from engine.integrations.langgraph import HistlogSaver
from schemas.checkpoints import StoredCheckpoint
from schemas.errors import ConversationClosed, InvalidConversationID, InvalidRequest, Unauthorized
from tests.service.server_support import serving
from tests.service.test_http_serve import TIMEOUT, listening, start
from tests.unit.test_langgraph import SyncFace, _full_conformance


@contextlib.contextmanager
def _served(path: Path, partitions: int = 1) -> Iterator[tuple[HistoryEngine, str]]:
    with HistoryEngine.open(path, partitions=partitions) as engine, serving(engine) as url:
        yield engine, url


def _conformance_over_http(tmp_path: Path, name: str, wrap: Callable[[HistlogSaver], BaseCheckpointSaver[str]],
                           partitions: int = 1) -> None:
    """The suite on a fresh engine and server per capability, the saver made by ``connect``."""
    counter = iter(range(100))
    stack = contextlib.ExitStack()

    def make() -> tuple[HistlogSaver, BaseCheckpointSaver[str]]:
        _, url = stack.enter_context(_served(tmp_path / f"d{next(counter)}", partitions))
        saver = HistlogSaver.connect(url, timeout=10)
        return saver, wrap(saver)

    with stack:
        _full_conformance(make, name)


@pytest.mark.parametrize("partitions", [1, 3])
def test_the_async_face_over_the_async_client_passes_all_eight(tmp_path: Path, partitions: int) -> None:
    _conformance_over_http(tmp_path, f"HistlogSaver-http-async-{partitions}", lambda saver: saver, partitions)


def test_the_sync_face_over_the_sync_client_passes_all_eight(tmp_path: Path) -> None:
    _conformance_over_http(tmp_path, "HistlogSaver-http-sync", SyncFace)


class Chat(TypedDict):
    messages: Annotated[list[str], operator.add]


def _approving(saver: BaseCheckpointSaver[str]) -> Any:
    """A graph that drafts a reply, asks a person (``interrupt``), then sends what they said."""
    def draft(state: Chat) -> dict[str, list[str]]:
        return {"messages": [f"draft {len(state['messages'])}"]}

    def approve(state: Chat) -> dict[str, list[str]]:
        answer = interrupt({"question": "send it?", "draft": state["messages"][-1]})
        return {"messages": [f"sent ({answer})"]}

    builder = StateGraph(Chat)
    builder.add_node("draft", draft)
    builder.add_node("approve", approve)
    builder.add_edge(START, "draft")
    builder.add_edge("draft", "approve")
    builder.add_edge("approve", END)
    return builder.compile(checkpointer=saver)


@contextlib.contextmanager
def _histlog_serve(data: Path) -> Iterator[str]:
    """A real ``histlog serve`` process over ``data`` on a free loopback port."""
    proc = start(data, "--listen", "127.0.0.1:0")
    try:
        yield listening(proc)
    finally:
        proc.terminate()
        try:
            proc.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(TIMEOUT)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def test_a_graph_interrupted_through_one_server_resumes_through_the_next(tmp_path: Path) -> None:
    config = {"configurable": {"thread_id": "customer/42"}}
    with _histlog_serve(tmp_path / "data") as url, HistlogSaver.connect(url) as saver:
        graph = _approving(saver)
        out = graph.invoke({"messages": ["refund please"]}, config)
        assert out["__interrupt__"][0].value == {"question": "send it?", "draft": "draft 1"}
        assert graph.get_state(config).next == ("approve",)
    with _histlog_serve(tmp_path / "data") as url, HistlogSaver.connect(url) as saver:  # a new process
        graph = _approving(saver)
        assert graph.get_state(config).values["messages"] == ["refund please", "draft 1"]
        out = graph.invoke(Command(resume="yes"), config)
        assert out["messages"] == ["refund please", "draft 1", "sent (yes)"]
        history = list(graph.get_state_history(config))
        assert [len(s.values["messages"]) for s in history] == [3, 2, 1, 0]
        assert all(s.config["configurable"]["checkpoint_ns"] == "" for s in history)
        saver.delete_thread("customer/42")
        assert saver.get_tuple(config) is None
        with pytest.raises(ConversationClosed):
            graph.invoke({"messages": ["back?"]}, config)


def test_an_async_graph_interrupts_and_resumes_over_the_async_client(tmp_path: Path) -> None:
    async def run(url: str) -> list[str]:
        async with HistlogSaver(HistoryClient(url), aclient=AsyncHistoryClient(url)) as saver:
            graph = _approving(saver)
            config = {"configurable": {"thread_id": "t-async"}}
            await graph.ainvoke({"messages": ["hi"]}, config)
            assert (await graph.aget_state(config)).next == ("approve",)
            out = await graph.ainvoke(Command(resume="ok"), config)
            listed = [t async for t in saver.alist(config)]
            assert len(listed) == 4 and listed[0].checkpoint["id"] == (await saver.aget_tuple(config)).checkpoint["id"]
            return list(out["messages"])

    with _served(tmp_path / "d") as (_, url):
        assert asyncio.run(run(url)) == ["hi", "draft 1", "sent (ok)"]


# ----- the clients' checkpoint calls against the engine's
def _typed(b: bytes) -> tuple[str, bytes]:
    return ("msgpack", b)


def _put(target: Any, thread: str, cid: str, parent: str | None, ns: str = "", run: str | None = None) -> Any:
    return target.put_checkpoint(thread, ns, cid, parent_id=parent, run_id=run, checkpoint=_typed(b"c" + cid.encode()),
                                 metadata=("json", b"{}"), versions={"m": cid, "n": "1"},
                                 blobs=[("m", cid, _typed(cid.encode())), ("n", "1", None)])


def _calls(target: Any, wait: Callable[[Any], Any]) -> list[Any]:
    """The same sequence of checkpoint calls on ``target`` (an engine or a client face), what each read gave."""
    seen: list[Any] = []
    for thread, run in (("a/1", "r1"), ("b", "r2")):
        parent = None
        for cid in ("1ef-1", "1ef-2", "1ef-3"):
            wait(_put(target, thread, cid, parent, run=run))
            wait(_put(target, thread, cid, parent, ns="sub", run=run))
            parent = cid
    wait(target.put_checkpoint_writes("a/1", "", "1ef-2", "task", [(0, "x", _typed(b"1")), (-1, "__error__",
                                                                                           _typed(b"e"))]))
    seen.append(wait(target.get_checkpoint("a/1")))
    seen.append(wait(target.get_checkpoint("a/1", "", "1ef-2")))
    seen.append(wait(target.get_checkpoint("a/1", "sub", "1ef-9")))
    seen.append(wait(target.get_checkpoint("never")))
    seen.append(list(wait(target.list_checkpoints("a/1"))))
    seen.append(list(wait(target.list_checkpoints("a/1", "sub", before="1ef-3", limit=1))))
    seen.append(list(wait(target.list_checkpoints(limit=4))))
    wait(target.copy_checkpoints("a/1", "copy"))
    seen.append(list(wait(target.list_checkpoints("copy"))))
    wait(target.prune_checkpoints(["a/1"], "keep_latest"))
    seen.append(list(wait(target.list_checkpoints("a/1"))))
    wait(target.delete_checkpoint_runs(["r2"]))
    seen.append(list(wait(target.list_checkpoints("b"))))
    wait(target.delete_checkpoint_runs([]))
    wait(target.prune_checkpoints(["copy", "a/1"], "delete"))
    seen.append(list(wait(target.list_checkpoints())))
    wait(target.clear("a/1"))
    seen.append(wait(target.get_checkpoint("a/1")))
    try:
        wait(_put(target, "a/1", "1ef-4", None))
    except ConversationClosed as e:
        seen.append(type(e))
    return seen


def test_the_clients_return_what_the_engine_returns(tmp_path: Path) -> None:
    with HistoryEngine.open(tmp_path / "local") as engine:
        expected = _calls(engine, lambda x: x)
    assert isinstance(expected[0], StoredCheckpoint) and expected[2] is None and expected[3] is None
    assert [w.channel for w in expected[1].pending_writes] == ["__error__", "x"]
    assert expected[1].channel_values == {"m": _typed(b"1ef-2")} and expected[-1] is ConversationClosed
    with _served(tmp_path / "sync") as (_, url), HistoryClient(url) as client:
        assert _calls(client, lambda x: x) == expected

    async def over_async(url: str) -> list[Any]:
        """``_calls`` in a worker thread whose ``wait`` runs each coroutine on this loop."""
        async with AsyncHistoryClient(url) as aclient:
            loop = asyncio.get_running_loop()
            return await asyncio.to_thread(_calls, aclient,
                                           lambda x: asyncio.run_coroutine_threadsafe(x, loop).result())

    with _served(tmp_path / "async") as (_, url):
        assert asyncio.run(over_async(url)) == expected


def test_bad_arguments_raise_the_engines_errors_before_any_request() -> None:
    dead = "http://127.0.0.1:9"  # nothing listens: a request would end in LogUnavailable
    good: dict[str, Any] = {"parent_id": None, "run_id": None, "checkpoint": ("json", b"{}"),
                            "metadata": ("json", b"{}"), "versions": {}}
    cases: list[tuple[Callable[[Any], Any], type[Exception], str]] = [
        (lambda t: t.put_checkpoint("t", "", "c1", **{**good, "checkpoint": "x"}), InvalidRequest, "checkpoint"),
        (lambda t: t.put_checkpoint("t", "", "c1", **{**good, "versions": {"a\x00": "1"}}), InvalidRequest, "channel"),
        (lambda t: t.put_checkpoint("t", "", "c1", **{**good, "run_id": ""}), InvalidRequest, "run_id"),
        (lambda t: t.put_checkpoint("t", "ns\x1f", "c1", **good), InvalidRequest, "checkpoint_ns"),
        (lambda t: t.put_checkpoint(" t", "", "c1", **good), InvalidConversationID, "conversation id"),
        (lambda t: t.put_checkpoint("t", "", "c1", **good, timeout=-1), Exception, "timeout"),
        (lambda t: t.put_checkpoint_writes("t", "", "c1", "task", []), InvalidRequest, "writes"),
        (lambda t: t.put_checkpoint_writes("t", "", "c1", "task", [(2**31, "x", ("j", b""))]), InvalidRequest,
         "index"),
        (lambda t: t.get_checkpoint("t", "", ""), InvalidRequest, "checkpoint_id"),
        (lambda t: t.get_checkpoint("", ""), InvalidConversationID, "conversation id"),
        (lambda t: t.list_checkpoints("t", limit=-1), InvalidRequest, "limit"),
        (lambda t: t.list_checkpoints("t", before=""), InvalidRequest, "before"),
        (lambda t: t.prune_checkpoints(["t"], "everything"), InvalidRequest, "strategy"),
        (lambda t: t.prune_checkpoints("t"), InvalidRequest, "thread_ids"),
        (lambda t: t.delete_checkpoint_runs(["r", ""]), InvalidRequest, "run_id"),
        (lambda t: t.delete_checkpoint_runs("r"), InvalidRequest, "run_ids"),
        (lambda t: t.copy_checkpoints("t", ""), InvalidConversationID, "conversation id"),
    ]
    client, aclient = HistoryClient(dead, timeout=0.5), AsyncHistoryClient(dead, timeout=0.5)
    try:
        for call, error, words in cases:
            with pytest.raises(error, match=words):
                call(client)

            async def run(call: Callable[[Any], Any] = call) -> None:
                await call(aclient)

            with pytest.raises(error, match=words):
                asyncio.run(run())
        with pytest.raises(InvalidRequest, match="strategy"):  # a prune of runs is delete_checkpoint_runs
            client.prune_checkpoints(["t"], "runs")
    finally:
        client.close()
        asyncio.run(aclient.close())


def test_a_saver_takes_an_engine_or_a_client(tmp_path: Path) -> None:
    with HistoryEngine.open(tmp_path / "d") as engine:
        with pytest.raises(TypeError, match="aclient"):
            HistlogSaver(engine, aclient=AsyncHistoryClient("http://127.0.0.1:9"))
        with pytest.raises(TypeError, match="HistoryClient"):
            HistlogSaver("http://127.0.0.1:9")  # type: ignore[arg-type]
        with serving(engine) as url:
            client = HistoryClient(url)
            with pytest.raises(TypeError, match="AsyncHistoryClient"):
                HistlogSaver(client, aclient=client)  # type: ignore[arg-type]
            saver = HistlogSaver(client)  # the async client made from the sync one's URL, token, timeout
            assert isinstance(saver.aengine, AsyncHistoryClient) and saver.aengine.urls == (url,)
            config = {"configurable": {"thread_id": "t"}}
            _approving(saver).invoke({"messages": ["hi"]}, config)

            async def latest() -> Any:
                return await saver.aget_tuple(config)

            assert asyncio.run(latest()) == saver.get_tuple(config)
            saver.close()  # closes the async client it made, not the client it was given
            assert saver.get_tuple(config) is not None
            client.close()


def test_a_token_goes_with_every_request_of_both_faces(tmp_path: Path) -> None:
    config = {"configurable": {"thread_id": "t"}}
    with HistoryEngine.open(tmp_path / "d") as engine, serving(engine, token="s3cret") as url:
        with HistlogSaver.connect(url, token="wrong", timeout=2) as saver, pytest.raises(Unauthorized):
            saver.get_tuple(config)
        saver = HistlogSaver(HistoryClient(url, token="s3cret"))  # the async client made with the token

        async def run() -> Any:
            await _approving(saver).ainvoke({"messages": ["hi"]}, config)
            return await saver.aget_tuple(config)

        try:
            assert asyncio.run(run()).checkpoint["id"] == saver.get_tuple(config).checkpoint["id"]
        finally:
            saver.close()
            assert isinstance(saver.engine, HistoryClient)
            saver.engine.close()
