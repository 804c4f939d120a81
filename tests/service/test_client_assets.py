"""Assets in both clients (``HistoryClient``, ``AsyncHistoryClient``) at the wire: what they send
(``PUT .../messages/{m}/assets`` with ``{"assets": [...]}`` in ordinal order), what they raise
(``AppendConflict`` for a 409, never retried; ``InvalidRequest`` for an answer that is no list of
refs) and that bad arguments send nothing. Their behaviour against a real server is the assets
contract (``tests/conformance/assets_contract.py``, run over both clients by
``test_conformance_http.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest

from schemas import AppendConflict, AssetRef, InvalidRequest
from tests.service.server_support import running
from tests.service.test_client_retries import Script, problem
from tests.service.test_client_slots import _sent, face

__all__ = ["face"]

IMAGE = AssetRef("sha256:" + "ab" * 32, "image", 0, mime="image/png")
THUMB = AssetRef("sha256:" + "cd" * 32, "thumbnail", 1)
ANSWER = (200, orjson.dumps({"assets": [IMAGE.tree(), THUMB.tree()]}), [])
PATH = b"/v1/conversations/c%2F1/messages/a%201%2F0/assets"


def test_a_link_sends_the_refs_in_ordinal_order_and_returns_the_messages_assets(
        face: Callable[[str], Callable[..., Any]]) -> None:
    script = Script([ANSWER])
    with running(script) as url:
        assert face(url)("link_assets", "c/1", "a 1/0", [THUMB, IMAGE]) == (IMAGE, THUMB)
    assert _sent(script) == [("PUT", PATH, {"assets": [IMAGE.tree(), THUMB.tree()]})]


def test_a_409_conflict_is_raised_as_such_and_not_retried(face: Callable[[str], Callable[..., Any]]) -> None:
    script = Script([problem(AppendConflict("message 'a 1/0' already links another asset at ordinal 0"), 409),
                     ANSWER])
    with running(script) as url, pytest.raises(AppendConflict, match="ordinal 0"):
        face(url)("link_assets", "c/1", "a 1/0", [IMAGE])
    assert len(script.seen) == 1


@pytest.mark.parametrize("answer", [{}, {"assets": [{"role": "image", "ordinal": 0}]},
                                    {"assets": [{**IMAGE.tree(), "ordinal": -1}]}, {"assets": "x"}])
def test_an_answer_that_is_no_list_of_refs_is_an_invalid_request(face: Callable[[str], Callable[..., Any]],
                                                                  answer: dict[str, Any]) -> None:
    with running(Script([(200, orjson.dumps(answer), [])])) as url, pytest.raises(InvalidRequest):
        face(url)("link_assets", "c/1", "a 1/0", [IMAGE])


@pytest.mark.parametrize(("message_id", "refs", "words"), [
    ("a 1/0", [], "assets"), ("a 1/0", ["x"], "AssetRef"), ("a 1/0", [IMAGE, AssetRef(THUMB.content_hash, "x", 0)],
                                                            "ordinal 0"),
    ("no-index", [IMAGE], "message_id"), (7, [IMAGE], "message_id"),
])
def test_bad_arguments_send_nothing(face: Callable[[str], Callable[..., Any]], message_id: Any, refs: Any,
                                    words: str) -> None:
    script = Script([ANSWER])
    with running(script) as url, pytest.raises(InvalidRequest, match=words):
        face(url)("link_assets", "c/1", message_id, refs)
    assert script.seen == []
