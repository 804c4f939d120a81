"""The key store contract: where a conversation's data keys live, outside the event log.

A ``KeyStore`` keeps data keys (``schemas.sealed.DataKey``) and, per erased conversation, an
erasure marker. Promises, for every backend (tests/unit/test_keystore_file.py and
tests/integration/test_kafka_keys.py run the same cases):

* ``create(c)`` returns a durable key to seal ``c``'s content under (fsynced; acknowledged by
  all in-sync Kafka replicas) with no I/O on the caller's path while spares are left: the key is
  ``c``'s own key if it has one (a key record under its id, what releases before spares wrote),
  else a *spare* the store made durable ahead and binds to ``c`` in this process's memory
  (``engine.keys.pool``: one process seals a conversation under one key; another instance, or
  this one after a restart, may bind another, and content under any of them opens).
  ``KeyErased`` once ``c`` was destroyed: an erased conversation never gets a key again.
* ``get(c, key_id)`` the key, after catching up with the store when it is not known locally (a
  known key is answered from memory: an instance that has not yet caught up with another's
  ``destroy`` may still return it; every instance calls ``destroy`` itself when it applies the
  log's ``ConversationCleared``, which catches up, so all end in the same state);
  ``KeyErased`` when ``c`` was destroyed, whatever the key (the content is erased on purpose);
  ``KeyStoreDamaged`` when ``c`` was never destroyed and there is no such key (a lost or foreign
  key store: an erasure must never be inferred from a missing key).
* ``destroy(c, key_ids=())`` (idempotent) writes the erasure marker first, then removes ``c``'s
  own keys, its binding and every live spare among ``key_ids`` (the key ids ``c``'s records in
  the log name: the state's ``K`` rows, ``projections.erasure``): when it returns no file of an
  embedded store holds their bytes; on Kafka they are tombstoned and leave the broker's files
  when compaction runs (bounded by the keys topic's ``max.compaction.lag.ms``). A crash in
  between leaves the marker (``get`` already answers ``KeyErased``) and the state's pending
  erasure: the next ``clear`` or open calls ``destroy`` again. No I/O when ``c`` is erased
  already and none of its keys is left.
* ``list_keys(c=None)``: ``(conversation id, key id)`` of every live key, sorted; a spare not
  bound in this process shows conversation id ``""`` (its conversation is in the log).
* ``known(c)``: whether ``create(c)`` answers now with no I/O (an event loop may call it then).
* ``destroy_many([(c, key_ids), ...])``: ``destroy`` of each, with the writes shared (one fsync per
  bucket of markers, one rewrite per bucket; on Kafka, one round trip for all the markers): what
  an erasure of many conversations at once calls (a projector step of many clears).
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

    def destroy_many(self, erasures: Sequence[tuple[str, Sequence[str]]]) -> None: ...

    def list_keys(self, conversation_id: str | None = None) -> list[tuple[str, str]]: ...

    def known(self, conversation_id: str) -> bool: ...

    def erased(self, conversation_id: str) -> bool: ...

    def close(self) -> None: ...
