"""An event's content: sealed and opened (``seal_event`` / ``open_event``, the one place content is
sealed and opened, over ``schemas.sealed``) and checked into the batch it carries
(``event_batch``: the digest, count, sizes and messages of a decoded event, exactly, by the
message models). The events and their codec are ``schemas.events``, which never sees a key.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from schemas.canonical import digest_of
from schemas.errors import CorruptLog, HistoryError
from schemas.events import AssetsLinked, BatchAppended, Checkpointed, TurnReplaced
from schemas.sealed import (
    SEALED_ASSETS,
    SEALED_BATCH,
    SEALED_CHECKPOINTED,
    SEALED_REPLACED,
    DataKey,
    open_sealed,
    seal,
)

if TYPE_CHECKING:
    from schemas.batch import Batch
    from schemas.messages import Message

__all__ = ["Content", "event_batch", "open_content", "open_event", "seal_assets", "seal_checkpointed", "seal_event"]


_READERS: list[Callable[[str, str, bytes], Batch]] = []


def _from_canonical() -> Callable[[str, str, bytes], Batch]:
    """``Batch.from_canonical``, imported on first use (the codec itself needs no message
    model), then kept: an import statement per record costs ~1 us."""
    if not _READERS:
        from schemas.batch import Batch

        _READERS.append(Batch.from_canonical)
    return _READERS[0]


def _starts_turn(message: Message) -> bool:
    """``schemas.messages.starts_turn`` (imported on use: only replacements ask, and the codec
    itself needs no message model)."""
    from schemas.messages import starts_turn

    return starts_turn(message)


Content = BatchAppended | TurnReplaced | AssetsLinked | Checkpointed
"""The events whose content is sealed: a batch's messages, a replacement's, a link's refs, a
checkpoint change's content."""


def _record_of(event: Content) -> str:
    if isinstance(event, AssetsLinked):
        return SEALED_ASSETS
    if isinstance(event, Checkpointed):
        return SEALED_CHECKPOINTED
    return SEALED_BATCH if isinstance(event, BatchAppended) else SEALED_REPLACED


def _bound_id(event: Content) -> str:
    """The id the sealed content is bound to besides its conversation (associated data)."""
    if isinstance(event, AssetsLinked):
        return event.message_id
    return event.record_id if isinstance(event, Checkpointed) else event.append_id


def seal_checkpointed(event: Checkpointed, key: DataKey) -> Checkpointed:
    """The sealed form of a plain ``Checkpointed``: its content encrypted under ``key``."""
    assert event.sealed is None  # Invariant: writers seal the plain event they built, once.
    sealed = seal(key, event.content, conversation_id=event.conversation_id, append_id=event.record_id,
                  record=SEALED_CHECKPOINTED)
    return Checkpointed(event.conversation_id, event.record_id, event.kind, b"", event.created_at_ms, sealed)


def seal_assets(event: AssetsLinked, key: DataKey) -> AssetsLinked:
    """The sealed form of a plain ``AssetsLinked``: its refs encrypted under ``key``, ``assets``
    emptied (as ``seal_event`` seals a batch)."""
    assert event.sealed is None  # Invariant: writers seal the plain event they built, once.
    sealed = seal(key, event.assets, conversation_id=event.conversation_id, append_id=event.message_id,
                  record=SEALED_ASSETS)
    return AssetsLinked(event.conversation_id, event.message_id, b"", event.created_at_ms, sealed)


def seal_event(event: BatchAppended | TurnReplaced, key: DataKey) -> BatchAppended | TurnReplaced:
    """The sealed form of a plain event: its content (``messages``) encrypted under ``key`` for this
    record (``schemas.sealed.seal``), ``digest`` and ``messages`` emptied. The one place content
    is sealed."""
    assert event.sealed is None  # Invariant: writers seal the plain event they built, once.
    sealed = seal(key, event.messages, conversation_id=event.conversation_id, append_id=event.append_id,
                  record=_record_of(event))
    if isinstance(event, BatchAppended):
        return BatchAppended(event.conversation_id, event.append_id, "", b"", event.message_count,
                             event.content_bytes, event.created_at_ms, event.expected_last, sealed, event.fence,
                             event.run_id, event.turn_id, event.turn_position)
    return TurnReplaced(event.conversation_id, event.append_id, "", b"", event.message_count, event.content_bytes,
                        event.created_at_ms, event.old_turn_id, event.reason, sealed, event.fence, event.run_id)


def open_content(event: Content, key: DataKey) -> bytes:
    """The content of a sealed event, opened under ``key`` (its ``sealed.key_id``'s data key):
    the canonical JSON its ``sealed`` holds, for ``event_batch(event, content=...)``, which checks
    it without a plain event being built. ``DecryptionFailed`` (a ``CorruptLog``: poison) when it
    does not open."""
    sealed = event.sealed
    assert sealed is not None  # Invariant: callers open sealed events only.
    return open_sealed(key, sealed, conversation_id=event.conversation_id, append_id=_bound_id(event),
                       record=_record_of(event))


def open_event(event: BatchAppended | TurnReplaced, key: DataKey) -> BatchAppended | TurnReplaced:
    """The plain form of a sealed event, opened under ``key`` (``open_content``): ``messages`` the
    decrypted content and ``digest`` its ``sha256:`` (computed here, in memory only: admission
    compares content by it, every instance alike, whichever key sealed it). ``DecryptionFailed``
    when it does not open. A plain event is returned as it is."""
    if event.sealed is None:
        return event
    content = open_content(event, key)
    if isinstance(event, BatchAppended):
        return BatchAppended(event.conversation_id, event.append_id, digest_of(content), content,
                             event.message_count, event.content_bytes, event.created_at_ms, event.expected_last)
    return TurnReplaced(event.conversation_id, event.append_id, digest_of(content), content, event.message_count,
                        event.content_bytes, event.created_at_ms, event.old_turn_id, event.reason)


def event_batch(event: BatchAppended | TurnReplaced, known: Batch | None = None, *,
                content: bytes | None = None) -> Batch:
    """The batch a decoded event carries, checked: ``CorruptLog`` unless its messages have the
    event's digest and are the canonical JSON of valid messages whose count and content bytes are
    the event's, and a replacement turn starts with its user message.

    ``known`` is a batch this process wrote under the same record key and digest: when its
    canonical bytes are the event's it is returned without parsing (its digest is then the
    event's by construction). Otherwise the messages are validated in full, never skipped for a
    matching digest (the digest is public), by ``Batch.from_canonical``, which also gives the
    reason of a rejection.

    A plain event's messages and digest are its fields. A sealed event's are ``content`` (what
    ``open_content`` opened of it; required) and its ``sha256:``, computed once here, in memory:
    the event stays sealed (no plain copy of it is built) and the batch's ``digest`` is the one
    admission compares and stores.
    """
    if event.sealed is None:
        assert content is None  # Invariant: a plain event's messages are its own.
        messages = event.messages
    else:
        assert content is not None  # Invariant: callers open a sealed event before reading its batch.
        messages = content
    if known is not None and known.canonical_json() == messages:
        batch = known
    else:
        # A plain event's digest is a claim, checked first. Opened content has no digest to
        # check: its batch's is computed from it, once.
        if content is None and digest_of(messages) != event.digest:
            raise CorruptLog("event messages do not match its digest", reason="digest mismatch")
        try:
            batch = _from_canonical()(event.conversation_id, event.append_id, messages)
        except HistoryError as e:
            reason = f"messages are not canonical valid messages: {e}"[:300]
            raise CorruptLog(reason, reason=reason) from None
    if len(batch) != event.message_count or batch.content_bytes() != event.content_bytes:
        reason = "message_count or content_bytes does not match the messages"
        raise CorruptLog(reason, reason=reason)
    if isinstance(event, TurnReplaced) and not _starts_turn(batch.messages[0]):
        reason = "a replacement turn must start with its user message (not internal feedback)"
        raise CorruptLog(reason, reason=reason)
    return batch
