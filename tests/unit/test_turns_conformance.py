"""The turns conformance suite (issue 7) on the embedded default: FileLog + RocksDB, 1 and 4 partitions."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import HistoryEngine
from tests.conformance.turns_contract import TurnsContract
from tests.unit.test_engine_conformance import FileBackend


class FourPartitions(FileBackend):
    def open(self) -> HistoryEngine:
        return HistoryEngine.open(self.path, partitions=4)


class TestEmbeddedTurns(TurnsContract):
    max_examples = 40

    @pytest.fixture
    def backend(self, tmp_path: Path) -> FileBackend:
        return FileBackend(tmp_path / "data")


class TestEmbeddedTurnsFourPartitions(TurnsContract):
    max_examples = 40

    @pytest.fixture
    def backend(self, tmp_path: Path) -> FileBackend:
        return FourPartitions(tmp_path / "data")
