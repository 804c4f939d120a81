"""The key builders of the keyspaces the features built on the history keep (their prefixes, and
the table of every keyspace, are ``projections.keys``, the one registry of key bytes): runs and
fences (``F``, ``J``), turn slots (``L``), assets (``G``), message deletes (``D``) and graph
checkpoints (``Y``, ``Z``, ``V``, ``B``). Kept apart so ``projections.keys`` stays the history's."""

from __future__ import annotations

import struct

from projections.keys import (
    ASSET,
    DELETED,
    END,
    GRAPH_RUN,
    RUN,
    RUN_WRITES,
    SEP,
    SLOT,
    prefix_end,
)

__all__ = [
    "assets_key",
    "deleted_key",
    "deleted_value",
    "graph_key",
    "graph_range",
    "graph_run_key",
    "graph_run_range",
    "graph_write_index",
    "read_deleted_value",
    "read_graph_run_key",
    "read_graph_write_index",
    "read_slot_value",
    "run_epoch_key",
    "run_key",
    "run_request_key",
    "run_requests_range",
    "run_turn_key",
    "run_writes_range",
    "slot_key",
    "slot_value",
]

_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
_RUN_TURN = b"t"
_RUN_REQUEST = b"u"


def graph_key(prefix: bytes, conv: bytes, *parts: bytes) -> bytes:
    """A graph-checkpoint key (``Y``, ``Z``, ``V``): ``prefix conv`` then each part after a ``1F``
    (names hold no control character, so ``1F`` ends each one)."""
    return prefix + conv + SEP + SEP.join(parts)


def graph_range(prefix: bytes, conv: bytes, *parts: bytes) -> tuple[bytes, bytes]:
    """``[lower, upper)`` of the graph keys under ``prefix conv 1F parts... 1F``."""
    lower = graph_key(prefix, conv, *parts) + SEP
    return lower, lower[:-1] + END


def graph_write_index(index: int) -> bytes:
    """A write's index in its ``V`` key: ``index + 2³¹`` as a u32, so the special (negative) ones sort first."""
    return _U32.pack(index + (1 << 31))


def read_graph_write_index(key: bytes) -> int:
    return int(_U32.unpack_from(key, len(key) - 4)[0]) - (1 << 31)


def graph_run_key(partition: int, run: bytes, conv: bytes, ns: bytes, checkpoint: bytes) -> bytes:
    return GRAPH_RUN + _U32.pack(partition) + run + SEP + conv + SEP + ns + SEP + checkpoint


def graph_run_range(partition: int, run: bytes | None = None) -> tuple[bytes, bytes]:
    """``[lower, upper)`` of a partition's ``B`` rows (of one run, when given)."""
    lower = GRAPH_RUN + _U32.pack(partition) + (run + SEP if run is not None else b"")
    return lower, prefix_end(lower)


def read_graph_run_key(key: bytes) -> tuple[bytes, bytes, bytes]:
    """``(conv, ns, checkpoint)`` of a ``B`` key."""
    _, conv, ns, checkpoint = key[len(GRAPH_RUN) + 4:].split(SEP)
    return conv, ns, checkpoint


def deleted_key(conv: bytes, append_id: bytes) -> bytes:
    return DELETED + conv + SEP + append_id


def deleted_value(indexes: list[int]) -> bytes:
    """A ``D`` row: the deleted indexes of one batch, ascending."""
    return struct.pack(f">{len(indexes)}I", *indexes)


def read_deleted_value(b: bytes) -> tuple[int, ...]:
    return struct.unpack(f">{len(b) // 4}I", b)


def assets_key(conv: bytes, seq: int) -> bytes:
    """Keyed by the message's seq: stable, so a hidden message keeps its assets."""
    return ASSET + conv + SEP + _U64.pack(seq)


def slot_key(conv: bytes, slot_id: bytes) -> bytes:
    return SLOT + conv + SEP + slot_id


def slot_value(position: int, used: bool) -> bytes:
    return _U64.pack(position) + (b"\x01" if used else b"\x00")


def read_slot_value(b: bytes) -> tuple[int, bool]:
    """``(position, used)`` of an ``L`` row."""
    return int(_U64.unpack_from(b)[0]), b[_U64.size:] == b"\x01"


def run_key(conv: bytes, run_id: bytes) -> bytes:
    """A run's epoch; ``run_id`` ``b""``: the conversation's latest epoch (run ids are never empty)."""
    return RUN + conv + SEP + run_id


def run_epoch_key(conv: bytes, epoch: int) -> bytes:
    """The run that has epoch ``epoch`` (``00`` after the separator: no run id holds a control
    character, so no run's key is one of these)."""
    return RUN + conv + SEP + b"\x00" + _U64.pack(epoch)


def run_turn_key(conv: bytes, run_id: bytes, turn_id: bytes) -> bytes:
    """The run wrote a message (visible or hidden since) in turn ``turn_id``."""
    return RUN_WRITES + conv + SEP + run_id + SEP + _RUN_TURN + turn_id


def run_request_key(conv: bytes, run_id: bytes, seq: int) -> bytes:
    """The run wrote the user message of seq ``seq`` (its id is the value)."""
    return RUN_WRITES + conv + SEP + run_id + SEP + _RUN_REQUEST + _U64.pack(seq)


def run_writes_range(conv: bytes, run_id: bytes) -> tuple[bytes, bytes]:
    """``[lower, upper)`` of every ``J`` row of one run: empty when it wrote nothing."""
    lower = RUN_WRITES + conv + SEP + run_id + SEP
    return lower, prefix_end(lower)


def run_requests_range(conv: bytes, run_id: bytes) -> tuple[bytes, bytes]:
    """``[lower, upper)`` of the user messages one run wrote, oldest seq first."""
    lower = RUN_WRITES + conv + SEP + run_id + SEP + _RUN_REQUEST
    return lower, prefix_end(lower)
