"""Deep nesting is bad input, refused with InvalidMessage / InvalidBatch (issue 11, defect 9).

Metadata values and tool ``details`` may nest at most ``MAX_DEPTH`` (64) levels of arrays and
objects; any JSON text at most ``MAX_DOCUMENT_DEPTH``. Every way JSON enters is covered, each with
input 10_000 levels deep (far past Python's recursion limit, which no input may reach): message
construction, ``model_validate``/``model_validate_json``, ``RawJSON``, ``Batch.from_json``,
``Batch.from_canonical`` (what admission uses: such a record on the log is poison), the CLI.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine import HistoryEngine
from engine.log.base import record_key
from schemas import Batch, InvalidBatch, InvalidMessage, Message
from schemas.canonical import MAX_DEPTH, MAX_DOCUMENT_DEPTH, RawJSON
from schemas.messages import ToolOutput, ToolResultPart
from tests.poison_support import frame

ROOT = Path(__file__).resolve().parents[2]
DEEP = 10_000


def nested(depth: int, kind: str = "list") -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value] if kind == "list" else {"k": value}
    return value


def nested_text(depth: int) -> str:
    return "[" * depth + "]" * depth


def message_json(metadata_value: str) -> bytes:
    return ('{"metadata":{"k":' + metadata_value + '},"parts":[{"kind":"text","text":"x"}],"role":"user"}').encode()


@pytest.mark.parametrize("kind", ["list", "dict"])
def test_metadata_nested_to_the_limit_is_fine_and_one_deeper_is_refused(kind: str) -> None:
    stored = Message.user("x", metadata={"k": nested(MAX_DEPTH, kind)}).metadata["k"]
    assert stored.count("[" if kind == "list" else "{") == MAX_DEPTH
    with pytest.raises(InvalidMessage, match=rf"metadata\['k'\]: JSON value nested deeper than {MAX_DEPTH} levels"):
        Message.user("x", metadata={"k": nested(MAX_DEPTH + 1, kind)})


@pytest.mark.parametrize("kind", ["list", "dict"])
def test_metadata_nested_10000_deep_is_invalid_not_a_recursion_error(kind: str) -> None:
    with pytest.raises(InvalidMessage, match=str(MAX_DEPTH)):
        Message.user("x", metadata={"k": nested(DEEP, kind)})
    with pytest.raises(InvalidMessage, match=str(MAX_DEPTH)):
        part = {"kind": "text", "text": "x", "metadata": {"k": nested(DEEP, kind)}}
        Message.model_validate({"role": "user", "parts": [part]})


def test_a_metadata_value_that_contains_itself_is_invalid() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(InvalidMessage, match="nested deeper"):
        Message.user("x", metadata={"k": loop})


def test_tool_details_nested_10000_deep_are_invalid() -> None:
    assert ToolOutput((), nested(MAX_DEPTH)).details is not None
    for depth in (MAX_DEPTH + 1, DEEP):
        with pytest.raises(InvalidMessage, match=str(MAX_DEPTH)):
            ToolOutput((), nested(depth))
        with pytest.raises(InvalidMessage, match=str(MAX_DEPTH)):
            ToolResultPart("t", "n", {"details": nested(depth)})


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, MAX_DOCUMENT_DEPTH + 1, DEEP])
def test_deep_json_text_is_invalid_on_every_parse_path(depth: int) -> None:
    data = message_json(nested_text(depth))
    for parse in (Message.model_validate_json, Message.from_canonical, Message.from_stored):
        with pytest.raises(InvalidMessage, match=str(MAX_DEPTH)):
            parse(data)
    with pytest.raises(InvalidMessage, match=str(MAX_DEPTH)):
        RawJSON(nested_text(depth))
    with pytest.raises(InvalidBatch, match=str(MAX_DEPTH)):
        Batch.from_canonical("c", "a", b"[" + data + b"]")
    wrapped = b'{"append_id":"a","conversation_id":"c","messages":[' + data + b"]}"
    with pytest.raises(InvalidBatch, match=str(MAX_DEPTH)):
        Batch.from_json(wrapped)


def test_json_text_nested_to_the_limit_round_trips_exactly() -> None:
    data = message_json(nested_text(MAX_DEPTH))
    message = Message.model_validate_json(data)
    assert message.canonical_json() == data
    assert Message.from_canonical(data) == message == Message.from_stored(data)
    batch = Batch("c", "a", [message])
    assert Batch.from_canonical("c", "a", batch.canonical_json()) == batch
    assert Batch.from_json(batch.to_json()) == batch


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    text = json.dumps({"k": "[" * DEEP + "{" * DEEP})
    assert RawJSON(text) == text.replace(" ", "")
    message = Message.user("[" * DEEP, metadata={"k": "{" * DEEP})
    assert Message.model_validate_json(message.canonical_json()) == message


def test_a_deeply_nested_record_on_the_log_is_poison(tmp_path: Path) -> None:
    messages = b"[" + message_json(nested_text(DEEP)) + b"]"
    record = {"conversation_id": "c", "append_id": "deep", "digest": "sha256:" + hashlib.sha256(messages).hexdigest(),
              "messages": messages, "message_count": 1, "content_bytes": 36, "created_at_ms": 0,
              "expected_last": None}
    with HistoryEngine.open(tmp_path / "d") as eng:
        position = eng.log.append(record_key("c", "deep"), frame("BatchAppended", record))
        eng.append(Batch("c", "a1", [Message.user("after")]))
        assert eng.catch_up(timeout=30)
        assert eng.stats().corrupt == 1
        [(where, why)] = eng.poison()
        assert where == position and "nested deeper" in why
        assert [m.text() for m in eng.read("c")] == ["after"]


@pytest.mark.parametrize("depth", [800, DEEP])
def test_the_cli_refuses_a_deeply_nested_file_with_exit_2_and_one_line(tmp_path: Path, depth: int) -> None:
    path = tmp_path / "batch.json"
    path.write_bytes(b"[" + message_json(nested_text(depth)) + b"]")
    proc = subprocess.run([sys.executable, "-m", "engine", "--data", str(tmp_path / "data"), "append", "c", "a",
                           "--file", str(path)], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert "nested deeper" in line and str(MAX_DEPTH) in line
