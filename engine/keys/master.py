"""The optional master key that wraps data keys at rest, and its file.

**File format** (``histlog keygen FILE`` writes it; mode 0600; ``docs/erasure.md``)::

    # histlog master key v1: 32 random bytes in hex. Keep it secret, back it up apart from the data.
    <64 lowercase hex digits>

Exactly these two lines (each ending in ``\\n``). ``load_master_key`` refuses anything else, and a
file that group or others may read (like ssh does for private keys), with ``InvalidConfiguration``
naming the file and the fix, before any key is read or written.

**Wrapping** a data key's secret: ``nonce (12 random bytes) | AES-256-GCM(master, nonce, secret,
b"histlog key wrap v1" + conversation id + key id)`` (48 bytes: secret + tag), so a wrapped secret
cannot be moved to another key id. A key store record names the master key by its id
(``MasterKey.key_id``: the first 8 bytes of HMAC-SHA256(master, b"histlog master key id")), so
opening with the wrong master key says which one is needed instead of failing to decrypt.

Rotation: ``histlog keys rotate`` (``engine.keys.files.rotate_master_key``) rewrites every record
of the embedded store under another master key (or unwrapped), bucket by bucket with an fsynced
rename; the Kafka keys topic cannot be rotated yet (docs/erasure.md §3).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from schemas.entropy import random_bytes
from schemas.errors import InvalidConfiguration, KeyStoreDamaged
from schemas.sealed import NONCE_BYTES, SECRET_BYTES

__all__ = ["ENV_MASTER_KEY_FILE", "HEADER", "WRAPPED_BYTES", "MasterKey", "load_master_key",
           "master_key_from", "write_master_key"]

ENV_MASTER_KEY_FILE: Final = "HISTLOG_MASTER_KEY_FILE"
HEADER: Final = "# histlog master key v1: 32 random bytes in hex. Keep it secret, back it up apart from the data."
WRAPPED_BYTES: Final = NONCE_BYTES + SECRET_BYTES + 16
"""A wrapped secret: nonce, then the secret encrypted with its 16-byte tag."""
_HEX: Final = re.compile(r"[0-9a-f]{64}")
_WRAP_TAG: Final = b"histlog key wrap v1"


def _ad(conversation_id: str, key_id: str) -> bytes:
    conv = conversation_id.encode("utf-8")
    return _WRAP_TAG + len(conv).to_bytes(4, "big") + conv + key_id.encode("ascii")


@dataclass(frozen=True, slots=True, repr=False)
class MasterKey:
    """A 32-byte master key. ``repr`` shows only its id."""

    secret: bytes
    key_id: bytes = field(init=False)
    _aead: AESGCM = field(init=False, compare=False)

    def __post_init__(self) -> None:
        if type(self.secret) is not bytes or len(self.secret) != SECRET_BYTES:
            raise ValueError(f"a master key is {SECRET_BYTES} bytes")
        object.__setattr__(self, "key_id", hmac.new(self.secret, b"histlog master key id", hashlib.sha256).digest()[:8])
        object.__setattr__(self, "_aead", AESGCM(self.secret))

    def wrap(self, secret: bytes, *, conversation_id: str, key_id: str) -> bytes:
        nonce = random_bytes(NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, secret, _ad(conversation_id, key_id))

    def unwrap(self, wrapped: bytes, *, conversation_id: str, key_id: str, where: str) -> bytes:
        """The secret; ``KeyStoreDamaged`` when the wrapped bytes do not open under this key."""
        try:
            secret = self._aead.decrypt(wrapped[:NONCE_BYTES], wrapped[NONCE_BYTES:], _ad(conversation_id, key_id))
        except InvalidTag:
            raise KeyStoreDamaged(f"the wrapped data key {key_id} of {conversation_id!r} ({where}) does not open "
                                  "under the master key: the record is damaged; restore the key store from a "
                                  "backup", where=where) from None
        return secret

    def __repr__(self) -> str:
        return f"MasterKey(key_id={self.key_id.hex()!r})"


def write_master_key(path: Path) -> MasterKey:
    """Create ``path`` (mode 0600, refusing to overwrite) with a new random master key; fsynced."""
    key = MasterKey(os.urandom(SECRET_BYTES))
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise InvalidConfiguration(f"{path} already exists: histlog keygen never overwrites a key (the data "
                                   "keys it wraps would be lost); choose another path") from None
    except OSError as exc:
        raise InvalidConfiguration(f"cannot create master key file {path}: {exc.strerror}") from None
    try:
        os.write(fd, f"{HEADER}\n{key.secret.hex()}\n".encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    dir_fd = os.open(path.parent if str(path.parent) else Path("."), os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return key


def load_master_key(path: Path) -> MasterKey:
    """Read a master key file (the format above); ``InvalidConfiguration`` for anything else."""
    try:
        mode = path.stat().st_mode
        text = path.read_bytes()
    except OSError as exc:
        raise InvalidConfiguration(f"cannot read master key file {path}: {exc.strerror}; "
                                   "create one with `histlog keygen FILE`") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise InvalidConfiguration(f"master key file {path} is accessible by group or others "
                                   f"(mode {stat.S_IMODE(mode):o}); fix: chmod 600 {path}")
    lines = text.split(b"\n")
    well_formed = (len(lines) == 3 and lines[0] == HEADER.encode("ascii") and lines[2] == b""
                   and _HEX.fullmatch(lines[1].decode("ascii", "replace")) is not None)
    if not well_formed:
        raise InvalidConfiguration(f"{path} is not a histlog master key file (expected the line {HEADER!r} "
                                   "then 64 lowercase hex digits); create one with `histlog keygen FILE`")
    return MasterKey(bytes.fromhex(lines[1].decode("ascii")))


def master_key_from(master_key_file: str | Path | None, env: Mapping[str, str] | None = None) -> MasterKey | None:
    """The master key ``open`` uses: ``master_key_file``, else ``$HISTLOG_MASTER_KEY_FILE``, else none."""
    chosen = master_key_file if master_key_file is not None else (env if env is not None else os.environ).get(
        ENV_MASTER_KEY_FILE) or None
    return None if chosen is None else load_master_key(Path(chosen))
