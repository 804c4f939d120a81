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
