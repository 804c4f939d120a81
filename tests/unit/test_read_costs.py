"""Read costs without timing (issue 5): the RocksDB keys a query visits (``StateStore.keys_read``)
are O(result) and the same for a 1,000- and a 100,000-message conversation.

Both conversations end with the same tail of turns, so their newest windows have the same
shape and a cost that does not depend on history length must be *equal* across them. Turns
vary in size (a user message, then 0-3 tool rounds and an answer); messages carry about 200
bytes of content, so about 30 fit in 8 KiB.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pytest

from engine import HistoryEngine
from schemas import Batch, HistoryLoad, HistoryPosition, Located, Message, ToolCallPart, ToolOutput, ToolResultPart
from tests.conformance.reads_contract import (
    expected_positions,
    reference_measure,
    reference_turn_sources,
    reference_within_bytes,
)
from tests.conformance.turns_model import reference_window

BIG, SMALL = 100_000, 1_000
BUDGET = 8 * 1024
SLACK = 8  # seeks and the one key past each range end
T = TypeVar("T")


def _turn(rng: random.Random, k: int) -> list[Message]:
    words = " ".join(rng.choice(["order", "status", "shipping", "refund", "invoice", "delay"]) for _ in range(28))
    out = [Message.user(f"question {k}: {words}", metadata={"external_id": f"ext-{k}"})]
    for r in range(rng.choice([0, 0, 1, 1, 2, 3])):
        call = f"call-{k}-{r}"
        out.append(Message.assistant(ToolCallPart(call, "lookup", f'{{"order": {k}, "words": "{words[:120]}"}}')))
        out.append(Message.tool(ToolResultPart(call, "lookup", ToolOutput.text(f"result {k}/{r}: {words[:150]}"))))
    out.append(Message.assistant(f"answer {k}: {words}"))
    return out


def _build(engine: HistoryEngine, conv: str, total: int, tail: list[Message]) -> list[Message]:
    """About ``total`` messages (a system message, generated turns, then ``tail``) appended in
    batches of about 100; returns them in stored order."""
    rng = random.Random(conv)
    messages = [Message.system("You are a careful order-support assistant.")]
    k = 0
    while len(messages) < total - len(tail):
        messages.extend(_turn(rng, k))
        k += 1
    messages.extend(tail)
    pending: list[Message] = []
    for i, m in enumerate(messages):
        pending.append(m)
        if len(pending) >= 100 and (i + 1 == len(messages) or messages[i + 1].role == "user"):
            engine.append(Batch(conv, f"a{i}", pending))
            pending = []
    if pending:
        engine.append(Batch(conv, "last", pending))
    return messages


@dataclass
class Built:
    engine: HistoryEngine
    messages: dict[str, list[Message]]

    def middle(self, conv: str) -> HistoryPosition:
        """A position in the middle of the conversation (the 2nd message of a turn there)."""
        msgs = self.messages[conv]
        positions = expected_positions(msgs)
        i = len(msgs) // 2
        while msgs[i].role != "user":
            i += 1
        return positions[i + 1]

    def time_at(self, conv: str, at: HistoryPosition) -> datetime:
        """The stored time of the message at ``at``."""
        return self.engine.entries(conv, after=HistoryPosition(at.turn, at.seq - 1), limit=1)[0].created_at

    def external_at(self, conv: str, at: HistoryPosition) -> str:
        """The external id of the user message of the turn at ``at``."""
        turn = self.engine.entries(conv, after=HistoryPosition(at.turn, 0), limit=1)[0]
        return str(orjson.loads(str(turn.message.metadata["external_id"])))

    def cost(self, query: Callable[[], T]) -> tuple[T, int]:
        before = self.engine._store.keys_read
        result = query()
        return result, self.engine._store.keys_read - before


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    path: Path = tmp_path_factory.mktemp("costs")
    tail_rng = random.Random("tail")
    tail = [m for k in range(60) for m in _turn(tail_rng, 10**6 + k)]
    with HistoryEngine.open(path, fsync="never") as engine:
        messages = {conv: _build(engine, conv, n, tail) for conv, n in (("big", BIG), ("small", SMALL))}
        yield Built(engine, messages)


QUERIES: dict[str, Callable[[HistoryEngine, str], Any]] = {
    "window(20)": lambda e, c: e.window(c, 20),
    "read_within_bytes(8 KiB)": lambda e, c: e.read_within_bytes(c, BUDGET),
    "read_within_bytes(8 KiB, unit=message)": lambda e, c: e.read_within_bytes(c, BUDGET, unit="message"),
    "turn_sources(8 KiB)": lambda e, c: e.turn_sources(c, BUDGET),
    "entries(order=desc, limit=50)": lambda e, c: e.entries(c, order="desc", limit=50),
    "locate(newest external id, before=10, after=10)": lambda e, c: e.locate(c, f"ext-{10**6 + 30}", 10, 10),
}


def _size(result: Any) -> int:
    if isinstance(result, Located):
        return 1 + len(result.before) + len(result.after)
    return len(result.messages) if isinstance(result, HistoryLoad) else len(result)


def test_the_conversations_have_the_sizes_the_costs_are_stated_for(built: Built) -> None:
    assert built.engine.measure("big").messages >= BIG
    assert SMALL <= built.engine.measure("small").messages < 2 * SMALL
    load = built.engine.read_within_bytes("big", BUDGET)
    assert 20 <= len(load.messages) <= 45 and load.truncated


@pytest.mark.parametrize("name", list(QUERIES))
def test_newest_window_costs_o_result_and_not_history(built: Built, name: str) -> None:
    query = QUERIES[name]
    small, small_keys = built.cost(lambda: query(built.engine, "small"))
    big, big_keys = built.cost(lambda: query(built.engine, "big"))
    assert 0 < _size(big) == _size(small)
    assert big_keys <= 2 * _size(big) + SLACK, (name, big_keys, _size(big))
    assert big_keys == small_keys, (name, small_keys, big_keys)


def test_newest_windows_are_correct(built: Built) -> None:
    es = built.engine.entries("small")
    assert [e.message for e in es] == built.messages["small"]
    engine = built.engine
    assert engine.window("small", 20) == reference_window(built.messages["small"], 20)
    assert engine.read_within_bytes("small", BUDGET) == reference_within_bytes(es, BUDGET)
    assert engine.read_within_bytes("small", BUDGET, unit="message") == \
        reference_within_bytes(es, BUDGET, unit="message")
    assert engine.turn_sources("small", BUDGET) == reference_turn_sources(es, BUDGET)
    # Same tail, so the same messages (other ids and positions) on the big conversation.
    assert engine.window("big", 20) == engine.window("small", 20)
    assert [e.message for e in engine.read_within_bytes("big", BUDGET).messages] == \
        [e.message for e in engine.read_within_bytes("small", BUDGET).messages]


def test_windows_cut_in_the_middle_cost_o_result(built: Built) -> None:
    for conv in ("small", "big"):
        mid = built.middle(conv)
        for name, query in {
            "read_within_bytes(before=mid)": lambda c, m: built.engine.read_within_bytes(c, BUDGET, before=m),
            "turn_sources(before=mid)": lambda c, m: built.engine.turn_sources(c, BUDGET, before=m),
            "read_within_bytes(after=mid, before=mid+60)": lambda c, m: built.engine.read_within_bytes(
                c, 2**40, after=m, before=HistoryPosition(m.turn + 6, 0)),
            "entries(after=mid, limit=20)": lambda c, m: built.engine.entries(c, after=m, limit=20),
            "entries(before=mid, order=desc, limit=50)": lambda c, m: built.engine.entries(
                c, before=m, order="desc", limit=50),
            "entries(since=t(mid), until=t(mid)+1ms)": lambda c, m: built.engine.entries(
                c, since=built.time_at(c, m), until=built.time_at(c, m) + timedelta(milliseconds=1)),
            "entries(since=t(mid), limit=30)": lambda c, m: built.engine.entries(c, since=built.time_at(c, m),
                                                                                 limit=30),
            "entries(until=t(mid), order=desc, limit=30)": lambda c, m: built.engine.entries(
                c, until=built.time_at(c, m), order="desc", limit=30),
            "locate(external id in the middle, before=5, after=5)": lambda c, m: built.engine.locate(
                c, built.external_at(c, m), 5, 5),
        }.items():
            result, keys = built.cost(lambda q=query, c=conv, m=mid: q(c, m))  # type: ignore[misc]
            assert _size(result) > 0, (conv, name)
            assert keys <= 2 * _size(result) + SLACK, (conv, name, keys, _size(result))


def test_measure_visits_a_constant_number_of_keys(built: Built) -> None:
    costs = []
    for conv in ("small", "big"):
        for after in (HistoryPosition.START, built.middle(conv), HistoryPosition(10**9, 0)):
            _, keys = built.cost(lambda c=conv, a=after: built.engine.measure(c, after=a))  # type: ignore[misc]
            costs.append(keys)
    assert max(costs) <= 6, costs
    assert costs[:3] == costs[3:], costs  # the same at 1k and 100k


def test_measure_is_correct(built: Built) -> None:
    es = built.engine.entries("small")
    for after in (HistoryPosition.START, built.middle("small"), es[-1].position, HistoryPosition(3, 999)):
        assert built.engine.measure("small", after=after) == reference_measure(es, after), after
    big = built.engine.measure("big", after=built.middle("big"))
    assert big.messages == len(built.messages["big"]) - built.middle("big").seq


def test_navigation_reads_are_correct(built: Built) -> None:
    """The reads the cost tests count return what the plain forward read implies."""
    engine, conv = built.engine, "small"
    es = engine.entries(conv)
    assert engine.entries(conv, order="desc", limit=50) == es[::-1][:50]
    mid = built.middle(conv)
    older = [e for e in es if e.position < mid]
    assert engine.entries(conv, before=mid, order="desc", limit=50) == older[::-1][:50]
    t = built.time_at(conv, mid)
    assert engine.entries(conv, since=t, limit=30) == [e for e in es if e.created_at >= t][:30]
    assert engine.entries(conv, until=t, order="desc", limit=30) == [e for e in es if e.created_at < t][::-1][:30]
    external = built.external_at(conv, mid)
    found = engine.locate(conv, external, 5, 5)
    at = next(i for i, e in enumerate(es) if e.message.metadata.get("external_id") == f'"{external}"')
    assert (found.before, found.message, found.after) == (es[at - 5:at], es[at], es[at + 1:at + 6])
    assert all(a.created_at <= b.created_at for a, b in pairwise(es))


@pytest.fixture(scope="module")
def listed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HistoryEngine]:
    """10,000 open conversations of one bot (and 1,000 cleared among them), 100 of another."""
    with HistoryEngine.open(tmp_path_factory.mktemp("listing"), fsync="never") as engine:
        for i in range(10_000):
            engine.append(Batch(f"bot-big/{i:05d}", "a", [Message.user("hi")]))
            if i % 10 == 5:
                engine.append(Batch(f"bot-big/{i:05d}-gone", "a", [Message.user("hi")]))
                engine.clear(f"bot-big/{i:05d}-gone")
        for i in range(100):
            engine.append(Batch(f"bot-small/{i:05d}", "a", [Message.user("hi")]))
        yield engine


def test_prefix_pages_cost_o_page_not_conversations(listed: HistoryEngine) -> None:
    def cost(**kw: Any) -> tuple[list[Any], int]:
        before = listed._store.keys_read
        page = listed.conversations(**kw)
        return page, listed._store.keys_read - before

    small, small_keys = cost(prefix="bot-small/", limit=20)
    big, big_keys = cost(prefix="bot-big/", limit=20)
    deep, deep_keys = cost(prefix="bot-big/", after="bot-big/08000", limit=20)
    assert small == [f"bot-small/{i:05d}" for i in range(20)]
    assert big == [f"bot-big/{i:05d}" for i in range(20)]  # the cleared ones are not listed
    assert deep == [f"bot-big/{i:05d}" for i in range(8001, 8021)]
    assert small_keys == big_keys == deep_keys <= 20 + 1, (small_keys, big_keys, deep_keys)
    last, last_keys = cost(prefix="bot-small/", after="bot-small/00090", limit=20)
    assert last == [f"bot-small/{i:05d}" for i in range(91, 100)] and last_keys <= len(last) + 1


def test_reads_by_ids_visit_two_keys_an_id_wherever_the_ids_are(built: Built) -> None:
    costs = {}
    engine = built.engine
    for conv in ("small", "big"):
        named = engine.entries(conv, limit=10) + engine.entries(conv, order="desc", limit=10)
        named += engine.entries(conv, after=built.middle(conv), limit=10)
        ids = [e.id for e in named] + ["unknown/0", "nope"]
        found, keys = built.cost(lambda c=conv, i=ids: engine.entries_by_ids(c, i))  # type: ignore[misc]
        assert found == sorted({e.id: e for e in named}.values(), key=lambda e: e.position)
        sources, source_keys = built.cost(lambda c=conv, i=ids: engine.turn_sources_by_ids(c, i))  # type: ignore[misc]
        assert [s.id for s in sources] == [e.id for e in found]
        assert keys <= 1 + 2 * len(ids) and source_keys <= 1 + 2 * len(ids), (conv, keys, source_keys)
        costs[conv] = (keys, source_keys)
    assert costs["small"] == costs["big"], costs  # the same at 1k and 100k messages
