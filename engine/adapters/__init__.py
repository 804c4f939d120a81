"""Provider adapters: pure conversions between histlog messages and the message dicts of the
OpenAI Chat Completions API (``engine.adapters.openai``) and the Anthropic Messages API
(``engine.adapters.anthropic``), over the shared payload readers of ``_common``. No SDK is
imported; the dicts are the JSON payloads (what ``json.loads`` of a request or response body
gives, or an SDK's ``model_dump()``).

Promises:

* **Provider → histlog** (``from_openai``, ``from_anthropic``, ``*_response``) never drops what
  it does not understand: an unknown role, block type or member raises ``InvalidMessage``
  saying where (``OpenAI messages[3].content[1]: ...``). Provider members histlog has no field
  for but that matter on the way back (image ``detail``, ``cache_control``, citations, a
  message ``name``, the ``developer`` role) are kept in part or message metadata under
  ``openai.*`` / ``anthropic.*`` keys and restored by the reverse conversion.
* **histlog → provider** (``to_openai``, ``to_anthropic``) raises ``InvalidMessage`` for
  content the provider cannot take and the model would need (e.g. media in an assistant
  message); what the model never sees is left out: message and part metadata other than the
  provider's own keys, ``Citation`` objects, tool ``details`` when the output has content.
* **Round trips** provider → histlog → provider give the same payload, up to the
  normalisations listed per function (e.g. a single text part is written as a string).

Tool results name their tool in histlog (``ToolResultPart.name``) but not in either provider's
format: the name is taken from the assistant tool call with the same id earlier in the same
list, or from ``tool_names={call_id: name}`` (for a list that starts after the call).
"""

from __future__ import annotations

from engine.adapters.anthropic import from_anthropic, from_anthropic_response, to_anthropic
from engine.adapters.openai import from_openai, from_openai_response, to_openai

__all__ = [
    "from_anthropic",
    "from_anthropic_response",
    "from_openai",
    "from_openai_response",
    "to_anthropic",
    "to_openai",
]
