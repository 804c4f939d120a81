"""The read-projection conformance suite on the embedded default (FileLog + RocksDB, real
files), with one partition and with four."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import HistoryEngine
from tests.conformance.reads_contract import ReadsContract
from tests.unit.test_engine_conformance import FileBackend


class FourPartitions(FileBackend):
    def open(self) -> HistoryEngine:
        return HistoryEngine.open(self.path, partitions=4)


class TestEmbeddedReads(ReadsContract):
    @pytest.fixture
    def backend(self, tmp_path: Path) -> FileBackend:
        return FileBackend(tmp_path / "data")


class TestEmbeddedReadsFourPartitions(ReadsContract):
    @pytest.fixture
    def backend(self, tmp_path: Path) -> FileBackend:
        return FourPartitions(tmp_path / "data")
