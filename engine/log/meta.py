"""``meta.json``: the FileLog's metadata file, read and written here and nowhere else.

It names the format, its version and the partition count, which is fixed when the log is
created: ``{"format": "histlog-filelog", "version": 1, "partitions": N}`` (``docs/log-format.md``).
Its presence is the commit point of a log's creation (``layout``), so ``write`` makes it durable
atomically: a temporary file, fsync, rename, then fsync of the log directory and of its parent.
``read_partitions`` accepts only what ``write`` writes; ``FileLog``, ``layout`` and ``verify``
all read it through here, so they can never disagree about what a valid meta file is.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from engine.log import format as fmt
from engine.log.segment import fsync_dir

__all__ = ["META_FORMAT", "META_VERSION", "exists", "read_partitions", "stored_partitions", "write"]

META_FORMAT = "histlog-filelog"
META_VERSION = 1


def exists(root: Path) -> bool:
    """True when ``root`` has a meta file (valid or not): the log's creation was committed."""
    return fmt.meta_path(root).exists()


def write(root: Path, partitions: int) -> None:
    """Write ``root/meta.json`` for ``partitions`` partitions, durably and atomically."""
    meta = fmt.meta_path(root)
    tmp = meta.with_suffix(".tmp")
    body = json.dumps({"format": META_FORMAT, "version": META_VERSION, "partitions": partitions}).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, body)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, meta)
    fsync_dir(root)
    fsync_dir(root.resolve().parent)  # and the log directory itself


def read_partitions(root: Path) -> int:
    """The partition count in ``root/meta.json``. Raises ``OSError`` (absent, unreadable) or
    ``ValueError`` (not a meta file this code wrote) saying what is wrong."""
    data = json.loads(fmt.meta_path(root).read_bytes())
    if not isinstance(data, dict) or data.get("format") != META_FORMAT:
        raise ValueError(f"format {data.get('format') if isinstance(data, dict) else data!r}")
    stored = data.get("partitions")
    if not isinstance(stored, int) or isinstance(stored, bool) or stored < 1:
        raise ValueError(f"partitions {stored!r}")
    return stored


def stored_partitions(root: Path) -> int | None:
    """``read_partitions``, or None when the meta file is absent or unreadable."""
    try:
        return read_partitions(root)
    except (OSError, ValueError):
        return None
