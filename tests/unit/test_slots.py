"""Turn slots decided in log order (``projections.slots``, ``projections.admission``): a record
filed under a slot that reached the log behind a later turn is refused there, on the state a
rebuild gives too; slots survive a reopen; the keys each new event writes; the event's bytes
(writes without a slot keep the bytes every release wrote). The behaviour every backend shares
is ``tests/conformance/slots_contract.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import HistoryEngine
from projections import feature_keys, keys
from schemas import Batch, Fence, InvalidRequest, Message, SlotUnavailable, TurnSlot
from schemas.errors import CorruptLog
from schemas.events import (
    BATCH_APPENDED_V4_FINGERPRINT,
    TURN_ALLOCATED_FINGERPRINT,
    BatchAppended,
    TurnAllocated,
    decode_event,
    encode_event,
    fingerprint_of,
)
from schemas.records import record_key


def _state_rows(engine: HistoryEngine) -> list[tuple[bytes, bytes]]:
    return list(engine._projector.store.iterator().scan(b"", b"\xff" * 16))


def _raw(engine: HistoryEngine, batch: Batch, slot: TurnSlot) -> None:
    """Write ``batch`` under ``slot`` straight to the log, as an instance that has not applied the
    later turn yet would (no pre-check on this state), and wait for its decision."""
    event = BatchAppended.of(batch, 1_767_225_600_000, None, None, slot)
    position = engine.log.append(record_key(batch.conversation_id, batch.append_id), encode_event(event))
    engine.wait_applied(position, timeout=30)


def test_a_slotted_record_behind_a_later_turn_is_refused_in_log_order_and_by_a_rebuild(tmp_path: Path) -> None:
    with HistoryEngine.open(tmp_path / "d", partitions=2) as engine:
        early = engine.allocate_turn("c")
        late = engine.allocate_turn("c")
        _raw(engine, Batch("c", "a1", [Message.user("under the later slot")]), late)
        _raw(engine, Batch("c", "a2", [Message.user("under the earlier one: behind it")]), early)
        _raw(engine, Batch("c", "a3", [Message.user("the later one again: used")]), late)
        assert [(t.id, t.position) for t in engine.turns("c")] == [(late.turn_id, 2)]
        with pytest.raises(SlotUnavailable, match="already used"):  # decided by this state, no record
            engine.append(Batch("c", "a4", [Message.user("again")]), turn=late)
        live = (engine._projector.stats(), _state_rows(engine))
    with HistoryEngine.open(tmp_path / "d", partitions=2, rebuild=True) as engine:
        assert engine.catch_up(timeout=30)
        assert (engine._projector.stats(), _state_rows(engine)) == live


def test_slots_survive_a_reopen_and_equal_a_rebuild(tmp_path: Path) -> None:
    with HistoryEngine.open(tmp_path / "d") as engine:
        used = engine.allocate_turn("c")
        engine.append(Batch("c", "a", [Message.user("q"), Message.assistant("a")]), turn=used)
        spare = engine.allocate_turn("c")
        live = (engine._projector.stats(), _state_rows(engine))
    with HistoryEngine.open(tmp_path / "d", rebuild=True) as engine:
        assert engine.catch_up(timeout=30)
        assert (engine._projector.stats(), _state_rows(engine)) == live
    with HistoryEngine.open(tmp_path / "d") as engine:
        assert engine.latest_turn("c").id == used.turn_id
        engine.append(Batch("c", "b", [Message.user("q2")]), turn=spare)  # still usable after the reopen
        assert engine.allocate_turn("c").position == 3
        with pytest.raises(SlotUnavailable, match="already used"):
            engine.append(Batch("c", "x", [Message.user("q3")]), turn=used)


def test_what_each_new_event_writes(tmp_path: Path) -> None:
    """The keys a slot adds (docs/runs.md): its allocation 1 (``L``) and the summary row it
    updates; an append under it the same keys as one without (its ``T`` row holds the slot's id,
    its ``L`` row is rewritten in place)."""
    with HistoryEngine.open(tmp_path / "d") as engine:
        def count() -> int:  # the conversation's rows (not the checkpoints)
            return sum(1 for k, _ in _state_rows(engine) if not k.startswith((keys.CHECKPOINT, keys.META)))

        engine.append(Batch("c", "a", [Message.user("q"), Message.assistant("a")]))
        before = count()
        slot = engine.allocate_turn("c")
        assert count() - before == 1
        before = count()
        engine.append(Batch("c", "b", [Message.user("q"), Message.assistant("a")]), turn=slot)
        slotted = count() - before
        before = count()
        engine.append(Batch("c", "d", [Message.user("q"), Message.assistant("a")]))
        assert count() - before == slotted
        rows = dict(_state_rows(engine))
        assert rows[feature_keys.slot_key(b"c", slot.slot_id.encode())] == feature_keys.slot_value(2, used=True)
        assert keys.read_turn_id(rows[keys.turn_key(b"c", 2)]) == slot.turn_id
        assert keys.read_turn_id(rows[keys.turn_key(b"c", 3)]) is None


def test_the_event_carries_the_slot_and_writers_without_one_keep_their_bytes() -> None:
    batch = Batch("c", "a", [Message.user("hi")])
    slot = TurnSlot("c", "slot-1/0", 4)
    slotted = BatchAppended.of(batch, 5, None, None, slot)
    assert (slotted.turn_id, slotted.turn_position) == ("slot-1/0", 4)
    assert decode_event(encode_event(slotted)) == slotted
    assert encode_event(slotted)[2:10] == fingerprint_of("BatchAppended")  # version 5
    fenced = BatchAppended.of(batch, 5, None, Fence("c", "r1", 3))
    assert encode_event(fenced)[2:10] == BATCH_APPENDED_V4_FINGERPRINT  # a run's write keeps version 4
    both = BatchAppended.of(batch, 5, None, Fence("c", "r1", 3), slot)
    assert decode_event(encode_event(both)) == both
    allocated = TurnAllocated("c", "slot-1", 5)
    assert encode_event(allocated)[2:10] == TURN_ALLOCATED_FINGERPRINT
    assert decode_event(encode_event(allocated)) == allocated


@pytest.mark.parametrize(("turn_id", "position", "field"), [
    ("slot-1/0", None, "turn_position"), (None, 3, "turn_id"), ("slot-1/2", 3, "turn_id"),
    ("nope", 3, "turn_id"), ("slot-1/0", 0, "turn_position"),
])
def test_a_record_with_a_broken_slot_is_poison(turn_id: str | None, position: int | None, field: str) -> None:
    event = BatchAppended("c", "a", "sha256:" + "0" * 64, b"[]", 1, 0, 5, turn_id=turn_id, turn_position=position)
    with pytest.raises(CorruptLog, match=field):
        decode_event(encode_event(event))
    with pytest.raises(CorruptLog, match="slot_id"):
        decode_event(encode_event(TurnAllocated("c", "", 5)))


def test_a_slot_checks_its_own_fields() -> None:
    for position in (0, -1, True, 1.0, 1 << 63):
        with pytest.raises(InvalidRequest, match="position"):
            TurnSlot("c", "s/0", position)  # type: ignore[arg-type]
    for turn_id in ("s", "s/1", "", 3):
        with pytest.raises(InvalidRequest, match="turn"):
            TurnSlot("c", turn_id, 1)  # type: ignore[arg-type]
    assert TurnSlot("c", "s/0", 1).slot_id == "s"
