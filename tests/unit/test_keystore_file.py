"""The embedded key store (engine/keys/files.py) against its contract (engine/keys/base.py), on
real files: durable spares bound in memory, conversations' own keys (what releases before spares
wrote, built on disk here), erasure that leaves no key byte in any file (checked by reading every
byte under keys/), crash cases built on disk and by kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from engine.keys import FileKeyStore, KeyStore, MasterKey, write_master_key
from engine.keys.files import bucket_of, spare_bucket
from engine.keys.pool import BATCH
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


def _own_keys(path: Path, convs: list[str], master: MasterKey | None = None) -> dict[str, DataKey]:
    """Conversations' own key records, appended to their buckets as releases before spares wrote them."""
    path.mkdir(parents=True, exist_ok=True)
    keys = {c: DataKey.generate() for c in convs}
    for c, key in keys.items():
        with open(path / f"b-{bucket_of(c):02x}.keys", "ab") as f:
            f.write(frame(encode_record(c, key, master)))
    return keys


def _stats(path: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in path.iterdir()}


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


def test_create_binds_a_durable_spare_for_this_lifetime(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    with FileKeyStore(path) as store:
        key = store.create("c")
        assert store.create("c") == key and store.get("c", key.key_id) == key
        other = store.create("d")
        assert other != key
        assert store.known("c") and store.known("never-seen")  # spares are left: no I/O for a new one
        assert ("c", key.key_id) in store.list_keys() and store.list_keys("d") == [("d", other.key_id)]
        # The refill made BATCH spares of one bucket durable before handing any out.
        bucket = path / f"b-{spare_bucket(key.key_id):02x}.keys"
        assert key.secret in bucket.read_bytes() and other.secret in bucket.read_bytes()
        assert len(store.list_keys()) >= BATCH
    with FileKeyStore(path) as store:
        # Survives the process: served to the records that name it, never handed out again.
        assert store.get("c", key.key_id) == key and store.get("d", other.key_id) == other
        again = store.create("c")
        assert again not in (key, other)
        assert ("", key.key_id) in store.list_keys() and ("c", again.key_id) in store.list_keys()


def test_a_spare_is_handed_out_with_its_keys_derived(tmp_path: Path) -> None:
    """The refill derives each spare's AES and MAC keys, so a new conversation's first seal
    does not; a key loaded from the file (another lifetime's) derives on first use."""
    with FileKeyStore(tmp_path / "keys") as store:
        key = store.create("c")
        assert key._derived  # derived by the refill thread, before the take
        sealed = seal(key, b"[]", conversation_id="c", append_id="a")
    with FileKeyStore(tmp_path / "keys") as store:
        loaded = store.get("c", key.key_id)
        assert not loaded._derived
        assert open_sealed(loaded, sealed, conversation_id="c", append_id="a") == b"[]"
        assert loaded._derived


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


def test_many_new_conversations_at_once_each_get_their_own_key(tmp_path: Path) -> None:
    with FileKeyStore(tmp_path / "keys") as store:
        got: dict[str, DataKey] = {}
        lock = threading.Lock()

        def run(t: int) -> None:
            for i in range(3 * BATCH // 8):
                key = store.create(f"c-{t}-{i}")
                with lock:
                    got[f"c-{t}-{i}"] = key

        threads = [threading.Thread(target=run, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert len(got) == 3 * BATCH and len({k.key_id for k in got.values()}) == 3 * BATCH  # refilled, never shared
    with FileKeyStore(tmp_path / "keys") as store:
        assert all(store.get(c, k.key_id) == k for c, k in got.items())


def test_destroy_leaves_no_key_byte_in_any_file_and_keeps_the_others(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    victim, *others = _same_bucket(4)
    with FileKeyStore(path) as store:
        keys = {c: store.create(c) for c in [victim, *others]}
        assert len({spare_bucket(k.key_id) for k in keys.values()}) == 1  # one refill: one bucket file
        assert keys[victim].secret in _all_bytes(path)  # the proof below can fail
        sealed = seal(keys[victim], b"secret content", conversation_id=victim, append_id="a")
        store.destroy(victim)  # its binding goes with it
        _assert_no_key_bytes(path, keys[victim])
        with pytest.raises(KeyErased) as info:
            store.get(victim, keys[victim].key_id)
        assert info.value.key_id == keys[victim].key_id
        with pytest.raises(KeyErased):
            store.create(victim)
        assert store.erased(victim) and not store.erased(others[0]) and not store.known(victim)
        store.destroy(victim)  # idempotent
    with FileKeyStore(path) as store:
        _assert_no_key_bytes(path, keys[victim])
        with pytest.raises(KeyErased):
            store.get(victim, sealed.key_id)
        with pytest.raises(KeyErased):
            store.create(victim)
        for c in others:
            assert store.get(c, keys[c].key_id) == keys[c]


def test_destroy_in_a_later_lifetime_takes_the_key_ids_the_log_names(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    with FileKeyStore(path) as store:
        first, kept = store.create("c"), store.create("k")
    with FileKeyStore(path) as store:
        second = store.create("c")
        store.destroy("c", [first.key_id, second.key_id, "f" * 32])  # an id that is no live key is ignored
        _assert_no_key_bytes(path, first)
        _assert_no_key_bytes(path, second)
        assert store.get("k", kept.key_id) == kept
    with FileKeyStore(path) as store:
        with pytest.raises(KeyErased):
            store.get("c", first.key_id)
        assert store.get("k", kept.key_id) == kept


def test_a_later_lifetimes_spare_is_not_destroyed_without_its_id(tmp_path: Path) -> None:
    # Which spares a conversation used is in the log, not in the store: destroy removes only what
    # it is told (the state's K rows tell it: tests/reliability/test_erasure_*.py).
    path = tmp_path / "keys"
    with FileKeyStore(path) as store:
        earlier = store.create("c")
    with FileKeyStore(path) as store:
        store.destroy("c")
        assert earlier.secret in _all_bytes(path)
        with pytest.raises(KeyErased):
            store.get("c", earlier.key_id)  # erased whatever the key
        store.destroy("c", [earlier.key_id])
        _assert_no_key_bytes(path, earlier)


def test_destroy_of_an_erased_conversation_with_nothing_left_does_no_io(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    with FileKeyStore(path) as store:
        store.create("c")
        store.destroy("c")
        before = _stats(path)
        store.destroy("c", ["0" * 32])
        store.destroy("c")
        assert _stats(path) == before


def test_own_keys_of_older_releases_are_kept_served_and_destroyed(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    victim, other = _same_bucket(2)
    own = _own_keys(path, [victim, other])
    with FileKeyStore(path) as store:
        assert store.create(victim) == own[victim]  # its records need it: it stays the conversation's key
        assert store.get(other, own[other].key_id) == own[other]
        store.destroy(victim)
        _assert_no_key_bytes(path, own[victim])
        assert store.get(other, own[other].key_id) == own[other]


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


def _one_refill(path: Path) -> tuple[Path, list[DataKey]]:
    with FileKeyStore(path) as store:
        store.create("c")
        spares = [store.get("", k) for _, k in store.list_keys()]
    (bucket,) = path.glob("b-*.keys")
    data = bucket.read_bytes()
    return bucket, sorted(spares, key=lambda k: data.index(k.key_id.encode()))  # in file order


def test_torn_tail_of_a_refill_keeps_its_whole_spares_and_cuts_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    bucket, spares = _one_refill(path)
    full = bucket.read_bytes()
    one = len(full) // len(spares)
    assert one * len(spares) == len(full)
    cuts = sorted({*range(0, 2 * one + 1), *range(len(full) - one, len(full) + 1), *range(0, len(full), 997)})
    for cut in cuts:
        bucket.write_bytes(full[:cut])
        with FileKeyStore(path) as store:
            whole = cut // one
            assert len(store.list_keys()) == whole
            assert bucket.stat().st_size == whole * one  # the torn tail was truncated
            assert all(store.get("x", k.key_id) == k for k in spares[:whole])  # spares serve any conversation's records
    bucket.write_bytes(full[:one + 5])
    with FileKeyStore(path) as store:
        assert store.create("new") not in spares  # and the store takes new keys after it


def test_damage_followed_by_records_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    bucket, _ = _one_refill(path)
    data = bytearray(bucket.read_bytes())
    data[12] ^= 0xFF  # inside the first record's body: its CRC fails, whole records follow
    bucket.write_bytes(bytes(data))
    with pytest.raises(KeyStoreDamaged, match="followed by more records"):
        FileKeyStore(path)


def test_a_damaged_length_field_is_refused_not_truncated(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    bucket, _ = _one_refill(path)
    data = bytearray(bucket.read_bytes())
    data[0] = 0x7F  # the first frame claims a length past the end: the other keys must not be cut
    bucket.write_bytes(bytes(data))
    with pytest.raises(KeyStoreDamaged):
        FileKeyStore(path)
    assert bucket.read_bytes() == bytes(data)


def test_reopen_completes_a_destroy_cut_after_its_marker(tmp_path: Path) -> None:
    victim, other = _same_bucket(2)
    path = tmp_path / "keys"
    own = _own_keys(path, [victim, other])
    kv, ko = own[victim], own[other]
    bucket = path / f"b-{bucket_of(victim):02x}.keys"
    with open(bucket, "ab") as f:  # the state a crash between the marker and the rewrite leaves
        f.write(frame(encode_record(victim, None)))
    (path / "b-00.keys.tmp").write_bytes(frame(encode_record(victim, kv)))  # a rewrite cut before its rename
    assert kv.secret in _all_bytes(path)
    with FileKeyStore(path) as store:
        _assert_no_key_bytes(path, kv)
        with pytest.raises(KeyErased):
            store.get(victim, kv.key_id)
        assert store.get(other, ko.key_id) == ko


def test_a_failed_refill_is_raised_to_the_creator_and_fail_stops(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    with FileKeyStore(path) as store:
        blocked = [path / f"b-{b:02x}.keys" for b in range(256)]
        for p in blocked:
            p.mkdir()  # no bucket file can be written (even by root): every refill fails
        try:
            with pytest.raises(StateUnavailable, match="cannot write the key store"):
                store.create("c")
        finally:
            for p in blocked:
                p.rmdir()
        with pytest.raises(StateUnavailable, match="reopen"):
            store.create("c")  # fail-stop: a failed append leaves the file unknown until reopened
    with FileKeyStore(path) as store:
        key = store.create("c")
        assert store.get("c", key.key_id) == key


def test_a_read_only_store_sees_spares_made_after_it_opened(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    with FileKeyStore(path) as writer:
        writer.create("first")
        with FileKeyStore(path, read_only=True) as reader:
            writer.destroy("first")  # a destroy rewrites the bucket: the reader reloads it
            key = writer.create("later")
            assert reader.get("later", key.key_id) == key
            with pytest.raises(StateUnavailable, match="read-only"):
                reader.create("x")


def test_a_read_only_reload_drops_what_the_writer_removed_and_keeps_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    with FileKeyStore(path) as writer:
        key = writer.create("first")  # a spare of one refill: BATCH spares in bucket spare_bucket(key)
        with FileKeyStore(path, read_only=True) as reader:
            before = reader.list_keys()
            assert ("", key.key_id) in before
            writer.destroy("first", [key.key_id])  # rewrites that bucket without the key
            unknown = f"{spare_bucket(key.key_id):02x}" + "0" * 30  # a miss in the same bucket: a reload
            with pytest.raises(KeyStoreDamaged, match="no key"):
                reader.get("other", unknown)
            assert reader.list_keys() == [k for k in before if k != ("", key.key_id)]


def test_opening_a_store_does_work_linear_in_its_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each bucket is loaded once, never by scanning the keys other buckets loaded (that scan
    made an open O(buckets x keys): 9 of 12 s for 100,000 keys)."""
    import engine.keys.files as files

    path = tmp_path / "keys"
    with FileKeyStore(path) as store:
        for i in range(20 * BATCH):  # 20 refills, each in its own random bucket
            store.create(f"c-{i}")
    calls = [0]

    def counted(f: Callable[[str], int]) -> Callable[[str], int]:
        def wrapper(arg: str) -> int:
            calls[0] += 1
            return f(arg)
        return wrapper

    monkeypatch.setattr(files, "spare_bucket", counted(files.spare_bucket))
    monkeypatch.setattr(files, "bucket_of", counted(files.bucket_of))
    with FileKeyStore(path) as store:
        assert len(store.list_keys()) >= 20 * BATCH
    assert calls[0] <= 20 * BATCH  # at most one bucket computation per key (the old scan: ~128 per key)


def test_one_process_at_a_time(tmp_path: Path) -> None:
    with FileKeyStore(tmp_path / "keys"), pytest.raises(StateUnavailable, match="in use"):
        FileKeyStore(tmp_path / "keys")


def test_master_key_wraps_keys_at_rest(tmp_path: Path) -> None:
    master = write_master_key(tmp_path / "master.key")
    path = tmp_path / "keys"
    plain_before = _own_keys(path, ["d"])["d"]  # written before the master key was set: still read
    with FileKeyStore(path, master=master) as store:
        key = store.create("c")
        assert key.secret not in _all_bytes(path)
    with FileKeyStore(path, master=master) as store:
        assert store.get("c", key.key_id) == key and store.get("d", plain_before.key_id) == plain_before
        store.destroy("c", [key.key_id])
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
            # Every key on disk is whole (it loaded); the unbound ones are spares no create returned.
            listed = store.list_keys()
            assert {k for _, k in listed} >= {key_id for key_id, _ in acked.values()}
            assert len(listed) - len(acked) <= kills * 2 * BATCH
