"""Every package's ``__all__`` imports, and the public names of engine and projections are there."""

from __future__ import annotations

import importlib

import pytest

API_NAMES = {
    "engine": {"HistoryEngine", "WindowReader", "EngineStats", "HistoryError", "AppendConflict",
               "ConversationClosed", "CommitUnconfirmed", "LogUnavailable", "CorruptLog", "Batch", "Receipt",
               "HistoryMiddleware", "MiddlewareConfig", "CommitError", "uuid7", "EMPTY", "HistoryLoad",
               "HistoryTurn", "TurnSource", "Measure", "StoredMessage", "HistoryPosition", "TurnNotReplaceable",
               "PreconditionFailed", "NotFound"},
    "projections": {"Projection", "ProjectionTx", "ProjectionView", "BatchEvent", "ClearEvent", "TurnReplacedEvent"},
    "engine.cluster": {"Membership", "OwnershipMap", "OwnershipAssignor"},
    "engine.log": {"Log", "LogCursor", "Record", "partition_for_key", "record_key"},
    "engine.adapters": {"from_openai", "to_openai", "from_openai_response", "from_anthropic", "to_anthropic",
                        "from_anthropic_response"},
}


@pytest.mark.parametrize("package", sorted(API_NAMES))
def test_all_names_import_and_cover_the_contract(package: str) -> None:
    module = importlib.import_module(package)
    exported = set(module.__all__)
    for name in exported:
        assert hasattr(module, name), f"{package}.__all__ names {name!r}, which does not import"
    assert API_NAMES[package] <= exported
