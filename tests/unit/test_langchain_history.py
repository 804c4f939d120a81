"""``HistlogChatMessageHistory``, the legacy ``BaseChatMessageHistory``, on a real embedded engine,
alone and under LangChain's own ``RunnableWithMessageHistory``."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("langchain_core")

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableLambda

from engine import HistoryEngine
from engine.aio import AsyncHistoryEngine
from engine.integrations.langchain import ConversionError, HistlogChatMessageHistory
from schemas import ConversationClosed, InvalidComponent


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[HistoryEngine]:
    with HistoryEngine.open(tmp_path / "data") as eng:
        yield eng


def _history(engine: HistoryEngine, conversation: str = "s1") -> HistlogChatMessageHistory:
    with warnings.catch_warnings():  # LangChain deprecated the interface (1.6.4): it warns on purpose
        warnings.simplefilter("ignore")
        return HistlogChatMessageHistory(engine, conversation)


def test_add_messages_is_one_batch_and_messages_reads_them_back(engine: HistoryEngine) -> None:
    history = _history(engine)
    turn = [HumanMessage("1+2?"), AIMessage("", tool_calls=[{"id": "k", "name": "add", "args": {"a": 1, "b": 2}}]),
            ToolMessage("3", tool_call_id="k", name="add"), AIMessage("3")]
    history.add_messages(turn)
    entries = engine.entries("s1")
    assert len(entries) == 4 and len({e.append_id for e in entries}) == 1
    assert history.messages == turn
    assert history.last_receipt is not None and history.last_receipt.conversation_id == "s1"


def test_messages_with_ids_are_appended_once_even_when_added_twice(engine: HistoryEngine) -> None:
    history = _history(engine)
    turn = [HumanMessage("hi", id="u1"), AIMessage("hello", id="a1")]
    history.add_messages(turn)
    history.add_messages(turn)  # a retry
    assert len(history.messages) == 2 and engine.stats().accepted == 1
    history.add_messages([HumanMessage("hi")])  # no id: a new append each time
    history.add_messages([HumanMessage("hi")])
    assert len(history.messages) == 4


def test_a_batch_that_cannot_be_converted_writes_nothing(engine: HistoryEngine) -> None:
    history = _history(engine)
    with pytest.raises(ConversionError):
        history.add_messages([HumanMessage("ok"), ToolMessage("x", tool_call_id="k")])  # no tool name
    assert history.messages == [] and engine.stats().accepted == 0


def test_clear_erases_and_closes_the_conversation(engine: HistoryEngine) -> None:
    history = _history(engine)
    history.add_messages([HumanMessage("hi")])
    history.clear()
    assert history.messages == []
    with pytest.raises(ConversationClosed):
        history.add_messages([HumanMessage("again")])


def test_under_runnable_with_message_history(engine: HistoryEngine) -> None:
    from langchain_core.runnables.history import RunnableWithMessageHistory

    def echo(messages: list[object]) -> AIMessage:
        return AIMessage(f"seen {len(messages)}")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        chain = RunnableWithMessageHistory(RunnableLambda(echo), lambda session: _history(engine, session))
        config = {"configurable": {"session_id": "s9"}}
        assert chain.invoke([HumanMessage("one")], config=config).content == "seen 1"  # type: ignore[arg-type]
        assert chain.invoke([HumanMessage("two")], config=config).content == "seen 3"  # type: ignore[arg-type]
    assert [m.text() for m in engine.read("s9")] == ["one", "seen 1", "two", "seen 3"]
    assert len({e.append_id for e in engine.entries("s9")}) == 2  # one batch per invocation


def test_an_async_store_is_refused(engine: HistoryEngine) -> None:
    with pytest.raises(InvalidComponent, match="sync store"):
        HistlogChatMessageHistory(AsyncHistoryEngine(engine), "s1")
