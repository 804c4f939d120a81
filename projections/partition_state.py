"""A partition's state, as one unit: where every row the records of one partition wrote lies
(``partition_rows``), and its deletion (``drop_partition``). The one home of that rule:
``projections.partitions`` drops a partition given up, ``projections.snapshots`` copies one.

The state of a partition is the rows of its conversations (the partition of a conversation is
``schemas.records.partition_for_key``, as the log's) and the rows keyed by the partition itself
(``projections.keys``: checkpoints with admission's counters, poison, custom projection rows,
graph runs).
"""

from __future__ import annotations

from pathlib import Path

from projections import feature_keys, keys
from projections.store import Snapshot, StateStore, Tx
from schemas.records import partition_for_key

__all__ = ["CORE", "drop_partition", "partition_rows", "scratch_prefix"]

CORE = "core"  # the checkpoint name of admission + the built-in read projections


def scratch_prefix(state_dir: Path) -> str:
    """The name prefix of the scratch admission states that ``register`` replays through (beside
    ``state_dir``); one left by a killed process is garbage, removed when the state is next opened."""
    return f".replay-{state_dir.name}-"


def partition_rows(snap: Snapshot, partition: int, partitions: int) -> tuple[list[bytes], list[tuple[bytes, bytes]]]:
    """Where everything the records of ``partition`` wrote lies, read from ``snap``: the point
    keys (conversation summaries, open marks, erasing marks, checkpoints) and the key ranges
    (each conversation's rows and data-key ids, its poison, its graph runs, the custom rows of
    its events). One home for "a partition's state", shared by ``drop_partition`` (which deletes
    it) and ``projections.snapshots`` (which copies it). Reads every conversation summary row
    once: a drop or a snapshot is rare, a read never pays for it."""
    convs = [keys.read_conv_key(k) for k, _ in snap.scan(*keys.conversations_range())]
    points: list[bytes] = []
    ranges: list[tuple[bytes, bytes]] = []
    for conv in convs:
        if partition_for_key(conv, partitions) == partition:
            points += [keys.conv_key(conv), keys.open_key(conv), keys.erasing_key(conv)]
            ranges += [*keys.conversation_ranges(conv), keys.key_id_range(conv)]
    ranges += [keys.poison_partition_range(partition), feature_keys.graph_run_range(partition)]
    checkpoints = [k for k, _ in snap.scan(keys.CHECKPOINT, keys.prefix_end(keys.CHECKPOINT))]
    for k in checkpoints:
        name, p = keys.read_checkpoint_key(k)
        if p == partition:
            points.append(k)
            ranges.append(keys.custom_partition_keyspace(name, p))  # none for admission's own
    return points, ranges


def drop_partition(store: StateStore, tx: Tx, partition: int, partitions: int) -> None:
    """Add to ``tx`` the deletion of everything the records of ``partition`` wrote
    (``partition_rows``): its conversations' rows, its poison, checkpoints (of admission, with
    its counters, and of every custom projection) and the custom rows of its events. Committed in
    one WriteBatch, so a crash leaves the partition either whole or gone (and then rebuilt from
    offset 0 when taken again)."""
    points, ranges = partition_rows(store.iterator(), partition, partitions)
    for k in points:
        tx.delete(k)
    for lower, upper in ranges:
        tx.delete_range(lower, upper)
