"""``HistlogMiddleware`` and ``HistlogChatMessageHistory`` over HTTP: LangChain's own agent loop
with a tool-calling fake model, storing through ``HistoryClient`` / ``AsyncHistoryClient`` into a
real server on loopback (uvicorn over ``build_app``, FileLog + RocksDB underneath)."""

from __future__ import annotations

import asyncio
import uuid
import warnings
from typing import Any

import pytest

pytest.importorskip("langchain")

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage

from engine.client import AsyncHistoryClient, HistoryClient
from engine.integrations.langchain import HistlogChatMessageHistory, HistlogMiddleware, from_langchain
from tests.langchain_support import ToolCallingFake, add, texts, tool_round
from tests.service.conftest import Served


def _invoke(store: Any, model: ToolCallingFake, text: str, run_id: uuid.UUID) -> dict[str, Any]:
    agent = create_agent(model, [add], middleware=[HistlogMiddleware(store)])
    config: Any = {"configurable": {"thread_id": "bot/c1"}, "run_id": run_id}
    return agent.invoke({"messages": [{"role": "user", "content": text}]}, config=config)


def test_sync_agent_through_history_client(served: Served) -> None:
    with HistoryClient(served.url) as client:
        first = _invoke(client, ToolCallingFake(tool_round("k1", 1, 2, "3")), "1+2?", uuid.uuid4())
        model = ToolCallingFake([AIMessage("you asked 1+2")])
        run_id = uuid.uuid4()
        _invoke(client, model, "what did I ask?", run_id)
        assert texts(model.seen[0]) == [("human", "1+2?"), ("ai", ""), ("tool", "3"), ("ai", "3"),
                                        ("human", "what did I ask?")]
        # a retried run (same run id) stores nothing twice and returns the stored answer
        again = _invoke(client, ToolCallingFake([AIMessage("something else")]), "what did I ask?", run_id)
        assert again["messages"][-1].text == "you asked 1+2"
    stored = served.engine.read("bot/c1")
    assert stored[:4] == from_langchain(first["messages"])
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    assert len({e.append_id for e in served.engine.entries("bot/c1")}) == 2


def test_async_agent_through_async_history_client(served: Served) -> None:
    async def main() -> None:
        async with AsyncHistoryClient(served.url) as client:
            for text, answer in (("1+2?", "3"), ("2+2?", "4")):
                model = ToolCallingFake(tool_round(f"k{answer}", 2, 2, answer))
                agent = create_agent(model, [add], middleware=[HistlogMiddleware(client)])
                await agent.ainvoke({"messages": [{"role": "user", "content": text}]},
                                    config={"configurable": {"thread_id": "bot/c2"}})
            assert texts(model.seen[0])[:4] == [("human", "1+2?"), ("ai", ""), ("tool", "4"), ("ai", "3")]

    asyncio.run(main())
    assert [m.text() for m in served.engine.read("bot/c2") if m.role == "user"] == ["1+2?", "2+2?"]


def test_legacy_history_through_history_client(served: Served) -> None:
    with HistoryClient(served.url) as client, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # LangChain deprecated BaseChatMessageHistory and warns on use
        history = HistlogChatMessageHistory(client, "legacy")
        turn = [HumanMessage("hi", id="u1"), AIMessage("hello", id="a1")]
        history.add_messages(turn)
        history.add_messages(turn)
        assert history.messages == turn
    assert served.engine.stats().accepted == 1
