"""histlog's engine: the logs, the ``HistoryEngine`` facade, ``WindowReader``, the history
middleware, the provider adapters, the CLI, and the service's clients ``HistoryClient`` /
``AsyncHistoryClient`` (imported on first use: they need httpx, ``pip install 'histlog[server]'``).

The errors and the data model are re-exported from ``schemas`` for convenience.
"""

from typing import TYPE_CHECKING

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

if TYPE_CHECKING:
    from engine.client import AsyncHistoryClient, HistoryClient

_CLIENTS = ("AsyncHistoryClient", "HistoryClient")


def __getattr__(name: str) -> object:
    """``HistoryClient`` and ``AsyncHistoryClient`` load ``engine.client`` (and httpx) when first
    asked for, so the embedded engine imports without the ``server`` extra."""
    if name in _CLIENTS:
        try:
            import engine.client as clients
        except ImportError as exc:
            raise ImportError(f"engine.{name} needs httpx ({exc}): pip install 'histlog[server]'") from exc
        return getattr(clients, name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")


__all__ = [
    "EMPTY",
    "AsyncHistoryClient",
    "AsyncWrappedModel",
    "AsyncWrappedStreamer",
    "EngineStats",
    "HistoryClient",
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
