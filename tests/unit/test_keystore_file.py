"""The embedded key store (engine/keys/files.py) against its contract (engine/keys/base.py), on
real files: create-if-absent, durable creates, erasure that leaves no key byte in any file
(checked by reading every byte under keys/), crash cases built on disk and by kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from engine.keys import FileKeyStore, KeyStore, MasterKey, write_master_key
from engine.keys.files import bucket_of
from engine.keys.record import encode_record, frame
from schemas.errors import KeyErased, KeyStoreDamaged, StateUnavailable
from schemas.sealed import DataKey, open_sealed, seal

ROOT = Path(__file__).resolve().parents[2]


def _same_bucket(n: int) -> list[str]:
    """``n`` conversation ids in one bucket (so a rewrite must keep the others)."""
    first = "conv-0"
    out = [first]
    i = 1
    while len(out) < n:
        if bucket_of(f"conv-{i}") == bucket_of(first):
            out.append(f"conv-{i}")
        i += 1
    return out


def _all_bytes(path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file())


def _assert_no_key_bytes(path: Path, key: DataKey, master: MasterKey | None = None) -> None:
    data = _all_bytes(path)
    assert key.secret not in data
    assert key.secret.hex().encode() not in data
    assert key.key_id.encode() not in data  # the whole record went, not just the secret


def test_is_a_key_store(tmp_path: Path) -> None:
    with FileKeyStore(tmp_path / "keys") as store:
        assert isinstance(store, KeyStore)


def test_create_is_create_if_absent_and_durable(tmp_path: Path) -> None:
    with FileKeyStore(tmp_path / "keys") as store:
        key = store.create("c")
        assert store.create("c") == key
        assert store.get("c", key.key_id) == key
        other = store.create("d")
        assert other != key
    with FileKeyStore(tmp_path / "keys") as store:
        assert store.get("c", key.key_id) == key and store.create("c") == key
        assert store.list_keys() == sorted([("c", key.key_id), ("d", other.key_id)])
        assert store.list_keys("d") == [("d", other.key_id)]


def test_racing_threads_get_one_key(tmp_path: Path) -> None:
    with FileKeyStore(tmp_path / "keys") as store:
        got: list[DataKey] = []
        barrier = threading.Barrier(8)

        def run() -> None:
            barrier.wait(timeout=10)
            got.append(store.create("race"))

        threads = [threading.Thread(target=run) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=10)
        assert len(got) == 8 and len(set(got)) == 1
        assert store.list_keys("race") == [("race", got[0].key_id)]


def test_destroy_leaves_no_key_byte_in_any_file_and_keeps_the_others(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    victim, *others = _same_bucket(4)
    with FileKeyStore(path) as store:
        keys = {c: store.create(c) for c in [victim, *others]}
        assert keys[victim].secret in _all_bytes(path)  # the proof below can fail
        sealed = seal(keys[victim], b"secret content", conversation_id=victim, append_id="a")
        store.destroy(victim)
        _assert_no_key_bytes(path, keys[victim])
        with pytest.raises(KeyErased) as info:
            store.get(victim, keys[victim].key_id)
        assert info.value.key_id == keys[victim].key_id
        with pytest.raises(KeyErased):
            store.create(victim)
        assert store.erased(victim) and not store.erased(others[0])
        store.destroy(victim)  # idempotent
    with FileKeyStore(path) as store:
        _assert_no_key_bytes(path, keys[victim])
        with pytest.raises(KeyErased):
            store.get(victim, sealed.key_id)
        with pytest.raises(KeyErased):
            store.create(victim)
        for c in others:
            assert store.get(c, keys[c].key_id) == keys[c]


def test_a_key_never_created_is_damage_not_erasure(tmp_path: Path) -> None:
    with FileKeyStore(tmp_path / "keys") as store:
        store.create("c")
        with pytest.raises(KeyStoreDamaged):
            store.get("c", "0" * 32)
        with pytest.raises(KeyStoreDamaged):
            store.get("never", "0" * 32)


def test_destroy_of_a_conversation_without_keys_marks_it(tmp_path: Path) -> None:
    with FileKeyStore(tmp_path / "keys") as store:
        store.destroy("plain")
        with pytest.raises(KeyErased):
            store.create("plain")


def test_torn_tail_at_every_byte_leaves_no_key_or_a_whole_one(tmp_path: Path) -> None:
    first, second = _same_bucket(2)
    path = tmp_path / "keys"
    with FileKeyStore(path) as store:
        k1 = store.create(first)
        k2 = store.create(second)
    bucket = next(path.glob("b-*.keys"))
    full = bucket.read_bytes()
    one = len(frame(encode_record(first, k1)))
    for cut in range(one, len(full) + 1):
        bucket.write_bytes(full[:cut])
        with FileKeyStore(path) as store:
            assert store.get(first, k1.key_id) == k1
            if cut == len(full):
                assert store.get(second, k2.key_id) == k2
            else:
                assert store.list_keys(second) == []
                assert bucket.stat().st_size == one  # the torn tail was truncated
                assert store.create(second) != k2  # and the store takes new keys after it


def test_damage_followed_by_records_is_refused(tmp_path: Path) -> None:
    first, second = _same_bucket(2)
    path = tmp_path / "keys"
    with FileKeyStore(path) as store:
        store.create(first)
        store.create(second)
    bucket = next(path.glob("b-*.keys"))
    data = bytearray(bucket.read_bytes())
    data[12] ^= 0xFF  # inside the first record's body: its CRC fails, a whole record follows
    bucket.write_bytes(bytes(data))
    with pytest.raises(KeyStoreDamaged, match="followed by more records"):
        FileKeyStore(path)


def test_a_damaged_length_field_is_refused_not_truncated(tmp_path: Path) -> None:
    convs = _same_bucket(12)
    path = tmp_path / "keys"
    with FileKeyStore(path) as store:
        for c in convs:
            store.create(c)
    bucket = next(path.glob("b-*.keys"))
    data = bytearray(bucket.read_bytes())
    data[0] = 0x7F  # the first frame claims a length past the end: the other 11 keys must not be cut
    bucket.write_bytes(bytes(data))
    with pytest.raises(KeyStoreDamaged):
        FileKeyStore(path)
    assert bucket.read_bytes() == bytes(data)


def test_reopen_completes_a_destroy_cut_after_its_marker(tmp_path: Path) -> None:
    victim, other = _same_bucket(2)
    path = tmp_path / "keys"
    with FileKeyStore(path) as store:
        kv, ko = store.create(victim), store.create(other)
    bucket = next(path.glob("b-*.keys"))
    with open(bucket, "ab") as f:  # the state a crash between the marker and the rewrite leaves
        f.write(frame(encode_record(victim, None)))
    (path / "b-00.keys.tmp").write_bytes(frame(encode_record(victim, kv)))  # a rewrite cut before its rename
    assert kv.secret in _all_bytes(path)
    with FileKeyStore(path) as store:
        _assert_no_key_bytes(path, kv)
        with pytest.raises(KeyErased):
            store.get(victim, kv.key_id)
        assert store.get(other, ko.key_id) == ko


def test_one_process_at_a_time(tmp_path: Path) -> None:
    with FileKeyStore(tmp_path / "keys"), pytest.raises(StateUnavailable, match="in use"):
        FileKeyStore(tmp_path / "keys")


def test_master_key_wraps_keys_at_rest(tmp_path: Path) -> None:
    master = write_master_key(tmp_path / "master.key")
    path = tmp_path / "keys"
    with FileKeyStore(path, master=master) as store:
        key = store.create("c")
        assert key.secret not in _all_bytes(path)
        plain_before = store.create("d")
    with FileKeyStore(path, master=master) as store:
        assert store.get("c", key.key_id) == key and store.get("d", plain_before.key_id) == plain_before
        store.destroy("c")
    _assert_no_key_bytes(path, key)
    with pytest.raises(KeyStoreDamaged, match="master key"):
        FileKeyStore(path, master=MasterKey(os.urandom(32)))
    with pytest.raises(KeyStoreDamaged, match="master key"):
        FileKeyStore(path)


_CHILD = """
import sys
from pathlib import Path
from engine.keys import FileKeyStore
store = FileKeyStore(Path(sys.argv[1]))
i = int(sys.argv[2])
while True:
    c = f"k9-{i}"
    key = store.create(c)
    print(c, key.key_id, key.secret.hex(), flush=True)
    i += 1
"""


@pytest.mark.parametrize("round_", range(3))
def test_kill_9_during_creates_leaves_no_key_or_whole_ones(tmp_path: Path, round_: int) -> None:
    path = tmp_path / "keys"
    acked: dict[str, tuple[str, str]] = {}
    start = 0
    for kills in range(1, 3):  # two kills on the same store
        child = subprocess.Popen([sys.executable, "-c", _CHILD, str(path), str(start)], stdout=subprocess.PIPE,
                                 env={**os.environ, "PYTHONPATH": str(ROOT)}, text=True)
        assert child.stdout is not None
        deadline = time.monotonic() + 60
        wanted = 5 + 7 * round_
        try:
            while len(acked) < start + wanted and time.monotonic() < deadline:
                line = child.stdout.readline()
                if not line:
                    break
                c, key_id, secret = line.split()
                acked[c] = (key_id, secret)
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)
        # Acknowledged before the kill, read after it; a last line without its newline was cut by the
        # kill and acknowledges nothing.
        for line in child.stdout.read().split("\n")[:-1]:
            c, key_id, secret = line.split()
            acked[c] = (key_id, secret)
        child.stdout.close()
        assert len(acked) >= start + wanted, "the child did not create keys in time"
        start = len(acked) + 1000
        with FileKeyStore(path) as store:  # opens: every frame whole, a torn tail cut
            for c, (key_id, secret) in acked.items():
                key = store.get(c, key_id)
                assert key.secret.hex() == secret
                sealed = seal(key, b"x", conversation_id=c, append_id="a")
                assert open_sealed(key, sealed, conversation_id=c, append_id="a") == b"x"
            unacked = {c for c, _ in store.list_keys()} - set(acked)
            assert len(unacked) <= kills  # at most the create in flight at each kill, and whole (it loaded)
