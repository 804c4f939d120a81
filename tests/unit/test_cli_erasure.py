"""The CLI's views of sealed and erased records: ``histlog tail --no-follow`` and ``histlog log
verify`` on a real data dir (file log, RocksDB state, ``keys/``), and the read-only key store they
use (``FileKeyStore(path, read_only=True)``: no lock, no repair, no write).

The data dir holds one record of each kind: a plain append (``seal=False``), a sealed append, a
sealed append whose conversation was cleared (its key destroyed: *erased*), the clear itself, an
undecodable record and a sealed record whose ciphertext was changed (both poison).
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from engine.facade import HistoryEngine
from engine.keys import FileKeyStore, MasterKey
from engine.keys.files import spare_bucket
from schemas.batch import Batch
from schemas.errors import KeyErased, KeyStoreDamaged, StateUnavailable
from schemas.events import BatchAppended, decode_event, encode_event
from schemas.messages import Message
from tests.unit.cli_support import Capsys, clean_cli_env, run

SECRET = "the-sealed-words-7f3a"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    clean_cli_env(monkeypatch)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    with HistoryEngine.open(root, seal=False) as engine:
        engine.append(Batch("p", "a1", [Message.user("plain words")]))
    with HistoryEngine.open(root) as engine:
        engine.append(Batch("s", "a1", [Message.user(SECRET)]))
        engine.append(Batch("e", "a1", [Message.user(SECRET + " erased")]))
        engine.clear("e")
        engine.log.append(b"x", b"not an event")
        sealed = decode_event(engine.log.read(0, 1, 1)[0].value)
        assert isinstance(sealed, BatchAppended) and sealed.sealed is not None
        flipped = bytes([sealed.sealed.ciphertext[0] ^ 1]) + sealed.sealed.ciphertext[1:]
        tampered = dataclasses.replace(sealed, append_id="a2",
                                       sealed=dataclasses.replace(sealed.sealed, ciphertext=flipped))
        engine.log.append(b"s", encode_event(tampered))
    return root


def key_id_of(data: Path, conversation: str) -> str:
    """The key id the conversation's first sealed record names (the log says which key sealed it)."""
    with HistoryEngine.open(data) as engine:
        for record in engine.log.read(0, 0, 100):
            event = decode_event(record.value) if record.value.startswith(b"\xc3\x01") else None
            if isinstance(event, BatchAppended) and event.conversation_id == conversation and event.sealed:
                return event.sealed.key_id
    raise AssertionError(f"no sealed record of {conversation!r}")


def bucket_of_key(keys_dir: Path, key_id: str) -> Path:
    return keys_dir / f"b-{spare_bucket(key_id):02x}.keys"


def files_of(root: Path) -> dict[str, tuple[bytes, int]]:
    return {str(f.relative_to(root)): (f.read_bytes(), f.stat().st_mtime_ns) for f in root.rglob("*") if f.is_file()}


# --------------------------------------------------------------------------- tail


def test_tail_shows_plain_sealed_erased_and_poison_records_and_never_sealed_content(capsys: Capsys,
                                                                                  data: Path) -> None:
    s_key = key_id_of(data, "s")
    code, out, err = run(capsys, "--data", str(data), "tail", "--no-follow", "--lines", "10")
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 6
    plain, sealed, erased, clear, garbage, tampered = lines
    assert "append  p  a1  1 message  sha256:" in plain
    assert f"append  s  a1  1 message  sealed  key {s_key[:8]}…  " in sealed and "content bytes" in sealed
    assert "append  e  a1  1 message  erased  key " in erased and "destroyed" in erased
    assert "poison" not in erased and "sealed  key" not in erased
    assert clear.endswith("clear   e")
    assert "  poison  " in garbage
    assert "  poison  " in tampered and "does not open" in tampered
    assert SECRET not in out and "plain words" not in out


def test_tail_without_a_key_store_keeps_plain_records_as_before(capsys: Capsys, tmp_path: Path) -> None:
    root = tmp_path / "plain"
    with HistoryEngine.open(root, seal=False) as engine:
        engine.append(Batch("c", "a1", [Message.user("x")]))
        engine.clear("c")
    code, out, _ = run(capsys, "--data", str(root), "tail", "--no-follow")
    assert code == 0
    first, second = out.splitlines()
    assert "append  c  a1  1 message  sha256:" in first and first.endswith("…")
    assert second.endswith("clear   c")


# --------------------------------------------------------------------------- log verify


COUNTS = "records: 1 plain, 1 sealed, 1 erased, 1 clear, 0 run, 0 slot, 0 delete, 2 poison, 0 missing key"


def test_log_verify_counts_plain_sealed_erased_and_poison_records(capsys: Capsys, data: Path) -> None:
    before = files_of(data)
    code, out, err = run(capsys, "--data", str(data), "log", "verify")
    assert code == 0, err  # poison is the engine's business (counted, skipped), not damage of the log
    assert "6 records: clean" in out
    assert COUNTS in out and "read-only" in out
    assert "poison at 0:4: " in out and "poison at 0:5: " in out and "does not open" in out
    assert files_of(data) == before, "verify wrote to the data dir"


def test_log_verify_frames_only_skips_the_record_counts(capsys: Capsys, data: Path) -> None:
    bucket_of_key(data / "keys", key_id_of(data, "s")).unlink()  # a missing key is not looked for either
    code, out, _ = run(capsys, "--data", str(data), "log", "verify", "--frames-only")
    assert code == 0 and "6 records: clean" in out and "  records: " not in out and "sealed" not in out


def test_log_verify_reads_the_keys_while_an_engine_holds_them(capsys: Capsys, data: Path) -> None:
    with HistoryEngine.open(data) as engine:
        with pytest.raises(StateUnavailable, match="in use by another process"):
            FileKeyStore(data / "keys")  # the engine's flock is really held
        code, out, err = run(capsys, "--data", str(data), "log", "verify")
        assert code == 0, err
        assert COUNTS in out
        engine.append(Batch("s", "a3", [Message.user("still writable")]))


def test_log_verify_reports_a_sealed_record_whose_key_the_store_lacks(capsys: Capsys, data: Path) -> None:
    bucket_of_key(data / "keys", key_id_of(data, "s")).unlink()  # a lost bucket: s was never erased
    code, out, err = run(capsys, "--data", str(data), "log", "verify")
    assert code == 1
    assert "2 missing key" in out and "missing key at 0:1: " in out and "missing key at 0:5: " in out
    assert "restore DATA/keys from a backup" in err


def test_log_verify_without_the_master_key_says_sealed_records_were_not_opened(capsys: Capsys,
                                                                               tmp_path: Path) -> None:
    key = tmp_path / "master.key"
    assert run(capsys, "keygen", str(key))[0] == 0
    root = tmp_path / "wrapped"
    with HistoryEngine.open(root, master_key_file=key) as engine:
        engine.append(Batch("c", "a1", [Message.user(SECRET)]))
    capsys.readouterr()
    code, out, _ = run(capsys, "--data", str(root), "log", "verify")
    assert code == 0
    assert "records: 0 plain, 1 sealed, 0 erased" in out and "sealed records not opened" in out
    assert "wrapped by master key" in out


def test_log_verify_of_a_data_dir_without_a_key_store(capsys: Capsys, data: Path) -> None:
    shutil.rmtree(data / "keys")
    code, out, _ = run(capsys, "--data", str(data), "log", "verify")
    assert code == 0
    # unopened: not told apart
    assert "records: 1 plain, 3 sealed, 0 erased, 1 clear, 0 run, 0 slot, 0 delete, 1 poison" in out
    assert "no key store at" in out and not (data / "keys").exists()


# --------------------------------------------------------------------------- the read-only key store


def test_a_read_only_store_takes_no_lock_writes_nothing_and_refuses_writes(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    with FileKeyStore(path) as writer:
        key = writer.create("c")
        writer.destroy("gone")
        with FileKeyStore(path, read_only=True) as reader:
            assert reader.get("c", key.key_id) == key
            assert reader.erased("gone") and not reader.erased("c")
            with pytest.raises(KeyErased):
                reader.get("gone", key.key_id)
            with pytest.raises(StateUnavailable, match="read-only"):
                reader.create("d")
            with pytest.raises(StateUnavailable, match="read-only"):
                reader.destroy("c")
            later = writer.create("later")  # created after the reader loaded: found in its bucket file
            assert reader.get("later", later.key_id) == later
            with pytest.raises(KeyStoreDamaged):
                reader.get("never", "0" * 32)


def test_a_read_only_store_neither_cuts_a_torn_tail_nor_completes_a_destroy(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    with FileKeyStore(path) as writer:
        key = writer.create("c")
    bucket = bucket_of_key(path, key.key_id)
    with open(bucket, "ab") as f:
        f.write(b"\x00\x00\x00\x50torn")  # what a create killed mid-write leaves
    (path / "b-00.keys.tmp").write_bytes(b"a rewrite that never reached its rename")
    before = files_of(path)
    with FileKeyStore(path, read_only=True) as reader:
        assert reader.get("c", key.key_id) == key
    assert files_of(path) == before
    with FileKeyStore(path) as writer:  # the writable open repairs both
        assert writer.get("c", key.key_id) == key
    assert not (path / "b-00.keys.tmp").exists() and not bucket.read_bytes().endswith(b"torn")


def test_a_read_only_store_of_a_missing_directory_is_refused_and_not_created(tmp_path: Path) -> None:
    with pytest.raises(StateUnavailable, match="no key store"):
        FileKeyStore(tmp_path / "nowhere", read_only=True)
    assert not (tmp_path / "nowhere").exists()


def test_opening_with_a_wrong_master_key_cuts_no_torn_tail(tmp_path: Path) -> None:
    key_a, key_b = MasterKey(b"a" * 32), MasterKey(b"b" * 32)
    path = tmp_path / "keys"
    with FileKeyStore(path, master=key_a) as writer:
        key = writer.create("c")
    bucket = bucket_of_key(path, key.key_id)
    with open(bucket, "ab") as f:
        f.write(b"\x00\x00\x00\x50torn")
    before = bucket.read_bytes()
    with pytest.raises(KeyStoreDamaged, match=key_a.key_id.hex()):
        FileKeyStore(path, master=key_b)
    assert bucket.read_bytes() == before
