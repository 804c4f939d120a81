"""The wire contracts by their bytes: the log record key and partitioner (``schemas.records``)
and the RocksDB key layout (``projections.keys``). A byte changed here is a format change."""

from __future__ import annotations

import pytest

from projections import feature_keys, keys
from projections.custom import keyspace
from projections.rows import AggregateRow, ConversationRow, Stats, checkpoint_value, read_checkpoint_stats
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


def test_the_example_of_docs_events_md() -> None:
    key = record_key("support/42", "a-1")
    assert key == bytes.fromhex("73 75 70 70 6f 72 74 2f 34 32 1f 61 2d 31")
    assert partition_for_key(key, 3) == 221559865 % 3 == 1


def test_one_partition_takes_everything() -> None:
    assert partition_for_key(b"anything\x1fa", 1) == 0


def test_every_key_keeps_its_bytes() -> None:
    c = b"conv"
    ord8 = (3).to_bytes(8, "big")
    assert keys.STATE_FORMAT == b"14"
    assert keys.conv_key(c) == b"Cconv"
    assert keys.read_conv_key(b"Cconv") == c
    assert keys.receipt_key(c, b"a/1") == b"Rconv\x1fa/1"
    assert keys.read_receipt_key(b"Rconv\x1fa/1") == (c, b"a/1")
    assert keys.message_key(c, 3) == b"Mconv\x1f" + ord8
    assert keys.system_key(c, 3) == b"Sconv\x1f" + ord8
    assert keys.source_key(c, 3) == b"Nconv\x1f" + ord8
    assert keys.aggregate_key(c, 3) == b"Aconv\x1f" + ord8
    assert keys.turn_key(c, 3) == b"Tconv\x1f" + ord8
    assert keys.read_key_u64(keys.turn_key(c, 3)) == keys.read_key_u64(keys.message_key(c, 3)) == 3
    assert keys.hidden_key(c, 3, 4) == b"Hconv\x1f" + ord8 + (4).to_bytes(8, "big")
    assert keys.checkpoint_key("core", 2) == b"Pcore\x00" + (2).to_bytes(4, "big")
    assert keys.poison_key(2, 9) == b"Q" + (2).to_bytes(4, "big") + (9).to_bytes(8, "big")
    assert keys.read_poison_key(keys.poison_key(2, 9)) == (2, 9)
    assert keys.meta_key("format") == keys.FORMAT_KEY == b"mformat"
    assert keys.IDENTITY_KEY == b"midentity"
    assert checkpoint_value(7) == (7).to_bytes(8, "big")
    stats = Stats(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11)
    assert checkpoint_value(7, stats) == b"".join(n.to_bytes(8, "big") for n in (7, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11))
    assert read_checkpoint_stats(checkpoint_value(7, stats)) == stats
    # A row written before deleted was counted (10 counters) still reads, with it at 0.
    ten = b"".join(n.to_bytes(8, "big") for n in (7, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10))
    assert read_checkpoint_stats(ten) == Stats(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0)
    # A row written before fenced was counted (9 counters) still reads, with it at 0.
    nine = b"".join(n.to_bytes(8, "big") for n in (7, 1, 2, 3, 4, 5, 6, 7, 8, 9))
    assert read_checkpoint_stats(nine) == Stats(1, 2, 3, 4, 5, 6, 7, 8, 9, 0)
    # A row written before cleared/erased were counted (7 counters) still reads, with those at 0.
    old_row = b"".join(n.to_bytes(8, "big") for n in (7, 1, 2, 3, 4, 5, 6, 7))
    assert read_checkpoint_stats(old_row) == Stats(1, 2, 3, 4, 5, 6, 7, 0, 0)
    assert keys.erasing_key(c) == b"Econv"
    kid = "0123456789abcdef0123456789abcdef"
    assert keys.key_id_key(c, kid) == b"Kconv\x1f" + kid.encode()
    assert keys.read_key_id_key(keys.key_id_key(c, kid)) == (c, kid)
    assert keys.key_id_range(c) == (b"Kconv\x1f", b"Kconv\x20")
    assert (keys.ERASE_COMPACT, keys.ERASE_KEYS_ONLY) == (b"", b"k")
    assert read_checkpoint_stats(None) == read_checkpoint_stats(checkpoint_value(7)) == Stats()
    m, n, s = keys.message_keys(c)
    assert (m + ord8, n + ord8, s + ord8) == (keys.message_key(c, 3), keys.source_key(c, 3), keys.system_key(c, 3))
    assert AggregateRow.pack([1, 2, 3, 4]) == b"".join(n.to_bytes(8, "big") for n in (1, 2, 3, 4))
    assert AggregateRow.at(AggregateRow.pack([1, 2, 3, 4]), 1) == (3, 4)
    assert AggregateRow.count(AggregateRow.pack([1, 2, 3, 4])) == 2
    assert keys.read_checkpoint_key(keys.checkpoint_key("core", 2)) == ("core", 2)
    ms = (1234).to_bytes(8, "big")
    assert keys.time_key(c, 1234, 3) == b"Wconv\x1f" + ms + ord8
    assert keys.read_time_key(keys.time_key(c, 1234, 3)) == (1234, 3)
    assert keys.external_text("tg\x01/1") == b'"tg\\u0001/1"'  # control characters escaped: 1F ends it
    assert keys.external_key(c, b'"x"', 3) == b'Xconv\x1f"x"\x1f' + ord8
    assert keys.open_key(c) == b"Oconv" and keys.read_open_key(b"Oconv") == c
    row = ConversationRow(False, 5, 2, 2, 4, 99, "a-2", 1234, kid, 7, 3)
    assert row.encode() == (b"\x00" + b"".join(n.to_bytes(8, "big") for n in (5, 2, 2, 4, 99, 1234, 7, 3)) + b"\x20"
                            + kid.encode() + b"a-2")
    assert feature_keys.slot_key(c, b"s-1") == b"Lconv\x1fs-1"
    assert feature_keys.slot_value(3, used=True) == ord8 + b"\x01"
    assert feature_keys.read_slot_value(ord8 + b"\x00") == (3, False)
    assert keys.turn_value(1, 3) == (1).to_bytes(8, "big") + ord8 and keys.read_turn_id(keys.turn_value(1, 3)) is None
    assert keys.read_turn_id(keys.turn_value(1, 3, b"s-1/0")) == "s-1/0"
    assert feature_keys.assets_key(c, 3) == b"Gconv\x1f" + ord8
    assert feature_keys.deleted_key(c, b"a-2") == b"Dconv\x1fa-2"
    assert feature_keys.deleted_value([0, 2]) == (0).to_bytes(4, "big") + (2).to_bytes(4, "big")
    assert feature_keys.read_deleted_value(feature_keys.deleted_value([0, 2])) == (0, 2)
    assert keys.read_hidden_seq(keys.hidden_key(c, 3, 4)) == 4
    assert feature_keys.graph_key(keys.GRAPH_CHECKPOINT, c, b"", b"cp1") == b"Yconv\x1f\x1fcp1"
    assert feature_keys.graph_key(keys.GRAPH_BLOB, c, b"ns", b"ch", b"2") == b"Zconv\x1fns\x1fch\x1f2"
    index = feature_keys.graph_write_index(-1)
    assert index == ((1 << 31) - 1).to_bytes(4, "big") and feature_keys.read_graph_write_index(b"V" + index) == -1
    assert feature_keys.graph_range(keys.GRAPH_WRITE, c, b"", b"cp1") == (b"Vconv\x1f\x1fcp1\x1f", b"Vconv\x1f\x1fcp1 ")
    run_key = feature_keys.graph_run_key(2, b"r", c, b"ns", b"cp1")
    assert run_key == b"B" + (2).to_bytes(4, "big") + b"r\x1fconv\x1fns\x1fcp1"
    assert feature_keys.read_graph_run_key(run_key) == (c, b"ns", b"cp1")
    assert feature_keys.graph_run_range(2, b"r") == (b"B" + (2).to_bytes(4, "big") + b"r\x1f",
                                                      b"B" + (2).to_bytes(4, "big") + b"r ")
    assert ConversationRow.decode(row.encode()) == row
    assert ConversationRow.decode(ConversationRow(closed=True).encode()) == ConversationRow(closed=True)


def test_ranges_keep_their_bounds() -> None:
    assert keys.conv_range(keys.MESSAGE, b"c") == (b"Mc\x1f", b"Mc\x20")
    assert keys.conversation_ranges(b"c") == [(p + b"c\x1f", p + b"c\x20") for p in (b"M", b"N", b"A", b"S", b"T",
                                                                                        b"H", b"R", b"W", b"X",
                                                                                        b"F", b"J", b"L", b"G",
                                                                                        b"D", b"Y", b"Z", b"V")]
    assert keys.content_ranges(b"c") == [(p + b"c\x1f", p + b"c\x20") for p in (b"M", b"N", b"H", b"G", b"X")]
    assert feature_keys.run_key(b"c", b"") == b"Fc\x1f" and feature_keys.run_key(b"c", b"r") == b"Fc\x1fr"
    assert feature_keys.run_epoch_key(b"c", 2) == b"Fc\x1f\x00" + (2).to_bytes(8, "big")
    assert feature_keys.run_turn_key(b"c", b"r", b"a/0") == b"Jc\x1fr\x1fta/0"
    assert feature_keys.run_request_key(b"c", b"r", 3) == b"Jc\x1fr\x1fu" + (3).to_bytes(8, "big")
    assert feature_keys.run_writes_range(b"c", b"r") == (b"Jc\x1fr\x1f", b"Jc\x1fr\x20")
    assert feature_keys.run_requests_range(b"c", b"r") == (b"Jc\x1fr\x1fu", b"Jc\x1fr\x1fv")
    assert keys.external_range(b"c", b'"x"') == (b'Xc\x1f"x"\x1f', b'Xc\x1f"x" ')
    assert keys.open_range(b"bot/") == (b"Obot/", b"Obot0") and keys.open_range() == (b"O", b"P")
    assert (keys.RECEIPT_PREFIX, keys.RECEIPT_END) == (b"R", b"S")
    assert keys.conversations_range() == (b"C", b"D")
    assert keys.poison_range() == (b"Q", b"R")
    assert keys.checkpoint_range("core") == (b"Pcore\x00", b"Pcore\x01")
    assert keys.custom_keyspace("n") == keyspace("n") == (b"Un\x00", b"Un\x01")
    two = (2).to_bytes(4, "big")
    assert keys.custom_partition_keyspace("n", 2) == (b"Un\x00" + two, b"Un\x00" + (3).to_bytes(4, "big"))
    assert keys.poison_partition_range(2) == (b"Q" + two, b"Q" + (3).to_bytes(4, "big"))


@pytest.mark.parametrize(("prefix", "end"),
                         [(b"a", b"b"), (b"a\xff", b"b"), (b"ab\xff\xff", b"ac"), (b"U\x00", b"U\x01")])
def test_prefix_end_is_the_least_key_after_the_prefix(prefix: bytes, end: bytes) -> None:
    assert keys.prefix_end(prefix) == end
    assert all(k < end for k in (prefix, prefix + b"\x00", prefix + b"\xff" * 3))
    assert not end.startswith(prefix)


@pytest.mark.parametrize("prefix", [b"", b"\xff", b"\xff\xff"])
def test_prefix_end_refuses_a_prefix_no_key_bounds(prefix: bytes) -> None:
    with pytest.raises(ValueError, match="no key is greater"):
        keys.prefix_end(prefix)
