"""The facade conformance suite on the embedded default (FileLog + RocksDB, real files)."""

from __future__ import annotations

from tests.conformance.backends import Embedded
from tests.conformance.facade_contract import FacadeContract, ProjectionContract


class TestEmbeddedFacade(Embedded, FacadeContract):
    pass


class TestEmbeddedFacadeFourPartitions(Embedded, FacadeContract):
    partitions = 4


class TestEmbeddedProjections(Embedded, ProjectionContract):
    pass
