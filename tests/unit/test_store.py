"""StateStore snapshots: a failed iterator is an error, never a silently shorter result; a step's
overlay (``Tx``) reads and commits what a dict model of the same operations gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
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


_KEYS = st.binary(min_size=1, max_size=3).map(lambda b: bytes(c % 4 + 97 for c in b))  # few keys, many collisions
_OPS = st.lists(st.one_of(
    st.tuples(st.just("put"), _KEYS, st.binary(max_size=2)),
    st.tuples(st.just("delete"), _KEYS),
    st.tuples(st.just("range"), _KEYS, _KEYS),
    st.tuples(st.just("commit")),
), max_size=40)


@settings(max_examples=150, deadline=None)
@given(committed=st.dictionaries(_KEYS, st.binary(max_size=2), max_size=8), ops=_OPS,
       probes=st.lists(_KEYS, max_size=12))
def test_a_steps_reads_and_commit_equal_a_dict_model_whatever_the_range_deletes(
        tmp_path_factory: pytest.TempPathFactory, committed: dict[bytes, bytes], ops: list[tuple[Any, ...]],
        probes: list[bytes]) -> None:
    """The overlay (pending writes, range deletes joined for its reads, pending keys found by
    bisection) reads and commits what applying the same operations in order to a dict gives."""
    store = StateStore(tmp_path_factory.mktemp("tx"))
    try:
        for k, v in committed.items():
            store.db.put(k, v)
        model = dict(committed)
        tx = store.tx()
        for op in ops:
            if op[0] == "put":
                tx.put(op[1], op[2])
                model[op[1]] = op[2]
            elif op[0] == "delete":
                tx.delete(op[1])
                model.pop(op[1], None)
            elif op[0] == "range":
                lower, upper = sorted((op[1], op[2]))
                tx.delete_range(lower, upper)
                model = {k: v for k, v in model.items() if not lower <= k < upper}
            else:
                tx.commit()
                tx = store.tx()
            for k in probes:
                assert tx.get(k) == model.get(k), (op, k)
            assert tx.scan(b"a", b"e") == sorted(model.items()), op
        tx.commit()
        assert dict(store.db.items()) == model
    finally:
        store.close()


def test_compaction_joins_neighbouring_ranges_unless_a_live_key_lies_between(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    try:
        for k in (b"a1", b"b1", b"c1", b"x1"):
            store.db.put(k, b"v")
        for k in (b"a1", b"b1", b"c1"):
            store.db.delete(k)
        ranges = [(b"c", b"d"), (b"a", b"b"), (b"b", b"c"), (b"y", b"z"), (b"a0", b"a2")]
        assert store._joined(ranges) == [(b"a", b"d"), (b"y", b"z")]  # x1 lives between d and y
        store.compact(ranges)
        assert dict(store.db.items()) == {b"x1": b"v"}
    finally:
        store.close()
