"""The key store contract: where a conversation's data keys live, outside the event log.

A ``KeyStore`` keeps, per conversation, its data keys (``schemas.sealed.DataKey``) and, once
destroyed, an erasure marker. Promises, for every backend (tests/unit/test_keystore_file.py and
tests/integration/test_kafka_keys.py run the same cases):

* ``create(c)`` returns the conversation's key, creating it if it has none: **create-if-absent**.
  Callers racing on the same new conversation, in one process or on several instances sharing
  a backend, all get the same key (the first key record for ``c`` in the store wins; a creator
  reads its own write back before answering). It returns only once the key is durable (fsynced;
  acknowledged by all in-sync Kafka replicas), so content sealed under it can be appended.
  ``KeyErased`` once ``c`` was destroyed: an erased conversation never gets a key again.
* ``get(c, key_id)`` the key, after catching up with the store when it is not known locally (a
  known key is answered from memory: an instance that has not yet caught up with another's
  ``destroy`` may still return it; every instance calls ``destroy`` itself when it applies the
  log's ``ConversationCleared``, which catches up, so all end in the same state);
  ``KeyErased`` when ``c`` was destroyed (the content is erased on purpose); ``KeyStoreDamaged``
  when ``c`` was never destroyed and still has no such key (a lost or foreign key store: an
  erasure must never be inferred from a missing key).
* ``destroy(c)`` (idempotent) writes the erasure marker first, then removes every key of ``c``:
  when it returns no file of an embedded store holds their bytes; on Kafka they are tombstoned
  and leave the broker's files when compaction runs (bounded by the keys topic's
  ``max.compaction.lag.ms``). A crash in between leaves the marker: the next ``destroy`` or
  open completes it, and ``get`` already answers ``KeyErased``.
* ``list_keys(c=None)``: ``(conversation id, key id)`` of every live key, sorted.
* ``known(c)``: whether ``create(c)`` answers from memory, with no I/O (an event loop may call it then).
* ``erased(c)``: whether ``c`` was destroyed.

Thread-safe. Key material never appears in errors, logs or reprs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from schemas.sealed import DataKey

__all__ = ["KeyStore"]


@runtime_checkable
class KeyStore(Protocol):
    """See the module docstring."""

    def create(self, conversation_id: str) -> DataKey: ...

    def get(self, conversation_id: str, key_id: str) -> DataKey: ...

    def destroy(self, conversation_id: str, key_ids: Sequence[str] = ()) -> None: ...

    def list_keys(self, conversation_id: str | None = None) -> list[tuple[str, str]]: ...

    def known(self, conversation_id: str) -> bool: ...

    def erased(self, conversation_id: str) -> bool: ...

    def close(self) -> None: ...
