"""Assets (API.md "Runs, slots, assets, deletes": ``link_assets``, ``AssetRef``,
``StoredMessage.assets``), run by every backend (``ReadsContract`` includes it: file, memory,
Kafka, the async face and both HTTP clients).
"""

from __future__ import annotations

from typing import Any

import pytest

from schemas import (
    AppendConflict,
    AssetRef,
    Batch,
    ConversationClosed,
    HistoryPosition,
    InvalidRequest,
    Message,
    NotFound,
)

__all__ = ["AssetsContract"]

IMAGE = AssetRef("sha256:" + "ab" * 32, "image", 0, mime="image/png", size_bytes=2048, storage_key="s3://b/k",
                 name="cat.png")
THUMB = AssetRef("sha256:" + "cd" * 32, "thumbnail", 1)


def _turn(c: str, a: str, question: str) -> Batch:
    return Batch(c, a, [Message.user(question), Message.assistant(f"answer to {question}")])


class AssetsContract:
    """Hand-written cases on one backend (the ``engine`` fixture is ``ReadsContract``'s)."""

    def test_linked_assets_come_back_in_every_read(self, engine: Any) -> None:
        c = "assets"
        engine.append(_turn(c, "a", "look"))
        engine.append(_turn(c, "b", "again"))
        assert engine.link_assets(c, "a/0", [THUMB, IMAGE]) == (IMAGE, THUMB)  # in ordinal order
        assert [e.assets for e in engine.entries(c)] == [(IMAGE, THUMB), (), (), ()]
        assert engine.entries(c, order="desc")[-1].assets == (IMAGE, THUMB)
        assert engine.entries_by_ids(c, ["a/0"])[0].assets == (IMAGE, THUMB)
        assert engine.window_entries(c, 10).entries[0].assets == (IMAGE, THUMB)
        assert engine.read_within_bytes(c, 1 << 20).messages[0].assets == (IMAGE, THUMB)
        assert engine.turn(c, "a/1").messages[0].assets == (IMAGE, THUMB)
        assert engine.turns(c)[0].messages[0].assets == (IMAGE, THUMB)
        assert engine.latest_turn(c).messages[0].assets == ()
        assert engine.entries(c, after=HistoryPosition(1, 1))[0].assets == ()

    def test_linking_is_idempotent_and_another_ref_at_a_linked_ordinal_conflicts(self, engine: Any) -> None:
        c = "assets-idem"
        engine.append(_turn(c, "a", "look"))
        assert engine.link_assets(c, "a/1", [IMAGE]) == (IMAGE,)
        assert engine.link_assets(c, "a/1", [IMAGE]) == (IMAGE,)  # the same ref again: nothing changes
        assert engine.link_assets(c, "a/1", [IMAGE, THUMB]) == (IMAGE, THUMB)  # a new ordinal joins
        other = AssetRef("sha256:" + "ef" * 32, "image", 0)
        with pytest.raises(AppendConflict, match="ordinal 0"):
            engine.link_assets(c, "a/1", [other, AssetRef("sha256:" + "ef" * 32, "image", 5)])
        assert engine.entries(c)[1].assets == (IMAGE, THUMB)  # nothing of the refused link

    def test_only_a_visible_message_links_and_a_hidden_one_keeps_its_assets(self, engine: Any) -> None:
        c = "assets-hidden"
        engine.append(_turn(c, "a", "look"))
        engine.link_assets(c, "a/0", [IMAGE])
        for unknown in ("nope/0", "a/7"):
            with pytest.raises(NotFound):
                engine.link_assets(c, unknown, [THUMB])
        with pytest.raises(NotFound):
            engine.link_assets("assets-never-written", "a/0", [THUMB])
        engine.replace_turn(Batch(c, "b", [Message.user("look, edited")]), "a/0", "edit")
        with pytest.raises(NotFound, match="hidden"):
            engine.link_assets(c, "a/0", [THUMB])
        hidden = [e for e in engine.entries(c, include_hidden=True) if e.hidden]
        assert [(e.id, e.assets) for e in hidden] == [("a/0", (IMAGE,)), ("a/1", ())]
        assert [e.assets for e in engine.entries(c)] == [()]

    def test_assets_refuse_bad_input_before_any_write(self, engine: Any) -> None:
        c = "assets-bad"
        engine.append(_turn(c, "a", "look"))
        for refs in ([], "x", [IMAGE, AssetRef("sha256:" + "00" * 32, "image", 0)], ["not a ref"]):
            with pytest.raises(InvalidRequest, match="assets"):
                engine.link_assets(c, "a/0", refs)
        with pytest.raises(InvalidRequest, match="message_id"):
            engine.link_assets(c, "not-a-message-id", [IMAGE])
        for bad in ({"content_hash": "sha256:" + "AB" * 32}, {"content_hash": "md5:00"}, {"ordinal": -1},
                    {"ordinal": True}, {"role": ""}, {"size_bytes": -1}, {"mime": "a\x00b"}):
            fields = {"content_hash": IMAGE.content_hash, "role": "image", "ordinal": 0, **bad}
            with pytest.raises(InvalidRequest, match=next(iter(bad))):
                AssetRef(**fields)
        assert engine.entries(c)[0].assets == ()

    def test_a_clear_erases_the_assets(self, engine: Any) -> None:
        c = "assets-cleared"
        engine.append(_turn(c, "a", "look"))
        engine.link_assets(c, "a/0", [IMAGE])
        engine.clear(c)
        with pytest.raises(ConversationClosed):
            engine.link_assets(c, "a/0", [IMAGE])
        assert engine.entries(c) == []
