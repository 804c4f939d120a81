"""The projector admits this process's own records without decoding and opening them again
(``projections.admission.Known``), with the same verdict as any other instance and a rebuild.

Admission is run twice over the same records, into two real RocksDB states with one real key
store: once with every record registered as the write path registers it (``Own``: the event it
encoded, its plain form, its batch, its key), once without (what another instance or a rebuild
does). Decisions, rows and outcome counters must be equal, and the registered run must not have
decoded or opened a registered record. A record whose bytes differ by one byte from the
registered ones takes the full path (poison, as today); one whose key was destroyed in between
is erased. Then the same through the engine: live writes against ``open(rebuild=True)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engine import HistoryEngine
from engine.keys import FileKeyStore
from projections import admission, keys, runtime
from projections.admission import Decision, Known, Outcome, Own, admit
from projections.erasure import open_content
from projections.rows import ConversationRow, Stats
from projections.store import StateStore
from schemas.batch import Batch
from schemas.errors import AppendConflict, PreconditionFailed, TurnNotReplaceable
from schemas.event_content import seal_event
from schemas.events import BatchAppended, ConversationCleared, TurnReplaced, decode_event, encode_event
from schemas.messages import Message
from schemas.positions import LogPosition
from schemas.records import record_key

AT = 1_767_225_600_000
Record = tuple[bytes, bytes, Own | None]


def _batch(conv: str, aid: str, text: str, answer: str | None = None) -> Batch:
    messages = [Message.user(text)] + ([Message.assistant(answer)] if answer is not None else [])
    return Batch(conv, aid, messages)


class Writer:
    """Builds records exactly as ``engine.writes`` does: the plain event, sealed under the
    conversation's key when there is a key store, encoded; registered as ``Own``."""

    def __init__(self, store: FileKeyStore | None) -> None:
        self.store = store

    def batch(self, b: Batch, expected_last: str | None = None) -> Record:
        return self._own(b, BatchAppended.of(b, AT, expected_last))

    def replace(self, b: Batch, old_turn_id: str, reason: str) -> Record:
        return self._own(b, TurnReplaced.of(b, AT, old_turn_id, reason))

    def _own(self, b: Batch, plain: BatchAppended | TurnReplaced) -> Record:
        own = Own(plain, b, None)
        if self.store is not None:
            key = self.store.create(b.conversation_id)
            own = Own(seal_event(plain, key), b, key)
        return record_key(b.conversation_id, b.append_id), encode_event(own.event), own


def _workload(w: Writer) -> list[Record]:
    """Every outcome admission has, each from a record this process wrote."""
    return [
        w.batch(_batch("c1", "a1", "hello", "hi")),  # accepted
        w.batch(_batch("c1", "a1", "hello", "hi")),  # duplicate (sealed: other bytes, same content)
        w.batch(_batch("c1", "a1", "other")),  # conflict
        w.batch(_batch("c1", "a2", "late"), expected_last=""),  # precondition_failed
        w.batch(_batch("c1", "a3", "next", "ok"), expected_last="a1"),  # accepted
        w.replace(_batch("c1", "e1", "edited", "new"), "a3/0", "edit"),  # accepted
        w.replace(_batch("c1", "e2", "stale"), "a1/0", "edit"),  # not_replaceable
        w.replace(_batch("c1", "r1", "edited", "again"), "e1/0", "retry"),  # accepted (same user message)
        w.replace(_batch("c1", "r2", "changed", "x"), "r1/0", "retry"),  # not_replaceable (content differs)
        w.batch(_batch("c2", "b1", "to forget")),  # accepted
        (record_key("c2"), encode_event(ConversationCleared("c2", AT)), None),  # cleared
        w.batch(_batch("c2", "b2", "after")),  # rejected_closed
        w.batch(_batch("c3", "x1", "🦀 ünïcode", "✓")),  # accepted
    ]


def _run(state: StateStore, records: list[Record], store: FileKeyStore | None,
         register: bool) -> tuple[list[Decision], Stats, list[tuple[bytes, bytes]]]:
    known: Known = {(k, v): own for k, v, own in records if own is not None} if register else {}
    stats = Stats()
    decisions = []
    for offset, (k, v, _) in enumerate(records):
        tx = state.tx()
        decision, _ = admit(tx, stats, LogPosition(0, offset), k, v, known=known, want_event=True, keys_=store)
        tx.commit()
        decisions.append(decision)
    return decisions, stats, list(state.iterator().scan(b"", b"\xff" * 16))


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How often admission decoded a value and opened sealed content (spies calling the real ones)."""
    counts = {"decode": 0, "open": 0}

    def spy(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            counts[name] += 1
            return real(*args)
        return call

    monkeypatch.setattr(admission, "decode_event", spy("decode", decode_event))
    monkeypatch.setattr(admission, "open_content", spy("open", open_content))
    return counts


@pytest.fixture
def key_store(tmp_path: Path) -> Iterator[FileKeyStore]:
    with FileKeyStore(tmp_path / "keys") as store:
        yield store


@pytest.mark.parametrize("sealed", [True, False], ids=["sealed", "plain"])
def test_own_records_get_the_verdicts_rows_and_counters_of_the_full_path(
        tmp_path: Path, key_store: FileKeyStore, calls: dict[str, int], sealed: bool) -> None:
    store = key_store if sealed else None
    records = _workload(Writer(store))
    own_state, full_state = StateStore(tmp_path / "own"), StateStore(tmp_path / "full")
    try:
        own = _run(own_state, records, store, register=True)
        assert calls == {"decode": 1, "open": 0}  # the clear only: no registered record was decoded or opened
        full = _run(full_state, records, store, register=False)
        assert calls["decode"] == 1 + len(records)
    finally:
        own_state.close()
        full_state.close()
    assert own == full
    outcomes = [d.outcome for d in own[0]]
    assert outcomes == [Outcome.ACCEPTED, Outcome.DUPLICATE, Outcome.CONFLICT, Outcome.PRECONDITION_FAILED,
                        Outcome.ACCEPTED, Outcome.ACCEPTED, Outcome.NOT_REPLACEABLE, Outcome.ACCEPTED,
                        Outcome.NOT_REPLACEABLE, Outcome.ACCEPTED, Outcome.CLEARED, Outcome.REJECTED_CLOSED,
                        Outcome.ACCEPTED]


@pytest.mark.parametrize("sealed", [True, False], ids=["sealed", "plain"])
@pytest.mark.parametrize("where", [-1, -40, 15], ids=["last byte", "inside the content", "in the ids"])
def test_a_record_one_byte_off_from_the_registered_bytes_takes_the_full_path(
        tmp_path: Path, key_store: FileKeyStore, calls: dict[str, int], sealed: bool, where: int) -> None:
    store = key_store if sealed else None
    k, v, own = Writer(store).batch(_batch("c1", "a1", "hello there, a long enough text", "hi"))
    assert own is not None
    changed = bytearray(v)
    changed[where] ^= 0x01
    state = StateStore(tmp_path / "state")
    try:
        tx = state.tx()
        decision, _ = admit(tx, Stats(), LogPosition(0, 0), k, bytes(changed), known={(k, v): own},
                            keys_=store)
        assert calls["decode"] == 1
        assert decision.outcome is Outcome.CORRUPT  # poison, as without the registration
        tx = state.tx()
        assert admit(tx, Stats(), LogPosition(0, 0), k, bytes(changed), keys_=store)[0] == decision
    finally:
        state.close()


def test_an_own_record_whose_key_was_destroyed_meanwhile_is_erased(
        tmp_path: Path, key_store: FileKeyStore, calls: dict[str, int]) -> None:
    w = Writer(key_store)
    first = w.batch(_batch("c1", "a1", "kept"))
    records = [first, w.batch(_batch("c1", "a2", "forgotten")), w.batch(_batch("c2", "b1", "also forgotten"))]
    known: Known = {(k, v): own for k, v, own in records if own is not None}
    state = StateStore(tmp_path / "state")
    try:
        stats = Stats()
        tx = state.tx()
        assert admit(tx, stats, LogPosition(0, 0), *first[:2], known=known, keys_=key_store)[0].outcome \
            is Outcome.ACCEPTED
        tx.commit()
        key_store.destroy("c1")  # a clear elsewhere erased c1 after these were written
        key_store.destroy("c2")
        tx = state.tx()
        tx.put(keys.conv_key(b"c1"), ConversationRow(closed=True).encode())  # c1's clear was applied
        outcomes = [admit(tx, stats, LogPosition(0, i), k, v, known=known, keys_=key_store)[0].outcome
                    for i, (k, v, _) in enumerate(records[1:], start=1)]
        assert outcomes == [Outcome.REJECTED_CLOSED, Outcome.ERASED]
        assert calls["open"] == 0 and stats.erased == 1 and stats.rejected_closed == 1
        full = [admit(tx, Stats(), LogPosition(0, i), k, v, keys_=key_store)[0].outcome
                for i, (k, v, _) in enumerate(records[1:], start=1)]
        assert full == outcomes
    finally:
        state.close()


def _spy_decisions(monkeypatch: pytest.MonkeyPatch) -> list[tuple[LogPosition, Decision]]:
    seen: list[tuple[LogPosition, Decision]] = []
    real = admit

    def recording(tx: Any, stats: Any, position: LogPosition, *args: Any, **kw: Any) -> Any:
        decision, event = real(tx, stats, position, *args, **kw)
        seen.append((position, decision))
        return decision, event

    monkeypatch.setattr(runtime, "admit", recording)
    return seen


def _state_rows(engine: HistoryEngine) -> list[tuple[bytes, bytes]]:
    return list(engine._projector.store.iterator().scan(b"", b"\xff" * 16))


@pytest.mark.parametrize("seal", [True, False], ids=["sealed", "plain"])
def test_an_engines_own_records_give_the_state_a_rebuild_gives(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, calls: dict[str, int], seal: bool) -> None:
    """Live writes (their records admitted from the registration) against ``open(rebuild=True)``
    over the same log (every record decoded and opened): same decisions, rows and counters."""
    seen = _spy_decisions(monkeypatch)
    with HistoryEngine.open(tmp_path / "d", partitions=2, seal=seal) as engine:
        first = engine.append(_batch("c1", "a1", "hello", "hi"))
        engine.append(_batch("c1", "a2", "more", "yes"), expected_last=first)
        engine.replace_turn(_batch("c1", "e1", "edited", "new"), "a2/0", "edit")
        engine.replace_turn(_batch("c1", "r1", "edited", "again"), "e1/0", "retry")
        for i in range(20):
            engine.append(_batch(f"c{i % 5 + 2}", f"x{i}", f"text {i} é🦀", "ok"))
        with pytest.raises(PreconditionFailed):
            engine.append(_batch("c1", "late", "x"), expected_last=first)
        with pytest.raises(TurnNotReplaceable):
            engine.replace_turn(_batch("c1", "e9", "x"), "a1/0", "edit")
        with pytest.raises(AppendConflict):
            engine.append(_batch("c1", "a1", "other"))
        assert engine.catch_up(timeout=30)
        assert calls == {"decode": 0, "open": 0}  # every record was this engine's own
        live = (sorted(seen), engine._projector.stats(), _state_rows(engine))
    seen.clear()
    with HistoryEngine.open(tmp_path / "d", partitions=2, seal=seal, rebuild=True) as engine:
        assert engine.catch_up(timeout=30)
        rebuilt = (sorted(seen), engine._projector.stats(), _state_rows(engine))
    assert calls["decode"] == len(rebuilt[0]) == 24 and calls["open"] == (24 if seal else 0)
    assert live[0] == rebuilt[0]
    assert live[1] == rebuilt[1]
    assert live[2] == rebuilt[2]
