"""The FileLog directory as a whole: crash-safe creation, and what a directory holds.

``meta.json`` is the commit point of a log's creation. ``create`` makes every partition
directory and its first, empty segment durable *before* it writes ``meta.json`` atomically
(temporary file, fsync, rename, fsync of the directory), so:

* ``meta.json`` present means every partition directory and first segment was made durable
  once: a partition directory or segment file missing later was *removed*, and its records
  are lost (``FileLog`` refuses to open, ``verify`` reports it).
* ``meta.json`` absent with partition directories that hold nothing but empty first
  segments is a creation killed part-way (``INTERRUPTED``): nothing was ever appended, so
  opening completes it. Absent with anything else in a partition directory (``HAS_DATA``)
  is a log that lost its ``meta.json``: corruption.

Kinds of directory are decided here once, for ``FileLog`` and ``verify`` alike; the meta file
itself is read and written by ``engine.log.meta``.
"""

from __future__ import annotations

import logging
import os
from enum import Enum
from pathlib import Path

from engine.log import format as fmt
from engine.log import meta as meta_file
from engine.log.segment import fsync_dir
from schemas.errors import CorruptLog, LogUnavailable

__all__ = ["Contents", "contents", "create", "missing", "open_or_create"]

logger = logging.getLogger("engine.log.file")

class Contents(Enum):
    """What a FileLog directory *without* ``meta.json`` holds."""

    NOTHING = "nothing"  # no partition directory: a new log
    INTERRUPTED = "interrupted creation"  # only empty first segments: complete the creation
    HAS_DATA = "data without meta"  # anything else: corruption


def contents(root: Path) -> Contents:
    """Classify ``root`` (which has no ``meta.json``) by its partition directories; read-only."""
    if not root.is_dir():
        return Contents.NOTHING
    found = Contents.NOTHING
    for entry in root.iterdir():
        if not entry.name.isdigit():
            continue  # LOCK, the meta temporary file, unknown files
        if not entry.is_dir():
            return Contents.HAS_DATA
        for item in entry.iterdir():
            if fmt.parse_segment_name(item.name) is None:
                continue  # unknown files are ignored, as everywhere in the log
            if item.name != fmt.segment_name(0) or not item.is_file() or item.stat().st_size != 0:
                return Contents.HAS_DATA
        found = Contents.INTERRUPTED
    return found


def create(root: Path, partitions: int) -> None:
    """Create (or complete) a log of ``partitions`` partitions in ``root``; ``meta.json`` last.

    Call with the writer lock held and only when ``contents(root)`` is ``NOTHING`` or
    ``INTERRUPTED``. Partition directories at or above ``partitions`` left by an interrupted
    creation of a larger log hold only an empty segment: they are removed first, so the
    finished log has exactly the partitions ``meta.json`` names.
    """
    for entry in root.iterdir():
        if entry.name.isdigit() and int(entry.name) >= partitions and entry.is_dir():
            empty = fmt.partition_dir(root, int(entry.name)) / fmt.segment_name(0)
            if empty.exists():
                empty.unlink()
            if not any(entry.iterdir()):
                entry.rmdir()
    for p in range(partitions):
        pdir = fmt.partition_dir(root, p)
        pdir.mkdir(exist_ok=True)
        first = fmt.segment_path(root, p, 0)
        os.close(os.open(first, os.O_WRONLY | os.O_CREAT, 0o644))
        fsync_dir(pdir)  # the empty first segment is durable
    fsync_dir(root)  # every partition directory is durable before meta.json can exist
    meta_file.write(root, partitions)


def missing(root: Path) -> bool:
    """True when ``root`` holds no log yet (nothing, or an interrupted creation); read-only."""
    return not meta_file.exists(root) and contents(root) is not Contents.HAS_DATA


def open_or_create(root: Path, partitions: int) -> bool:
    """Check ``meta.json`` against ``partitions``, or create the log; True when created.

    Call with the writer lock held. Raises ``CorruptLog`` for partition directories holding
    data without ``meta.json`` or an unreadable ``meta.json``, ``LogUnavailable`` for another
    partition count (it is fixed at creation).
    """
    meta = fmt.meta_path(root)
    if not meta_file.exists(root):
        found = contents(root)
        if found is Contents.HAS_DATA:
            raise CorruptLog(f"file log {root} has partition directories but no {meta.name}; restore it "
                             "from a backup (or recreate it with the original partition count)",
                             reason="missing meta")
        if found is Contents.INTERRUPTED:
            logger.warning("file log %s: completing a creation that was interrupted (no %s, only empty "
                           "partitions)", root, meta.name)
        create(root, partitions)
        return True
    try:
        stored = meta_file.read_partitions(root)
    except (OSError, ValueError) as exc:
        raise CorruptLog(f"{meta} is unreadable ({exc}); restore it from a backup", reason="bad meta") from exc
    if stored != partitions:
        raise LogUnavailable(
            f"file log {root} was created with {stored} partitions but opened with {partitions}; open it "
            f"with partitions={stored} (the count is fixed at creation)")
    return False
