"""LangChain benchmark (issue 18): what ``HistlogMiddleware`` adds per agent step, against the
same ``create_agent`` agent without it, measured in the same run.

Run ``python -m bench --only langchain [--quick]`` (or ``histlog bench langchain``).

Setup: the embedded default (``HistoryEngine.open(tmpdir)``), one conversation prefilled with 10
two-message turns, and two agents built once from LangChain's own ``create_agent`` with a real
tool (``add``) and a fake chat model that answers at once (a tool call, then the answer: one
run = 2 model steps + 1 tool step), so every microsecond measured is LangChain's or histlog's.
The **plain** agent has no middleware (and no memory: it is the floor); the **empty hooks**
agent has a middleware with the same three hooks doing nothing (LangChain's own price of two
extra graph nodes and a model-call wrapper, which any middleware pays); the **histlog** agent
has ``HistlogMiddleware(engine, window=20)``: each run reads the window (O(window): it stays 20
messages however long the conversation grows), converts it, shows it to the model on both
steps, and appends the run's 4-message turn as one batch. Each sample runs the three agents back
to back (who goes first rotates); reported: percentiles of each agent's run and of the
per-sample differences ("added": histlog vs plain, per run and per model step = added / 2;
"histlog's own": histlog vs empty hooks), for fsync ``always`` (the default: the append waits
for the disk) and ``never`` (the difference is the fsync).

Measured on 2 shared cores while other work ran (3 ``--quick`` runs, p50): added per model step
1.4-4.8 ms with fsync never (histlog's own 2.3-9.9 ms a run over the empty hooks' 4.1-7.3 ms
run), 4.1-5.8 ms with fsync always (the append's disk wait); one full run (300 samples): 3.3 ms
(never) and 4.7 ms (always) per step. Taken apart on the same machine:
``window(c, 20)`` ~0.35 ms, ``to_langchain`` of the 20-message window ~0.3 ms,
``from_langchain`` of a 20-message list ~0.7 ms (mostly histlog's own message validation), the
append the rest. The lead re-measures on a quiet machine.
"""

from __future__ import annotations

import itertools
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import percentiles
from engine import HistoryEngine
from schemas import Batch, Message

__all__ = ["report", "run"]

STEPS_PER_RUN = 2  # model calls per run: the tool call, then the answer


def _agent(engine: HistoryEngine | None, hooks: bool = False) -> Any:
    """The agent: no middleware, a middleware whose hooks do nothing (``hooks``: LangChain's own
    cost of the three hooks), or ``HistlogMiddleware`` over ``engine``."""
    from langchain.agents import create_agent
    from langchain.agents.middleware import AgentMiddleware
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool

    from engine.integrations.langchain import HistlogMiddleware

    class Fake(GenericFakeChatModel):
        def bind_tools(self, tools: Any, **kwargs: Any) -> Fake:
            return self

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    answers = itertools.cycle([AIMessage("", tool_calls=[{"id": "k", "name": "add", "args": {"a": 1, "b": 2}}]),
                               AIMessage("1 + 2 = 3")])
    class Hooks(AgentMiddleware):  # type: ignore[type-arg]
        """The hooks HistlogMiddleware uses, doing nothing."""

        def before_agent(self, state: Any, runtime: Any) -> None:
            return None

        def wrap_model_call(self, request: Any, handler: Any) -> Any:
            return handler(request)

        def after_agent(self, state: Any, runtime: Any) -> None:
            return None

    middleware: list[Any] = [HistlogMiddleware(engine, window=20)] if engine is not None else []
    if hooks:
        middleware = [Hooks()]
    return create_agent(Fake(messages=answers), [add], system_prompt="You add numbers.", middleware=middleware)


def _invoke(agent: Any, i: int) -> float:
    started = time.perf_counter_ns()
    agent.invoke({"messages": [{"role": "user", "content": f"what is 1 + 2? ({i})"}]},
                 config={"configurable": {"thread_id": "bench"}})
    return (time.perf_counter_ns() - started) / 1e6


def _case(engine: HistoryEngine, n: int) -> dict[str, Any]:
    plain, hooks, memory = _agent(None), _agent(None, hooks=True), _agent(engine)
    for i in range(5):  # warm-up: imports, graph caches, the state's first reads
        for agent in (plain, hooks, memory):
            _invoke(agent, i)
    base, empty, total, added, own = [], [], [], [], []
    for i in range(n):
        order = [(0, plain), (1, hooks), (2, memory)]
        times = [0.0, 0.0, 0.0]
        for k, agent in order[i % 3:] + order[:i % 3]:  # rotate who goes first
            times[k] = _invoke(agent, i)
        base.append(times[0])
        empty.append(times[1])
        total.append(times[2])
        added.append(times[2] - times[0])
        own.append(times[2] - times[1])
    b50, b99 = percentiles(base)
    e50, _ = percentiles(empty)
    m50, m99 = percentiles(total)
    a50, a99 = percentiles(added)
    o50, o99 = percentiles(own)
    return {"samples": n, "plain_run_p50_ms": round(b50, 3), "plain_run_p99_ms": round(b99, 3),
            "empty_hooks_run_p50_ms": round(e50, 3),
            "histlog_run_p50_ms": round(m50, 3), "histlog_run_p99_ms": round(m99, 3),
            "added_run_p50_ms": round(a50, 3), "added_run_p99_ms": round(a99, 3),
            "added_step_p50_ms": round(a50 / STEPS_PER_RUN, 3), "ratio_p50": round(m50 / b50, 3),
            "histlog_own_run_p50_ms": round(o50, 3), "histlog_own_run_p99_ms": round(o99, 3)}


def run(quick: bool = False, progress: bool = True) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="histlog-bench-lc-"))
    n = 30 if quick else 300
    cases: dict[str, Any] = {}
    try:
        for fsync in ("always", "never"):
            with HistoryEngine.open(root / fsync, fsync=fsync) as engine:
                turns = [m for i in range(10) for m in (Message.user(f"q{i}"), Message.assistant(f"a{i}"))]
                engine.append(Batch("bench", "prefill", turns))
                if progress:
                    print(f"  fsync={fsync}: {n} pairs of agent runs", file=sys.stderr, flush=True)
                cases[fsync] = _case(engine, n)
                cases[fsync]["stored_messages"] = len(engine.read("bench"))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"bench": "langchain", "quick": quick, "steps_per_run": STEPS_PER_RUN, "cases": cases}


def report(result: dict[str, Any]) -> str:
    lines = ["fsync  | plain run | empty hooks | histlog run | added/run p50 (p99) | added/step | ratio "
             "| histlog's own/run (vs empty hooks)",
             "-------|-----------|-------------|-------------|---------------------|------------|-------"
             "|-----------------------------------"]
    for fsync, c in result["cases"].items():
        lines.append(f"{fsync:6} | {c['plain_run_p50_ms']:6.2f} ms | {c['empty_hooks_run_p50_ms']:8.2f} ms | "
                     f"{c['histlog_run_p50_ms']:8.2f} ms | "
                     f"{c['added_run_p50_ms']:7.2f} ({c['added_run_p99_ms']:.2f}) ms | "
                     f"{c['added_step_p50_ms']:7.2f} ms | {c['ratio_p50']:.2f}x | "
                     f"{c['histlog_own_run_p50_ms']:.2f} ({c['histlog_own_run_p99_ms']:.2f}) ms")
    lines.append(f"(one run = {result['steps_per_run']} model steps + 1 tool step; window 20; the three agents "
                 "back to back per sample)")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(run(quick="--quick" in sys.argv)))
