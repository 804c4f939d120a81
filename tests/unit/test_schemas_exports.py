"""``schemas.__all__`` is complete for the public names and importable; the committed JSON Schema is fresh."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import schemas

ROOT = Path(__file__).resolve().parents[2]

API_NAMES = {
    # IDs, positions
    "ConversationID",
    "AppendID",
    "LogPosition",
    "HistoryPosition",
    # messages
    "Role",
    "TextPart",
    "MediaPart",
    "ReasoningPart",
    "ToolCallPart",
    "ToolResultPart",
    "ToolOutput",
    "RefusalPart",
    "Message",
    "RawJSON",
    # batch, receipt, read side
    "Batch",
    "Receipt",
    "StoredMessage",
    "HistoryLoad",
    "HistoryTurn",
    "TurnSource",
    "Measure",
    # chat
    "FinishReason",
    "Usage",
    "ChatRequest",
    "ChatResponse",
    "ChatDelta",
    "TextDelta",
    "ReasoningDelta",
    "ToolCallDelta",
    "RefusalDelta",
    "ResponseAccumulator",
    # errors
    "HistoryError",
    "InvalidConversationID",
    "InvalidAppendID",
    "InvalidMessage",
    "InvalidBatch",
    "InvalidReceipt",
    "InvalidWindow",
    "AppendConflict",
    "ConversationClosed",
    "NotFound",
    "TurnNotReplaceable",
    "PreconditionFailed",
    "WindowTooSmall",
    "CommitError",
    "CommitUnconfirmed",
    "LogUnavailable",
    "CorruptLog",
}


def test_all_is_importable() -> None:
    for name in schemas.__all__:
        assert getattr(schemas, name) is not None, name
    assert len(set(schemas.__all__)) == len(schemas.__all__)


def test_all_covers_the_api() -> None:
    assert API_NAMES - set(schemas.__all__) == set()


def test_all_errors_reexported() -> None:
    import schemas.errors

    assert set(schemas.errors.__all__) <= set(schemas.__all__)


def test_committed_json_schema_is_fresh() -> None:
    spec = importlib.util.spec_from_file_location(
        "export_json_schema", ROOT / "scripts" / "export_json_schema.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    committed = (ROOT / "schemas" / "message.schema.json").read_text(encoding="utf-8")
    assert committed == module.export(), "run: python scripts/export_json_schema.py"
