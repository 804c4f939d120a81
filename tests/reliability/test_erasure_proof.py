"""``clear`` forgets, checked as a user would (issue 16; ../shared/API.md "Erasure"): put
unguessable tokens in a conversation (text, tool result, metadata, external id; one turn
replaced, so the state holds hidden rows), clear it, close, and read every byte of every file
under the data directory (log segments, RocksDB tables, WAL and manifests, the key store): no
token, no canonical JSON, no digest. The other conversations read back byte-exact, after a
rebuild from the log (``state/`` deleted) and over three more open/close cycles; the cleared one
stays closed. A custom projection that stores content loses the conversation's rows, physically,
and a replay gives it only the conversation's ``ClearEvent``.

On the real engine: ``HistoryEngine.open`` on a temporary directory (FileLog, RocksDB, the file
key store), for ``fsync`` "always" and "never" and 1 or 4 partitions.
"""

from __future__ import annotations

import secrets as secrets_module
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from engine.facade import HistoryEngine
from engine.keys import FileKeyStore
from engine.log.file import FsyncPolicy
from schemas.errors import ConversationClosed, StateUnavailable
from tests.reliability.erasure_support import (
    ContentStore,
    Written,
    all_files,
    files_holding,
    holds_some_of,
    needles_of,
    snapshot,
    token_batch,
    victim_token,
    write_conversation,
)


def holds_bytes(root: Path, needle: bytes) -> bool:
    return any(needle in p.read_bytes() for p in root.rglob("*") if p.is_file())

OTHERS = [f"other-{i}" for i in range(6)]


def _assert_forgotten(root: Path, w: Written) -> None:
    found = files_holding(root, needles_of(w))
    assert not found, f"{w.conv} was cleared but these files still hold its content: {found}"


def _assert_present(root: Path, w: Written) -> None:
    """The positive control: a live conversation's token is found (the state keeps plaintext),
    so the grep reads the files that matter and ``_assert_forgotten`` can fail."""
    assert holds_some_of(root, w), \
        f"the live conversation {w.conv}'s token is in no file: the grep reads nothing; files: {all_files(root)}"


def _assert_closed(engine: HistoryEngine, conv: str) -> None:
    assert engine.read(conv) == []
    assert engine.entries(conv) == []
    with pytest.raises(ConversationClosed):
        engine.append(token_batch(conv, "after-clear", "0" * 32))


@pytest.mark.parametrize("partitions", [1, 4])
@pytest.mark.parametrize("fsync", ["always", "never"])
def test_clear_leaves_no_trace_in_any_file(tmp_path: Path, fsync: FsyncPolicy, partitions: int) -> None:
    root = tmp_path / "data"
    victim = "victim"
    with HistoryEngine.open(root, partitions=partitions, fsync=fsync) as engine:
        store = ContentStore()
        engine.register(store)
        w = write_conversation(engine, victim, turns=2, replace=True, victim=True)
        others = [write_conversation(engine, c, turns=2, replace=(i == 0)) for i, c in enumerate(OTHERS)]
        assert store.rows_of(engine, victim), "the projection stores the victim's content"
        before = snapshot(engine, OTHERS)
        rows_before = {o.conv: store.rows_of(engine, o.conv) for o in others}
        assert engine.stats().cleared == 0

        engine.clear(victim)

        _assert_closed(engine, victim)
        assert store.rows_of(engine, victim) == []
        assert engine.stats().cleared == 1
        assert snapshot(engine, OTHERS) == before
    _assert_forgotten(root, w)
    _assert_present(root, others[0])

    # Reopen: the same reads; the projection resumes after the clear (nothing of the victim).
    with HistoryEngine.open(root, fsync=fsync) as engine:
        assert snapshot(engine, OTHERS) == before
        _assert_closed(engine, victim)
        store = ContentStore()
        engine.register(store)
        assert [s for s in store.seen if s[1] == victim] == []
        engine.clear(victim)  # idempotent
    _assert_forgotten(root, w)

    # Rebuild from the log: the victim's records are met with their key destroyed (erased), a
    # replayed projection gets only the victim's ClearEvent, and every read is as before.
    shutil.rmtree(root / "state")
    with HistoryEngine.open(root, fsync=fsync) as engine:
        stats = engine.stats()
        assert stats.cleared == 1
        assert stats.erased == len(w.receipts)  # 2 appends and 1 replacement of the victim
        assert snapshot(engine, OTHERS) == before
        _assert_closed(engine, victim)
        store = ContentStore()
        engine.register(store)
        assert [s for s in store.seen if s[1] == victim] == [("clear", victim)]
        assert store.rows_of(engine, victim) == []
        assert {o.conv: store.rows_of(engine, o.conv) for o in others} == rows_before
    _assert_forgotten(root, w)
    _assert_present(root, others[0])

    for _ in range(3):
        with HistoryEngine.open(root, fsync=fsync) as engine:
            assert snapshot(engine, OTHERS) == before
            _assert_closed(engine, victim)
        _assert_forgotten(root, w)


def test_projection_registered_after_the_clear_loses_the_rows_physically(tmp_path: Path) -> None:
    """A projection that held the victim's rows but was not registered when ``clear`` ran
    deletes them when it is registered again (its catch-up delivers the ``ClearEvent``); the
    deletion must then be made physical, as a live projection's is. (Until it is registered
    again its rows stay: only the projection knows which of its rows are the conversation's.)"""
    root = tmp_path / "data"
    with HistoryEngine.open(root, partitions=2) as engine:
        engine.register(ContentStore())
        w = write_conversation(engine, "victim", turns=2, victim=True)
        other = write_conversation(engine, "other", turns=1)
    with HistoryEngine.open(root) as engine:  # the projection is not registered in this run
        engine.clear("victim")
    with HistoryEngine.open(root) as engine:
        store = ContentStore()
        engine.register(store)
        assert store.seen == [("clear", "victim")]
        assert store.rows_of(engine, "victim") == []
        assert store.rows_of(engine, "other")
    _assert_forgotten(root, w)
    _assert_present(root, other)


class _DestroyFailsOnce:
    """``FileKeyStore.destroy_many`` (what an erasure calls) raising once (a full disk, say),
    then working again."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = FileKeyStore.destroy_many

        def destroy_many(keys: FileKeyStore, erasures: Sequence[tuple[str, Sequence[str]]]) -> None:
            self.calls += 1
            if self.calls == 1:
                raise OSError(28, "No space left on device (injected)")
            real(keys, erasures)

        monkeypatch.setattr(FileKeyStore, "destroy_many", destroy_many)


def test_a_failed_erasure_leaves_it_closed_and_clear_again_completes_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "data"
    failing = _DestroyFailsOnce(monkeypatch)
    with HistoryEngine.open(root) as engine:
        w = write_conversation(engine, "victim", turns=2, victim=True)
        other = write_conversation(engine, "other", turns=1)
        before = snapshot(engine, ["other"])
        with pytest.raises(StateUnavailable, match="call clear again"):
            engine.clear("victim")
        assert failing.calls == 1
        _assert_closed(engine, "victim")
        engine.clear("victim")
        assert failing.calls == 2
        _assert_closed(engine, "victim")
        assert snapshot(engine, ["other"]) == before
    _assert_forgotten(root, w)
    _assert_present(root, other)
    with HistoryEngine.open(root) as engine:
        assert engine.stats().cleared == 1
        assert snapshot(engine, ["other"]) == before
        _assert_closed(engine, "victim")


def test_a_failed_erasure_is_completed_by_the_next_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "data"
    failing = _DestroyFailsOnce(monkeypatch)
    with HistoryEngine.open(root) as engine:
        w = write_conversation(engine, "victim", turns=1, victim=True)
        with pytest.raises(StateUnavailable, match="call clear again"):
            engine.clear("victim")
    with HistoryEngine.open(root) as engine:
        assert failing.calls == 2
        _assert_closed(engine, "victim")
    _assert_forgotten(root, w)


def test_the_grep_finds_a_conversation_that_was_not_cleared(tmp_path: Path) -> None:
    """The control of every check above: the same needles, the same files, no clear: found
    (the state keeps the content in plaintext rows; the log holds only ciphertext)."""
    root = tmp_path / "data"
    with HistoryEngine.open(root) as engine:
        w = write_conversation(engine, "victim", turns=2, replace=True, victim=True)
    found = files_holding(root, needles_of(w))
    named = {what.split(" window")[0] for what, _ in found}  # a token, whole or by a 12-letter window
    assert named >= {f"token {i}" for i in range(len(w.tokens))}, found
    assert all(path.startswith("state/") for _, path in found), found


def test_no_external_id_in_the_manifest_after_clear(tmp_path: Path) -> None:
    """The victim's ``X`` row (its messages' ``external_id``, content) is the largest key of a
    table file (written in a run of its own, after the state's metadata row): the MANIFEST
    written at the next open names that file with its boundary keys, and must not keep them
    once ``clear`` compacted the file away."""
    root = tmp_path / "data"
    with HistoryEngine.open(root) as engine:
        write_conversation(engine, "other", turns=1)
    with HistoryEngine.open(root) as engine:
        w = write_conversation(engine, "zz-victim", turns=2, victim=True)  # sorts last: its X key ends the file
    with HistoryEngine.open(root) as engine:
        engine.clear("zz-victim")
    _assert_forgotten(root, w)


def test_a_conversation_written_over_several_lifetimes_is_forgotten_with_every_key(tmp_path: Path) -> None:
    """Each process lifetime seals a conversation under the spare key it bound (in memory only:
    engine/keys/pool.py), so a conversation appended to across restarts has several keys, and
    only the log (the state's K rows) says which: a clear in a later lifetime, which bound none
    of them, destroys them all; no file holds any of their secrets or the content."""
    root = tmp_path / "data"
    victim, kept = Written("victim"), Written("kept")
    secrets_of: dict[str, list[bytes]] = {"victim": [], "kept": []}
    for life in range(3):
        with HistoryEngine.open(root) as engine:
            assert engine.keys is not None
            for w, token in ((victim, victim_token()), (kept, secrets_module.token_hex(16))):
                batch = token_batch(w.conv, f"life-{life}", token)
                w.receipts.append(engine.append(batch))
                w.tokens.append(token)
                w.batches.append(batch)
                ((_, key_id),) = engine.keys.list_keys(w.conv)  # this lifetime's binding
                secrets_of[w.conv].append(engine.keys.get(w.conv, key_id).secret)
    assert len(set(secrets_of["victim"])) == 3, "every lifetime bound another key"
    assert all(holds_bytes(root, s) for s in secrets_of["victim"])  # the proof below can fail
    with HistoryEngine.open(root) as engine:
        before = snapshot(engine, ["kept"])
        engine.clear("victim")
        _assert_closed(engine, victim.conv)
    needles = {**needles_of(victim), **{f"key secret {i}": s for i, s in enumerate(secrets_of["victim"])}}
    found = files_holding(root, needles)
    assert not found, f"the cleared conversation or one of its keys is still in: {found}"
    assert all(holds_bytes(root, s) for s in secrets_of["kept"])
    shutil.rmtree(root / "state")
    with HistoryEngine.open(root) as engine:  # a rebuild: the victim's records are erased, the rest intact
        assert snapshot(engine, ["kept"]) == before
        _assert_closed(engine, victim.conv)
        assert engine.stats().erased == 3
