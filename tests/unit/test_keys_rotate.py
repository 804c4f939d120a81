"""``histlog keys rotate`` (``engine.keys.files.rotate_master_key``) on real data dirs written by
the real engine: the content reads with the new master key, the old one opens nothing (a clear
``KeyStoreDamaged`` naming the key id needed), no old wrapped bytes or plain secrets stay in any
file, a wrong old key changes nothing, a running engine's lock is respected, and a rotation cut
by a crash is finished by running it again (docs/erasure.md §3).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from engine.facade import HistoryEngine
from engine.keys import FileKeyStore, load_master_key
from engine.keys.files import read_frames, rotate_master_key
from schemas.batch import Batch
from schemas.errors import InvalidConfiguration, KeyStoreDamaged
from schemas.messages import Message
from tests.unit.cli_support import Capsys, clean_cli_env, run

CONVERSATIONS = [f"conv-{i}" for i in range(8)]  # spread over several bucket files


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    clean_cli_env(monkeypatch)


def keygen(capsys: Capsys, path: Path) -> Path:
    assert run(capsys, "keygen", str(path))[0] == 0
    return path


def write_history(root: Path, master: Path | None) -> None:
    """One message per conversation, and one more conversation cleared (its marker must stay)."""
    with HistoryEngine.open(root, master_key_file=master) as engine:
        for c in CONVERSATIONS:
            engine.append(Batch(c, "a1", [Message.user(f"words of {c}")]))
        engine.append(Batch("cleared", "a1", [Message.user("erased words")]))
        engine.clear("cleared")


def assert_reads(root: Path, master: Path | None) -> None:
    with HistoryEngine.open(root, master_key_file=master) as engine:
        for c in CONVERSATIONS:
            assert [m.text() for m in engine.read(c)] == [f"words of {c}"]
        assert engine.read("cleared") == []
        assert engine.stats().corrupt == 0


def frames_under(keys: Path) -> list[bytes]:
    return [raw for bucket in sorted(keys.glob("b-*.keys")) for _, raw, _ in read_frames(bucket)[0]]


def all_bytes(keys: Path) -> bytes:
    return b"".join(f.read_bytes() for f in sorted(keys.iterdir()) if f.is_file())


def key_count(keys: Path, master: Path | None) -> int:
    """Data keys on disk: the conversations' and the spares made ahead of them (``engine.keys.pool``)."""
    with FileKeyStore(keys, read_only=True, master=load_master_key(master) if master else None) as store:
        count = len(store.list_keys())
    assert count > len(CONVERSATIONS)
    return count


def test_rotate_rewraps_every_key_and_the_old_master_key_opens_nothing(capsys: Capsys, tmp_path: Path) -> None:
    old, new = keygen(capsys, tmp_path / "old.key"), keygen(capsys, tmp_path / "new.key")
    root = tmp_path / "data"
    write_history(root, old)
    before = frames_under(root / "keys")
    count = key_count(root / "keys", old)
    code, out, err = run(capsys, "--data", str(root), "keys", "rotate", "--old-key", str(old), "--new-key", str(new))
    assert code == 0, err
    new_id, old_id = load_master_key(new).key_id.hex(), load_master_key(old).key_id.hex()
    assert f"{count} data keys now wrapped by master key {new_id}" in out
    assert "1 erasure markers kept" in out and f"master key {old_id} opens nothing" in out
    assert_reads(root, new)
    with pytest.raises(KeyStoreDamaged, match=f"wrapped by master key {new_id}, not by the given one"):
        HistoryEngine.open(root, master_key_file=old)
    with pytest.raises(KeyStoreDamaged, match=f"wrapped by master key {new_id}"):
        HistoryEngine.open(root)
    stored = all_bytes(root / "keys")
    kept = [raw for raw in before if raw in stored]
    assert len(kept) == 1 and b"cleared" in kept[0]  # only the erasure marker is byte-identical


def test_rotate_wraps_an_unwrapped_store_and_unwrap_undoes_it(capsys: Capsys, tmp_path: Path) -> None:
    new = keygen(capsys, tmp_path / "new.key")
    root = tmp_path / "data"
    write_history(root, None)
    with FileKeyStore(root / "keys", read_only=True) as keys:
        secrets = [keys.get(c, k).secret for c, k in keys.list_keys()]
    assert len(secrets) == key_count(root / "keys", None) and all(s in all_bytes(root / "keys") for s in secrets)
    code, out, err = run(capsys, "--data", str(root), "keys", "rotate", "--new-key", str(new))
    assert code == 0, err
    assert not any(s in all_bytes(root / "keys") for s in secrets), "a plain secret is still on disk"
    with pytest.raises(KeyStoreDamaged, match=load_master_key(new).key_id.hex()):
        HistoryEngine.open(root)
    assert_reads(root, new)
    code, out, err = run(capsys, "--data", str(root), "keys", "rotate", "--old-key", str(new), "--unwrap")
    assert code == 0, err
    assert "data keys now unwrapped" in out
    assert_reads(root, None)


def test_a_wrong_old_key_changes_nothing_and_names_the_key_needed(capsys: Capsys, tmp_path: Path) -> None:
    right, wrong, new = (keygen(capsys, tmp_path / f"{n}.key") for n in ("right", "wrong", "new"))
    root = tmp_path / "data"
    write_history(root, right)
    before = {f.name: f.read_bytes() for f in (root / "keys").iterdir()}
    code, _, err = run(capsys, "--data", str(root), "keys", "rotate", "--old-key", str(wrong), "--new-key", str(new))
    assert code == 4
    assert f"wrapped by master key {load_master_key(right).key_id.hex()}" in err and "nothing was rewritten" in err
    code, _, err = run(capsys, "--data", str(root), "keys", "rotate", "--new-key", str(new))
    assert code == 4 and "--old-key FILE" in err
    assert {f.name: f.read_bytes() for f in (root / "keys").iterdir()} == before
    assert_reads(root, right)


def test_rotate_refuses_while_an_engine_holds_the_key_store(capsys: Capsys, tmp_path: Path) -> None:
    new = keygen(capsys, tmp_path / "new.key")
    root = tmp_path / "data"
    write_history(root, None)
    with HistoryEngine.open(root) as engine:
        code, _, err = run(capsys, "--data", str(root), "keys", "rotate", "--new-key", str(new))
        assert code == 4 and "in use by another process" in err
        engine.append(Batch("conv-0", "a2", [Message.user("after the refusal")]))
    with HistoryEngine.open(root) as engine:
        assert len(engine.read("conv-0")) == 2


def test_a_rotation_cut_by_a_crash_is_finished_by_running_it_again(capsys: Capsys, tmp_path: Path) -> None:
    old, new = keygen(capsys, tmp_path / "old.key"), keygen(capsys, tmp_path / "new.key")
    root = tmp_path / "data"
    write_history(root, old)
    keys = root / "keys"
    count = key_count(keys, old)
    master_id = load_master_key(old).key_id

    def wrapping() -> list[Path]:  # the bucket files holding data keys wrapped by the old master key
        return [b for b in sorted(keys.glob("b-*.keys")) if master_id in b.read_bytes()]

    # Each lifetime's refill writes its spares to a random bucket (and the clear's marker holds no
    # key): open lifetimes until three bucket files hold wrapped keys, so the one left unrotated
    # below holds some whatever the draws (two refills may share a bucket, 1 in 256 a pair).
    i = 0
    while len(wrapping()) < 3:
        assert i < 50, "50 refills left fewer than three bucket files holding keys"
        with FileKeyStore(keys, master=load_master_key(old)) as store:
            store.create(f"more-{i}")
        i += 1
    count = key_count(keys, old)
    buckets = wrapping()
    # The crash: a copy rotated whole gives the buckets renamed before it; the rest are still old,
    # and a .tmp of the next bucket was being written.
    done = tmp_path / "rotated-copy"
    shutil.copytree(keys, done)
    assert run(capsys, "--data", str(tmp_path / "unused"), "keys", "rotate", "--old-key", str(old),
               "--new-key", str(new))[0] == 2  # no key store there: refused, nothing created
    assert not (tmp_path / "unused" / "keys").exists()
    rotate_master_key(done, load_master_key(old), load_master_key(new))
    for bucket in buckets[:2]:
        shutil.copyfile(done / bucket.name, bucket)
    (keys / (buckets[2].name + ".tmp")).write_bytes((done / buckets[2].name).read_bytes()[:20])
    with pytest.raises(KeyStoreDamaged, match=load_master_key(old).key_id.hex()):
        HistoryEngine.open(root, master_key_file=new)  # half rotated: the old key is still needed
    code, out, err = run(capsys, "--data", str(root), "keys", "rotate", "--old-key", str(old), "--new-key", str(new))
    assert code == 0, err
    assert f"{count} data keys now wrapped by master key {load_master_key(new).key_id.hex()}" in out
    assert not list(keys.glob("*.tmp"))
    assert_reads(root, new)


def test_rotate_refusals(capsys: Capsys, tmp_path: Path) -> None:
    key = keygen(capsys, tmp_path / "a.key")
    root = tmp_path / "data"
    write_history(root, key)
    code, _, err = run(capsys, "--data", str(root), "keys", "rotate", "--old-key", str(key), "--new-key", str(key))
    assert code == 2 and "the new master key is the old one" in err
    code, _, err = run(capsys, "--data", str(root), "keys", "rotate", "--old-key", str(key))
    assert code == 2 and "--new-key FILE" in err
    code, _, err = run(capsys, "--kafka", "127.0.0.1:9", "--state", str(tmp_path / "s"), "keys", "rotate",
                       "--new-key", str(key))
    assert code == 2 and "Kafka keys topic is not built" in err
    assert not (tmp_path / "s").exists()
    with pytest.raises(InvalidConfiguration, match="no key store"):
        rotate_master_key(tmp_path / "nowhere", None, load_master_key(key))
    assert_reads(root, key)
