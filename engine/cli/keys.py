"""``histlog keygen FILE``: write a new master key file (engine/keys/master.py has the format).

The file is created with mode 0600 and never overwritten (the data keys a master key wraps are
unreadable without it, so replacing one by mistake would lose every conversation it wraps). It
prints the key's id, the id key store records name it by, and nothing of the key itself.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TextIO

from engine.cli.exits import OK
from engine.keys.master import ENV_MASTER_KEY_FILE, write_master_key

__all__ = ["cmd_keygen"]


def cmd_keygen(ns: argparse.Namespace, out: TextIO) -> int:
    path = Path(ns.file)
    key = write_master_key(path)
    print(f"wrote master key {key.key_id.hex()} to {path} (mode 0600); back it up apart from the data; "
          f"key stores load it from {ENV_MASTER_KEY_FILE}={path} (docs/erasure.md)", file=out)
    return OK
