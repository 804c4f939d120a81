"""Log backends: ``FileLog`` (embedded default), ``KafkaLog``, ``MemoryLog`` (unit tests)."""

from engine.log.base import Log, LogCursor, Record, partition_for_key, record_key

__all__ = ["Log", "LogCursor", "Record", "partition_for_key", "record_key"]
