"""The owned-partitions contract (``tests/conformance/owned_contract.py``) on the embedded file
log: a 4-partition FileLog and RocksDB under ``tmp_path``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conformance.owned_contract import FileOwned, OwnedContract


class TestFileOwned(OwnedContract):
    @pytest.fixture
    def backend(self, tmp_path: Path) -> FileOwned:
        return FileOwned(tmp_path / "data")
