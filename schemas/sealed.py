"""Sealing an event's content: AES-256-GCM under a per-conversation data key, and a keyed MAC.

The one home of the sealed-content wire format (``docs/events.md`` "Sealed content"). Pure: no
I/O; randomness comes from ``os.urandom`` only, in blocks (``schemas.entropy``: nonces, new keys).

**Keys.** A *data key* is one 32-byte random secret named by a *key id* (32 lowercase hex
digits, random, so it says nothing about the content). HKDF-SHA256 (no salt) derives two
independent 32-byte keys from the secret::

    enc_key = HKDF(secret, info=b"histlog data key v1: aes-256-gcm")
    mac_key = HKDF(secret, info=b"histlog data key v1: hmac-sha256")

so destroying the secret destroys both: the ciphertext becomes unreadable and the MAC
unverifiable (it can no longer confirm a guess of the content).

**Sealing** ``content`` (the canonical JSON bytes of an event's messages)::

    nonce      = 12 random bytes (96-bit, never reused: 2**-32 collision risk after 2**32 seals per key)
    ciphertext = AES-256-GCM(enc_key, nonce, content, associated_data) (content + 16-byte tag)
    mac        = HMAC-SHA256(mac_key, content) (32 bytes): the dedup evidence, in place of sha256:

``associated_data`` binds a ciphertext to its record, so it cannot be moved to another
conversation, append id, key id or event type/version (``associated_data`` below: a tag and
four length-prefixed UTF-8 fields). ``open_sealed`` checks the GCM tag, then the MAC against the
decrypted bytes; any failure is ``DecryptionFailed`` (a ``CorruptLog``: the record is poison).
A destroyed key is the caller's ``KeyErased`` (the key store raises it), never a decryption error.

Promises: ``open_sealed(k, seal(k, b, ...), ...) == b``; changing any byte of the nonce,
ciphertext, MAC or associated data, or opening under another key, raises ``DecryptionFailed``
(property tests in tests/unit/test_sealed.py). Equal content under one key gives equal MACs
(``DataKey.mac``), so admission can compare evidence without the plaintext.

Measured (bench/bench_sealed.py): see its docstring; seal + open of a 2-message batch costs a few
microseconds, about the Avro encode of the same event.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import struct
import threading
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from schemas.entropy import random_bytes
from schemas.errors import DecryptionFailed

__all__ = [
    "DERIVED_KEYS",
    "KEY_ID_LENGTH",
    "MAC_BYTES",
    "NONCE_BYTES",
    "SEALED_ASSETS",
    "SEALED_BATCH",
    "SEALED_CHECKPOINTED",
    "SEALED_REPLACED",
    "SECRET_BYTES",
    "TAG_BYTES",
    "DataKey",
    "Sealed",
    "associated_data",
    "key_id_problem",
    "open_sealed",
    "seal",
]

SECRET_BYTES: Final = 32
"""A data key's secret: 32 random bytes (AES-256)."""
NONCE_BYTES: Final = 12
"""AES-GCM nonce: 96 bits, random per seal."""
TAG_BYTES: Final = 16
"""AES-GCM tag appended to the ciphertext."""
MAC_BYTES: Final = 32
"""HMAC-SHA256 output."""
KEY_ID_LENGTH: Final = 32
"""A key id is 32 lowercase hex digits (16 random bytes)."""

SEALED_BATCH: Final = "histlog.events.BatchAppended/3"
"""The record a sealed batch lives in (name/version), part of its associated data."""
SEALED_REPLACED: Final = "histlog.events.TurnReplaced/2"
"""The record a sealed replacement turn lives in (name/version), part of its associated data."""
SEALED_ASSETS: Final = "histlog.events.AssetsLinked/1"
"""The record sealed asset refs live in (name/version); their "append id" is the message id."""
SEALED_CHECKPOINTED: Final = "histlog.events.Checkpointed/1"
"""The record sealed checkpoint content lives in (name/version); its "append id" is the record id."""
_RECORDS: Final = frozenset({SEALED_BATCH, SEALED_REPLACED, SEALED_ASSETS, SEALED_CHECKPOINTED})

DERIVED_KEYS: Final = 16_384
"""At most this many data keys hold their derived state at once (an ``AESGCM`` with its OpenSSL
contexts and two HMAC hash states: about 3 KB a key, 48 MB in all, against about 300 bytes for
the id and secret alone). Deriving more drops the state of the key derived longest ago, which
derives it again on its next use (~9 us). Without the bound a long-running process kept the
state of every key it ever sealed or opened with: 3 GB for a million conversations."""

_AD_TAG: Final = b"histlog sealed v1"
_INFO_ENC: Final = b"histlog data key v1: aes-256-gcm"
_INFO_MAC: Final = b"histlog data key v1: hmac-sha256"
_KEY_ID: Final = re.compile(r"[0-9a-f]{32}")
_XOR_36: Final = bytes(b ^ 0x36 for b in range(256))
_XOR_5C: Final = bytes(b ^ 0x5C for b in range(256))


def key_id_problem(key_id: object) -> str:
    """Why ``key_id`` is no key id (``""`` when it is one): 32 lowercase hex digits."""
    if not isinstance(key_id, str):
        return f"a key id is a str, not {type(key_id).__name__}"
    if not _KEY_ID.fullmatch(key_id):
        return f"a key id is {KEY_ID_LENGTH} lowercase hex digits, not {key_id[:40]!r}"
    return ""


def _derive(secret: bytes) -> tuple[bytes, bytes]:
    """``(enc_key, mac_key)``: HKDF-SHA256 (RFC 5869) with no salt, 32 bytes each, written out:
    one extract (``PRK = HMAC(32 zero bytes, secret)``) serves both expands (``T(1) =
    HMAC(PRK, info | 0x01)``, all a 32-byte output needs). About 4 us instead of two ``HKDF``
    objects' 8; tests/unit/test_sealed.py checks it against ``cryptography``'s HKDF."""
    prk = _hmac(_NO_SALT, secret)
    pads = _hmac_pads(prk)
    return _hmac(pads, _INFO_ENC + b"\x01"), _hmac(pads, _INFO_MAC + b"\x01")


def _hmac_pads(key: bytes) -> tuple[Any, Any]:
    """HMAC-SHA256's two hash states after its padded key blocks (RFC 2104: a key of at most
    64 bytes, zero-padded to SHA-256's block, XOR 0x36 inner and 0x5c outer), made once per key."""
    block = key.ljust(64, b"\0")
    return hashlib.sha256(block.translate(_XOR_36)), hashlib.sha256(block.translate(_XOR_5C))


def _hmac(pads: tuple[Any, Any], message: bytes) -> bytes:
    """HMAC-SHA256 of ``message`` from its key's pads (the states are copied, never changed):
    1.1 us against ``hmac.new``'s 3.6 (tests/unit/test_sealed.py checks it against ``hmac``)."""
    inner, outer = pads[0].copy(), pads[1].copy()
    inner.update(message)
    outer.update(inner.digest())
    digest = outer.digest()
    assert isinstance(digest, bytes)  # Invariant: hashlib digests are bytes.
    return digest


_NO_SALT: Final = _hmac_pads(bytes(32))  # HKDF's extract without a salt: HMAC keyed by 32 zero bytes


@dataclass(frozen=True, slots=True, repr=False, weakref_slot=True)
class DataKey:
    """A conversation's data key: its id, its secret and the two keys derived from it, derived on
    first use (~7 us, then every seal reuses them while it is among the ``DERIVED_KEYS`` derived
    last) or ahead by ``prepare`` (a key store's refill of spares): a key store loads, rewrites
    and rotates records without deriving keys it never seals or opens with. ``repr`` never shows
    key material."""

    key_id: str
    secret: bytes
    _derived: list[tuple[AESGCM, tuple[Any, Any]]] = field(init=False, compare=False,
                                                           default_factory=list)  # [(AESGCM, HMAC pads)]

    def __post_init__(self) -> None:
        problem = key_id_problem(self.key_id)
        if problem:
            raise ValueError(problem)
        if type(self.secret) is not bytes or len(self.secret) != SECRET_BYTES:
            raise ValueError(f"a data key secret is {SECRET_BYTES} bytes")

    def _keys(self) -> tuple[AESGCM, tuple[Any, Any]]:
        """The AESGCM of the encryption key and the MAC key's HMAC pads: derived on first use and
        kept while this key is among the ``DERIVED_KEYS`` derived last (``_Derived``)."""
        try:
            return self._derived[0]  # atomic: the state, or IndexError once dropped (or never made)
        except IndexError:
            return _DERIVED.derive(self)

    def prepare(self) -> None:
        """Derive the AES and MAC keys now rather than on first use (a key store's refill does it
        for its spares, off the write path: 7-8 us a key, 15-20 in a busy process)."""
        self._keys()

    @classmethod
    def generate(cls) -> DataKey:
        """A new random key with a new random key id."""
        return cls.generate_many(1)[0]

    @classmethod
    def generate_many(cls, n: int, prefix: str = "") -> list[DataKey]:
        """``n`` new random keys whose ids start with ``prefix`` (lowercase hex digits, an even
        count, at most 8): one draw from the OS for all of them, and no validation of what is
        valid by construction (1.5 us a key instead of 4.5: a key store's refill makes 256)."""
        if len(prefix) % 2 or len(prefix) > 8 or key_id_problem(prefix.ljust(KEY_ID_LENGTH, "0")):
            raise ValueError(f"a key id prefix is at most 8 lowercase hex digits, an even count, not {prefix!r}")
        width = KEY_ID_LENGTH // 2 - len(prefix) // 2
        step = width + SECRET_BYTES
        raw = random_bytes(n * step)
        made = []
        for at in range(0, n * step, step):
            key = object.__new__(cls)
            object.__setattr__(key, "key_id", prefix + raw[at:at + width].hex())
            object.__setattr__(key, "secret", raw[at + width:at + step])
            object.__setattr__(key, "_derived", [])
            made.append(key)
        return made

    def mac(self, content: bytes) -> bytes:
        """HMAC-SHA256 of ``content`` under this key's MAC key: the dedup evidence."""
        return _hmac(self._keys()[1], content)

    def __repr__(self) -> str:
        return f"DataKey(key_id={self.key_id!r})"


class _Derived:
    """The keys holding derived state, oldest first, at most ``limit``: a key past the bound has
    its state dropped (its ``_derived`` list emptied), so it derives again on its next use. A
    hit costs nothing here (``DataKey._keys`` reads the key's own list); only a derivation takes
    the lock. Order is by derivation, not by use: a key in constant use is dropped once every
    ``limit`` derivations and costs one derivation more, which is cheaper than bookkeeping on
    every seal. Held by weak reference: a key no store holds any more (destroyed) takes its
    state with it, never kept alive here."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._order: deque[weakref.ref[DataKey]] = deque()

    def derive(self, key: DataKey) -> tuple[AESGCM, tuple[Any, Any]]:
        enc_key, mac_key = _derive(key.secret)
        made = (AESGCM(enc_key), _hmac_pads(mac_key))
        with self._lock:
            if key._derived:  # another thread derived it meanwhile: the same keys, its state stays
                return key._derived[0]
            key._derived.append(made)
            self._order.append(weakref.ref(key))
            while len(self._order) > self.limit:
                old = self._order.popleft()()
                if old is not None:
                    old._derived.clear()
        return made

    def __len__(self) -> int:
        """How many keys hold derived state now (what the bound bounds)."""
        with self._lock:
            return sum(1 for ref in self._order if (key := ref()) is not None and key._derived)


_DERIVED: Final = _Derived(DERIVED_KEYS)


@dataclass(frozen=True, slots=True)
class Sealed:
    """The sealed form of one event's content, as the event's fields carry it."""

    key_id: str
    nonce: bytes
    ciphertext: bytes
    mac: bytes


def _field(value: str) -> bytes:
    raw = value.encode("utf-8")
    return len(raw).to_bytes(4, "big") + raw


_AD_PREFIX: Final = {record: _AD_TAG + _field(record) for record in _RECORDS}


def associated_data(record: str, conversation_id: str, append_id: str, key_id: str) -> bytes:
    """The AES-GCM associated data of a sealed event::

        b"histlog sealed v1" | u32be len + record | u32be len + conversation id
                             | u32be len + append id | u32be len + key id

    (``record`` is ``SEALED_BATCH``, ``SEALED_REPLACED`` or ``SEALED_ASSETS``: the event's name
    and schema version; for asset refs the "append id" is the message id.)
    Length prefixes make the encoding injective: no two field tuples give the same bytes."""
    c, a, k = conversation_id.encode("utf-8"), append_id.encode("utf-8"), key_id.encode("utf-8")
    return b"".join((_AD_PREFIX[record], _U32(len(c)), c, _U32(len(a)), a, _U32(len(k)), k))


_U32: Final = struct.Struct(">I").pack


def _check_record(record: str) -> None:
    if record not in _RECORDS:
        raise ValueError(f"record must be one of {sorted(_RECORDS)}, not {record!r}")


def seal(key: DataKey, content: bytes, *, conversation_id: str, append_id: str,
         record: str = SEALED_BATCH) -> Sealed:
    """Encrypt ``content`` under ``key`` for the record (conversation, append id, record type).

    A fresh random nonce each call, so sealing the same content twice gives different
    ciphertexts but the same MAC."""
    _check_record(record)
    nonce = random_bytes(NONCE_BYTES)
    ad = associated_data(record, conversation_id, append_id, key.key_id)
    aead, pads = key._keys()
    return Sealed(key.key_id, nonce, aead.encrypt(nonce, content, ad), _hmac(pads, content))


def _failed(reason: str, conversation_id: str, append_id: str) -> DecryptionFailed:
    return DecryptionFailed(
        f"sealed content of ({conversation_id!r}, {append_id!r}) does not open: {reason}; the record "
        "was changed or moved, or sealed under another key (it is poison, not erased)",
        reason=f"decryption failed: {reason}")


def open_sealed(key: DataKey, sealed: Sealed, *, conversation_id: str, append_id: str,
                record: str = SEALED_BATCH) -> bytes:
    """The content ``sealed`` holds, after checking its GCM tag and its MAC.

    Raises ``DecryptionFailed`` when the key id is not ``key``'s, the nonce or MAC has the wrong
    length, the tag does not verify (any changed byte of nonce, ciphertext or associated data,
    or another key) or the MAC does not match the decrypted bytes."""
    _check_record(record)
    if sealed.key_id != key.key_id:
        raise _failed(f"key id {sealed.key_id!r} is not the given key's {key.key_id!r}", conversation_id, append_id)
    if len(sealed.nonce) != NONCE_BYTES or len(sealed.mac) != MAC_BYTES:
        raise _failed(f"nonce must be {NONCE_BYTES} bytes and mac {MAC_BYTES}", conversation_id, append_id)
    if len(sealed.ciphertext) < TAG_BYTES:
        raise _failed(f"ciphertext shorter than its {TAG_BYTES}-byte tag", conversation_id, append_id)
    ad = associated_data(record, conversation_id, append_id, key.key_id)
    aead, pads = key._keys()
    try:
        content = aead.decrypt(sealed.nonce, sealed.ciphertext, ad)
    except InvalidTag:
        raise _failed("the AES-GCM tag does not verify", conversation_id, append_id) from None
    if not hmac.compare_digest(_hmac(pads, content), sealed.mac):
        raise _failed("the MAC does not match the decrypted content", conversation_id, append_id)
    return content
