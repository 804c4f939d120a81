"""A LangChain agent whose memory is histlog: ``create_agent`` + ``HistlogMiddleware``.

Runs without network or API key: the chat model is LangChain's ``GenericFakeChatModel`` with
scripted answers (it calls the ``order_status`` tool, then answers). Swap in a real model
(``init_chat_model("openai:gpt-5")``...) and nothing else changes.

    pip install 'histlog[langchain]'
    python -m examples.langchain_agent [DATA_DIR]

Two runs on one conversation (the ``thread_id``): the second run's model sees the first turn,
loaded from histlog, before its own message; each run is stored as one batch; running the first
run again with the same ``run_id`` stores nothing twice.
"""

from __future__ import annotations

import sys
import tempfile
import uuid
from collections.abc import Sequence
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatResult
from langchain_core.tools import tool

from engine import HistoryEngine
from engine.integrations.langchain import HistlogMiddleware

__all__ = ["ScriptedModel", "main", "order_status"]


class ScriptedModel(GenericFakeChatModel):
    """LangChain's fake chat model, able to take tools, printing how many messages it is shown."""

    def __init__(self, answers: Sequence[AIMessage]) -> None:
        super().__init__(messages=iter(list(answers)))

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        print(f"  model sees {len(messages)} messages: {' | '.join(f'{m.type}:{m.text[:24]}' for m in messages)}")
        return super()._generate(messages, *args, **kwargs)


@tool
def order_status(order_id: str) -> str:
    """Where an order is."""
    return f"order {order_id}: out for delivery, arrives today by 14:00"


def _lookup(call_id: str, order_id: str, answer: str) -> list[AIMessage]:
    return [AIMessage("", tool_calls=[{"id": call_id, "name": "order_status", "args": {"order_id": order_id}}]),
            AIMessage(answer)]


def main(data_dir: str) -> list[str]:
    """Run the two turns (and a retry) on ``data_dir``; return the stored conversation's lines."""
    with HistoryEngine.open(data_dir) as engine:
        memory = HistlogMiddleware(engine, window=20)
        config: Any = {"configurable": {"thread_id": "parcelly/alice"}, "run_id": uuid.uuid4()}
        turns = [("Where is order A1042?", _lookup("c1", "A1042", "A1042 arrives today by 14:00.")),
                 ("And can I change the address?", [AIMessage("Not for A1042 any more: it is out for delivery.")])]
        for i, (question, answers) in enumerate(turns):
            print(f"run {i + 1}: {question}")
            agent = create_agent(ScriptedModel(answers), [order_status],
                                 system_prompt="You are Parcelly's assistant.", middleware=[memory])
            run_config = config if i == 0 else {**config, "run_id": uuid.uuid4()}
            result = agent.invoke({"messages": [{"role": "user", "content": question}]}, config=run_config)
            print(f"  answer: {result['messages'][-1].text}")
        print("retry of run 1 (same run_id): stores nothing, returns the stored answer")
        agent = create_agent(ScriptedModel(_lookup("c9", "A1042", "(a different answer)")), [order_status],
                             middleware=[memory])
        result = agent.invoke({"messages": [{"role": "user", "content": turns[0][0]}]}, config=config)
        print(f"  answer: {result['messages'][-1].text}")
        lines = [f"{e.position.turn}:{e.position.seq} {e.message.role.value:9} "
                 f"{e.message.text() or e.message.parts[0].kind}" for e in engine.entries("parcelly/alice")]
    print("stored:", *lines, sep="\n  ")
    return lines


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(tmp)
