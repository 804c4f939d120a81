"""What a partition's records wrote to the state, found and deleted as one unit.

A member of a cluster owns a changing subset of the log's partitions (docs/design.md §9);
admission never crosses partitions, because a conversation lives in one. So the state of a
partition is: the rows of its conversations (the partition of a conversation is
``schemas.records.partition_for_key``, as the log's), and the rows keyed by the partition
itself (``projections.keys``: checkpoints, poison, counters, custom projection rows). No read
key carries the partition, so the reads and their costs are those of a full replica.
"""

from __future__ import annotations

from projections import keys
from projections.store import StateStore, Tx
from schemas.records import partition_for_key

__all__ = ["drop_partition"]


def drop_partition(store: StateStore, tx: Tx, partition: int, partitions: int) -> None:
    """Add to ``tx`` the deletion of everything the records of ``partition`` wrote: its
    conversations' rows, its poison, counters and checkpoints (of admission and of every custom
    projection) and the custom rows of its events. Committed in one WriteBatch, so a crash
    leaves the partition either whole or gone (and then rebuilt from offset 0 when taken again).
    Reads every conversation summary row once: a drop is rare, a read never pays for it."""
    snap = store.iterator()
    convs = [keys.read_conv_key(k) for k, _ in snap.scan(*keys.conversations_range())]
    for conv in convs:
        if partition_for_key(conv, partitions) == partition:
            tx.delete(keys.conv_key(conv))
            for lower, upper in keys.conversation_ranges(conv):
                tx.delete_range(lower, upper)
    tx.delete_range(*keys.poison_partition_range(partition))
    tx.delete(keys.stats_key(partition))
    checkpoints = [k for k, _ in snap.scan(keys.CHECKPOINT, keys.prefix_end(keys.CHECKPOINT))]
    for k in checkpoints:
        name, p = keys.read_checkpoint_key(k)
        if p == partition:
            tx.delete(k)
            tx.delete_range(*keys.custom_partition_keyspace(name, p))  # none for admission's own
