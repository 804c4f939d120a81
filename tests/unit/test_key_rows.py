"""The ``K`` rows (``projections.keys.key_id_key``): the state records which data keys each
conversation's records were sealed under, and ``clear`` destroys exactly those (then deletes its
``E`` and ``K`` rows). Real RocksDB, a real FileLog and a real ``FileKeyStore``: a subclass of it
records every ``destroy_many([(c, key_ids), ...])`` call, then runs the real one.

A second key of one conversation is what the key store's bucket file holds when two creators
raced (or, with pooled keys, a spare bound before a restart): a second key record, written here
to the bucket file with the store's own record functions while no engine holds it."""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from engine import HistoryEngine
from engine.keys import FileKeyStore
from engine.keys.files import bucket_of
from engine.keys.record import encode_record, frame
from projections import erasure, keys
from projections.store import StateStore
from schemas.batch import Batch
from schemas.canonical import digest_of
from schemas.errors import ConversationClosed, StateUnavailable
from schemas.event_content import seal_event
from schemas.events import BatchAppended, encode_event
from schemas.messages import Message
from schemas.records import record_key
from schemas.sealed import DataKey


class RecordingKeys(FileKeyStore):
    """A ``FileKeyStore`` that records each conversation an erasure destroys (``destroy_many``:
    conversation, key ids), and can be made to fail the next ``fail`` calls (a full disk, say)
    before doing anything."""

    calls: list[tuple[str, list[str]]] = []
    fail = 0

    def destroy_many(self, erasures: Sequence[tuple[str, Sequence[str]]]) -> None:
        RecordingKeys.calls += [(conversation_id, sorted(key_ids)) for conversation_id, key_ids in erasures]
        if RecordingKeys.fail:
            RecordingKeys.fail -= 1
            raise StateUnavailable("No space left on device (injected)")
        super().destroy_many(erasures)


@pytest.fixture(autouse=True)
def recording(monkeypatch: pytest.MonkeyPatch) -> type[RecordingKeys]:
    monkeypatch.delenv("HISTLOG_MASTER_KEY_FILE", raising=False)
    monkeypatch.setattr("engine.state.FileKeyStore", RecordingKeys)
    RecordingKeys.calls = []
    RecordingKeys.fail = 0
    return RecordingKeys


@pytest.fixture
def compactions(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per ``StateStore.compact`` call (the number of ranges it compacted)."""
    calls: list[int] = []
    real = StateStore.compact

    def compact(self: StateStore, ranges: Any) -> None:
        ranges = list(ranges)
        calls.append(len(ranges))
        real(self, ranges)

    monkeypatch.setattr(StateStore, "compact", compact)
    return calls


def _turn(conv: str, aid: str, text: str = "hello") -> Batch:
    return Batch(conv, aid, [Message.user(f"{text} {aid}"), Message.assistant("ok")])


def _add_key(data: Path, conv: str) -> DataKey:
    """A second live key record of ``conv`` in its bucket file (no engine open on ``data``)."""
    key = DataKey.generate()
    with open(data / "keys" / f"b-{bucket_of(conv):02x}.keys", "ab") as f:
        f.write(frame(encode_record(conv, key)))
    return key


def _sealed(eng: HistoryEngine, batch: Batch, key: DataKey, expected_last: str | None = None) -> None:
    """``batch`` appended to the log sealed under ``key`` (as a writer holding that key would),
    then applied."""
    event = seal_event(BatchAppended.of(batch, int(time.time() * 1000), expected_last), key)
    eng.log.append(record_key(batch.conversation_id, batch.append_id), encode_event(event))
    assert eng.catch_up(timeout=30)


def _all_rows(eng: HistoryEngine) -> dict[bytes, bytes]:
    return dict(eng._store.iterator().scan(b"", b"\xff" * 8))


def _rows(eng: HistoryEngine, prefix: bytes) -> dict[bytes, bytes]:
    return {k: v for k, v in _all_rows(eng).items() if k.startswith(prefix)}


def _key_ids(eng: HistoryEngine, conv: str) -> set[str]:
    lower, upper = keys.key_id_range(conv.encode())
    return {keys.read_key_id_key(k)[1] for k in _rows(eng, keys.KEY_ID) if lower <= k < upper}


def test_k_rows_hold_the_key_ids_of_the_records_and_a_rebuild_has_the_same(tmp_path: Path,
                                                                          recording: type[RecordingKeys]) -> None:
    with HistoryEngine.open(tmp_path, partitions=2, fsync="never") as eng:
        eng.append(_turn("c", "a0"))
        eng.append(_turn("c", "a1"))  # the same key: one K row
        eng.append(_turn("other", "a0"))
        assert eng.keys is not None
        first = {k for c, k in eng.keys.list_keys("c")}
        other = {k for c, k in eng.keys.list_keys("other")}
    second = _add_key(tmp_path, "c")
    with HistoryEngine.open(tmp_path, fsync="never") as eng:
        _sealed(eng, _turn("c", "a2"), second)
        _sealed(eng, _turn("c", "a0"), second)  # an identical retry under the other key: a duplicate
        assert (eng.stats().accepted, eng.stats().duplicates) == (4, 1)
        assert _key_ids(eng, "c") == first | {second.key_id} and len(first) == 1
        assert _key_ids(eng, "other") == other
        assert all(v == b"" for v in _rows(eng, keys.KEY_ID).values())
        live = _all_rows(eng)
    shutil.rmtree(tmp_path / "state")
    with HistoryEngine.open(tmp_path, fsync="never") as eng:  # a rebuild from the log
        assert _all_rows(eng) == live
        eng.clear("c")
        assert recording.calls == [("c", sorted(first | {second.key_id}))]
        assert _key_ids(eng, "c") == set() and _rows(eng, keys.ERASING) == {}
        assert _key_ids(eng, "other") == other  # another conversation's keys stay
        assert eng.keys is not None and eng.keys.list_keys("c") == []
        assert eng.read("other")


def test_a_conversation_whose_only_record_was_refused_has_its_key_destroyed_at_clear(
        tmp_path: Path, recording: type[RecordingKeys], compactions: list[int]) -> None:
    with HistoryEngine.open(tmp_path, partitions=1, fsync="never") as eng:
        assert eng.keys is not None
        key = eng.keys.create("r")
        _sealed(eng, _turn("r", "a0"), key, expected_last="a-never")  # refused: no row of "r" but K
        assert eng.stats().precondition_failed == 1
        assert _rows(eng, keys.conv_key(b"r")) == {} and _key_ids(eng, "r") == {key.key_id}
        # Content that opens but is no batch (one message counted, a JSON number inside): poison,
        # and its key is listed all the same.
        other = eng.keys.create("p")
        content = b"[1]"
        bogus = BatchAppended("p", "a0", digest_of(content), content, 1, len(content), int(time.time() * 1000))
        eng.log.append(record_key("p", "a0"), encode_event(seal_event(bogus, other)))
        assert eng.catch_up(timeout=30) and eng.stats().corrupt == 1
        assert _key_ids(eng, "p") == {other.key_id}
        eng.clear("r")
        eng.clear("p")
        assert recording.calls == [("r", [key.key_id]), ("p", [other.key_id])]
        assert compactions == []  # it had no rows: nothing to compact
        assert _key_ids(eng, "r") == _key_ids(eng, "p") == set() and _rows(eng, keys.ERASING) == {}
        assert eng.keys.list_keys("r") == eng.keys.list_keys("p") == []


def test_a_sealed_record_after_the_clear_destroys_its_key(tmp_path: Path, recording: type[RecordingKeys]) -> None:
    with HistoryEngine.open(tmp_path, partitions=1, fsync="never") as eng:
        eng.append(_turn("c", "a0"))
        eng.clear("c")
        assert eng.keys is not None
        spare = DataKey.generate()  # bound to "c" by a writer before the clear, used after it
        recording.calls.clear()
        _sealed(eng, _turn("c", "a1"), spare)
        assert recording.calls == [("c", [spare.key_id])]
        assert eng.stats().rejected_closed == 1
        assert _key_ids(eng, "c") == set() and _rows(eng, keys.ERASING) == {}
        with pytest.raises(ConversationClosed):
            eng.append(_turn("c", "a2"))


def test_a_failed_destroy_leaves_the_e_and_k_rows_and_the_next_open_completes(
        tmp_path: Path, recording: type[RecordingKeys]) -> None:
    with HistoryEngine.open(tmp_path, partitions=1, fsync="never") as eng:
        eng.append(_turn("c", "a0"))
        ids = _key_ids(eng, "c")
        assert len(ids) == 1
        recording.fail = 1
        with pytest.raises(StateUnavailable, match="call clear again"):
            eng.clear("c")
        assert _rows(eng, keys.ERASING) == {keys.erasing_key(b"c"): keys.ERASE_COMPACT}
        assert _key_ids(eng, "c") == ids
        assert eng.keys is not None and eng.keys.list_keys("c")  # nothing destroyed yet
    with HistoryEngine.open(tmp_path, fsync="never") as eng:
        assert recording.calls == [("c", sorted(ids))] * 2
        assert _key_ids(eng, "c") == set() and _rows(eng, keys.ERASING) == {}
        assert eng.keys is not None and eng.keys.list_keys("c") == []


def test_a_replay_of_a_cleared_conversation_without_rows_writes_and_removes_its_e_row_without_compacting(
        tmp_path: Path, compactions: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    with HistoryEngine.open(tmp_path, partitions=1, fsync="never") as eng:
        eng.append(_turn("c", "a0"))
        eng.clear("c")
        eng.clear("never-seen")  # no record at all: keys only (its marker), nothing to compact
        assert compactions == [len(keys.erasure_ranges(b"c"))]  # the one conversation that had rows
    compactions.clear()
    marks: list[tuple[bytes, bytes | None]] = []
    real = erasure.destroy_keys

    def destroy_keys(store: StateStore, keys_: Any, convs: Sequence[bytes]) -> dict[bytes, list[str]]:
        marks.extend((c, store.get(keys.erasing_key(c))) for c in convs)
        return real(store, keys_, convs)

    monkeypatch.setattr(erasure, "destroy_keys", destroy_keys)
    shutil.rmtree(tmp_path / "state")
    with HistoryEngine.open(tmp_path, fsync="never") as eng:  # the records of "c" are erased now
        assert sorted(marks) == [(b"c", keys.ERASE_KEYS_ONLY), (b"never-seen", keys.ERASE_KEYS_ONLY)]
        assert compactions == []
        assert _rows(eng, keys.ERASING) == {} and _rows(eng, keys.KEY_ID) == {}
        assert (eng.stats().erased, eng.stats().cleared) == (1, 2)
