"""Erasure in the projections (docs/design.md §10): opening sealed content, and the physical
cleanup that makes ``clear`` forget.

* ``open_content``: the content of a sealed event, opened under the data key its key id names
  (``DataKeys``: the engine's key store, ``engine.keys``). ``KeyErased`` when the key was
  destroyed (admission then applies the record without effect: **erased**), ``DecryptionFailed``
  when it does not open (poison), ``KeyStoreDamaged`` when the store never had the key (the
  projector stops: content is never skipped because a key store was lost).
* ``destroy_keys`` then ``finish``: what follows the commit of a ``ConversationCleared``, whose
  step deleted the conversation's rows (not its ``K`` rows) and wrote its ``E`` (erasing) row:
  destroy its keys, its own and every one its ``K`` rows name (the data keys its records were
  sealed under, recorded by admission whenever it opened one: a key store may bind a key to its
  conversation in memory only, so the log, projected into ``K``, is the durable list); then
  ``finish``: for a conversation whose ``E`` row says it had rows (``keys.ERASE_COMPACT``), flush
  the memtable (so the WAL that held its rows is retired), compact every key range its rows had
  (and the given custom projections' ranges) down to the last level, so no file of the state
  keeps the rows or their tombstones,
  then delete the ``E`` and ``K`` rows in one WriteBatch. Each step is idempotent: a crash or an
  error in between leaves the ``E`` and ``K`` rows, and the next ``clear`` of the conversation,
  or the next open, runs it again (``pending``). A sealed record met after the clear
  (``KeyErased``) has its own key destroyed by admission: a key bound before the clear and used
  after it is in no ``K`` row the clear read.
* ``forget_unseen``: a custom projection with state that does not see a clear (not registered
  in this process, or stopped after an error) cannot be asked to delete its rows of the
  conversation, and histlog cannot tell which of its rows those are. So, in the clear's own
  WriteBatch, every such projection loses its rows and its checkpoint in the clear's partition:
  registering it again replays that partition from the log's start, where the cleared
  conversation's records are erased. A projection being caught up (``register``) is left alone:
  its catch-up reaches the clear and delivers the ``ClearEvent``.

Cost of a clear: one key destroy (a bucket rewrite and two fsyncs, or one Kafka round trip), one
scan of its ``K`` rows, one memtable flush and a compaction of the files that overlap the
conversation's ranges (no flush nor compaction for one that had no rows). The projector runs
``destroy_keys`` in the step and ``finish``, the slow one, on its eraser (``projections.eraser``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from projections import keys
from projections.store import StateStore, Tx
from schemas import event_content
from schemas.errors import KeyStoreDamaged
from schemas.event_content import Content
from schemas.sealed import DataKey

__all__ = ["DataKeys", "destroy_keys", "finish", "forget_unseen", "open_content", "pending"]


class DataKeys(Protocol):
    """What the projections need of a key store (``engine.keys.KeyStore``)."""

    def get(self, conversation_id: str, key_id: str) -> DataKey: ...

    def destroy(self, conversation_id: str, key_ids: Sequence[str] = ()) -> None:
        """Write ``conversation_id``'s erasure marker (idempotent), then remove its own keys and
        every key of ``key_ids`` still live; no I/O when it is erased and none of them is live."""

    def destroy_many(self, erasures: Sequence[tuple[str, Sequence[str]]]) -> None:
        """``destroy`` of each ``(conversation_id, key_ids)``, its writes shared."""


def open_content(event: Content, keys_: DataKeys | None) -> bytes:
    """The content of the sealed ``event``, opened (``schemas.event_content.open_content``) under its
    conversation's key from ``keys_``."""
    sealed = event.sealed
    assert sealed is not None  # Invariant: admission opens sealed events only.
    if keys_ is None:
        raise KeyStoreDamaged(f"a sealed record of {event.conversation_id!r} reached an engine without a key "
                              "store; open the engine with HistoryEngine.open, which opens the key store beside "
                              "the log")
    return event_content.open_content(event, keys_.get(event.conversation_id, sealed.key_id))


def pending(store: StateStore) -> list[bytes]:
    """The conversations whose erasure has not completed (``E`` rows), in key order."""
    return [keys.read_erasing_key(k) for k, _ in store.iterator().scan(*keys.erasing_range())]


def destroy_keys(store: StateStore, keys_: DataKeys | None, convs: Sequence[bytes]) -> dict[bytes, list[str]]:
    """An erasure's first part, for ``convs`` (closed, their rows deleted): destroy each
    conversation's keys, its own and every one its ``K`` rows name, and return those key ids
    (``finish`` deletes their rows). Run between steps (the projector's step lock): once it
    returns, the key store answers ``KeyErased`` for the conversation, so no later step opens its
    content or writes a ``K`` row of it. Raises what the key store raised."""
    snap = store.iterator()
    used = {conv: [keys.read_key_id_key(k)[1] for k, _ in snap.scan(*keys.key_id_range(conv))] for conv in convs}
    if keys_ is not None:
        keys_.destroy_many([(conv.decode("utf-8"), used[conv]) for conv in convs])
    return used


def finish(store: StateStore, convs: Sequence[bytes], used: Mapping[bytes, Sequence[str]],
           extra: Iterable[tuple[bytes, bytes]] = (), deleted: Sequence[bytes] = ()) -> None:
    """An erasure's second part, after ``destroy_keys`` (``used``: what it returned): compact the
    files of the conversations that had rows (and of ``deleted``'s), then delete their ``E`` and ``K`` rows in one
    WriteBatch. Raises what RocksDB raised (the ``E`` and ``K`` rows then stay). It may run beside
    later steps (``projections.eraser``): they write no row of a cleared conversation, and the
    ``E`` row stays until this is done."""
    marks = {conv: store.get(keys.erasing_key(conv)) for conv in convs}
    # Only a conversation that had rows has files to clean (its E row says so): a replay that meets
    # a clear after its records were erased (their keys destroyed) compacts nothing.
    dirty = [conv for conv, mark in marks.items() if mark == keys.ERASE_COMPACT]
    # ``deleted``: open conversations whose messages were deleted (``projections.deletes``): the
    # files of their rows that hold content are compacted the same way, nothing else of them changes.
    ranges = [*(r for conv in dirty for r in keys.erasure_ranges(conv)),
              *(r for conv in deleted for r in keys.content_ranges(conv))]
    if ranges:
        store.compact(list(dict.fromkeys([*ranges, *extra])))
    done = [conv for conv, mark in marks.items() if mark is not None or used.get(conv)]
    if not done:
        return
    tx = store.tx()
    for conv in done:
        tx.delete(keys.erasing_key(conv))
        for k in used.get(conv, ()):
            tx.delete(keys.key_id_key(conv, k))
    tx.commit()


def forget_unseen(store: StateStore, tx: Tx, partitions: Iterable[int],
                  seen: Iterable[str]) -> list[tuple[bytes, bytes]]:
    """Delete, in ``tx`` (the step that applied clears in ``partitions``), the rows and checkpoint
    in those partitions of every custom projection that has state there but did not see the
    step (not in ``seen``: admission's own checkpoint name, the live projections and those
    being caught up); see the module docstring. Returns the key ranges deleted, for the
    erasure's compaction."""
    parts, skip = set(partitions), set(seen)
    unseen = [keys.read_checkpoint_key(k) for k, _ in store.iterator().scan(keys.CHECKPOINT,
                                                                             keys.prefix_end(keys.CHECKPOINT))]
    ranges = []
    for name, p in unseen:
        if name in skip or p not in parts:
            continue
        lower, upper = keys.custom_partition_keyspace(name, p)
        tx.delete_range(lower, upper)
        tx.delete(keys.checkpoint_key(name, p))
        ranges.append((lower, upper))
    return ranges
