"""FileLog recovery on open, decided before anything is changed (the policy; spec: docs/log-format.md §5).

``Recovery.plan`` looks at one partition and returns what opening will do to it (the torn
tail to cut, the acknowledged records found missing) or raises ``CorruptLog``; it only
reads. ``FileLog`` plans every partition first and applies the plans only when none was
refused, so a refused open changes no file. The evidence (``acknowledged``: per partition,
the offset below which records are known to have been acknowledged and applied, i.e. the
state's checkpoints) turns a short log into a finding: with ``strict`` (``fsync="always"``,
where an acknowledged record was on disk) it is ``CorruptLog``; without, a power loss can
explain it, so it is reported as ``LostRecords`` for the caller to rebuild from.

The same checks serve reads (``records``) and older segments (``index_older``, ``corrupt``,
``expect_offset``), so every ``CorruptLog`` about segment bytes is worded in one place.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from pathlib import Path

import crc32c

from engine.log import format as fmt
from engine.log.base import Record
from engine.log.index import load_tail_index
from engine.log.segment import Damage, Frame, file_crc, scan
from schemas.errors import CorruptLog
from schemas.positions import LogPosition

__all__ = ["NO_LOG", "LostRecords", "Plan", "Recovery", "RecoveryCut", "Segment"]

NO_LOG = f"the log did not exist (no {fmt.META_FILE})"


@dataclass(frozen=True, slots=True)
class RecoveryCut:
    """A torn tail removed on open: where, why, and how much."""

    partition: int
    segment: str
    file_position: int
    next_offset: int
    bytes_dropped: int
    reason: str


@dataclass(frozen=True, slots=True)
class LostRecords:
    """Acknowledged records a partition no longer has, accepted on open (``FileLog.lost``).

    Only without ``fsync="always"``, where a power loss may take records the state had
    already applied: ``expected_end`` (the evidence) > ``found_end`` (the log's end after
    recovery); the caller must rebuild what it derived from offsets ``>= found_end``. With
    ``fsync="always"`` the same finding raises ``CorruptLog`` instead.
    """

    partition: int
    expected_end: int
    found_end: int
    reason: str


class Segment:
    """One segment file as the log knows it: base offset, size, offset→position index.

    ``positions[i]`` is the file position of record ``base + i``; ``None`` for an older
    segment not read yet (indexed, and checked, on first read). Mutated under the log lock.
    """

    __slots__ = ("base", "fd", "path", "positions", "size")

    def __init__(self, base: int, path: Path, size: int, positions: array[int] | None) -> None:
        self.base = base
        self.path = path
        self.size = size
        self.positions = positions
        self.fd = -1


@dataclass(slots=True)
class Plan:
    """What recovery will do to one partition, decided before any file is changed."""

    partition: int
    segments: list[Segment]
    positions: array[int]  # of the tail segment, after the cut
    cut: RecoveryCut | None
    lost: LostRecords | None
    frames_scanned: int  # frames of the tail walked (0: its saved index verified, engine.log.index)
    crc: int  # CRC-32C of the tail's bytes after the cut (its writer's seed, SegmentWriter.crc)


class Recovery:
    """The recovery policy of one FileLog directory (read-only; see the module docstring)."""

    def __init__(self, root: Path, partitions: int, acknowledged: list[int] | None, *, strict: bool) -> None:
        self.root = root
        self.partitions = partitions
        self.acknowledged = acknowledged
        self.strict = strict

    def plan(self, partition: int, *, created: bool) -> Plan:
        """Decide the recovery of one partition without changing anything (raises ``CorruptLog``)."""
        pdir = fmt.partition_dir(self.root, partition)
        if not pdir.is_dir():
            raise CorruptLog(
                f"file log {self.root}: partition {partition}'s directory {pdir} is missing, but "
                f"{fmt.META_FILE} says the log has {self.partitions} partitions (each directory is made "
                f"with the log): its records are lost{self._gone(partition)}. Restore the directory from "
                "a backup; nothing was changed", reason="missing partition", position=LogPosition(partition, 0))
        segments = [Segment(base, sp, sp.stat().st_size, None) for base, sp in fmt.list_segments(pdir)]
        if not segments:
            raise CorruptLog(
                f"file log {self.root}: partition {partition} has no segment files in {pdir} (the first "
                f"one is made with the log): its records are lost{self._gone(partition)}. Restore the "
                "segment files from a backup; nothing was changed", reason="missing segments",
                position=LogPosition(partition, 0))
        if segments[0].base != 0:
            raise CorruptLog(f"file log {self.root}: partition {partition} starts with segment "
                             f"{segments[0].path.name}; the segments before it are missing: restore "
                             "them from a backup", reason="missing segment", position=LogPosition(partition, 0))
        tail = segments[-1]
        positions, cut, scanned, crc = self.scan_tail(partition, tail)
        end = tail.base + len(positions)
        if created:
            detail = NO_LOG
        elif cut is not None:
            detail = (f"its newest segment {tail.path.name} is damaged at byte {cut.file_position} "
                      f"({cut.reason}), and cutting it there leaves the partition ending at offset {end}")
        else:
            detail = f"it ends at offset {end} (newest segment {tail.path.name})"
        return Plan(partition, segments, positions, cut, self.shortfall(partition, end, detail), scanned, crc)

    def _gone(self, partition: int) -> str:
        """How much of ``partition`` is gone when none of its files is left: the state's checkpoint
        (what it had applied, so was acknowledged) against the log's end, now 0."""
        if self.acknowledged is None:
            return " (no state's checkpoint to tell how many; the log now ends at offset 0)"
        applied = self.acknowledged[partition]
        return (f" (the state's checkpoint shows {applied} record(s) of this partition applied: expected end "
                f"offset {applied}, found 0, where the log now ends)")

    def shortfall(self, partition: int, found: int, detail: str) -> LostRecords | None:
        """Compare a partition's end with the evidence: ``None`` when it has every acknowledged
        record; else raise ``CorruptLog`` (``"always"``) or return what was lost."""
        if self.acknowledged is None or found >= self.acknowledged[partition]:
            return None
        expected = self.acknowledged[partition]
        if self.strict:
            raise CorruptLog(
                f"file log {self.root}: partition {partition}: {detail}, but the state's checkpoint shows "
                f"records below offset {expected} were acknowledged with fsync=\"always\" (expected end "
                f"offset {expected}, found {found}): acknowledged records {found}..{expected - 1} were "
                "removed or damaged; nothing was changed. Restore the partition's segment files from a "
                "backup (histlog log verify shows what is there); or, to accept losing those records, "
                "rebuild the state from the log as it is (histlog rebuild --accept-log-loss)",
                reason="acknowledged records missing", position=LogPosition(partition, found))
        return LostRecords(partition, expected, found, detail)

    def scan_tail(self, partition: int, seg: Segment) -> tuple[array[int], RecoveryCut | None, int, int]:
        """Scan the newest segment: the positions of its intact records, the torn tail to cut
        (damage with nothing intact after it), how many frames were walked for it and the CRC-32C
        of the bytes it keeps (all of them, or those before the cut). Raises ``CorruptLog`` on
        anything else. A saved index that verifies against the segment's bytes
        (``engine.log.index``: a clean close, and not one byte changed since) gives the positions
        without the walk, whose verdict it already knows: clean, nothing to cut."""
        size, crc = file_crc(seg.path)  # no copy of the segment unless it has to be walked
        indexed = load_tail_index(self.root, partition, seg.base, size, crc)
        if indexed is not None:
            return indexed, None, 0, crc
        data = seg.path.read_bytes()
        crc = crc32c.crc32c(data)  # of the bytes walked (nothing changes them: the log is locked)
        positions: array[int] = array("Q")
        items = list(scan(data, expected_offset=seg.base))
        for i, item in enumerate(items):
            if isinstance(item, Frame):
                self.expect_offset(partition, seg, item, seg.base + len(positions))
                positions.append(item.position)
                continue
            later_intact = any(isinstance(x, Frame) for x in items[i + 1:])
            if item.intact or later_intact:
                raise self.corrupt(partition, seg, item, "with intact records after it" if later_intact
                                    else "in a record written whole")
            return positions, RecoveryCut(partition, seg.path.name, item.position, seg.base + len(positions),
                                          len(data) - item.position, item.reason), len(items), \
                crc32c.crc32c(memoryview(data)[:item.position])
        return positions, None, len(items), crc

    def expect_offset(self, partition: int, seg: Segment, frame: Frame, expected: int) -> None:
        if frame.offset != expected:
            raise CorruptLog(
                f"file log {self.root}: partition {partition} segment {seg.path.name} byte "
                f"{frame.position} holds offset {frame.offset}, expected {expected}; run the verify "
                "tool (histlog log verify) and restore the segment from a backup",
                reason="unexpected offset", position=LogPosition(partition, expected))

    def corrupt(self, partition: int, seg: Segment, damage: Damage, why: str) -> CorruptLog:
        if damage.intact and damage.reason.startswith("unsupported format version"):
            return CorruptLog(
                f"file log {self.root}: partition {partition} segment {seg.path.name} byte "
                f"{damage.position}: {damage.reason}; it was written by a newer histlog: upgrade "
                "histlog to read this log; nothing was changed", reason=damage.reason, position=None)
        return CorruptLog(
            f"file log {self.root}: partition {partition} segment {seg.path.name} byte "
            f"{damage.position}: {damage.reason} ({len(damage.data)} bytes, {why}). This is corruption, "
            "not a torn write: run the verify tool (histlog log verify) and restore the segment from "
            "a backup; nothing was changed", reason=damage.reason, position=None)

    def records(self, partition: int, seg: Segment, data: bytes, offset: int, count: int,
                position: int) -> list[Record]:
        """The ``count`` records from ``offset`` in ``data``, read from byte ``position`` of an
        indexed segment, each checked (CRC, offset); any damage or a short read is corruption."""
        out: list[Record] = []
        for item in scan(data, expected_offset=offset, base_position=position):
            if isinstance(item, Damage):
                raise self.corrupt(partition, seg, item, "found while reading")
            self.expect_offset(partition, seg, item, offset + len(out))
            out.append(Record(partition, item.offset, item.timestamp_ms, item.key, item.value, item.headers))
        if len(out) != count:
            raise CorruptLog(f"file log {self.root}: partition {partition} segment {seg.path.name}: "
                             f"expected {count} records at byte {position}, read {len(out)}; run the "
                             "verify tool", reason="short read", position=LogPosition(partition, offset))
        return out

    def index_older(self, partition: int, seg: Segment, next_base: int) -> array[int]:
        """Index (and check) an older segment on first read: any damage is corruption."""
        data = seg.path.read_bytes()
        positions: array[int] = array("Q")
        for item in scan(data, expected_offset=seg.base):
            if isinstance(item, Damage):
                raise self.corrupt(partition, seg, item, "in an older segment")
            self.expect_offset(partition, seg, item, seg.base + len(positions))
            positions.append(item.position)
        if seg.base + len(positions) != next_base:
            raise CorruptLog(
                f"file log {self.root}: partition {partition} segment {seg.path.name} ends at offset "
                f"{seg.base + len(positions)} but the next segment starts at {next_base}; run the verify "
                "tool and restore the segment from a backup", reason="missing records",
                position=LogPosition(partition, seg.base + len(positions)))
        return positions
