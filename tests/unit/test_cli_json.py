"""The JSON ``histlog`` prints and reads is the schemas' own: ``StoredMessage.to_json``,
``TurnSource.to_json``, ``Receipt.to_json`` out, ``Batch.from_messages_json`` in."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from schemas.batch import Batch, StoredMessage, TurnSource
from schemas.errors import InvalidBatch
from schemas.ids import AppendID
from schemas.messages import Message, Role
from schemas.positions import HistoryPosition
from schemas.times import iso_time

WHEN = datetime(2025, 3, 13, 10, 4, 11, 402_000, tzinfo=UTC)
MESSAGE = Message.model_validate_json(  # metadata with a number spelling only the exact parser keeps
    '{"role":"user","parts":[{"kind":"text","text":"où est ☃?"}],"metadata":{"n":1.50}}'.encode())


def test_iso_time_is_utc_milliseconds_and_z() -> None:
    assert iso_time(WHEN) == "2025-03-13T10:04:11.402Z"
    assert iso_time(datetime(1970, 1, 1, tzinfo=UTC)) == "1970-01-01T00:00:00.000Z"


def test_a_stored_message_embeds_its_canonical_message_with_sorted_keys() -> None:
    entry = StoredMessage("ä/0", MESSAGE, HistoryPosition(1, 2), AppendID("ä"), WHEN)
    raw = entry.to_json()
    assert raw == (b'{"append_id":"\xc3\xa4","created_at":"2025-03-13T10:04:11.402Z","id":"\xc3\xa4/0","message":'
                   + MESSAGE.canonical_json() + b',"position":"1:2"}')
    assert b'"n":1.50' in raw  # the message's own bytes, not a re-serialisation
    hidden = StoredMessage("a/0", MESSAGE, HistoryPosition(1, 2), AppendID("a"), WHEN, "r/0", "edit")
    tree = json.loads(hidden.to_json())
    assert list(tree) == ["append_id", "created_at", "id", "message", "position", "reason", "superseded_by"]
    assert (tree["reason"], tree["superseded_by"]) == ("edit", "r/0")


def test_a_turn_source_embeds_its_content() -> None:
    content = b'{"parts":[{"kind":"text","text":"q"}],"role":"user"}'
    source = TurnSource("a/0", Role.USER, content, WHEN, False)
    assert source.to_json() == (b'{"content":' + content + b',"created_at":"2025-03-13T10:04:11.402Z","id":"a/0",'
                                b'"interrupted":false,"role":"user"}')


@pytest.mark.parametrize("document", [
    b'[{"role":"user","parts":[{"kind":"text","text":"x"}],"metadata":{"n":1.50}}]',
    b' { "messages" : [ {"parts":[{"text":"x","kind":"text"}],"role":"user","metadata":{"n":1.50}} ] } ',
])
def test_a_messages_document_gives_the_batch_of_those_messages(document: bytes) -> None:
    message = Message.model_validate_json(b'{"role":"user","parts":[{"kind":"text","text":"x"}],"metadata":{"n":1.50}}')
    batch = Batch.from_messages_json("c", "a", document)
    assert batch == Batch("c", "a", [message])
    assert Batch.from_json(batch.to_json()) == batch  # and from_json still reads the whole batch


@pytest.mark.parametrize(("document", "says"), [
    (b"{not json", "invalid JSON"),
    (b"", "invalid JSON"),
    (b"42", "expected a JSON array of messages"),
    (b'{"msgs": []}', "got an object with keys ['msgs']"),
    (b'{"conversation_id":"c","append_id":"a","messages":[]}', "got an object with keys"),
    (b'{"messages":[],"messages":[]}', "duplicate object key"),
    (b"[]", "no messages"),
    (b'[{"role":"user","parts":[{"kind":"text","text":"x"}]},{"role":"x"}]', "messages[1]: role"),
    (b"\xff", "not UTF-8"),
])
def test_a_bad_messages_document_is_an_invalid_batch_that_says_why(document: bytes, says: str) -> None:
    with pytest.raises(InvalidBatch, match=r"^invalid batch: ") as caught:
        Batch.from_messages_json("c", "a", document)
    assert says in str(caught.value)
