"""Example custom projections (see README "Writing a custom projection").

Run one from offset 0 with ``histlog replay --projection examples.projections:ToolUsage``.
"""

from __future__ import annotations

from projections import BatchEvent, ProjectedEvent, Projection, ProjectionTx


class ToolUsage(Projection):
    """How often each tool was called, over every conversation (cleared ones included: a
    clear hides a conversation's messages, not the fact that a tool ran)."""

    name = "tool-usage"

    def apply(self, event: ProjectedEvent, tx: ProjectionTx) -> None:
        if not isinstance(event, BatchEvent):
            return
        for message in event.messages:
            for part in message.parts:
                if part.kind == "tool_call":
                    key = part.name.encode()
                    tx.put(key, str(int(tx.get(key) or b"0") + 1).encode())
