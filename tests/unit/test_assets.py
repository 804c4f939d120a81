"""Assets decided in log order (``projections.assets``, ``projections.admission``): a link whose
message is not visible where it lands in the log is refused there, on the state a rebuild gives
too; the refs are sealed in the log and gone from every file once the conversation is cleared;
the keys a link writes; what a read of messages with assets visits; the event's bytes. The
behaviour every backend shares is ``tests/conformance/assets_contract.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import HistoryEngine
from projections import keys
from schemas import AssetRef, Batch, Message
from schemas.assets import assets_json
from schemas.errors import CorruptLog
from schemas.events import ASSETS_LINKED_FINGERPRINT, AssetsLinked, decode_event, encode_event
from schemas.records import record_key
from tests.reliability.erasure_support import files_holding, victim_token, windows

IMAGE = AssetRef("sha256:" + "ab" * 32, "image", 0, mime="image/png")


def _state_rows(engine: HistoryEngine) -> list[tuple[bytes, bytes]]:
    return list(engine._projector.store.iterator().scan(b"", b"\xff" * 16))


def _raw_link(engine: HistoryEngine, conv: str, message_id: str, refs: list[AssetRef]) -> None:
    """Write a plain link straight to the log (no pre-check on this state) and wait for its decision."""
    event = AssetsLinked(conv, message_id, assets_json(refs), 1_767_225_600_000)
    position = engine.log.append(record_key(conv, message_id), encode_event(event))
    engine.wait_applied(position, timeout=30)


def test_links_decided_in_log_order_equal_a_rebuild(tmp_path: Path) -> None:
    with HistoryEngine.open(tmp_path / "d", partitions=2) as engine:
        _raw_link(engine, "c", "a/0", [IMAGE])  # before its message: unknown there, nothing linked
        engine.append(Batch("c", "a", [Message.user("look"), Message.assistant("nice")]))
        _raw_link(engine, "c", "a/0", [IMAGE])
        _raw_link(engine, "c", "a/0", [AssetRef("sha256:" + "00" * 32, "image", 0)])  # a conflict: refused
        engine.replace_turn(Batch("c", "b", [Message.user("look again")]), "a/0", "edit")
        _raw_link(engine, "c", "a/1", [IMAGE])  # hidden by then: refused
        assert [(e.id, e.assets) for e in engine.entries("c", include_hidden=True)] == [
            ("a/0", (IMAGE,)), ("a/1", ()), ("b/0", ())]
        live = (engine._projector.stats(), _state_rows(engine))
    with HistoryEngine.open(tmp_path / "d", partitions=2, rebuild=True) as engine:
        assert engine.catch_up(timeout=30)
        assert (engine._projector.stats(), _state_rows(engine)) == live


def test_what_a_link_writes(tmp_path: Path) -> None:
    """A link writes the message's one ``G`` row (its refs merged in) and, the first time,
    rewrites the message's row in place (its flag; the sealed record's ``K`` row is the batch's,
    there already); a link of refs already there writes nothing, and no record either (this
    state answers it)."""
    with HistoryEngine.open(tmp_path / "d") as engine:
        engine.append(Batch("c", "a", [Message.user("look")]))

        def count() -> int:
            return sum(1 for k, _ in _state_rows(engine) if not k.startswith((keys.CHECKPOINT, keys.META)))

        before = count()
        engine.link_assets("c", "a/0", [IMAGE, AssetRef("sha256:" + "cd" * 32, "thumbnail", 1)])
        assert count() - before == 1
        engine.link_assets("c", "a/0", [AssetRef("sha256:" + "ef" * 32, "thumbnail", 2)])
        assert count() - before == 1 and len(engine.entries("c")[0].assets) == 3
        end = engine.log.end_offsets()
        assert engine.link_assets("c", "a/0", [IMAGE]) == engine.entries("c")[0].assets
        assert engine.log.end_offsets() == end


def test_the_refs_are_sealed_in_the_log_and_gone_from_every_file_after_a_clear(tmp_path: Path) -> None:
    token = victim_token()
    data = tmp_path / "d"
    with HistoryEngine.open(data) as engine:
        engine.append(Batch("c", "a", [Message.user("look")]))
        engine.link_assets("c", "a/0", [AssetRef("sha256:" + "ab" * 32, "image", 0, storage_key=token)])
        records = [r for p in range(engine.log.partitions) for r in engine.log.read(p, 0)]
        [record] = [r for r in records if r.key == record_key("c", "a/0")]
        assert token.encode() not in record.value  # sealed: the log never holds the refs in the clear
        assert files_holding(data, {"token": token.encode()})  # the state does, until the clear
        engine.clear("c")
    needles = {f"window {i}": w.encode() for i, w in enumerate(windows(token, 12))}
    assert files_holding(data, needles) == []


def test_reads_of_messages_with_assets_visit_one_key_more_per_message_with_assets(tmp_path: Path) -> None:
    with HistoryEngine.open(tmp_path / "d") as engine:
        for k in range(20):
            engine.append(Batch("c", f"a{k}", [Message.user(f"q{k}"), Message.assistant(f"r{k}")]))

        def visited() -> int:
            before = engine._store.keys_read
            engine.entries("c")
            return engine._store.keys_read - before

        plain = visited()
        for k in (3, 7, 11):
            engine.link_assets("c", f"a{k}/0", [IMAGE, AssetRef("sha256:" + "cd" * 32, "thumbnail", 1)])
        assert visited() == plain + 3  # a point read per message with assets, none for the others


def test_the_event_round_trips_and_a_broken_one_is_poison() -> None:
    linked = AssetsLinked("c", "a/0", assets_json([IMAGE]), 5)
    data = encode_event(linked)
    assert data[2:10] == ASSETS_LINKED_FINGERPRINT and decode_event(data) == linked
    for message_id, assets, field in (("a", assets_json([IMAGE]), "message_id"), ("a/0", b"[]", "assets"),
                                      ("a/0", b'[{"content_hash":"x","ordinal":0,"role":"i"}]', "assets"),
                                      ("a/0", assets_json([IMAGE]) + b" ", "assets")):
        with pytest.raises(CorruptLog, match=f"invalid {field}"):
            decode_event(encode_event(AssetsLinked("c", message_id, assets, 5)))
