"""The shared ``LogContract`` run against the in-process backends (MemoryLog, FileLog)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.log.base import Log
from engine.log.file import FileLog
from engine.log.memory import MemoryLog
from tests.conformance.log_contract import LogContract, MakeLog


class TestMemoryLogContract(LogContract):
    @pytest.fixture
    def make_log(self) -> Iterator[MakeLog]:
        made: list[Log] = []

        def factory(partitions: int = 1) -> Log:
            log = MemoryLog(partitions)
            made.append(log)
            return log

        yield factory
        for log in made:
            log.close()


class TestFileLogContract(LogContract):
    @pytest.fixture
    def make_log(self, tmp_path: Path) -> Iterator[MakeLog]:
        made: list[Log] = []

        def factory(partitions: int = 1) -> Log:
            log = FileLog(tmp_path / f"log{len(made)}", partitions, segment_bytes=64 * 1024)
            made.append(log)
            return log

        yield factory
        for log in made:
            log.close()
