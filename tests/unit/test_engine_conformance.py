"""The facade conformance suite on the embedded default (FileLog + RocksDB, real files)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from engine import HistoryEngine
from tests.conformance.facade_contract import FacadeContract, ProjectionContract


class FileBackend:
    def __init__(self, path: Path) -> None:
        self.path = path

    def open(self) -> HistoryEngine:
        return HistoryEngine.open(self.path)

    def drop_state(self) -> None:
        shutil.rmtree(self.path / "state")


class TestEmbeddedFacade(FacadeContract):
    @pytest.fixture
    def backend(self, tmp_path: Path) -> FileBackend:
        return FileBackend(tmp_path / "data")


class TestEmbeddedFacadeFourPartitions(FacadeContract):
    @pytest.fixture
    def backend(self, tmp_path: Path) -> FileBackend:
        class Four(FileBackend):
            def open(self) -> HistoryEngine:
                return HistoryEngine.open(self.path, partitions=4)

        return Four(tmp_path / "data")


class TestEmbeddedProjections(ProjectionContract):
    @pytest.fixture
    def backend(self, tmp_path: Path) -> FileBackend:
        return FileBackend(tmp_path / "data")
