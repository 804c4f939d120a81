"""Batch (one immutable append) and Receipt (proof it was accepted); the read-side value types
are ``schemas.results`` (re-exported here, where they always were).

A ``Batch`` is what the log stores: its ``canonical_json()`` is the canonical JSON array of its
messages (the IDs are not part of it) and ``digest`` is ``sha256:`` + hex of those bytes. Both
are computed once, at construction, from a snapshot of the messages (messages are deeply
immutable, so the snapshot is a tuple). ``Batch.from_canonical`` is the strict reverse used on
events read from the log: it only accepts bytes that are exactly canonical.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson
from pydantic import TypeAdapter, ValidationError

from schemas.canonical import DIGEST_PATTERN, digest_of, loads_exact
from schemas.errors import InvalidBatch, InvalidMessage, InvalidReceipt
from schemas.ids import AppendID, ConversationID, RunID
from schemas.messages import Message, invalid
from schemas.positions import LogPosition
from schemas.results import HistoryLoad, HistoryTurn, Located, Measure, StoredMessage, StoredWindow, TurnSource

__all__ = [
    "Batch",
    "HistoryLoad",
    "HistoryTurn",
    "Located",
    "Measure",
    "Receipt",
    "StoredMessage",
    "StoredWindow",
    "TurnSource",
]

_MESSAGES: Final = TypeAdapter(list[Message])
"""Built once: validates the canonical array of a batch (``from_canonical``)."""



def _join(messages: tuple[Message, ...]) -> bytes:
    return b"[" + b",".join([m.canonical_json() for m in messages]) + b"]"


def _load(data: bytes | bytearray | str) -> Any:
    """The JSON tree of ``data`` with exact numbers; ``InvalidBatch`` saying why it is not JSON."""
    try:
        return loads_exact(data)
    except ValueError as exc:
        raise InvalidBatch(f"invalid batch: {exc}") from None


def _messages_of(raw: Any) -> list[Message]:
    """The messages of a batch document's ``messages`` member, each validated."""
    if not isinstance(raw, list):
        raise InvalidBatch("invalid batch: messages must be a JSON array")
    messages = []
    for i, item in enumerate(raw):
        try:
            messages.append(Message.model_validate(item))
        except InvalidMessage as exc:
            raise InvalidBatch(
                f"invalid batch: messages[{i}]: {str(exc).removeprefix('invalid message: ')}"
            ) from None
    return messages


class Batch:
    """One immutable append: ``Batch(conversation_id, append_id, messages, run_id=None)``.

    Plain strings are accepted for the IDs and validated (``InvalidConversationID`` /
    ``InvalidAppendID``). ``messages`` is any iterable of ``Message``; at least one
    (``InvalidBatch`` otherwise). ``run_id``: the run that wrote it, for traceability only
    (``run_wrote_history``; ``InvalidRequest`` for a bad one): it is no part of the content, the
    digest or the equality, so a retry under another run is still a duplicate of the first.
    Equality and hash are by (conversation id, append id, digest).
    """

    __slots__ = ("_append_id", "_canonical", "_conversation_id", "_digest", "_messages", "_run_id")

    _conversation_id: ConversationID
    _append_id: AppendID
    _messages: tuple[Message, ...]
    _canonical: bytes
    _digest: str
    _run_id: RunID | None

    def __init__(self, conversation_id: str, append_id: str, messages: Iterable[Message], *,
                 run_id: str | None = None) -> None:
        conv = ConversationID(conversation_id)
        app = AppendID(append_id)
        if isinstance(messages, (str, bytes, Message)) or not isinstance(messages, Iterable):
            raise InvalidBatch(
                f"invalid batch: messages must be an iterable of Message, got {type(messages).__name__}"
            )
        snapshot = tuple(messages)
        if not snapshot:
            raise InvalidBatch("invalid batch: no messages (a batch needs at least one message)")
        for i, message in enumerate(snapshot):
            if type(message) is not Message and not isinstance(message, Message):
                raise InvalidBatch(
                    f"invalid batch: messages[{i}]: expected a Message, got {type(message).__name__}"
                )
        canonical = _join(snapshot)
        self._set(conv, app, snapshot, canonical, run_id=None if run_id is None else RunID(run_id))

    def _set(
        self, conv: ConversationID, app: AppendID, messages: tuple[Message, ...], canonical: bytes,
        digest: str | None = None, run_id: RunID | None = None,
    ) -> None:
        """``digest``: ``digest_of(canonical)``, when the caller computed it from these bytes."""
        object.__setattr__(self, "_run_id", run_id)
        object.__setattr__(self, "_conversation_id", conv)
        object.__setattr__(self, "_append_id", app)
        object.__setattr__(self, "_messages", messages)
        object.__setattr__(self, "_canonical", canonical)
        object.__setattr__(self, "_digest", digest_of(canonical) if digest is None else digest)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Batch is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("Batch is immutable")

    # ----- reading
    @property
    def conversation_id(self) -> ConversationID:
        return self._conversation_id

    @property
    def append_id(self) -> AppendID:
        return self._append_id

    @property
    def run_id(self) -> RunID | None:
        """The run that wrote the batch (traceability only), or None."""
        return self._run_id

    @property
    def messages(self) -> tuple[Message, ...]:
        """The snapshot taken at construction."""
        return self._messages

    @property
    def digest(self) -> str:
        """``"sha256:"`` + lowercase hex SHA-256 of ``canonical_json()``."""
        return self._digest

    def canonical_json(self) -> bytes:
        """The canonical JSON array of the messages (``docs/canonical-json.md``): what is digested."""
        return self._canonical

    def content_bytes(self) -> int:
        """Sum of the messages' ``content_bytes()`` (canonical JSON without message metadata)."""
        return sum(m.content_bytes() for m in self._messages)

    def __len__(self) -> int:
        return len(self._messages)

    def __iter__(self) -> Any:
        return iter(self._messages)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Batch):
            return NotImplemented
        return (
            self._digest == other._digest
            and self._conversation_id == other._conversation_id
            and self._append_id == other._append_id
        )

    def __hash__(self) -> int:
        return hash((self._conversation_id, self._append_id, self._digest))

    def __repr__(self) -> str:
        return (
            f"Batch({str(self._conversation_id)!r}, {str(self._append_id)!r}, "
            f"<{len(self._messages)} messages, {self._digest[:19]}...>)"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        if self._run_id is not None:
            return (_rebuild_batch, (str(self._conversation_id), str(self._append_id), self._canonical,
                                     str(self._run_id)))
        return (Batch.from_canonical, (str(self._conversation_id), str(self._append_id), self._canonical))

    def __copy__(self) -> Batch:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Batch:
        return self

    # ----- JSON
    def to_json(self) -> bytes:
        """``{"append_id":…,"conversation_id":…,"messages":[…canonical…]}`` (keys sorted, no
        spaces), with ``"run_id"`` when the batch has one."""
        tree: dict[str, Any] = {
            "append_id": str(self._append_id),
            "conversation_id": str(self._conversation_id),
            "messages": orjson.Fragment(self._canonical),
        }
        if self._run_id is not None:
            tree["run_id"] = str(self._run_id)
        return orjson.dumps(tree, option=orjson.OPT_SORT_KEYS)

    @classmethod
    def from_json(cls, data: bytes | bytearray | str) -> Batch:
        """Parse ``to_json()`` output (any key order or whitespace; number spellings kept).

        Raises ``InvalidBatch`` (bad JSON, wrong shape, invalid message) or the ID errors.
        """
        tree = _load(data)
        if not isinstance(tree, dict):
            raise InvalidBatch(
                "invalid batch: expected a JSON object with conversation_id, append_id, messages"
            )
        unknown = sorted(set(tree) - {"conversation_id", "append_id", "messages", "run_id"})
        if unknown:
            raise InvalidBatch(f"invalid batch: unknown member {unknown[0]!r}")
        missing = [k for k in ("conversation_id", "append_id", "messages") if k not in tree]
        if missing:
            raise InvalidBatch(f"invalid batch: missing member {missing[0]!r}")
        return cls(tree["conversation_id"], tree["append_id"], _messages_of(tree["messages"]),
                   run_id=tree.get("run_id"))

    @classmethod
    def from_messages_json(cls, conversation_id: str, append_id: str, data: bytes | bytearray | str) -> Batch:
        """The batch of ``conversation_id`` and ``append_id`` whose messages ``data`` holds: a
        JSON array of messages or ``{"messages": [...]}`` (``histlog append --file``), parsed as
        ``from_json`` parses its ``messages``. Raises ``InvalidBatch`` or the ID errors."""
        tree = _load(data)
        if isinstance(tree, dict):
            if set(tree) != {"messages"}:
                raise InvalidBatch('invalid batch: expected a JSON array of messages or {"messages": [...]}, '
                                   f"got an object with keys {sorted(tree)}")
            tree = tree["messages"]
        if not isinstance(tree, list):
            raise InvalidBatch('invalid batch: expected a JSON array of messages or {"messages": [...]}')
        return cls(conversation_id, append_id, _messages_of(tree))

    @classmethod
    def from_canonical(cls, conversation_id: str, append_id: str, data: bytes) -> Batch:
        """Rebuild a batch from its canonical bytes (an event read from the log).

        Raises ``InvalidBatch`` unless ``data`` is *exactly* the canonical JSON of the batch it
        describes (no extra whitespace, keys sorted, defaults omitted...). Fast path: pydantic's
        JSON parser; exact-number fallback when metadata or details carry number spellings
        pydantic cannot keep.
        """
        conv = ConversationID(conversation_id)
        app = AppendID(append_id)
        data = bytes(data)
        try:
            messages = tuple(_MESSAGES.validate_json(data))
        except (ValidationError, InvalidMessage, ValueError):
            messages = ()
        if not messages or _join(messages) != data:
            messages = cls._exact_messages(data)
            if not messages:
                raise InvalidBatch("invalid batch: no messages (a batch needs at least one message)")
            if _join(messages) != data:
                raise InvalidBatch(
                    "invalid batch: bytes are not canonical JSON (whitespace, key order, "
                    "defaults or spellings differ from the canonical form)"
                )
        batch = cls.__new__(cls)
        batch._set(conv, app, messages, data)
        return batch

    @staticmethod
    def _exact_messages(data: bytes) -> tuple[Message, ...]:
        try:
            tree = loads_exact(data)
        except ValueError as exc:
            raise InvalidBatch(f"invalid batch: {exc}") from None
        if not isinstance(tree, list):
            raise InvalidBatch("invalid batch: canonical bytes must be a JSON array of messages")
        try:
            return tuple(_MESSAGES.validate_python(tree))
        except ValidationError as exc:
            raise InvalidBatch(str(invalid(exc, "batch"))) from None
        except InvalidMessage as exc:
            raise InvalidBatch(f"invalid batch: {exc}") from None


def _rebuild_batch(conversation_id: str, append_id: str, canonical: bytes, run_id: str) -> Batch:
    """Unpickle a batch with a run (``Batch.__reduce__``)."""
    batch = Batch.from_canonical(conversation_id, append_id, canonical)
    object.__setattr__(batch, "_run_id", RunID(run_id))
    return batch


@dataclass(frozen=True, slots=True)
class Receipt:
    """Proof that a whole batch was accepted: its ids, digest, and the log ``position`` of the event.

    ``Receipt(conversation_id, append_id, digest, position)``; plain strings are accepted for
    the IDs. Raises ``InvalidReceipt`` for a malformed digest or position.
    """

    conversation_id: ConversationID
    append_id: AppendID
    digest: str
    position: LogPosition

    def __post_init__(self) -> None:
        object.__setattr__(self, "conversation_id", ConversationID(self.conversation_id))
        object.__setattr__(self, "append_id", AppendID(self.append_id))
        if not isinstance(self.digest, str) or DIGEST_PATTERN.fullmatch(self.digest) is None:
            raise InvalidReceipt(
                f"invalid receipt: digest {self.digest!r} is not 'sha256:' + 64 lowercase hex digits"
            )
        if not isinstance(self.position, LogPosition):
            raise InvalidReceipt(
                f"invalid receipt: position must be a LogPosition, got {type(self.position).__name__}"
            )

    @classmethod
    def of_valid(cls, conversation_id: ConversationID, append_id: AppendID, digest: str,
                 position: LogPosition) -> Receipt:
        """The receipt of parts that are valid already (admission's: typed ids, a digest it
        checked or computed, a ``LogPosition``), without checking them again: 1 us instead of 3,
        once per write."""
        receipt = object.__new__(cls)
        object.__setattr__(receipt, "conversation_id", conversation_id)
        object.__setattr__(receipt, "append_id", append_id)
        object.__setattr__(receipt, "digest", digest)
        object.__setattr__(receipt, "position", position)
        return receipt

    def validate_for(self, batch: Batch) -> None:
        """Raise ``InvalidReceipt`` unless this receipt names ``batch`` (ids and digest)."""
        if self.conversation_id != batch.conversation_id:
            raise InvalidReceipt(
                f"receipt is for conversation {str(self.conversation_id)!r}, "
                f"not {str(batch.conversation_id)!r}"
            )
        if self.append_id != batch.append_id:
            raise InvalidReceipt(
                f"receipt is for append id {str(self.append_id)!r}, not {str(batch.append_id)!r}"
            )
        if self.digest != batch.digest:
            raise InvalidReceipt(
                f"receipt digest {self.digest} does not match the batch ({batch.digest}): "
                "the append id names other content"
            )

    def to_dict(self) -> dict[str, Any]:
        """``{"conversation_id", "append_id", "digest", "position": {"partition", "offset"}}``."""
        return {
            "conversation_id": str(self.conversation_id),
            "append_id": str(self.append_id),
            "digest": self.digest,
            "position": {"partition": self.position.partition, "offset": self.position.offset},
        }

    def to_json(self) -> bytes:
        """``to_dict()`` as compact JSON with sorted keys."""
        return orjson.dumps(self.to_dict(), option=orjson.OPT_SORT_KEYS)

    @classmethod
    def from_json(cls, data: bytes | bytearray | str) -> Receipt:
        """Parse ``to_json()``. Raises ``InvalidReceipt`` (or the ID errors)."""
        try:
            tree = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise InvalidReceipt(f"invalid receipt: not JSON ({exc})") from None
        return cls.from_dict(tree)

    @classmethod
    def from_dict(cls, tree: Any) -> Receipt:
        """Build from ``to_dict()`` output. Raises ``InvalidReceipt`` (or the ID errors)."""
        keys = {"conversation_id", "append_id", "digest", "position"}
        if not isinstance(tree, Mapping) or set(tree) != keys:
            raise InvalidReceipt(f"invalid receipt: expected an object with exactly {sorted(keys)}")
        pos = tree["position"]
        if (
            not isinstance(pos, Mapping)
            or set(pos) != {"partition", "offset"}
            or not all(type(pos[k]) is int and pos[k] >= 0 for k in ("partition", "offset"))
        ):
            raise InvalidReceipt(
                'invalid receipt: position must be {"partition": int >= 0, "offset": int >= 0}'
            )
        return cls(
            tree["conversation_id"],
            tree["append_id"],
            tree["digest"],
            LogPosition(pos["partition"], pos["offset"]),
        )
