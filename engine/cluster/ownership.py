"""``OwnershipMap``: which member owns each partition, as this member last learned it.

The map is a value (frozen): membership builds a new one on every change of the group's
assignment, and a reader (``engine.service.routing.Router``) takes the current one per request,
so one request decides on one consistent map. ``GET /v1/cluster`` renders it
(``engine.service.wire.cluster_json``) as ``{"group","generation","partitions","self","owners"}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["OwnershipMap"]


@dataclass(frozen=True, slots=True)
class OwnershipMap:
    """Partition -> owner URL as this member last learned it from the group's assignment."""

    group: str
    generation: int            # the Kafka group generation the map comes from (-1: none yet)
    partitions: int            # the topic's partition count
    self_url: str              # this member's --advertise URL
    owners: Mapping[int, str]  # partition -> advertised URL of its owner (a partition may be absent mid-rebalance)
    standbys: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    """Partition -> the URLs of the members keeping it as a standby replica (``--standbys``)."""
    warmups: Mapping[int, str] = field(default_factory=dict)
    """Partition -> the URL of the member warming it up to take it over (KIP-441's warm-up)."""

    def owner_of(self, partition: int) -> str | None:
        return self.owners.get(partition)

    def owns(self, partition: int) -> bool:
        return self.owners.get(partition) == self.self_url

    def warming_here(self) -> frozenset[int]:
        """The partitions this member warms up, to take them over once it is within the lag."""
        return frozenset(p for p, url in self.warmups.items() if url == self.self_url)

    def standby_here(self) -> frozenset[int]:
        """The partitions this member is to keep as standbys (never ones it owns)."""
        return frozenset(p for p, urls in self.standbys.items()
                         if self.self_url in urls and self.owners.get(p) != self.self_url)
