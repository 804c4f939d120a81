"""The read-projection conformance suite (with the navigation model) on the embedded default
(FileLog + RocksDB, real files), with one partition and with four, and on an in-memory log with
the same RocksDB state."""

from __future__ import annotations

from tests.conformance.backends import Embedded, InMemory
from tests.conformance.reads_contract import ReadsContract


class TestEmbeddedReads(Embedded, ReadsContract):
    pass


class TestEmbeddedReadsFourPartitions(Embedded, ReadsContract):
    partitions = 4


class TestInMemoryReads(InMemory, ReadsContract):
    pass


class TestInMemoryReadsThreePartitions(InMemory, ReadsContract):
    partitions = 3
