"""The bound on derived key state (schemas/sealed.py ``DERIVED_KEYS``): a process holds the AES-GCM
and HMAC state of at most that many data keys, whatever the number of conversations it seals or
opens; a key past the bound derives again on its next use and seals and opens exactly as before."""

from __future__ import annotations

import gc
import threading
import weakref
from pathlib import Path

import pytest

from engine import HistoryEngine
from schemas import Batch, Message
from schemas import sealed as sealed_mod
from schemas.sealed import DERIVED_KEYS, DataKey, open_sealed, seal

CONTENT = b'[{"parts":[{"kind":"text","text":"hello"}],"role":"user"}]'


@pytest.fixture
def small_bound(monkeypatch: pytest.MonkeyPatch) -> int:
    limit = 8
    monkeypatch.setattr(sealed_mod._DERIVED, "limit", limit)
    return limit


def _round_trip(key: DataKey, c: str = "c", a: str = "a") -> None:
    assert open_sealed(key, seal(key, CONTENT, conversation_id=c, append_id=a), conversation_id=c,
                       append_id=a) == CONTENT


def test_the_bound_is_what_the_docs_say() -> None:
    assert sealed_mod._DERIVED.limit == DERIVED_KEYS == 16_384


def test_at_most_the_bound_of_keys_hold_derived_state(small_bound: int) -> None:
    keys = DataKey.generate_many(5 * small_bound)
    for key in keys:
        _round_trip(key)
        assert len(sealed_mod._DERIVED) <= small_bound
    assert len(sealed_mod._DERIVED) == small_bound
    assert all(k._derived for k in keys[-small_bound:])  # the last derived keep theirs
    assert not any(k._derived for k in keys[:-small_bound])  # the others were dropped
    mac = keys[0].mac(CONTENT)
    for key in keys:  # a dropped key derives again: the same MAC, every seal still opens
        _round_trip(key)
    assert keys[0].mac(CONTENT) == mac == DataKey(keys[0].key_id, keys[0].secret).mac(CONTENT)
    assert len(sealed_mod._DERIVED) <= small_bound


def test_prepared_spares_count_against_the_bound(small_bound: int) -> None:
    keys = DataKey.generate_many(3 * small_bound)
    for key in keys:
        key.prepare()
    assert len(sealed_mod._DERIVED) == small_bound and keys[-1]._derived and not keys[0]._derived


def test_a_key_nobody_holds_takes_its_derived_state_with_it() -> None:
    key = DataKey.generate()
    _round_trip(key)
    holding = len(sealed_mod._DERIVED)
    assert key._derived and holding >= 1
    ref = weakref.ref(key)
    del key
    gc.collect()
    assert ref() is None  # never kept alive by the bound's bookkeeping (a weak reference)
    assert len(sealed_mod._DERIVED) == holding - 1  # and its derived state went with it


def test_threads_sealing_while_keys_are_dropped_never_fail(small_bound: int) -> None:
    keys = DataKey.generate_many(4 * small_bound)
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def work(t: int) -> None:
        try:
            start.wait(timeout=30)
            for i in range(600):
                key = keys[(t * 7 + i * 5) % len(keys)]
                _round_trip(key, f"c{t}", f"a{i}")
        except BaseException as exc:  # reported below, with the thread's failure
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not any(th.is_alive() for th in threads)
    assert errors == []
    assert len(sealed_mod._DERIVED) <= small_bound


def _batch(c: str, a: str) -> Batch:
    return Batch(conversation_id=c, append_id=a, messages=[Message.user(f"hello {c}")])


def test_an_engine_with_more_conversations_than_the_bound(tmp_path: Path, small_bound: int) -> None:
    """Appends, reads, a clear and a rebuild over 6x the bound of conversations: every message
    reads back, and the process never holds more derived keys than the bound."""
    convs = [f"conv-{i}" for i in range(6 * small_bound)]
    with HistoryEngine.open(tmp_path / "data") as engine:
        for c in convs:
            engine.append(_batch(c, "a1"))
            assert len(sealed_mod._DERIVED) <= small_bound
        for c in convs:  # a second turn: most keys were dropped and derive again
            engine.append(_batch(c, "a2"))
        engine.clear(convs[0])
        texts = {c: [m.text() for m in engine.read(c)] for c in convs[1:]}
    assert all(t == [f"hello {c}", f"hello {c}"] for c, t in texts.items())
    with HistoryEngine.open(tmp_path / "data", rebuild=True) as engine:
        assert engine.stats().accepted == 2 * len(convs) - 2
        assert {c: [m.text() for m in engine.read(c)] for c in convs[1:]} == texts
        assert len(sealed_mod._DERIVED) <= small_bound
