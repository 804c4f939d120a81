"""The log record's key and partition: wire contracts every log backend and every producer share.

A record's key is ``conversation_id + 0x1F + append_id`` in UTF-8 (an empty append id for a
``ConversationCleared``). IDs never contain ``0x1F`` (``schemas.ids``), so the key splits back
unambiguously. The partition of a record is Kafka's default partitioner applied to the
conversation-id bytes of its key (the bytes before the first ``0x1F``), so every event of one
conversation lands in one partition and a producer in any language computes the same one.
The spec is ``docs/log-format.md``; admission checks every key against its event with
``record_key_bytes``, the backends place records with ``partition_for_key``.
"""

from __future__ import annotations

from kafka.partitioner import murmur2

__all__ = ["KEY_SEPARATOR", "partition_for_key", "read_record_conv", "record_key", "record_key_bytes"]

KEY_SEPARATOR = b"\x1f"


def record_key_bytes(conversation: bytes, append_id: bytes = b"") -> bytes:
    """The record key from the UTF-8 bytes of both ids (``b""``: a clear's empty append id)."""
    return conversation + KEY_SEPARATOR + append_id


def record_key(conversation_id: str, append_id: str = "") -> bytes:
    """The record key: ``conversation_id + 0x1F + append_id`` in UTF-8 (empty append id for a clear)."""
    return record_key_bytes(conversation_id.encode("utf-8"), append_id.encode("utf-8"))


def read_record_conv(key: bytes) -> bytes:
    """The conversation id bytes of a record key (the bytes before its first ``0x1F``)."""
    return key.split(KEY_SEPARATOR, 1)[0]


def partition_for_key(key: bytes, partitions: int) -> int:
    """Kafka's default partitioner applied to the conversation id bytes of ``key``.

    ``(murmur2(conversation_id_bytes) & 0x7FFFFFFF) % partitions``, as Java's
    ``Utils.toPositive(Utils.murmur2(bytes)) % numPartitions``.
    """
    if partitions == 1:
        return 0
    conversation = read_record_conv(key)
    return (int(murmur2(conversation)) & 0x7FFFFFFF) % partitions
