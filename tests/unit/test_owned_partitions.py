"""The owned-partitions contract (``tests/conformance/owned_contract.py``) on the embedded file
log: a 4-partition FileLog and RocksDB under ``tmp_path``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conformance.owned_contract import FileOwned, OwnedContract
from tests.conformance.standby_contract import StandbyContract


class TestFileOwned(OwnedContract):
    @pytest.fixture
    def backend(self, tmp_path: Path) -> FileOwned:
        return FileOwned(tmp_path / "data")


def test_the_async_face_refuses_a_revoked_partition_even_for_positions_it_applied(tmp_path: Path) -> None:
    """``AsyncHistoryEngine`` answers small reads and applied ``wait_applied`` checks on the loop
    (no thread hand-off); a partition revoked must still be ``NotOwner`` there, not "applied"."""
    import asyncio

    from engine.aio import AsyncHistoryEngine
    from schemas import Batch, Message, NotOwner
    from tests.conformance.owned_contract import conversations_by_partition

    c = conversations_by_partition(1)[1][0]
    with FileOwned(tmp_path / "data").open() as engine:
        receipt = engine.append(Batch(c, "a1", [Message.user("hi")]))
        face = AsyncHistoryEngine(engine)
        asyncio.run(face.wait_applied(receipt.position))  # owned and applied: returns
        assert [m.text() for m in asyncio.run(face.window(c, 5))] == ["hi"]
        engine.revoke([1])
        with pytest.raises(NotOwner):
            asyncio.run(face.wait_applied(receipt.position))
        with pytest.raises(NotOwner):
            asyncio.run(face.window(c, 5))
        with pytest.raises(NotOwner):
            asyncio.run(face.measure(c))


class TestFileStandby(StandbyContract):
    @pytest.fixture
    def backend(self, tmp_path: Path) -> FileOwned:
        return FileOwned(tmp_path / "data")
