"""Example custom projections (see README "Writing a custom projection").

Run one from offset 0 with ``histlog replay --projection examples.projections:ToolUsage`` (or
``:WordIndex``).
"""

from __future__ import annotations

import re
import struct

from projections import (
    BatchEvent,
    ClearEvent,
    ProjectedEvent,
    Projection,
    ProjectionTx,
    ProjectionView,
    TurnReplacedEvent,
)
from schemas.messages import Message


class ToolUsage(Projection):
    """How often each tool was called, over every conversation. Replaced turns still count:
    hiding messages does not undo that a tool ran. A cleared conversation's calls count until the
    projection is rebuilt: a replay gives only the clear of an erased conversation (its content
    is gone), so a rebuilt count leaves them out."""

    name = "tool-usage"

    def apply(self, event: ProjectedEvent, tx: ProjectionTx) -> None:
        if isinstance(event, ClearEvent):
            return
        for message in event.messages:  # BatchEvent or TurnReplacedEvent: the new messages
            for part in message.parts:
                if part.kind == "tool_call":
                    key = part.name.encode()
                    tx.put(key, str(int(tx.get(key) or b"0") + 1).encode())

    @staticmethod
    def count(view: ProjectionView, tool: str) -> int:
        """Calls of ``tool``: the state is split by partition (a count per partition), so add them up."""
        return sum(int(v) for v in view.rows(tool.encode()).values())


_WORD = re.compile(r"\w+")
_SEQ = struct.Struct(">Q")


def words(message: Message) -> set[str]:
    """The lower-cased words of a message's text parts."""
    return {w.lower() for w in _WORD.findall(message.text())}


class WordIndex(Projection):
    """A full-text index of the *visible* history: which messages contain a word.

    Keys (in the projection's own keyspace; ``00`` separates, ids have no control characters):

    * ``w WORD 00 CONVERSATION 00 SEQ`` → empty: the posting list of a word, in conversation
      and stored order, so ``search`` is one prefix scan;
    * ``m CONVERSATION 00 SEQ`` → the message's words joined by ``\\n``: what to remove when the
      message is hidden (its turn was replaced) or the conversation is cleared.
    """

    name = "word-index"

    def apply(self, event: ProjectedEvent, tx: ProjectionTx) -> None:
        conv = event.conversation_id.encode("utf-8")
        if isinstance(event, ClearEvent):
            for key, _ in tx.scan(b"m" + conv + b"\x00"):
                self._drop(tx, conv, key[len(conv) + 2:])
            return
        if isinstance(event, TurnReplacedEvent):
            for hidden in event.hidden_seqs:
                self._drop(tx, conv, _SEQ.pack(hidden))
        assert isinstance(event, BatchEvent | TurnReplacedEvent)  # Invariant: ClearEvent returned above.
        for i, message in enumerate(event.messages):
            seq = _SEQ.pack(event.first_seq + i)
            found = sorted(words(message))
            for word in found:
                tx.put(b"w" + word.encode("utf-8") + b"\x00" + conv + b"\x00" + seq, b"")
            tx.put(b"m" + conv + b"\x00" + seq, "\n".join(found).encode("utf-8"))

    @staticmethod
    def _drop(tx: ProjectionTx, conv: bytes, seq: bytes) -> None:
        row = tx.get(b"m" + conv + b"\x00" + seq)
        if row is None:
            return
        for word in filter(None, row.split(b"\n")):
            tx.delete(b"w" + word + b"\x00" + conv + b"\x00" + seq)
        tx.delete(b"m" + conv + b"\x00" + seq)

    @staticmethod
    def search(view: ProjectionView, word: str) -> list[tuple[str, int]]:
        """``(conversation id, seq)`` of every visible message containing ``word``."""
        prefix = b"w" + word.lower().encode("utf-8") + b"\x00"
        hits = []
        for key, _ in view.scan(prefix):
            conv, seq = key[len(prefix):-9], key[-8:]  # CONVERSATION 00 SEQ (8 bytes, may hold 00s)
            hits.append((conv.decode("utf-8"), _SEQ.unpack(seq)[0]))
        return hits
