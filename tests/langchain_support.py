"""The parts the LangChain tests share: a fake chat model that calls tools (LangChain's own
``GenericFakeChatModel`` with ``bind_tools``, which it lacks) and records what it was shown, a
tool, and a scripted tool round."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatResult
from langchain_core.tools import tool

__all__ = ["ToolCallingFake", "add", "texts", "tool_round"]


class ToolCallingFake(GenericFakeChatModel):
    """``GenericFakeChatModel`` that accepts tools and records every request's messages in ``seen``."""

    seen: list[list[BaseMessage]] = []  # a pydantic field: each instance gets its own list
    fail_on_call: int | None = None  # raise on this call (1-based): a model that fails mid-run

    def __init__(self, answers: Sequence[AIMessage], **kwargs: Any) -> None:
        super().__init__(messages=iter(list(answers)), **kwargs)

    def bind_tools(self, tools: Any, **kwargs: Any) -> ToolCallingFake:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        self.seen.append(list(messages))
        if self.fail_on_call is not None and len(self.seen) == self.fail_on_call:
            raise RuntimeError("the model provider is down")
        return super()._generate(messages, *args, **kwargs)


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def tool_round(call_id: str, a: int, b: int, answer: str) -> list[AIMessage]:
    """The model's two answers of one tool round: call ``add(a, b)``, then answer."""
    return [AIMessage("", tool_calls=[{"id": call_id, "name": "add", "args": {"a": a, "b": b}}]), AIMessage(answer)]


def texts(messages: Iterator[BaseMessage] | Sequence[BaseMessage]) -> list[tuple[str, str]]:
    """``(type, text)`` of each message: what a model was shown, readable in an assertion."""
    return [(m.type, m.text) for m in messages]
