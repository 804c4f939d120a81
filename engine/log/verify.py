"""Read-only check of a FileLog directory (for ``histlog log verify``).

``verify(path, acknowledged)`` walks every segment of every partition with the segment
reader and reports what it finds; it never writes, truncates or locks anything, so it may
run next to a live writer (the newest segment may then end in a record being written: run it
on a stopped log for a definitive answer).

``acknowledged`` is evidence, per partition, of the offset below which records were
acknowledged and applied (the state's checkpoints, read by the caller: this module knows
nothing of the state). Each partition's end, after the cut opening would make, is compared
with it; without evidence, records removed whole at the end of a partition (or a removed
newest segment) cannot be told from a log that never had them.

Problem kinds:

* ``torn tail``: damage at the very end of a partition's newest segment with no intact
  record after it. Opening the log cuts it (the records were never acknowledged).
* ``corruption``: damage with an intact record after it, or in an older segment; wrong or
  missing offsets; a missing or unreadable ``meta.json``. Opening the log refuses with
  ``CorruptLog``: restore the named file from a backup.
  Also: ``meta.json`` present and a partition directory missing or without segment files
  (creation makes them before ``meta.json``, so they were removed and their records lost).
* ``unsupported version``: an intact record of a format version this code does not know
  (written by a newer histlog): upgrade histlog.
* ``interrupted creation``: no ``meta.json`` and only empty partitions; opening completes it.
* ``lost records``: a partition ends (after its torn tail is cut) below the evidence:
  acknowledged records are gone. With ``fsync="always"`` opening refuses (``CorruptLog``);
  otherwise the engine opens and rebuilds its state.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from engine.log import format as fmt
from engine.log import layout, meta
from engine.log.segment import Damage, Frame, scan

__all__ = ["Problem", "SegmentReport", "VerifyReport", "verify"]

ProblemKind = Literal["torn tail", "corruption", "unsupported version", "interrupted creation", "lost records"]
_OPENS: frozenset[str] = frozenset({"torn tail", "interrupted creation"})


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
        if self.length == 0:  # a finding about a file or directory, not about bytes in it
            return f"{self.kind}: {where}{self.segment}: {self.reason}"
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
    end_offsets: list[int] = field(default_factory=list)
    """Per partition, where it ends once opening has cut its torn tail."""
    acknowledged: list[int] | None = None
    """The evidence compared with ``end_offsets`` (None: none given, or ignored: see ``evidence_note``)."""
    evidence_note: str = ""

    @property
    def records(self) -> int:
        return sum(s.records for s in self.segments)

    @property
    def ok(self) -> bool:
        """True when opening the log would succeed and lose nothing acknowledged (torn tails are
        cut, an interrupted creation is completed)."""
        return all(p.kind in _OPENS for p in self.problems)

    @property
    def clean(self) -> bool:
        """True when there is nothing at all to report."""
        return not self.problems

    def summary(self) -> str:
        kinds = {p.kind for p in self.problems}
        verdict = ("clean" if self.clean else "OK after tail cut" if self.ok
                   else "LOST ACKNOWLEDGED RECORDS" if kinds <= _OPENS | {"lost records"} else "CORRUPT")
        lines = [f"{self.path}: {self.partitions} partitions, {len(self.segments)} segments, "
                 f"{self.records} records: {verdict}"]
        lines += [f"  {p}" for p in self.problems]
        if self.acknowledged is not None:
            short = any(e < a for e, a in zip(self.end_offsets, self.acknowledged, strict=True))
            lines.append(f"  evidence: state checkpoints acknowledged {self.acknowledged}, log ends "
                         f"{self.end_offsets}: " + ("RECORDS MISSING" if short else "consistent"))
        elif self.evidence_note:
            lines.append(f"  evidence: {self.evidence_note}")
        return "\n".join(lines)


def verify(path: str | os.PathLike[str], acknowledged: Sequence[int] | None = None) -> VerifyReport:
    """Check every segment under ``path`` (a FileLog directory) without changing anything;
    compare each partition's end with ``acknowledged`` when given (see the module docstring)."""
    root = Path(path)
    report = VerifyReport(root)
    try:
        report.partitions = meta.read_partitions(root)
        has_meta = True
    except (OSError, ValueError) as exc:
        has_meta = False
        if layout.contents(root) is layout.Contents.INTERRUPTED:
            report.problems.append(Problem(
                "interrupted creation", None, fmt.META_FILE, 0, 0, f"no {fmt.META_FILE} and only empty "
                "partitions: a creation was killed part-way (nothing was appended); opening completes it"))
        else:
            report.problems.append(Problem("corruption", None, fmt.META_FILE, 0, 0, f"unreadable meta: {exc}"))
        report.partitions = sum(1 for e in root.iterdir() if e.is_dir() and e.name.isdigit()) \
            if root.is_dir() else 0
    for p in range(report.partitions):
        report.end_offsets.append(_verify_partition(report, p, has_meta=has_meta))
    if acknowledged is not None:
        _compare(report, list(acknowledged))
    return report


def _verify_partition(report: VerifyReport, p: int, *, has_meta: bool) -> int:
    """Walk one partition's segments; its end after the cut opening would make."""
    pdir = fmt.partition_dir(report.path, p)
    segments = fmt.list_segments(pdir) if pdir.is_dir() else []
    if has_meta and not pdir.is_dir():
        report.problems.append(Problem(
            "corruption", p, f"{pdir.name}/", 0, 0, f"the partition directory is missing ({fmt.META_FILE} names "
            f"{report.partitions} partitions, each made with the log): its records are lost; restore it "
            "from a backup"))
    elif has_meta and not segments:
        report.problems.append(Problem(
            "corruption", p, f"{pdir.name}/", 0, 0, "the partition has no segment files (the first is made "
            "with the log): its records are lost; restore them from a backup"))
    if segments and segments[0][0] != 0:
        report.problems.append(Problem("corruption", p, segments[0][1].name, 0, 0,
                                       "first segment does not start at offset 0"))
    end = 0
    for i, (base, spath) in enumerate(segments):
        if i > 0 and base != end:
            report.problems.append(Problem(
                "corruption", p, spath.name, 0, 0, f"segment starts at offset {base}, previous ends at {end}"))
        end = _verify_segment(report, p, base, spath, newest=i == len(segments) - 1)
    return end


def _compare(report: VerifyReport, acknowledged: list[int]) -> None:
    if len(acknowledged) != report.partitions:
        report.evidence_note = (f"evidence ignored: the state's checkpoints name {len(acknowledged)} partitions, "
                                f"the log has {report.partitions}")
        return
    report.acknowledged = acknowledged
    for p, (end, expected) in enumerate(zip(report.end_offsets, acknowledged, strict=True)):
        if end < expected:
            segments = [s.segment for s in report.segments if s.partition == p]
            report.problems.append(Problem(
                "lost records", p, segments[-1] if segments else f"{p}/", 0, 0,
                f"the state's checkpoint shows records below offset {expected} were acknowledged, but the "
                f"partition ends at {end} once its torn tail is cut (expected end offset {expected}, found "
                f"{end}): acknowledged records {end}..{expected - 1} are gone. With fsync=\"always\" the "
                "engine refuses to open: restore the partition from a backup, or accept the loss "
                "(histlog rebuild --accept-log-loss)"))


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
