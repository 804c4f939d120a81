"""The read-projection conformance suite on the embedded default (FileLog + RocksDB, real
files), with one partition and with four."""

from __future__ import annotations

from tests.conformance.backends import Embedded
from tests.conformance.reads_contract import ReadsContract


class TestEmbeddedReads(Embedded, ReadsContract):
    pass


class TestEmbeddedReadsFourPartitions(Embedded, ReadsContract):
    partitions = 4
