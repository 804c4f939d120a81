"""The wire contracts by their bytes: the log record key and partitioner (``schemas.records``).
A byte changed here is a format change."""

from __future__ import annotations

import pytest

from schemas.records import KEY_SEPARATOR, partition_for_key, record_key, record_key_bytes

# Kafka's own test vectors for murmur2 (UtilsTest.testMurmur2, as Java ints).
KAFKA_MURMUR2 = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]


def test_record_key_bytes() -> None:
    assert KEY_SEPARATOR == b"\x1f"
    assert record_key("conv-1", "a1") == b"conv-1\x1fa1"
    assert record_key("conv-1") == b"conv-1\x1f"  # a clear: empty append id
    assert record_key("ü", "ß") == "ü".encode() + b"\x1f" + "ß".encode()
    assert record_key_bytes(b"c", b"a") == record_key("c", "a")


@pytest.mark.parametrize(("conversation", "java_hash"), KAFKA_MURMUR2)
@pytest.mark.parametrize("partitions", [2, 3, 7, 12])
def test_partition_is_javas_default_partitioner(conversation: bytes, java_hash: int, partitions: int) -> None:
    expected = (java_hash & 0x7FFFFFFF) % partitions  # Utils.toPositive(murmur2(bytes)) % n
    for append_id in (b"", b"append-1", b"x\x1fy"):
        assert partition_for_key(conversation + b"\x1f" + append_id, partitions) == expected


def test_one_partition_takes_everything() -> None:
    assert partition_for_key(b"anything\x1fa", 1) == 0
