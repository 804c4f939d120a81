"""Message deletes decided in log order (``projections.deletes``, ``projections.admission``):
random histories of appends, replacements and deletes read exactly as a model of them does, and
their state equals a rebuild from the log; the keys a delete leaves; the event's bytes and its
poison fields; a custom projection gets ``MessagesDeleted``. The behaviour every backend shares
is ``tests/conformance/deletes_contract.py``."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from engine import HistoryEngine
from projections import Projection, ProjectionTx, feature_keys, keys
from projections.events import MessagesDeleted as DeletedEvent
from projections.events import ProjectedEvent
from schemas import Batch, HistoryPosition, Message
from schemas.errors import CorruptLog
from schemas.events import MESSAGES_DELETED_FINGERPRINT, MessagesDeleted, decode_event, encode_event
from schemas.records import record_key


def _state_rows(engine: HistoryEngine) -> list[tuple[bytes, bytes]]:
    return list(engine._projector.store.iterator().scan(b"", b"\xff" * 16))


def _conversation_rows(engine: HistoryEngine) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in _state_rows(engine) if not k.startswith((keys.CHECKPOINT, keys.META))]


def _random_history(engine: HistoryEngine, c: str, rng: random.Random, steps: int) -> None:
    """Appends (of turns, of replies that join the latest turn), replacements of the latest turn
    and deletes of random stored ids, checking every read against the visible history after
    each delete."""
    ids: list[str] = []
    for n in range(1, steps + 1):
        roll = rng.random()
        if roll < 0.45:
            size = rng.randint(1, 4)
            msgs = [Message.user(f"q{n}"), *(Message.assistant(f"r{n}.{i}" * rng.randint(1, 3))
                                             for i in range(size - 1))]
            engine.append(Batch(c, f"a{n}", msgs))
            ids += [f"a{n}/{i}" for i in range(size)]
        elif roll < 0.6:
            engine.append(Batch(c, f"a{n}", [Message.assistant(f"more {n}")]))
            ids.append(f"a{n}/0")
        elif roll < 0.7:
            latest = engine.latest_turn(c)
            if latest is not None:
                engine.replace_turn(Batch(c, f"a{n}", [Message.user(f"edit {n}"), Message.assistant("ok")]),
                                    latest.id, "edit")
                ids += [f"a{n}/0", f"a{n}/1"]
        else:
            visible = [m.id for m in engine.entries(c)]
            pick = rng.sample(ids, min(len(ids), rng.randint(1, 4))) if ids else []
            gone = engine.delete_messages(c, pick)
            assert gone == len(set(pick) & set(visible))
            _check_reads(engine, c, [m for m in visible if m not in set(pick)])


def _check_reads(engine: HistoryEngine, c: str, expected: list[str]) -> None:
    entries = engine.entries(c)
    assert [m.id for m in entries] == expected
    measure = engine.measure(c)
    turns = {m.position.turn for m in entries}
    assert (measure.messages, measure.turns) == (len(entries), len(turns))
    assert measure.content_bytes == sum(len(m.message.content_json()) for m in entries)
    for k, m in enumerate(entries):  # every cursor still finds what follows it
        assert [e.id for e in engine.entries(c, after=m.position)] == expected[k + 1:]
        assert [e.id for e in engine.entries(c, before=m.position)] == expected[:k]
        assert engine.measure(c, after=m.position).messages == len(entries) - k - 1
    assert [m.id for m in engine.entries_by_ids(c, list(reversed(expected)))] == expected
    grouped = [t for t in engine.turns(c)]
    assert [m.id for t in grouped for m in t.messages] == [m.id for m in entries if m.position.turn > 0]
    latest = engine.latest_turn(c)
    assert (latest.position if latest else None) == (grouped[-1].position if grouped else None)
    for budget in (1 << 20, 200, 60):
        got = engine.read_within_bytes(c, budget)
        assert [m.id for m in got.messages] == expected[len(expected) - len(got.messages):]


@pytest.mark.parametrize("seed", range(6))
def test_random_deletes_read_as_the_model_and_equal_a_rebuild(tmp_path: Path, seed: int) -> None:
    with HistoryEngine.open(tmp_path / "d", partitions=2) as engine:
        _random_history(engine, "c", random.Random(seed), 60)
        _random_history(engine, "other", random.Random(seed + 100), 20)
        live = (engine._projector.stats(), _state_rows(engine))
    with HistoryEngine.open(tmp_path / "d", partitions=2, rebuild=True) as engine:
        assert engine.catch_up(timeout=30)
        assert (engine._projector.stats(), _state_rows(engine)) == live


def test_a_delete_leaves_no_row_of_the_deleted_messages(tmp_path: Path) -> None:
    """What a delete writes: the deleted messages' rows go (``M``, ``N``, ``S``, ``X``, ``G``,
    and the ``T``/``W``/``A`` rows that only they held), the later rows move down over them, and
    one ``D`` row per batch remembers their indexes; ``stats`` counts them."""
    with HistoryEngine.open(tmp_path / "d") as engine:
        c = "c"
        engine.append(Batch(c, "a", [Message.user("q1"), Message.assistant("r1")]))
        engine.append(Batch(c, "b", [Message.system("secret system"), Message.user("secret", metadata={
            "external_id": "wa-9"})]))
        engine.append(Batch(c, "d", [Message.user("q3"), Message.assistant("r3")]))
        before = len(_conversation_rows(engine))
        assert engine.delete_messages(c, ["b/0", "b/1"]) == 2
        rows = _conversation_rows(engine)
        assert not [k for k, v in rows if b"secret" in k or b"secret" in v or b"wa-9" in k]
        # gone: 2 M, 2 N, 1 S, 1 X, 1 T (turn 2), 1 W, 1 A; added: 1 D
        assert len(rows) == before - 9 + 1
        assert dict(rows)[feature_keys.deleted_key(c.encode(), b"b")] == feature_keys.deleted_value([0, 1])
        assert engine.stats().deleted == 2
        assert [m.id for m in engine.entries(c)] == ["a/0", "a/1", "d/0", "d/1"]
        assert engine.entries(c)[2].position == HistoryPosition(3, 5)  # positions never change


class _Seen(Projection):
    name = "seen-deletes"

    def __init__(self) -> None:
        self.events: list[ProjectedEvent] = []

    def apply(self, event: ProjectedEvent, tx: ProjectionTx) -> None:
        self.events.append(event)


def test_custom_projections_and_subscribers_get_the_event(tmp_path: Path) -> None:
    with HistoryEngine.open(tmp_path / "d") as engine:
        seen = _Seen()
        engine.register(seen, wait=True)
        with engine.subscribe() as events:
            engine.append(Batch("c", "a", [Message.user("q"), Message.assistant("r")]))
            engine.replace_turn(Batch("c", "b", [Message.user("q2")]), "a/0", "edit")
            assert engine.delete_messages("c", ["a/1", "b/0", "zz/0"]) == 1
            assert engine.delete_messages("c", ["zz/0"]) == 0  # nothing stored: no event
            got = [events.get(timeout=10) for _ in range(3)]
        deleted = [e for e in seen.events if isinstance(e, DeletedEvent)]
        assert [d.message_ids for d in deleted] == [("a/1", "b/0")]
        assert isinstance(got[2], DeletedEvent) and got[2].message_ids == ("a/1", "b/0")


def test_the_event_round_trips_and_broken_fields_are_poison() -> None:
    event = MessagesDeleted("c", "del-1", ("a/0", "b/2"), 3, 1_767_225_600_000)
    value = encode_event(event)
    assert value[2:10] == MESSAGES_DELETED_FINGERPRINT
    assert decode_event(value) == event
    for bad, field in ((MessagesDeleted("c", "del-1", (), None, 1), "message_ids"),
                       (MessagesDeleted("c", "del-1", ("not-an-id",), None, 1), "message_ids"),
                       (MessagesDeleted("c", "", ("a/0",), None, 1), "delete_id"),
                       (MessagesDeleted("c", "del-1", ("a/0",), 0, 1), "fence")):
        with pytest.raises(CorruptLog, match=field):
            decode_event(encode_event(bad))


def test_a_poison_delete_is_quarantined_and_deletes_nothing(tmp_path: Path) -> None:
    with HistoryEngine.open(tmp_path / "d") as engine:
        engine.append(Batch("c", "a", [Message.user("q")]))
        bad = MessagesDeleted("c", "del-x", ("a/0",), 0, 1_767_225_600_000)  # fence 0: no epoch
        position = engine.log.append(record_key("c", "del-x"), encode_event(bad))
        engine.wait_applied(position, timeout=30)
        assert engine.stats().corrupt == 1
        assert [m.id for m in engine.entries("c")] == ["a/0"]
