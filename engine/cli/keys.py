"""``histlog keygen FILE`` (write a new master key file; engine/keys/master.py has the format) and
``histlog keys rotate`` (rewrap the embedded key store under another master key).

keygen creates the file with mode 0600 and never overwrites it (the data keys a master key wraps
are unreadable without it, so replacing one by mistake would lose every conversation it wraps).
It prints the key's id, the id key store records name it by, and nothing of the key itself.

keys rotate (``engine.keys.files.rotate_master_key``; docs/erasure.md §3) runs with the engine
stopped (it takes the key store's lock): ``--old-key FILE`` (left out: the store's records are
unwrapped) and ``--new-key FILE`` or ``--unwrap``. Every record is read before any is written, so
a wrong old key changes nothing; each bucket is replaced by an fsynced rename, so a crash leaves
a store that the same command finishes. Only the embedded store (``--data``): rotating the Kafka
keys topic is not built.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TextIO

from engine.cli.exits import OK, UsageError
from engine.cli.target import Target
from engine.keys.files import rotate_master_key
from engine.keys.master import ENV_MASTER_KEY_FILE, load_master_key, write_master_key
from schemas.errors import KeyStoreDamaged

__all__ = ["cmd_keygen", "cmd_keys_rotate"]


def cmd_keygen(ns: argparse.Namespace, out: TextIO) -> int:
    path = Path(ns.file)
    key = write_master_key(path)
    print(f"wrote master key {key.key_id.hex()} to {path} (mode 0600); back it up apart from the data; "
          f"key stores load it from {ENV_MASTER_KEY_FILE}={path} (docs/erasure.md)", file=out)
    return OK


def cmd_keys_rotate(ns: argparse.Namespace, target: Target, out: TextIO) -> int:
    if not target.embedded:
        raise UsageError("keys rotate rewrites the embedded key store only (--data DIR, with the engine stopped); "
                         "rotating the Kafka keys topic is not built (docs/erasure.md §3)")
    assert target.data is not None  # Invariant: embedded targets have a data dir.
    if ns.new_key is None and not ns.unwrap:
        raise UsageError("keys rotate needs --new-key FILE (histlog keygen FILE writes one) or --unwrap")
    old = load_master_key(Path(ns.old_key)) if ns.old_key is not None else None
    new = load_master_key(Path(ns.new_key)) if ns.new_key is not None else None
    keys_dir = target.data / "keys"
    try:
        done = rotate_master_key(keys_dir, old, new)
    except KeyStoreDamaged as exc:
        hint = "" if old is not None else " (give it with --old-key FILE)"
        raise KeyStoreDamaged(f"{exc}{hint}; nothing was rewritten", where=exc.where) from None
    now = f"wrapped by master key {new.key_id.hex()}" if new is not None else "unwrapped"
    gone = f"; master key {old.key_id.hex()} opens nothing here now" if old is not None else ""
    then = (f"open the engine with {ENV_MASTER_KEY_FILE}={ns.new_key}" if new is not None
            else f"open the engine without {ENV_MASTER_KEY_FILE}")
    dropped = f", {done.dropped} keys of erased conversations dropped" if done.dropped else ""
    print(f"rotated {keys_dir}: {done.keys} data keys now {now} ({done.markers} erasure markers kept, "
          f"{done.buckets} bucket files rewritten{dropped}){gone}; {then}", file=out)
    return OK
