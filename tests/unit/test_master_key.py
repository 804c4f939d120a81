"""The master key file (engine/keys/master.py) and ``histlog keygen FILE``: the documented format,
mode 0600, never overwriting, refusing foreign or world-readable files, ``HISTLOG_MASTER_KEY_FILE``."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from engine.cli import main
from engine.keys import ENV_MASTER_KEY_FILE, load_master_key, master_key_from, write_master_key
from engine.keys.master import HEADER
from schemas.errors import InvalidConfiguration, KeyStoreDamaged


def test_keygen_writes_the_documented_format_with_mode_0600(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "master.key"
    assert main(["keygen", str(path)]) == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    header, hexkey, end = path.read_text(encoding="ascii").split("\n")
    assert header == HEADER and len(hexkey) == 64 and end == ""
    key = load_master_key(path)
    assert key.secret == bytes.fromhex(hexkey)
    out = capsys.readouterr().out
    assert key.key_id.hex() in out and hexkey not in out


def test_keygen_refuses_to_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "master.key"
    path.write_text("precious")
    assert main(["keygen", str(path)]) == 2
    assert path.read_text() == "precious"
    assert "already exists" in capsys.readouterr().err


def test_two_keys_differ(tmp_path: Path) -> None:
    assert write_master_key(tmp_path / "a").secret != write_master_key(tmp_path / "b").secret


@pytest.mark.parametrize("text", ["", HEADER + "\n" + "ab" * 31 + "\n", HEADER + "\n" + "AB" * 32 + "\n",
                                  HEADER + "\n" + "ab" * 32, "# other\n" + "ab" * 32 + "\n",
                                  HEADER + "\n" + "ab" * 32 + "\n\n"])
def test_foreign_files_are_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "k"
    path.write_text(text)
    path.chmod(0o600)
    with pytest.raises(InvalidConfiguration, match="not a histlog master key file"):
        load_master_key(path)


def test_a_file_others_may_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "k"
    write_master_key(path)
    path.chmod(0o644)
    with pytest.raises(InvalidConfiguration, match="chmod 600"):
        load_master_key(path)


def test_missing_file_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfiguration, match="histlog keygen"):
        load_master_key(tmp_path / "absent")


def test_argument_wins_over_the_environment(tmp_path: Path) -> None:
    a, b = write_master_key(tmp_path / "a"), write_master_key(tmp_path / "b")
    env = {ENV_MASTER_KEY_FILE: str(tmp_path / "b")}
    assert master_key_from(tmp_path / "a", env) == a
    assert master_key_from(None, env) == b
    assert master_key_from(None, {}) is None
    assert repr(a).count(a.secret.hex()) == 0 and a.key_id.hex() in repr(a)


def test_wrapping_binds_the_key_id(tmp_path: Path) -> None:
    key = write_master_key(tmp_path / "a")
    wrapped = key.wrap(os.urandom(32), conversation_id="c", key_id="0" * 32)
    with pytest.raises(KeyStoreDamaged, match="does not open"):
        key.unwrap(wrapped, conversation_id="c", key_id="1" * 32, where="test")

