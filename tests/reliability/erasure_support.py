"""What the erasure proofs share: unguessable content, the batches that carry it, a custom
projection that stores content, and the user's check ("read every byte of every file under the
data directory").

The content is ``secrets.token_hex(16)`` (128 random bits), each token in a text part, a tool
result, message metadata and an external id. The needles of a cleared conversation are its
tokens (and every 12-character window of them), its batches' canonical JSON and their digests
(hex and raw bytes): what would let anyone read the content or confirm a guess of it.

**Why the victim's tokens are not plain hex.** RocksDB compresses table blocks with Snappy
(this engine's default options), and Snappy replaces any 4-byte run that matched earlier bytes
of the block by a back-reference. A hex token in a block full of other hex (digests, ids, key
ids, other tokens) hits such a chance match about once per token (measured: a live
conversation's 32-digit hex token was absent, as a whole, from the only table file holding it,
while each of its 8-digit quarters was there), so a grep for a whole hex token can miss content
that is present. The victim's tokens are therefore the same 128 random bits spelled in the
letters G..V (``victim_token``), which no other byte string of the state spells (other
conversations keep hex tokens), and the grep also looks for every 12-letter window. A victim
token can still meet a chance match with the conversation's own other tokens (estimated: 4% of
tokens; seen once in nine runs of the control test when it looked for whole tokens only);
one match leaves a piece of at least 14 letters, so a window shows the token unless several
chance matches cut it into pieces all shorter than 12. A live conversation's presence (the
control that proves the grep can fail) is checked by 8-digit windows for the same reason.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from engine.facade import HistoryEngine
from projections.custom import Projection, ProjectionTx
from projections.events import BatchEvent, ClearEvent, ProjectedEvent, TurnReplacedEvent
from schemas.batch import Batch, Receipt
from schemas.messages import Message
from schemas.parts import TextPart, ToolCallPart, ToolOutput, ToolResultPart

__all__ = [
    "ContentStore",
    "Written",
    "files_holding",
    "holds_some_of",
    "needles_of",
    "snapshot",
    "token_batch",
    "victim_token",
    "windows",
    "write_conversation",
]


_VICTIM_LETTERS = str.maketrans("0123456789abcdef", "GHIJKLMNOPQRSTUV")


def victim_token() -> str:
    """128 random bits as 32 letters G..V: see the module docstring."""
    return secrets.token_hex(16).translate(_VICTIM_LETTERS)


def windows(token: str, width: int) -> list[str]:
    """Every ``width``-character window of ``token``."""
    return [token[i:i + width] for i in range(len(token) - width + 1)]


def token_batch(conv: str, append_id: str, token: str) -> Batch:
    """One turn carrying ``token`` in a text part, a tool result (``ToolOutput.text``), message
    metadata and an ``external_id`` (which keys the ``X`` rows of the state)."""
    return Batch(conv, append_id, [
        Message.user(TextPart(f"my secret is {token}"),
                     metadata={"note": f"meta-{token}", "external_id": f"ext-{token}"}),
        Message.assistant(ToolCallPart(id="call-1", name="lookup", arguments='{"q": "x"}')),
        Message.tool(ToolResultPart(id="call-1", name="lookup", output=ToolOutput.text(f"tool says {token}"))),
        Message.assistant(f"noted: {token[::-1]}"),
    ])


@dataclass
class Written:
    """What one conversation was written with: its tokens, batches and receipts."""

    conv: str
    tokens: list[str] = field(default_factory=list)
    batches: list[Batch] = field(default_factory=list)
    receipts: list[Receipt] = field(default_factory=list)


def write_conversation(engine: HistoryEngine, conv: str, turns: int = 2, replace: bool = False,
                       victim: bool = False) -> Written:
    """``turns`` token turns in ``conv``; with ``replace``, the last one is then replaced
    (``replace_turn``, reason "edit"), so the state holds hidden rows of the old turn. A
    ``victim`` (a conversation to be cleared) gets ``victim_token``s, the others hex tokens."""
    w = Written(conv)
    new_token = victim_token if victim else (lambda: secrets.token_hex(16))
    for i in range(turns):
        token = new_token()
        batch = token_batch(conv, f"a{i}", token)
        w.tokens.append(token)
        w.batches.append(batch)
        w.receipts.append(engine.append(batch))
    if replace:
        token = new_token()
        batch = token_batch(conv, "edit", token)
        latest = engine.latest_turn(conv)
        assert latest is not None
        w.receipts.append(engine.replace_turn(batch, latest.id, "edit"))
        w.tokens.append(token)
        w.batches.append(batch)
    return w


def needles_of(w: Written) -> dict[str, bytes]:
    """Every byte string no file may hold once ``w.conv`` is cleared, named for the report."""
    out: dict[str, bytes] = {}
    for i, token in enumerate(w.tokens):
        out[f"token {i}"] = token.encode()
        out[f"reversed token {i}"] = token[::-1].encode()
        for j, piece in enumerate(windows(token, 12)):
            out[f"token {i} window {j}"] = piece.encode()
    for i, batch in enumerate(w.batches):
        canonical = batch.canonical_json()
        out[f"canonical JSON of batch {i}"] = canonical
        for j, m in enumerate(batch.messages):
            if any(t.encode() in m.canonical_json() or t[::-1].encode() in m.canonical_json() for t in w.tokens):
                # Only a message of its own: the tool call message, the same in every token_batch,
                # is rightly in the rows of every other conversation.
                out[f"canonical JSON of batch {i} message {j}"] = m.canonical_json()
        hexdigest = hashlib.sha256(canonical).hexdigest()
        assert batch.digest == "sha256:" + hexdigest
        out[f"digest hex of batch {i}"] = hexdigest.encode()
        out[f"raw digest of batch {i}"] = bytes.fromhex(hexdigest)
    for i, receipt in enumerate(w.receipts):
        out[f"receipt digest {i}"] = receipt.digest.removeprefix("sha256:").encode()
    return out


def files_holding(root: Path, needles: dict[str, bytes]) -> list[tuple[str, str]]:
    """``(needle name, file)`` for every needle found in any file under ``root`` (every byte of
    every file: log segments, the state's table files, WAL, manifests, the key store)."""
    found: list[tuple[str, str]] = []
    seen = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            data = path.read_bytes()
            seen += 1
            for what, needle in needles.items():
                if needle in data:
                    found.append((what, str(path.relative_to(root))))
    assert seen > 0, f"no file under {root}"
    return found


def holds_some_of(root: Path, w: Written) -> bool:
    """Whether some file holds an 8-character window of each of ``w``'s tokens (a live one's)."""
    return all(files_holding(root, {str(j): piece.encode() for j, piece in enumerate(windows(t, 8))})
               for t in w.tokens)


def all_files(root: Path) -> list[str]:
    """Every file under ``root``, relative (what ``files_holding`` read)."""
    return sorted(str((Path(d) / f).relative_to(root)) for d, _, fs in os.walk(root) for f in fs)


def snapshot(engine: HistoryEngine, convs: Iterable[str]) -> dict[str, tuple[object, list[bytes]]]:
    """Per conversation: its entries (``StoredMessage``s) and its messages' canonical JSON."""
    return {c: (engine.entries(c), [m.canonical_json() for m in engine.read(c)]) for c in convs}


class ContentStore(Projection):
    """A custom projection that stores content: every message's canonical JSON under
    ``conversation 0x1F seq``; a ``ClearEvent`` deletes the conversation's rows. ``seen`` records
    what was delivered (kind, conversation), so a test can check a replay skips erased batches."""

    name = "content-store"

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def apply(self, event: ProjectedEvent, tx: ProjectionTx) -> None:
        conv = str(event.conversation_id)
        prefix = conv.encode() + b"\x1f"
        if isinstance(event, ClearEvent):
            self.seen.append(("clear", conv))
            for k, _ in tx.scan(prefix):
                tx.delete(k)
            return
        kind = "batch" if isinstance(event, BatchEvent) else "replace"
        assert isinstance(event, BatchEvent | TurnReplacedEvent)
        self.seen.append((kind, conv))
        for i, m in enumerate(event.messages):
            tx.put(prefix + str(event.first_seq + i).encode(), m.canonical_json())

    def rows_of(self, engine: HistoryEngine, conv: str) -> list[tuple[bytes, bytes]]:
        return engine.view(self.name).scan(conv.encode() + b"\x1f")
