"""The shared ``LogContract`` run against the in-process backends (MemoryLog, FileLog)."""

from __future__ import annotations

from tests.conformance.backends import FileLogs, MemoryLogs
from tests.conformance.log_contract import LogContract


class TestMemoryLogContract(MemoryLogs, LogContract):
    pass


class TestFileLogContract(FileLogs, LogContract):
    pass
