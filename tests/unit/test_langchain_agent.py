"""``HistlogMiddleware`` in LangChain's own agent loop (``create_agent``) with a fake chat model
that calls a real tool, over a real embedded engine (FileLog + RocksDB in a temporary
directory): what the model is shown, what is stored, retries, failures, asyncio."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langchain")

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from engine import HistoryEngine
from engine.aio import AsyncHistoryEngine
from engine.integrations.langchain import HistlogMiddleware, from_langchain
from schemas import (
    AppendConflict,
    Batch,
    CommitError,
    ConversationClosed,
    InvalidComponent,
    InvalidConversationID,
    InvalidWindow,
    Message,
)
from tests.langchain_support import ToolCallingFake, add, texts, tool_round

SYSTEM = "You add numbers."


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[HistoryEngine]:
    with HistoryEngine.open(tmp_path / "data") as eng:
        yield eng


def _run(store: Any, model: ToolCallingFake, text: str | HumanMessage, *, thread: str = "c1",
         run_id: uuid.UUID | None = None, **middleware: Any) -> dict[str, Any]:
    agent = create_agent(model, [add], system_prompt=SYSTEM, middleware=[HistlogMiddleware(store, **middleware)])
    config: dict[str, Any] = {"configurable": {"thread_id": thread}}
    if run_id is not None:
        config["run_id"] = run_id
    message = text if isinstance(text, HumanMessage) else {"role": "user", "content": text}
    return agent.invoke({"messages": [message]}, config=config)  # type: ignore[arg-type]


def test_a_run_is_stored_as_one_batch_of_the_whole_turn(engine: HistoryEngine) -> None:
    out = _run(engine, ToolCallingFake(tool_round("k1", 1, 2, "3")), "1+2?")
    entries = engine.entries("c1")
    assert [e.message.role for e in entries] == ["user", "assistant", "tool", "assistant"]
    assert len({e.append_id for e in entries}) == 1  # one batch
    assert [e.message for e in entries] == from_langchain(out["messages"])  # exactly what the agent produced
    assert entries[2].message.parts[0].output.content[0].text == "3"  # the real tool's result
    assert str(entries[0].append_id).startswith("langchain:")


def test_the_model_sees_the_stored_window_then_the_open_turn(engine: HistoryEngine) -> None:
    _run(engine, ToolCallingFake(tool_round("k1", 1, 2, "3")), "1+2?")
    model = ToolCallingFake(tool_round("k2", 3, 4, "7"))
    _run(engine, model, "and 3+4?")
    prior = [("human", "1+2?"), ("ai", ""), ("tool", "3"), ("ai", "3")]
    assert texts(model.seen[0]) == [("system", SYSTEM), *prior, ("human", "and 3+4?")]
    assert texts(model.seen[1]) == [("system", SYSTEM), *prior, ("human", "and 3+4?"), ("ai", ""), ("tool", "7")]
    assert len(engine.read("c1")) == 8


def test_the_window_keeps_whole_newest_turns_and_drops_stored_system_messages(engine: HistoryEngine) -> None:
    engine.append(Batch("c1", "seed", [Message.system("old system"), Message.user("a"), Message.assistant("A"),
                                       Message.user("b"), Message.assistant("B")]))
    model = ToolCallingFake([AIMessage("C")])
    _run(engine, model, "c", window=3)  # the merged system message + one whole turn fit in 3
    assert texts(model.seen[0]) == [("system", SYSTEM), ("human", "b"), ("ai", "B"), ("human", "c")]


def test_a_retried_run_stores_nothing_twice_and_returns_the_stored_turn(engine: HistoryEngine) -> None:
    run_id = uuid.uuid4()
    first = _run(engine, ToolCallingFake(tool_round("k1", 1, 2, "3")), "1+2?", run_id=run_id)
    stored = engine.read("c1")
    # the retry's model answers differently; its message ids are new ones too
    again = _run(engine, ToolCallingFake(tool_round("k9", 1, 2, "three")), "1+2?", run_id=run_id)
    assert engine.read("c1") == stored and len(stored) == 4
    assert engine.stats().accepted == 1
    assert from_langchain(again["messages"]) == stored == from_langchain(first["messages"])


def test_the_same_run_id_for_another_question_is_a_conflict(engine: HistoryEngine) -> None:
    run_id = uuid.uuid4()
    _run(engine, ToolCallingFake([AIMessage("3")]), "1+2?", run_id=run_id)
    with pytest.raises(CommitError) as info:
        _run(engine, ToolCallingFake([AIMessage("7")]), "3+4?", run_id=run_id)
    assert isinstance(info.value.__cause__, AppendConflict)
    assert [m.text() for m in engine.read("c1")] == ["1+2?", "3"]


def test_the_user_message_id_is_the_run_identity_without_a_run_id(engine: HistoryEngine) -> None:
    for answer in ("hi", "hello!"):  # a platform redelivering its message "42"
        out = _run(engine, ToolCallingFake([AIMessage(answer)]), HumanMessage("hello", id="platform-42"))
    assert [m.text() for m in engine.read("c1")] == ["hello", "hi"]
    assert [m.text for m in out["messages"]] == ["hello", "hi"]  # the redelivery got the stored answer
    _run(engine, ToolCallingFake([AIMessage("hi again")]), HumanMessage("hello", id="platform-43"))
    assert len(engine.read("c1")) == 4  # a new message is a new turn, even with the same text


@pytest.mark.parametrize("fail_on_call", [1, 2])
def test_a_failed_run_stores_nothing(engine: HistoryEngine, fail_on_call: int) -> None:
    model = ToolCallingFake(tool_round("k1", 1, 2, "3"), fail_on_call=fail_on_call)
    with pytest.raises(RuntimeError, match="provider is down"):
        _run(engine, model, "1+2?")
    assert engine.read("c1") == [] and engine.stats().accepted == 0
    _run(engine, ToolCallingFake(tool_round("k1", 1, 2, "3")), "1+2?")  # the retry stores the turn once
    assert len(engine.read("c1")) == 4


def test_an_append_that_fails_raises_commit_error_with_the_batch(engine: HistoryEngine) -> None:
    engine.clear("c1")
    with pytest.raises(CommitError) as info:
        _run(engine, ToolCallingFake([AIMessage("hi")]), "hello")
    assert isinstance(info.value.__cause__, ConversationClosed)
    assert [m.text() for m in info.value.batch.messages] == ["hello", "hi"]


def test_conversation_id_overrides_the_thread_and_one_is_needed(engine: HistoryEngine) -> None:
    _run(engine, ToolCallingFake([AIMessage("hi")]), "hello", conversation_id="fixed")
    assert engine.conversations() == ["fixed"]
    agent = create_agent(ToolCallingFake([AIMessage("x")]), [add], middleware=[HistlogMiddleware(engine)])
    with pytest.raises(InvalidConversationID, match="thread_id"):
        agent.invoke({"messages": [{"role": "user", "content": "hello"}]})
    assert engine.conversations() == ["fixed"]


def test_construction_checks_its_arguments(engine: HistoryEngine) -> None:
    with pytest.raises(InvalidWindow):
        HistlogMiddleware(engine, window=0)
    with pytest.raises(InvalidComponent):
        HistlogMiddleware(object())
    with pytest.raises(InvalidConversationID):
        HistlogMiddleware(engine, conversation_id=" padded")


def test_with_a_checkpointer_earlier_runs_are_not_shown_twice(engine: HistoryEngine) -> None:
    saver = InMemorySaver()
    mw = HistlogMiddleware(engine)
    for text, answer in (("one", "1"), ("two", "2")):
        model = ToolCallingFake([AIMessage(answer)])
        agent = create_agent(model, [add], middleware=[mw], checkpointer=saver)
        agent.invoke({"messages": [{"role": "user", "content": text}]}, config={"configurable": {"thread_id": "c1"}})
    assert texts(model.seen[0]) == [("human", "one"), ("ai", "1"), ("human", "two")]
    assert [m.text() for m in engine.read("c1")] == ["one", "1", "two", "2"]


def test_async_agent_with_an_async_engine_and_with_a_sync_one(engine: HistoryEngine) -> None:
    async def main() -> None:
        for store, text in ((AsyncHistoryEngine(engine), "1+2?"), (engine, "and again?")):
            model = ToolCallingFake(tool_round(f"k-{text}", 1, 2, "3"))
            agent = create_agent(model, [add], middleware=[HistlogMiddleware(store)])
            await agent.ainvoke({"messages": [{"role": "user", "content": text}]},
                                config={"configurable": {"thread_id": "c1"}})
        assert texts(model.seen[0])[:4] == [("human", "1+2?"), ("ai", ""), ("tool", "3"), ("ai", "3")]

    asyncio.run(main())
    assert [m.role for m in engine.read("c1")] == ["user", "assistant", "tool", "assistant"] * 2


def test_an_async_store_in_a_sync_agent_is_refused_before_any_read(engine: HistoryEngine) -> None:
    agent = create_agent(ToolCallingFake([AIMessage("x")]), [add],
                         middleware=[HistlogMiddleware(AsyncHistoryEngine(engine))])
    with pytest.raises(InvalidComponent, match="ainvoke"):
        agent.invoke({"messages": [{"role": "user", "content": "hi"}]}, config={"configurable": {"thread_id": "c1"}})


def test_async_retry_returns_the_stored_turn(engine: HistoryEngine) -> None:
    run_id = uuid.uuid4()

    async def run(answer: str) -> dict[str, Any]:
        agent = create_agent(ToolCallingFake([AIMessage(answer)]), [add],
                             middleware=[HistlogMiddleware(AsyncHistoryEngine(engine))])
        return await agent.ainvoke({"messages": [{"role": "user", "content": "hi"}]},
                                   config={"configurable": {"thread_id": "c1"}, "run_id": run_id})

    asyncio.run(run("first"))
    again = asyncio.run(run("second"))
    assert [m.text for m in again["messages"]] == ["hi", "first"]
    assert [m.text() for m in engine.read("c1")] == ["hi", "first"]


def test_a_streamed_run_stores_once_it_has_finished(engine: HistoryEngine) -> None:
    agent = create_agent(ToolCallingFake(tool_round("k1", 1, 2, "3")), [add], middleware=[HistlogMiddleware(engine)])
    chunks = agent.stream({"messages": [{"role": "user", "content": "1+2?"}]},
                          config={"configurable": {"thread_id": "c1"}}, stream_mode="updates")
    first = next(chunks)
    assert engine.read("c1") == []  # nothing is stored while the run is under way
    rest = list(chunks)
    assert first and rest
    assert [m.role for m in engine.read("c1")] == ["user", "assistant", "tool", "assistant"]
