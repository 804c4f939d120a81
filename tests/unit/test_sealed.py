"""Sealed content (schemas/sealed.py): round trip, and every tampering or wrong key is a typed
``DecryptionFailed`` (a ``CorruptLog``: poison), never a wrong plaintext or an untyped error."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.errors import CorruptLog, DecryptionFailed
from schemas.sealed import (
    MAC_BYTES,
    NONCE_BYTES,
    SEALED_BATCH,
    SEALED_REPLACED,
    TAG_BYTES,
    DataKey,
    Sealed,
    associated_data,
    key_id_problem,
    open_sealed,
    seal,
)

KEY = DataKey.generate()
OTHER = DataKey.generate()
CONTENT = b'[{"parts":[{"kind":"text","text":"hello"}],"role":"user"}]'
ids = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=20)


def _open(sealed: Sealed, key: DataKey = KEY, c: str = "c", a: str = "a", record: str = SEALED_BATCH) -> bytes:
    return open_sealed(key, sealed, conversation_id=c, append_id=a, record=record)


@settings(max_examples=200, deadline=None)
@given(content=st.binary(max_size=2000), c=ids, a=ids)
def test_round_trip(content: bytes, c: str, a: str) -> None:
    sealed = seal(KEY, content, conversation_id=c, append_id=a)
    assert len(sealed.nonce) == NONCE_BYTES and len(sealed.mac) == MAC_BYTES
    assert len(sealed.ciphertext) == len(content) + TAG_BYTES
    assert open_sealed(KEY, sealed, conversation_id=c, append_id=a) == content


def test_same_content_gives_new_ciphertext_but_same_mac() -> None:
    one, two = (seal(KEY, CONTENT, conversation_id="c", append_id="a") for _ in range(2))
    assert one.nonce != two.nonce and one.ciphertext != two.ciphertext
    assert one.mac == two.mac == KEY.mac(CONTENT)
    assert OTHER.mac(CONTENT) != KEY.mac(CONTENT)


def test_ciphertext_holds_no_plaintext() -> None:
    content = b"unguessable-0123456789abcdef" * 4
    sealed = seal(KEY, content, conversation_id="c", append_id="a")
    assert b"unguessable" not in sealed.ciphertext + sealed.mac + sealed.nonce


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_any_changed_byte_of_nonce_ciphertext_or_mac_fails(data: st.DataObject) -> None:
    sealed = seal(KEY, CONTENT, conversation_id="c", append_id="a")
    name = data.draw(st.sampled_from(["nonce", "ciphertext", "mac"]))
    raw = bytearray(getattr(sealed, name))
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] ^= data.draw(st.integers(1, 255))
    with pytest.raises(DecryptionFailed) as info:
        _open(dataclasses.replace(sealed, **{name: bytes(raw)}))
    assert isinstance(info.value, CorruptLog) and info.value.reason.startswith("decryption failed")


@settings(max_examples=100, deadline=None)
@given(c=ids, a=ids)
def test_moving_to_another_record_fails(c: str, a: str) -> None:
    sealed = seal(KEY, CONTENT, conversation_id="c", append_id="a")
    if (c, a) != ("c", "a"):
        with pytest.raises(DecryptionFailed):
            _open(sealed, c=c, a=a)
    with pytest.raises(DecryptionFailed):
        _open(sealed, record=SEALED_REPLACED)


def test_wrong_key_fails() -> None:
    sealed = seal(KEY, CONTENT, conversation_id="c", append_id="a")
    with pytest.raises(DecryptionFailed, match="key id"):
        _open(sealed, key=OTHER)
    # Another secret under the same key id: the tag does not verify.
    impostor = DataKey(KEY.key_id, OTHER.secret)
    with pytest.raises(DecryptionFailed, match="tag"):
        _open(sealed, key=impostor)


@pytest.mark.parametrize("change", ["short nonce", "short mac", "short ciphertext", "truncated", "extended"])
def test_malformed_fields_fail(change: str) -> None:
    s = seal(KEY, CONTENT, conversation_id="c", append_id="a")
    bad = {
        "short nonce": dataclasses.replace(s, nonce=s.nonce[:-1]),
        "short mac": dataclasses.replace(s, mac=s.mac[:-1]),
        "short ciphertext": dataclasses.replace(s, ciphertext=s.ciphertext[:TAG_BYTES - 1]),
        "truncated": dataclasses.replace(s, ciphertext=s.ciphertext[:-1]),
        "extended": dataclasses.replace(s, ciphertext=s.ciphertext + b"\0"),
    }[change]
    with pytest.raises(DecryptionFailed):
        _open(bad)


def test_associated_data_is_injective() -> None:
    assert associated_data(SEALED_BATCH, "ab", "c", KEY.key_id) != associated_data(SEALED_BATCH, "a", "bc", KEY.key_id)


def test_key_validation_and_repr() -> None:
    assert key_id_problem(KEY.key_id) == ""
    assert key_id_problem("ABC") and key_id_problem(3)
    with pytest.raises(ValueError):
        DataKey("0" * 32, b"short")
    with pytest.raises(ValueError):
        DataKey("not hex", bytes(32))
    assert KEY.secret.hex() not in repr(KEY) and KEY.key_id in repr(KEY)
    with pytest.raises(ValueError):
        seal(KEY, CONTENT, conversation_id="c", append_id="a", record="histlog.events.Other/1")


@settings(max_examples=100, deadline=None)
@given(secret=st.binary(min_size=32, max_size=32), content=st.binary(max_size=3000), c=ids, a=ids)
def test_mac_and_associated_data_are_the_documented_constructions(secret: bytes, content: bytes, c: str,
                                                                 a: str) -> None:
    """The wire format, rebuilt from the standard library and the module docstring: the MAC is
    HMAC-SHA256 under HKDF(secret, "... hmac-sha256"), the associated data its length-prefixed
    fields (the fast forms in sealed.py must give exactly these bytes)."""
    import hashlib
    import hmac
    import struct

    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    key = DataKey("0" * 32, secret)
    enc_key, mac_key = (HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(secret)
                        for info in (b"histlog data key v1: aes-256-gcm", b"histlog data key v1: hmac-sha256"))
    assert key.mac(content) == hmac.new(mac_key, content, hashlib.sha256).digest()
    assert key.mac(content) == key.mac(content)  # the pads' states are copied, never consumed
    sealed = seal(key, content, conversation_id=c, append_id=a)
    ad = associated_data(SEALED_BATCH, c, a, key.key_id)
    assert AESGCM(enc_key).decrypt(sealed.nonce, sealed.ciphertext, ad) == content
    assert sealed.mac == hmac.new(mac_key, content, hashlib.sha256).digest()

    def field(value: str) -> bytes:
        return struct.pack(">I", len(value.encode())) + value.encode()

    for record in (SEALED_BATCH, SEALED_REPLACED):
        assert associated_data(record, c, a, key.key_id) == (
            b"histlog sealed v1" + field(record) + field(c) + field(a) + field(key.key_id))


def test_generate_many_makes_valid_distinct_keys_under_a_prefix() -> None:
    made = DataKey.generate_many(300, "a7")
    assert len({k.key_id for k in made}) == len({k.secret for k in made}) == 300
    for key in made:
        assert key.key_id.startswith("a7") and not key_id_problem(key.key_id) and len(key.secret) == 32
        assert key == DataKey(key.key_id, key.secret)  # what validation would have built
        assert open_sealed(key, seal(key, CONTENT, conversation_id="c", append_id="a"),
                           conversation_id="c", append_id="a") == CONTENT
    assert all(not key_id_problem(k.key_id) for k in DataKey.generate_many(3))
    for bad in ("a", "A7", "zz", "0123456789"):
        with pytest.raises(ValueError):
            DataKey.generate_many(1, bad)
