"""Helpers for the two-instance erasure tests on Kafka (tests/integration/test_kafka_erasure.py):
bounded waits, the raw records of one conversation, a raw producer for records an engine would
never write itself (a second live data key, content sealed under it), and the byte scan of a
state directory that proves a token is gone."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from engine import HistoryEngine
from engine.keys import KeyStore
from engine.keys.record import encode_record
from engine.keys.record import record_key as key_record_key
from schemas import Batch, ConversationClosed, LogPosition, Message, ToolCallPart, ToolOutput, ToolResultPart
from schemas.event_content import seal_event
from schemas.events import BatchAppended, Event, decode_event, encode_event
from schemas.records import partition_for_key, read_record_conv, record_key
from schemas.sealed import DataKey
from schemas.times import now_ms
from tests.conformance.facade_contract import snapshot, turn

__all__ = ["WAIT_S", "RawProducer", "accepted_batches", "assert_erased_and_closed", "conversation_records",
           "counters", "files_holding", "key_records", "keys_of", "needles_of", "observed", "store_of", "token",
           "token_batch", "wait_until"]

WAIT_S = 60.0
"""Longest a condition may take to hold (a loaded 2-core machine): every wait is bounded by it."""


def wait_until(condition: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(0.01)


def token() -> str:
    """An unguessable token (random hex: it does not compress, so a scan finds it in any file)."""
    return secrets.token_hex(16)


def token_batch(conv: str, aid: str, tok: str) -> Batch:
    """A batch holding ``tok`` in a text part, a tool call's arguments, a tool result and metadata."""
    return Batch(conv, aid, [
        Message.user(f"my secret is {tok}", metadata={"note": f"meta-{tok}"}),
        Message.assistant(ToolCallPart("call-1", "lookup", '{"q": "' + tok + '"}')),
        Message.tool(ToolResultPart("call-1", "lookup", ToolOutput.text(f"result {tok}"))),
        Message.assistant(f"noted {tok}"),
    ])


def needles_of(tokens: Iterable[str], batches: Iterable[Batch] = ()) -> list[bytes]:
    """What must not be in any file: each token, and each batch's digest hex and canonical JSON."""
    out = [t.encode() for t in tokens]
    for b in batches:
        out += [b.digest.split(":", 1)[1].encode(), b.canonical_json()]
    return out


def files_holding(root: Path, needles: Iterable[bytes]) -> list[tuple[str, bytes]]:
    """Every (file, needle) such that the file under ``root`` holds the needle: every byte is read."""
    wanted = list(needles)
    found: list[tuple[str, bytes]] = []
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            data = path.read_bytes()
            found += [(str(path.relative_to(root)), n) for n in wanted if n in data]
    return found


def counters(engine: HistoryEngine) -> dict[str, int]:
    s = engine.stats()
    return {"accepted": s.accepted, "duplicates": s.duplicates, "conflicts": s.conflicts,
            "rejected_closed": s.rejected_closed, "corrupt": s.corrupt, "cleared": s.cleared, "erased": s.erased}


def observed(engine: HistoryEngine) -> dict[str, Any]:
    """What a reader observes of ``engine`` after it caught up with the log's end."""
    assert engine.catch_up(timeout=WAIT_S), "the engine did not catch up with the log"
    return snapshot(engine)


def conversation_records(engine: HistoryEngine, conv: str) -> list[tuple[int, Event]]:
    """``(offset, event)`` of every record of ``conv`` in the log, in log order (read raw)."""
    log_ = engine.log
    partition = partition_for_key(record_key(conv), log_.partitions)
    end = log_.end_offsets()[partition]
    out: list[tuple[int, Event]] = []
    offset = 0
    deadline = time.monotonic() + WAIT_S
    while offset < end:
        assert time.monotonic() < deadline, f"could not read partition {partition} up to {end}"
        for r in log_.read(partition, offset):
            offset = r.offset + 1
            if read_record_conv(r.key) == conv.encode():
                out.append((r.offset, decode_event(r.value)))
    return out


def key_records(bootstrap: str, keys_topic: str) -> list[tuple[bytes, bytes | None]]:
    """``(record key, value)`` of every record of the keys topic, in offset order (read raw)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest")
    try:
        tp = TopicPartition(keys_topic, 0)
        consumer.assign([tp])
        end = consumer.end_offsets([tp])[tp]
        out: list[tuple[bytes, bytes | None]] = []
        deadline = time.monotonic() + WAIT_S
        while consumer.position(tp) < end:
            assert time.monotonic() < deadline, f"could not read {keys_topic} up to {end}"
            for recs in consumer.poll(timeout_ms=500).values():
                out.extend((r.key, r.value) for r in recs)
        return out
    finally:
        consumer.close()


def store_of(e: HistoryEngine) -> KeyStore:
    assert e._keys is not None  # Invariant: HistoryEngine.open gives every engine its key store.
    return e._keys


def keys_of(e: HistoryEngine, conv: str) -> list[tuple[str, str]]:
    """The live keys of ``conv`` in ``e``'s key store, as it holds them in memory now."""
    return store_of(e).list_keys(conv)


def accepted_batches(e: HistoryEngine, conv: str) -> dict[str, list[bytes]]:
    """append id -> the canonical JSON of its messages, as ``e`` stores them."""
    out: dict[str, list[bytes]] = {}
    for entry in e.entries(conv):
        out.setdefault(str(entry.append_id), []).append(entry.message.canonical_json())
    return out


def assert_erased_and_closed(e: HistoryEngine, conv: str = "c") -> None:
    """Nothing of ``conv`` is readable on ``e``, its keys are gone, and it refuses appends."""
    assert e.read(conv) == [] and e.entries(conv) == [] and conv not in e.conversations()
    assert keys_of(e, conv) == []
    with pytest.raises(ConversationClosed):
        e.append(turn(conv, "after", "no more"))


class RawProducer:
    """A plain kafka-python producer on the event topic and its keys topic: records no engine
    writes itself, built with the schema layer's own functions (``seal_event``, ``encode_event``,
    ``encode_record``)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.topic, self.partitions = topic, partitions
        self._producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")

    def add_key(self, conv: str, key: DataKey) -> None:
        """A second live key record of ``conv``: what a creator that lost the race leaves when it
        crashes before tombstoning its own key (no master key: the engines here have none)."""
        self._producer.send(f"{self.topic}.keys", key=key_record_key(conv, key.key_id),
                            value=encode_record(conv, key), partition=0).get(timeout=WAIT_S)

    def sealed_batch(self, batch: Batch, key: DataKey) -> LogPosition:
        """``batch`` as an engine appends it, but sealed under ``key``; its position."""
        k = record_key(batch.conversation_id, batch.append_id)
        value = encode_event(seal_event(BatchAppended.of(batch, now_ms()), key))
        meta = self._producer.send(self.topic, key=k, value=value,
                                   partition=partition_for_key(k, self.partitions)).get(timeout=WAIT_S)
        return LogPosition(int(meta.partition), int(meta.offset))

    def close(self) -> None:
        self._producer.close()
