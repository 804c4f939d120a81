"""histlog's engine: the logs, the ``HistoryEngine`` facade, ``WindowReader`` and the CLI.

The errors and the data model are re-exported from ``schemas`` for convenience.
"""

from engine.facade import EMPTY, EngineStats, HistoryEngine
from engine.window import Reader, WindowReader
from schemas import *  # noqa: F403
from schemas import __all__ as _schemas_all

__all__ = ["EMPTY", "EngineStats", "HistoryEngine", "Reader", "WindowReader", *_schemas_all]
