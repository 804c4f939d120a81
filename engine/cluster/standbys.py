"""Where the group's standby replicas go (``serve --group G --standbys K``, docs/cluster.md
"Standby replicas"; Kafka Streams' standby tasks are the model).

The leader places, for every partition, ``K`` standbys on members other than its owner (fewer
when the group has fewer other members), computed from the *final* placement of the round, so a
partition moving in two phases already has its standbys while it has no owner. A standby is a
member that applies the partition into its own state without serving it: when its owner dies,
the partition goes (``assignor.prefer_state``) to a member holding its state, which then costs
only the tail it had not applied instead of a replay from offset 0.

The choice, per partition, deterministic:

1. spread: no member takes more than ``ceil(partitions * K / members)`` standbys while another
   member with room could take it (a last pass hands the excess over where the greedy pass
   could not);
2. apart: the partitions of one owner go to different standbys first, so that when the owner
   dies, balance (which gives each survivor its share) can send each of them to its standby;
   when a member owns more partitions than there are other members some must share one, and a
   failover may then send one of those to a member without its state (replayed or restored);
3. warmth: among those, the member whose state of the partition is furthest along (``held``:
   the checkpoints each member announced at its join) first, so a standby stays where it is
   and the most caught-up replicas are the ones kept;
4. then the member with fewer standbys so far, then the member id.

**Warm-up before a move** (KIP-441's idea, ``defer_cold_moves``): when balance moves a partition
from a live owner to a member whose state of it is more than ``--warmup-lag`` records behind the
owner's (a new member), the partition stays with its owner this round and the new member warms
it as a standby; once within the lag, that member joins again (``Membership.rejoin``) and the
round that follows moves the partition, so a rebalance never leaves a partition unavailable for
a replay. A dead owner's partitions move at once.

The placement goes to every member in the assignment's user data (``assignor.encode_owners``),
as partition -> the standbys' URLs; ``OwnershipMap.standbys`` is what a member learned of it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["DEFAULT_WARMUP_LAG", "MAX_STANDBYS", "defer_cold_moves", "place_standbys"]

#: The most standbys a partition may have (each one is a full copy of its state on a member).
MAX_STANDBYS = 8
#: ``--warmup-lag``'s default: how far (records) a member's state of a partition may be behind
#: its owner's for balance to move the partition to it at once.
DEFAULT_WARMUP_LAG = 1000


def defer_cold_moves(chosen: Mapping[int, str], current: Mapping[int, str], held: Mapping[str, Mapping[int, int]],
                     max_lag: int) -> tuple[dict[int, str], dict[int, str]]:
    """KIP-441's warm-up: ``chosen`` (partition -> member, this round's final placement) with
    every partition that would move from a live owner to a member whose state of it is more than
    ``max_lag`` records behind the owner's left with its owner; returned too: those partitions ->
    the member that is to warm them (as a standby) and take them once within ``max_lag``. A
    partition with no live owner (its owner died) moves at once: there is no one to wait with.
    ``current``: partition -> its owner now; ``held``: member -> {partition: applied offset}."""
    out, warming = dict(chosen), {}
    for p, y in sorted(chosen.items()):
        x = current.get(p)
        if x is None or x == y:
            continue
        if held.get(x, {}).get(p, 0) - held.get(y, {}).get(p, 0) > max_lag:
            out[p], warming[p] = x, y
    return out, warming


def place_standbys(final: Mapping[int, str], members: Sequence[str], held: Mapping[str, Mapping[int, int]],
                   k: int) -> dict[int, tuple[str, ...]]:
    """Partition -> the members (sorted) that keep it as a standby: ``k`` of them (fewer if the
    group has fewer other members), never its owner. ``final``: partition -> its owner at the end
    of this assignment; ``members``: every member of the round; ``held``: member -> {partition:
    checkpoint} of the state it holds (module docstring)."""
    pool = sorted(set(members))
    if k <= 0 or len(pool) < 2:
        return {}
    load = dict.fromkeys(pool, 0)
    cap = -(-len(final) * min(k, len(pool) - 1) // len(pool))
    out: dict[int, tuple[str, ...]] = {}
    pairs: dict[tuple[str, str], int] = {}  # (owner, standby) -> partitions of that owner it keeps
    for p in sorted(final):
        owner = final[p]

        def rank(m: str, p: int = p, owner: str = owner) -> tuple[bool, int, int, int, str]:
            return load[m] >= cap, pairs.get((owner, m), 0), -held.get(m, {}).get(p, -1), load[m], m

        chosen = sorted((m for m in pool if m != owner), key=rank)[:k]
        for m in chosen:
            load[m] += 1
            pairs[(owner, m)] = pairs.get((owner, m), 0) + 1
        out[p] = tuple(sorted(chosen))
    _even_out(out, final, load, cap)
    return out


def _even_out(out: dict[int, tuple[str, ...]], final: Mapping[int, str], load: dict[str, int], cap: int) -> None:
    """The greedy pass can leave a member over ``cap`` when the last partitions' only members with
    room were their owners: hand one of its standbys to a member under the cap, while one can take it."""
    while True:
        over = sorted(m for m, n in load.items() if n > cap)
        under = sorted(m for m, n in load.items() if n < cap)
        moved = next(((p, m, u) for m in over for p in sorted(out) if m in out[p]
                      for u in under if u != final[p] and u not in out[p]), None)
        if moved is None:
            return
        p, m, u = moved
        out[p] = tuple(sorted({*out[p], u} - {m}))
        load[m] -= 1
        load[u] += 1
