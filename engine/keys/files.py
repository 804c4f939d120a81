"""The embedded key store: ``path/keys/``, append-only bucket files, fsynced (contract: ``base``).

Layout: ``keys/LOCK`` (an ``flock``: one process at a time) and up to 256 bucket files
``keys/b-XX.keys``, each a sequence of frames ``u32 length | u32 CRC32C | record``
(``engine.keys.record``). A *spare* key (no conversation id: ``engine.keys.pool``) lives in the
bucket its key id's first two hex digits name; a conversation's own key (what releases before
spares wrote) and its erasure marker in bucket ``XX`` = hex of CRC32 of the conversation id's
UTF-8, low byte.

* ``create`` hands out a spare (``SparePool.take``), made durable ahead by the pool's refill:
  ``BATCH`` spares of one bucket appended in one write and fsynced once (and the directory when
  the file is new) before any is handed out, so a returned key survives kill -9 and power loss
  and no create waits for an fsync while spares are left.
* ``destroy(c, key_ids)`` (``destroy_many`` for several: one append per bucket of markers, one
  rewrite per bucket) appends the erasure marker (fsynced), then rewrites each bucket that
  held a key of ``c`` (its own keys, its binding, the live spares among ``key_ids``) into
  ``b-XX.keys.tmp``, fsyncs it, renames it over the bucket and fsyncs the directory. When it
  returns no file under ``keys/`` holds those keys' bytes (the old file is unlinked; freed disk
  blocks are the file system's: use disk encryption or a master key kept elsewhere against
  raw-disk forensics). Cost: one rewrite of 1/256 of the store per bucket.
* Open: leftover ``*.tmp`` files are deleted (a rewrite that did not reach its rename); a torn
  tail (a last frame cut short or failing its CRC: a create that never returned) is truncated
  and logged; a bad frame *followed by* more frames is ``KeyStoreDamaged`` (never skipped: a lost
  key is lost content). A conversation with a marker and keys (a destroy cut by a crash) is
  rewritten: reopening completes the erasure.

``FileKeyStore(path, read_only=True)`` inspects a store another process holds (``histlog log
verify`` beside a server): no lock, no write of any kind. ``rotate_master_key`` rewrites every
bucket under another master key with the engine stopped (``histlog keys rotate``; docs/erasure.md
§3): every record is read first, then each bucket goes through ``.tmp`` + fsync + rename.

Why files and not a RocksDB: a RocksDB delete leaves the key in the WAL and in SST files until a
flush, a compaction of its range and the purge of obsolete files have all run, which this store
must prove, not hope. Files make "no key bytes left" a property of one rename. Measured
(bench/bench_sealed.py, this 2-core box): create ~= one append + fsync, the same order as a
rocksdict ``put`` with ``sync=True``; destroy = one bucket rewrite + 2 fsyncs.
All keys are loaded at open, each bucket once: about 10 us and 300 bytes of memory a key (1 s
and 30 MB for 100,000 conversations' keys; 5.7 s while each bucket's load scanned the keys
loaded before it).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from engine.keys.master import MasterKey
from engine.keys.pool import SparePool
from engine.keys.record import FRAME_HEADER, MAX_FRAME, KeyRecord, decode_record, encode_record, frame, unframe
from schemas.entropy import random_bytes
from schemas.errors import InvalidConfiguration, KeyErased, KeyStoreDamaged, StateUnavailable
from schemas.sealed import DataKey, key_id_problem

__all__ = ["BUCKETS", "FileKeyStore", "Rotation", "bucket_of", "read_frames", "rotate_master_key", "spare_bucket"]

log = logging.getLogger(__name__)

BUCKETS: Final = 256


def bucket_of(conversation_id: str) -> int:
    """The bucket of a conversation's own keys and of its erasure marker."""
    return zlib.crc32(conversation_id.encode("utf-8")) & 0xFF


def spare_bucket(key_id: str) -> int:
    """The bucket of a spare key: its key id's first two hex digits (spares are made with them
    chosen, so one refill writes one file)."""
    return int(key_id[:2], 16)


def _lock(path: Path) -> int:
    """Create ``path`` if needed and take its ``LOCK`` (an exclusive ``flock``): the open fd."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(path / "LOCK", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise StateUnavailable(f"cannot open the key store {path}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise StateUnavailable(f"the key store {path} is in use by another process; close it first") from None
    return fd


def read_frames(path: Path) -> tuple[list[tuple[int, bytes, bytes]], int | None]:
    """The frames of bucket file ``path`` as ``(position, frame bytes, record body)``, and where a
    torn tail starts (None: no torn tail). Reads only. ``KeyStoreDamaged`` for a bad frame that
    is not a torn tail."""
    buf = path.read_bytes()
    out: list[tuple[int, bytes, bytes]] = []
    pos = 0
    while pos < len(buf):
        body, end = unframe(buf, pos)
        if body is None:
            # A torn tail is what one interrupted create leaves: at most one frame, reaching the
            # end, with no whole frame inside it. Anything else (a damaged length field
            # included) is damage, never truncated.
            rest = len(buf) - pos
            claimed = int.from_bytes(buf[pos:pos + 4], "big") if rest >= 4 else 0
            torn = rest < FRAME_HEADER or (pos + FRAME_HEADER + claimed >= len(buf) and rest <= MAX_FRAME
                                           and not any(unframe(buf, q)[0] for q in range(pos + 1, len(buf))))
            if not torn:
                raise KeyStoreDamaged(f"key store file {path} has a damaged record at byte {pos} followed by "
                                      "more records; restore path/keys from a backup", where=f"{path}@{pos}")
            return out, pos
        out.append((pos, buf[pos:end], body))
        pos = end
    return out, None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileKeyStore:
    """The embedded ``KeyStore`` in directory ``path`` (``<data>/keys``). Thread-safe."""

    def __init__(self, path: Path, *, master: MasterKey | None = None, read_only: bool = False) -> None:
        """Open (creating it if needed) the store in ``path``, holding its ``LOCK`` until ``close``.

        ``read_only=True`` is for inspecting a store another process holds (``histlog log verify``
        next to a running server): it takes no lock and never writes, creates,
        truncates, repairs or deletes anything (a torn tail is skipped, not cut; an interrupted
        destroy is not completed, its keys are just not loaded); ``create`` and ``destroy``
        raise ``StateUnavailable``. A key missing from memory is looked for again in its bucket
        file before ``get`` answers (a writer may have created it since). A missing directory
        is ``StateUnavailable``."""
        self._path = Path(path)
        self._master = master
        self._read_only = read_only
        self._mutex = threading.Lock()  # the in-memory maps (a create writes its file without it)
        # One writer per bucket file at a time, so a bucket's frames are fsynced in the order they
        # are written (a crash tears at most its last frame) while creates of different buckets,
        # the common case, write and fsync in parallel.
        self._bucket_locks = [threading.Lock() for _ in range(BUCKETS)]
        self._keys: dict[str, list[DataKey]] = {}  # conversations' own keys (written before spares)
        self._spares: dict[str, DataKey] = {}  # every live spare on disk, by key id, bound or not
        self._pool = SparePool(self._make_spares, name=str(self._path))
        self._erased: set[str] = set()
        self._loaded: dict[int, tuple[Sequence[str], Sequence[str]]] = {}  # read-only: bucket -> ids it loaded
        self._failed = ""
        self._lock_fd = -1
        if read_only:
            if not self._path.is_dir():
                raise StateUnavailable(f"no key store at {self._path} (a data dir written before erasure, or not "
                                       "a histlog data dir)")
        else:
            self._lock_fd = _lock(self._path)
        try:
            self._load()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ open

    def _bucket(self, b: int) -> Path:
        return self._path / f"b-{b:02x}.keys"

    def _read_bucket(self, path: Path) -> list[tuple[bytes, KeyRecord]]:
        """Every frame of a bucket with its record; then truncates a torn tail (skips it when
        read-only): only once every record was read, so an open with a wrong master key changes nothing."""
        frames, torn_at = read_frames(path)
        records = [(raw, decode_record(body, self._master, where=f"{path}@{pos}")) for pos, raw, body in frames]
        if torn_at is not None and not self._read_only:
            log.warning("key store %s: truncating a torn tail at byte %d (a create that never returned)",
                        path, torn_at)
            with open(path, "r+b") as f:
                f.truncate(torn_at)
                os.fsync(f.fileno())
        return records

    def _load(self) -> None:
        if not self._read_only:
            for tmp in self._path.glob("*.tmp"):
                tmp.unlink()
        dirty = [b for b in range(BUCKETS) if self._load_bucket(b)]
        if self._read_only:
            return
        for b in dirty:
            log.warning("key store %s: completing an interrupted destroy in bucket %02x", self._path, b)
            self._rewrite(b)

    def _load_bucket(self, b: int) -> bool:
        """Load bucket ``b`` into memory (replacing what was loaded of it); True when it holds keys
        of an erased conversation (a destroy cut short, or a void key written after the marker)."""
        path = self._bucket(b)
        try:
            records = self._read_bucket(path)
        except FileNotFoundError:
            return False
        # What this bucket loaded before (a read-only store's reload) goes first: found from the
        # ids it loaded then, never by scanning every key (at open that scan made loading the
        # store O(buckets x keys): 9 of 12 s for 100,000 keys).
        convs, spares = self._loaded.pop(b, ((), ()))
        for c in convs:
            self._keys.pop(c, None)
        for k in spares:
            self._spares.pop(k, None)
        erased_here = {r.conversation_id for _, r in records if r.key is None}
        self._erased |= erased_here
        dirty = False
        for _, r in records:
            if r.key is None:
                continue
            if not r.conversation_id:
                self._spares[r.key.key_id] = r.key
                continue
            if r.conversation_id in erased_here:
                dirty = True
                continue
            self._keys.setdefault(r.conversation_id, []).append(r.key)
        if self._read_only:  # only a read-only store loads a bucket again (a writer's maps follow its writes)
            self._loaded[b] = ([r.conversation_id for _, r in records if r.key is not None and r.conversation_id],
                               [r.key.key_id for _, r in records if r.key is not None and not r.conversation_id])
        return dirty

    # ------------------------------------------------------------------ writes

    def _check(self) -> None:
        if self._read_only:
            raise StateUnavailable(f"the key store {self._path} was opened read-only: it creates and destroys no keys")
        if self._failed:
            raise StateUnavailable(f"the key store {self._path} failed ({self._failed}); reopen it")

    def _append(self, b: int, data: bytes) -> None:
        path = self._bucket(b)
        new = not path.exists()
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            if new:
                _fsync_dir(self._path)
        except OSError as exc:
            # Fail-stop: after a failed write or fsync the file's content is unknown until reopened.
            self._failed = f"append to {path.name}: {exc.strerror}"
            raise StateUnavailable(f"cannot write the key store {path}: {exc.strerror}; fix it and reopen") from None

    def _rewrite(self, b: int, drop: frozenset[str] = frozenset()) -> None:
        """Rewrite bucket ``b`` without the key records of erased conversations and the spares in ``drop``."""
        path = self._bucket(b)
        keep = [raw for raw, r in self._read_bucket(path)
                if r.key is None or (r.conversation_id not in self._erased if r.conversation_id
                                     else r.key.key_id not in drop)]
        tmp = path.with_name(path.name + ".tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(b"".join(keep))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            _fsync_dir(self._path)
        except OSError as exc:
            self._failed = f"rewrite {path.name}: {exc.strerror}"
            raise StateUnavailable(f"cannot rewrite the key store {path}: {exc.strerror}; fix it and reopen "
                                   "(reopening completes the erasure)") from None

    def _make_spares(self, n: int) -> list[DataKey]:
        """The pool's refill: ``n`` spares of one random bucket, appended and fsynced at once."""
        b = random_bytes(1)[0]
        made = DataKey.generate_many(n, f"{b:02x}")  # ids start with the bucket's two hex digits
        data = b"".join(frame(encode_record("", key, self._master)) for key in made)
        with self._bucket_locks[b]:
            with self._mutex:
                self._check()
            self._append(b, data)  # fsynced: durable before any is handed out
        with self._mutex:
            self._spares.update((key.key_id, key) for key in made)
        return made

    def create(self, conversation_id: str) -> DataKey:
        # Every append of a conversation this process already bound a key to asks again: answered
        # without a lock (each read is one atomic dict or set lookup under the interpreter lock). In
        # a busy process the two locks of the full path cost ~10 us of CPU an append (in situ,
        # bench/bench_erasure.py). A destroy racing it is the race a locked create has with a
        # destroy just after it: the record sealed is erased by the projector (engine/keys/pool.py).
        key = self._pool.peek(conversation_id)
        if (key is not None and not self._read_only and not self._failed and conversation_id not in self._erased
                and conversation_id not in self._keys):
            return key
        with self._mutex:
            self._check()
            erased, own = conversation_id in self._erased, self._keys.get(conversation_id)
        return self._pool.create(conversation_id, erased=erased, own=own)

    def get(self, conversation_id: str, key_id: str) -> DataKey:
        if not self._read_only:  # a live key without a lock (as create); misses take the locked path
            found = self._find(conversation_id, key_id)
            if found is not None:
                return found
        with self._mutex:
            found = self._find(conversation_id, key_id)
            if found is None and self._read_only and conversation_id not in self._erased:
                # The writer may have created it since.
                self._load_bucket(bucket_of(conversation_id))
                if not key_id_problem(key_id):
                    self._load_bucket(spare_bucket(key_id))
                found = self._find(conversation_id, key_id)
            if found is not None:
                return found
            if conversation_id in self._erased:
                raise KeyErased(f"the data key {key_id} of {conversation_id!r} was destroyed: the content is "
                                "erased", conversation_id=conversation_id, key_id=key_id)
            raise KeyStoreDamaged(f"the key store {self._path} has no key {key_id} for {conversation_id!r}, which "
                                  "was never erased: this is not the key store the log was written with; "
                                  "restore it from a backup", where=str(self._path))

    def _find(self, conversation_id: str, key_id: str) -> DataKey | None:
        """The live key ``key_id`` for ``conversation_id`` (its own, or a spare), None for an
        erased conversation whatever the key (under ``_mutex``; ``get`` tries it without first:
        each read is atomic, and a hit is a key that was live at that moment)."""
        if conversation_id in self._erased:
            return None
        for key in self._keys.get(conversation_id, ()):
            if key.key_id == key_id:
                return key
        return self._spares.get(key_id)

    def destroy(self, conversation_id: str, key_ids: Sequence[str] = ()) -> None:
        self.destroy_many([(conversation_id, key_ids)])

    def destroy_many(self, erasures: Sequence[tuple[str, Sequence[str]]]) -> None:
        convs = list(dict.fromkeys(c for c, _ in erasures))
        bound = [key for c in convs if (key := self._pool.unbind(c)) is not None]
        with self._mutex:
            drop = frozenset(k for k in {*(k for _, ks in erasures for k in ks), *(key.key_id for key in bound)}
                             if k in self._spares)
        owns = {c: bucket_of(c) for c in convs}
        with contextlib.ExitStack() as held:
            for b in sorted({*owns.values(), *(spare_bucket(k) for k in drop)}):  # one lock order for all
                held.enter_context(self._bucket_locks[b])
            with self._mutex:
                self._check()
                markers: dict[int, list[bytes]] = {}
                for c in convs:
                    if c not in self._erased:
                        markers.setdefault(owns[c], []).append(frame(encode_record(c, None)))
                for b, frames in sorted(markers.items()):  # one write and fsync per bucket
                    self._append(b, b"".join(frames))
                self._erased.update(convs)
                # Memory and files hold the same keys: open loads every key and completes a destroy a
                # crash cut short, and a failed write or rewrite fail-stops the store until reopened.
                rewrite = {owns[c] for c in convs if self._keys.pop(c, None) is not None}
                for b in sorted(rewrite | {spare_bucket(k) for k in drop}):
                    self._rewrite(b, drop)
                for k in drop:
                    del self._spares[k]

    # ------------------------------------------------------------------ reads

    def list_keys(self, conversation_id: str | None = None) -> list[tuple[str, str]]:
        with self._mutex:
            own, spares = {c: list(keys) for c, keys in self._keys.items()}, list(self._spares)
        return self._pool.listing(own, spares, conversation_id)

    def known(self, conversation_id: str) -> bool:
        with self._mutex:
            if conversation_id in self._erased or self._failed or self._read_only:
                return False
            if self._keys.get(conversation_id):
                return True
        return self._pool.ready(conversation_id)

    def erased(self, conversation_id: str) -> bool:
        with self._mutex:
            return conversation_id in self._erased

    def close(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.close()
        fd, self._lock_fd = getattr(self, "_lock_fd", -1), -1
        if fd >= 0:
            os.close(fd)  # releases the flock

    def __enter__(self) -> FileKeyStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- master key rotation


@dataclass(frozen=True, slots=True)
class Rotation:
    """What ``rotate_master_key`` did: data keys rewritten, erasure markers kept, bucket files
    rewritten, and the keys of erased conversations it dropped (a destroy a crash cut short)."""

    keys: int
    markers: int
    buckets: int
    dropped: int


def rotate_master_key(path: Path, old: MasterKey | None, new: MasterKey | None) -> Rotation:
    """Rewrite every data key record of the store in ``path`` under master key ``new`` (``None``:
    unwrapped, wrap 0), reading them with ``old`` (``None``: the store has only unwrapped
    records). Records already under ``new`` are read with it, so running it again after a crash
    finishes the rotation. When it returns, no record is wrapped by ``old``: ``old`` opens
    nothing here.

    The engine must be stopped: it takes the store's ``LOCK`` (``StateUnavailable`` while an
    engine holds it). Every record is read and unwrapped *before* anything is written, so a wrong
    ``old`` key fails (``KeyStoreDamaged`` naming the master key id the records need) with the
    store unchanged. Then each bucket is written to ``b-XX.keys.tmp``, fsynced, renamed over the
    bucket and the directory fsynced: a crash leaves every bucket whole, under the old or the new
    key (rerun the same command). Erasure markers are kept as they are; keys of an erased
    conversation (a destroy cut short) are dropped, as opening would; a torn tail is dropped.
    """
    path = Path(path)
    if not (path / "LOCK").exists() and not any(path.glob("b-*.keys")):
        raise InvalidConfiguration(f"no key store at {path}: expected a histlog data dir's keys/ directory")
    if old is not None and new is not None and old.key_id == new.key_id:
        raise InvalidConfiguration(f"the new master key is the old one ({old.key_id.hex()}): give another "
                                   "(histlog keygen FILE)")
    fd = _lock(path)
    try:
        for tmp in path.glob("*.tmp"):
            tmp.unlink()  # a rotation or destroy that did not reach its rename
        plans: list[tuple[Path, bytes]] = []
        keys = markers = dropped = 0
        for b in range(BUCKETS):
            bucket = path / f"b-{b:02x}.keys"
            if not bucket.exists():
                continue
            frames, _ = read_frames(bucket)
            records = [_decode_either(body, old, new, where=f"{bucket}@{pos}") for pos, _, body in frames]
            erased = {r.conversation_id for r in records if r.key is None}
            out: list[bytes] = []
            for r in records:
                if r.key is not None and r.conversation_id in erased:
                    dropped += 1
                    continue
                keys += r.key is not None
                markers += r.key is None
                out.append(frame(encode_record(r.conversation_id, r.key, new)))
            plans.append((bucket, b"".join(out)))
        for bucket, data in plans:
            tmp = bucket.with_name(bucket.name + ".tmp")
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, bucket)
            _fsync_dir(path)
    except OSError as exc:
        raise StateUnavailable(f"cannot rewrite the key store {path}: {exc.strerror}; fix it and run the "
                               "rotation again (every bucket is whole, under the old or the new key)") from None
    finally:
        os.close(fd)
    return Rotation(keys, markers, len(plans), dropped)


def _decode_either(body: bytes, old: MasterKey | None, new: MasterKey | None, *, where: str) -> KeyRecord:
    """The record read with ``old``, or with ``new`` when an interrupted rotation already
    rewrapped it; the error of ``old`` (naming the master key id needed) when neither opens it."""
    try:
        return decode_record(body, old, where=where)
    except KeyStoreDamaged:
        if new is None:
            raise
        try:
            return decode_record(body, new, where=where)
        except KeyStoreDamaged:
            pass
        raise
