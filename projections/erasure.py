"""Erasure in the projections (docs/design.md §10): opening sealed content, and the physical
cleanup that makes ``clear`` forget.

* ``open_content``: the plain form of a sealed event, under the data key its key id names
  (``DataKeys``: the engine's key store, ``engine.keys``). ``KeyErased`` when the key was
  destroyed (admission then applies the record without effect: **erased**), ``DecryptionFailed``
  when it does not open (poison), ``KeyStoreDamaged`` when the store never had the key (the
  projector stops: content is never skipped because a key store was lost).
* ``complete``: what follows the commit of a ``ConversationCleared``, whose step deleted the
  conversation's rows and, if it had any, wrote its ``E`` (erasing) row: destroy its keys, then (for
  a conversation with an ``E`` row only) flush the memtable (so
  the WAL that held its rows is retired), compact every key range its rows had (and the given
  custom projections' ranges) down to the last level, so no file of the state keeps the rows or
  their tombstones, then delete the ``E`` row. Each step is idempotent: a crash or an error in
  between leaves the ``E`` row, and the next ``clear`` of the conversation, or the next open,
  runs it again (``pending``).

Cost of a clear: one key destroy (a bucket rewrite and two fsyncs, or one Kafka round trip), one
memtable flush and a compaction of the files that overlap the conversation's ranges.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from projections import keys
from projections.store import StateStore
from schemas.errors import KeyStoreDamaged
from schemas.events import BatchAppended, TurnReplaced, open_event
from schemas.sealed import DataKey

__all__ = ["DataKeys", "complete", "open_content", "pending"]


class DataKeys(Protocol):
    """What the projections need of a key store (``engine.keys.KeyStore``)."""

    def get(self, conversation_id: str, key_id: str) -> DataKey: ...

    def destroy(self, conversation_id: str) -> None: ...


def open_content(event: BatchAppended | TurnReplaced, keys_: DataKeys | None) -> BatchAppended | TurnReplaced:
    """``event`` opened (``schemas.events.open_event``) under its conversation's key from ``keys_``."""
    sealed = event.sealed
    if sealed is None:
        return event
    if keys_ is None:
        raise KeyStoreDamaged(f"a sealed record of {event.conversation_id!r} reached an engine without a key "
                              "store; open the engine with HistoryEngine.open, which opens the key store beside "
                              "the log")
    return open_event(event, keys_.get(event.conversation_id, sealed.key_id))


def pending(store: StateStore) -> list[bytes]:
    """The conversations whose erasure has not completed (``E`` rows), in key order."""
    return [keys.read_erasing_key(k) for k, _ in store.iterator().scan(*keys.erasing_range())]


def complete(store: StateStore, keys_: DataKeys | None, convs: Sequence[bytes],
             extra: Iterable[tuple[bytes, bytes]] = ()) -> None:
    """Finish the erasure of ``convs`` (already closed, their rows deleted): see the module
    docstring. Raises what the key store or RocksDB raised; the ``E`` rows then stay."""
    if keys_ is not None:
        for conv in convs:
            keys_.destroy(conv.decode("utf-8"))
    # Only a conversation that had rows has an E row and files to clean: a replay that meets
    # a clear after its records were erased (their keys destroyed) wrote none, and compacts nothing.
    dirty = [conv for conv in convs if store.get(keys.erasing_key(conv)) is not None]
    if not dirty:
        return
    store.compact([*(r for conv in dirty for r in keys.erasure_ranges(conv)), *extra])
    tx = store.tx()
    for conv in dirty:
        tx.delete(keys.erasing_key(conv))
    tx.commit()
