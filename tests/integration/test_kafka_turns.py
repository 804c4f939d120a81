"""Turns (issue 7) on a real Apache Kafka broker: the turns conformance suite, and several
instances on one topic racing ``replace_turn`` and ``expected_last`` appends: admission in log
order gives one winner, every instance agrees, and a fresh instance replaying the topic too."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from engine import EMPTY, HistoryEngine
from schemas import Batch, Message, PreconditionFailed, Receipt, TurnNotReplaceable
from tests.conformance.backends import KafkaBackend, OnKafka
from tests.conformance.turns_contract import TurnsContract, counters, history_of, race_threads, user_turn

pytestmark = pytest.mark.kafka
ROUNDS = 8


class TestKafkaTurns(OnKafka, TurnsContract):
    max_examples = 10
    partitions = 2


@pytest.fixture
def backend(kafka_bootstrap: str, kafka_topic: str, tmp_path: Path) -> KafkaBackend:
    return KafkaBackend(kafka_bootstrap, kafka_topic, tmp_path / "state-0", partitions=2)


@pytest.fixture
def pair(backend: KafkaBackend, tmp_path: Path) -> Iterator[list[HistoryEngine]]:
    """Two instances, each with its own state directory, on one topic (opened one after the
    other, so they do not race to create the topic)."""
    engines = [backend.open(tmp_path / f"state-{i}") for i in range(2)]
    yield engines
    for e in engines:
        e.close()


def one_winner(results: list[Receipt | Exception], loser: type[Exception]) -> Receipt:
    receipts = [r for r in results if isinstance(r, Receipt)]
    refused = [r for r in results if isinstance(r, loser)]
    assert len(receipts) == 1 and len(refused) == len(results) - 1, results
    return receipts[0]


def a_fresh_instance_agrees(backend: KafkaBackend, state: Path, engines: list[HistoryEngine],
                            convs: list[str], accepted: int) -> None:
    """A third instance replaying the topic shows the same histories and admission counters."""
    for e in engines:
        e.catch_up()
    with backend.open(state) as fresh:
        for conv in convs:
            assert {tuple(map(tuple, history_of(e, conv))) for e in [*engines, fresh]} == \
                {tuple(map(tuple, history_of(fresh, conv)))}
        assert {counters(e.stats()) for e in engines} == {counters(fresh.stats())}
        assert fresh.stats().accepted == accepted


def test_two_instances_racing_replace_turn_have_one_winner_everywhere(
        pair: list[HistoryEngine], backend: KafkaBackend, tmp_path: Path) -> None:
    conv = "race-replace"
    first = pair[0].append(user_turn(conv, "a0", "question"))
    pair[1].read(conv, at_least=first)
    winners: list[str] = []
    for i in range(ROUNDS):
        latest = pair[0].latest_turn(conv)
        assert latest is not None
        user = latest.messages[0].message
        batches = [Batch(conv, f"r{i}-retry", [Message.user(*user.parts), Message.assistant(f"retried {i}")]),
                   user_turn(conv, f"r{i}-edit", f"edited {i}")]
        reasons = ["retry", "edit"]
        k0, k1 = (0, 1) if i % 2 == 0 else (1, 0)  # alternate which instance sends which
        results = race_threads([partial(pair[k0].replace_turn, batches[0], latest.id, reasons[0]),
                        partial(pair[k1].replace_turn, batches[1], latest.id, reasons[1])])
        winner = one_winner(results, TurnNotReplaceable)
        winners.append(str(winner.append_id))
        for e in pair:
            e.read(conv, at_least=winner)
            now = e.latest_turn(conv)
            assert now is not None and now.id == f"{winner.append_id}/0" and now.position > latest.position
        assert history_of(pair[0], conv) == history_of(pair[1], conv)
        hidden = [e for e in pair[0].entries(conv, include_hidden=True) if e.hidden]
        assert {e.superseded_by for e in hidden[-2:]} == {f"{winner.append_id}/0"}
    visible = pair[1].entries(conv)
    assert [e.append_id for e in visible] == [winners[-1]] * 2  # only the last winner's turn is visible
    a_fresh_instance_agrees(backend, tmp_path / "fresh", pair, [conv], accepted=ROUNDS + 1)


def test_two_instances_racing_optimistic_appends_have_one_winner_everywhere(
        pair: list[HistoryEngine], backend: KafkaBackend, tmp_path: Path) -> None:
    conv = "race-expected-last"
    last: Receipt | object = EMPTY  # the first round races on an empty conversation
    winners: list[str] = []
    for i in range(ROUNDS):
        batches = [user_turn(conv, f"o{i}-{k}", f"from instance {k}") for k in range(2)]
        results = race_threads([partial(pair[k].append, batches[k], expected_last=last) for k in range(2)])  # type: ignore[arg-type]
        winner = one_winner(results, PreconditionFailed)
        winners.append(str(winner.append_id))
        for e in pair:
            e.read(conv, at_least=winner)
        assert history_of(pair[0], conv) == history_of(pair[1], conv)
        last = winner
    assert [e.append_id for e in pair[0].entries(conv)][::2] == winners
    a_fresh_instance_agrees(backend, tmp_path / "fresh", pair, [conv], accepted=ROUNDS)
