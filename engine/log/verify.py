"""Read-only check of a FileLog directory (for ``histlog log verify``).

``verify(path)`` walks every segment of every partition with the segment reader and
reports what it finds; it never writes, truncates or locks anything, so it may run next to
a live writer (the newest segment may then end in a record being written: run it on a
stopped log for a definitive answer).

Problem kinds:

* ``torn tail``: damage at the very end of a partition's newest segment with no intact
  record after it. Opening the log cuts it (the records were never acknowledged).
* ``corruption``: damage with an intact record after it, or in an older segment; wrong or
  missing offsets; a missing or unreadable ``meta.json``. Opening the log refuses with
  ``CorruptLog``: restore the named file from a backup.
* ``unsupported version``: an intact record of a format version this code does not know
  (written by a newer histlog): upgrade histlog.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from engine.log import format as fmt
from engine.log.segment import Damage, Frame, scan

__all__ = ["Problem", "SegmentReport", "VerifyReport", "verify"]

ProblemKind = Literal["torn tail", "corruption", "unsupported version"]


@dataclass(frozen=True, slots=True)
class Problem:
    kind: ProblemKind
    partition: int | None
    segment: str
    file_position: int
    length: int
    reason: str

    def __str__(self) -> str:
        where = f"partition {self.partition} " if self.partition is not None else ""
        return (f"{self.kind}: {where}{self.segment} byte {self.file_position} "
                f"({self.length} bytes): {self.reason}")


@dataclass(slots=True)
class SegmentReport:
    partition: int
    segment: str
    base_offset: int
    size: int
    records: int = 0
    last_offset: int | None = None


@dataclass(slots=True)
class VerifyReport:
    path: Path
    partitions: int = 0
    segments: list[SegmentReport] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def records(self) -> int:
        return sum(s.records for s in self.segments)

    @property
    def ok(self) -> bool:
        """True when opening the log would succeed (torn tails are cut on open)."""
        return all(p.kind == "torn tail" for p in self.problems)

    @property
    def clean(self) -> bool:
        """True when there is nothing at all to report."""
        return not self.problems

    def summary(self) -> str:
        lines = [f"{self.path}: {self.partitions} partitions, {len(self.segments)} segments, "
                 f"{self.records} records: " + ("clean" if self.clean else "OK after tail cut" if self.ok
                                                else "CORRUPT")]
        lines += [f"  {p}" for p in self.problems]
        return "\n".join(lines)


def verify(path: str | os.PathLike[str]) -> VerifyReport:
    """Check every segment under ``path`` (a FileLog directory) without changing anything."""
    root = Path(path)
    report = VerifyReport(root)
    meta = fmt.meta_path(root)
    try:
        report.partitions = int(json.loads(meta.read_bytes())["partitions"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        report.problems.append(Problem("corruption", None, meta.name, 0, 0, f"unreadable meta: {exc}"))
        report.partitions = sum(1 for e in root.iterdir() if e.is_dir() and e.name.isdigit()) \
            if root.is_dir() else 0
    for p in range(report.partitions):
        pdir = fmt.partition_dir(root, p)
        if not pdir.is_dir():
            continue  # created on first open
        segments = fmt.list_segments(pdir)
        if segments and segments[0][0] != 0:
            report.problems.append(Problem("corruption", p, segments[0][1].name, 0, 0,
                                           "first segment does not start at offset 0"))
        expected_next: int | None = None
        for i, (base, spath) in enumerate(segments):
            if expected_next is not None and base != expected_next:
                report.problems.append(Problem(
                    "corruption", p, spath.name, 0, 0,
                    f"segment starts at offset {base}, previous ends at {expected_next}"))
            expected_next = _verify_segment(report, p, base, spath, newest=i == len(segments) - 1)
    return report


def _verify_segment(report: VerifyReport, partition: int, base: int, spath: Path, *, newest: bool) -> int:
    data = spath.read_bytes()
    seg = SegmentReport(partition, spath.name, base, len(data))
    report.segments.append(seg)
    items = list(scan(data, expected_offset=base))
    expected: int | None = base  # None right after damage: the damaged bytes held records
    for i, item in enumerate(items):
        if isinstance(item, Frame):
            if expected is not None and item.offset != expected:
                report.problems.append(Problem("corruption", partition, spath.name, item.position,
                                               item.end - item.position,
                                               f"offset {item.offset}, expected {expected}"))
            seg.records += 1
            seg.last_offset = item.offset
            expected = item.offset + 1
            continue
        assert isinstance(item, Damage)  # Invariant: scan yields Frame or Damage
        later_intact = any(isinstance(x, Frame) for x in items[i + 1:])
        kind: ProblemKind
        if item.intact and item.reason.startswith("unsupported format version"):
            kind = "unsupported version"
        elif newest and not item.intact and not later_intact:
            kind = "torn tail"
        else:
            kind = "corruption"
        report.problems.append(Problem(kind, partition, spath.name, item.position, len(item.data),
                                       item.reason))
        expected = None
    return base + seg.records if expected is None else expected
