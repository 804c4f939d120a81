"""StateStore snapshots: a failed iterator is an error, never a silently shorter result."""

from __future__ import annotations

from pathlib import Path

import pytest
from rocksdict import ReadOptions

from projections.store import Snapshot, StateStore
from schemas import HistoryError


class Bounded(Snapshot):
    """An iterator that gives up (status Incomplete) after stepping over a few deleted keys."""

    def __init__(self, store: StateStore) -> None:
        options = ReadOptions()
        options.set_max_skippable_internal_keys(5)
        self._store = store
        self._it = store.db.iter(options)


def test_an_incomplete_iterator_raises_instead_of_ending_early(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    try:
        for i in range(100):
            store.db.put(b"k%03d" % i, b"v")
        for i in range(90):
            store.db.delete(b"k%03d" % i)
        assert [k for k, _ in store.iterator().scan(b"k", b"l")] == [b"k%03d" % i for i in range(90, 100)]
        with pytest.raises(HistoryError, match="reading the state store failed"):
            list(Bounded(store).scan(b"k", b"l"))
        with pytest.raises(HistoryError, match="reading the state store failed"):
            Bounded(store).get(b"k000")
    finally:
        store.close()


def test_a_step_writes_each_key_once_and_keeps_the_order_of_range_deletes(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    try:
        store.db.put(b"a1", b"old")
        store.db.put(b"b1", b"old")
        tx = store.tx()
        for v in (b"1", b"2", b"3"):
            tx.put(b"c", v)  # one summary row rewritten by three batches of one step
        tx.put(b"a1", b"before the range delete")
        tx.put(b"a2", b"before the range delete")
        tx.delete_range(b"a", b"b")  # drops the committed a1 and the step's own a1, a2
        tx.put(b"a2", b"after")
        tx.delete(b"b1")
        tx.put(b"b2", b"x")
        tx.delete(b"b2")
        assert [tx.get(k) for k in (b"a1", b"a2", b"b1", b"b2", b"c")] == [None, b"after", None, None, b"3"]
        tx._write()
        assert tx._batch.len() == 7  # c once, a1, a2, the range delete, then a2, b1 and b2 once each
        tx.commit()
        assert dict(store.db.items()) == {b"a2": b"after", b"c": b"3"}
    finally:
        store.close()


def test_floor_finds_the_greatest_key_at_or_below_and_visits_one(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    try:
        for k in (b"A\x00", b"A\x05", b"B\x00"):
            store.db.put(k, k)
        snap = store.iterator()
        before = store.keys_read
        assert snap.floor(b"A", b"A\x04") == (b"A\x00", b"A\x00")
        assert snap.floor(b"A", b"A\x05") == (b"A\x05", b"A\x05")
        assert snap.floor(b"A", b"A\xff") == (b"A\x05", b"A\x05")
        assert snap.floor(b"B", b"B") is None  # below every key of the range
        assert snap.floor(b"A", b"0") is None  # below every key
        assert store.keys_read - before == 5
    finally:
        store.close()
