"""``HistlogSaver`` on a real Apache Kafka broker: LangGraph's checkpointer conformance suite
(all eight capabilities) with each saver on a fresh topic, and two instances on one topic that
resume the same thread: each reads its own checkpoints back at once, and the other's once it
has caught up with the topic."""

from __future__ import annotations

import asyncio
import itertools
import operator
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.graph import END, START, StateGraph

from engine.integrations.langgraph import HistlogSaver

pytestmark = pytest.mark.kafka


def test_all_eight_capabilities_on_kafka(kafka_bootstrap: str, kafka_topic: str, tmp_path: Path) -> None:
    counter = itertools.count()

    @checkpointer_test(name="HistlogSaver-kafka")
    async def factory() -> AsyncIterator[BaseCheckpointSaver[str]]:
        n = next(counter)
        saver = HistlogSaver.open(kafka=kafka_bootstrap, topic=f"{kafka_topic}-{n}", state_dir=tmp_path / f"s{n}",
                                  partitions=2)
        try:
            yield saver
        finally:
            saver.close()

    report = asyncio.run(validate(factory))
    assert {cap: r.failures for cap, r in report.results.items() if r.failures} == {}
    assert report.conformance_level() == "FULL"


class Chat(TypedDict):
    messages: Annotated[list[str], operator.add]


def _graph(saver: HistlogSaver) -> Any:
    builder = StateGraph(Chat)
    builder.add_node("bot", lambda state: {"messages": [f"reply {len(state['messages'])}"]})
    builder.add_edge(START, "bot")
    builder.add_edge("bot", END)
    return builder.compile(checkpointer=saver)


def test_two_instances_resume_the_same_thread(kafka_bootstrap: str, kafka_topic: str, tmp_path: Path) -> None:
    config = {"configurable": {"thread_id": "customer-42"}}
    with HistlogSaver.open(kafka=kafka_bootstrap, topic=kafka_topic, state_dir=tmp_path / "a") as a, \
            HistlogSaver.open(kafka=kafka_bootstrap, topic=kafka_topic, state_dir=tmp_path / "b") as b:
        _graph(a).invoke({"messages": ["hi"]}, config)
        assert _graph(a).get_state(config).values["messages"] == ["hi", "reply 1"]  # its own: at once
        assert b.engine.catch_up(timeout=30)
        _graph(b).invoke({"messages": ["again"]}, config)  # b resumes what a wrote
        assert a.engine.catch_up(timeout=30)
        assert _graph(a).get_state(config).values["messages"] == ["hi", "reply 1", "again", "reply 3"]
        assert [t.checkpoint["id"] for t in a.list(config)] == [t.checkpoint["id"] for t in b.list(config)]
