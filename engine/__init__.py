"""histlog's engine: the logs, the ``HistoryEngine`` facade, ``WindowReader``, the history
middleware, the provider adapters and the CLI.

The errors and the data model are re-exported from ``schemas`` for convenience.
"""

from engine.facade import EMPTY, EngineStats, HistoryEngine
from engine.middleware import (
    AsyncWrappedModel,
    AsyncWrappedStreamer,
    HistoryMiddleware,
    MiddlewareConfig,
    TurnReplacer,
    WrappedModel,
    WrappedStreamer,
    Writer,
)
from engine.uuid7 import uuid7
from engine.window import Reader, WindowReader
from schemas import *  # noqa: F403
from schemas import __all__ as _schemas_all

__all__ = [
    "EMPTY",
    "AsyncWrappedModel",
    "AsyncWrappedStreamer",
    "EngineStats",
    "HistoryEngine",
    "HistoryMiddleware",
    "MiddlewareConfig",
    "Reader",
    "TurnReplacer",
    "WindowReader",
    "WrappedModel",
    "WrappedStreamer",
    "Writer",
    "uuid7",
    *_schemas_all,
]
