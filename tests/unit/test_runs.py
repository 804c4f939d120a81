"""Runs and fences decided in log order (``projections.runs``, ``projections.admission``): a
fenced record that reached the log before its successor's ``RunBegun`` was applied is refused
there, on the state a rebuild gives too; what a run wrote survives a reopen; the key counts of
the new events; ``Batch.run_id`` on the wire. The behaviour every backend shares is
``tests/conformance/runs_contract.py``."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from engine import HistoryEngine
from projections import feature_keys, keys
from schemas import Batch, Fence, Fenced, InvalidRequest, Message
from schemas.events import BatchAppended, RunBegun, TurnReplaced, decode_event, encode_event
from schemas.records import record_key


def _state_rows(engine: HistoryEngine) -> list[tuple[bytes, bytes]]:
    return list(engine._projector.store.iterator().scan(b"", b"\xff" * 16))


def _raw(engine: HistoryEngine, batch: Batch, fence: Fence | None) -> None:
    """Write ``batch`` with ``fence`` straight to the log, as a run that has not learned of its
    successor would (no pre-check on this state), and wait for its decision."""
    event = BatchAppended.of(batch, 1_767_225_600_000, None, fence)
    position = engine.log.append(record_key(batch.conversation_id, batch.append_id), encode_event(event))
    engine.wait_applied(position, timeout=30)


def test_a_fenced_record_already_in_the_log_is_refused_in_log_order_and_by_a_rebuild(tmp_path: Path) -> None:
    with HistoryEngine.open(tmp_path / "d", partitions=2) as engine:
        old = engine.begin_run("c", "r1")
        _raw(engine, Batch("c", "a1", [Message.user("before the new run")]), old)
        engine.begin_run("c", "r2")
        _raw(engine, Batch("c", "a2", [Message.user("after it: fenced")]), old)
        _raw(engine, Batch("c", "a3", [Message.user("an epoch no run has")]), Fence("c", "r9", 7))
        assert [e.id for e in engine.entries("c")] == ["a1/0"]
        assert engine.stats().fenced == 2 and engine.stats().accepted == 1
        with pytest.raises(Fenced):  # its retry is refused the same way (by this state, without the log)
            engine.append(Batch("c", "a2", [Message.user("after it: fenced")]), fence=old)
        live = (engine._projector.stats(), _state_rows(engine))
    with HistoryEngine.open(tmp_path / "d", partitions=2, rebuild=True) as engine:
        assert engine.catch_up(timeout=30)
        assert (engine._projector.stats(), _state_rows(engine)) == live


def test_runs_and_what_they_wrote_survive_a_reopen_and_equal_a_rebuild(tmp_path: Path) -> None:
    with HistoryEngine.open(tmp_path / "d") as engine:
        f = engine.begin_run("c", "r1")
        engine.append(Batch("c", "a", [Message.user("q"), Message.assistant("a")], run_id="r1"), fence=f)
        engine.replace_turn(Batch("c", "b", [Message.user("q2")], run_id="r1"), "a/0", "edit", fence=f)
        live = (engine._projector.stats(), _state_rows(engine))
    with HistoryEngine.open(tmp_path / "d", rebuild=True) as engine:
        assert engine.catch_up(timeout=30)
        assert (engine._projector.stats(), _state_rows(engine)) == live
    with HistoryEngine.open(tmp_path / "d") as engine:
        assert engine.begin_run("c", "r1") == f  # known here: no new record
        assert engine.run_wrote_history("c", "r1", "a/0") and engine.run_request_message("c", "r1", "a/0") == "b/0"
        assert engine.begin_run("c", "r2").epoch == 2
        assert [r for r in _state_rows(engine) if r[0].startswith(keys.RUN + b"c")] == [
            (feature_keys.run_key(b"c", b""), keys.u64(2)), (feature_keys.run_epoch_key(b"c", 1), b"r1"),
            (feature_keys.run_epoch_key(b"c", 2), b"r2"), (feature_keys.run_key(b"c", b"r1"), keys.u64(1)),
            (feature_keys.run_key(b"c", b"r2"), keys.u64(2))]
        assert engine.fence_of_epoch("c", 1) == f and engine.fence_of_epoch("c", 2).run_id == "r2"
        with pytest.raises(Fenced, match="no run of epoch 3"):
            engine.fence_of_epoch("c", 3)
        with pytest.raises(InvalidRequest, match="epoch"):
            engine.fence_of_epoch("c", 0)


def test_what_each_new_event_writes(tmp_path: Path) -> None:
    """The keys a run's begin and a run's write add (docs/runs.md): a new run 3 (``F`` run, ``F``
    latest, ``F`` epoch), a known run 0; a write of its run (the batch's ``run_id``, else its fence's) one
    ``J t`` per turn it touches and one ``J u`` per user message; the fence itself none."""
    with HistoryEngine.open(tmp_path / "d") as engine:
        def count() -> int:  # the conversation's rows (not the checkpoints)
            return sum(1 for k, _ in _state_rows(engine) if not k.startswith((keys.CHECKPOINT, keys.META)))

        before = count()
        f = engine.begin_run("c", "r1")
        engine.begin_run("c", "r1")
        assert count() - before == 3
        engine.append(Batch("c", "a", [Message.user("q"), Message.assistant("a")]))
        grew = []
        for aid, run, fence in (("b", None, None), ("c", None, f), ("d", "r1", None), ("e", "r2", f)):
            before = count()
            engine.append(Batch("c", aid, [Message.user("q"), Message.assistant("a")], run_id=run), fence=fence)
            grew.append(count() - before)
        assert grew == [grew[0], grew[0] + 2, grew[0] + 2, grew[0] + 2]
        j = [k for k, _ in _state_rows(engine) if k.startswith(keys.RUN_WRITES)]
        assert j == [feature_keys.run_turn_key(b"c", b"r1", b"c/0"), feature_keys.run_turn_key(b"c", b"r1", b"d/0"),
                     feature_keys.run_request_key(b"c", b"r1", 5), feature_keys.run_request_key(b"c", b"r1", 7),
                     feature_keys.run_turn_key(b"c", b"r2", b"e/0"), feature_keys.run_request_key(b"c", b"r2", 9)]


def test_the_event_carries_the_run_and_the_fence_and_old_writers_bytes_stay_the_same() -> None:
    batch = Batch("c", "a", [Message.user("hi")])
    plain = encode_event(BatchAppended.of(batch, 5))
    fenced = BatchAppended.of(batch, 5, None, Fence("c", "r1", 3))
    assert (fenced.fence, fenced.run_id) == (3, "r1")  # the fence names the run when the batch does not
    assert decode_event(encode_event(fenced)) == fenced
    assert encode_event(fenced)[2:10] != plain[2:10]  # the current schema, not the plain one
    assert plain == encode_event(decode_event(plain))  # no run, no fence: the bytes every release wrote
    own = BatchAppended.of(Batch("c", "a", [Message.user("hi")], run_id="mine"), 5, None, Fence("c", "r1", 3))
    assert own.run_id == "mine"
    replaced = TurnReplaced.of(batch, 5, "z/0", "edit", Fence("c", "r1", 1))
    assert decode_event(encode_event(replaced)) == replaced
    begun = RunBegun("c", "r1", 5)
    assert decode_event(encode_event(begun)) == begun


def test_a_batchs_run_is_kept_by_json_and_pickle_but_is_no_part_of_its_identity() -> None:
    batch = Batch("c", "a", [Message.user("hi")], run_id="r1")
    assert b'"run_id":"r1"' in batch.to_json() and Batch.from_json(batch.to_json()).run_id == "r1"
    assert b"run_id" not in Batch("c", "a", [Message.user("hi")]).to_json()
    assert pickle.loads(pickle.dumps(batch)).run_id == "r1"
    other = Batch("c", "a", [Message.user("hi")])
    assert batch == other and batch.digest == other.digest
    with pytest.raises(InvalidRequest, match="run id"):
        Batch("c", "a", [Message.user("hi")], run_id="\x00")


def test_a_fence_checks_its_own_fields() -> None:
    for epoch in (0, -1, True, 1.0, 1 << 63):
        with pytest.raises(InvalidRequest, match="epoch"):
            Fence("c", "r", epoch)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="run id"):
        Fence("c", "", 1)
