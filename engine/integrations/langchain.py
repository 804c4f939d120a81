"""histlog for LangChain (``pip install 'histlog[langchain]'``): the names the public contract
"LangChain" promises, from three modules.

- ``to_langchain`` / ``from_langchain`` / ``ConversionError`` (``lc_messages``, ``lc_blocks``):
  lossless conversion both ways; what has no counterpart raises, nothing is dropped.
- ``HistlogMiddleware`` (``lc_middleware``): agent middleware for langchain 1.x
  ``create_agent``: the stored window before the model, each run's turn appended as one batch
  under an append id derived from the run.
- ``HistlogChatMessageHistory`` (``lc_history``): the legacy ``BaseChatMessageHistory``.

docs/langchain.md is the user's guide.
"""

from engine.integrations.lc_blocks import ConversionError
from engine.integrations.lc_history import HistlogChatMessageHistory
from engine.integrations.lc_messages import from_langchain, to_langchain
from engine.integrations.lc_middleware import HistlogMiddleware, HistlogState

__all__ = [
    "ConversionError",
    "HistlogChatMessageHistory",
    "HistlogMiddleware",
    "HistlogState",
    "from_langchain",
    "to_langchain",
]
