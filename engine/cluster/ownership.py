"""Who owns which partition of the topic, as one member of a cluster last learned it (issue 14).

The map is a value: a member builds a new one on every change of the group's assignment and
hands it on (``Membership.on_change``); the router and ``GET /v1/cluster`` (SERVICE.md) read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["OwnershipMap"]


@dataclass(frozen=True, slots=True)
class OwnershipMap:
    """Partition -> owner URL as this member last learned it from the group's assignment."""
    group: str
    generation: int            # the Kafka group generation the map comes from (-1: none yet)
    partitions: int            # the topic's partition count
    self_url: str              # this member's --advertise URL
    owners: Mapping[int, str]  # partition -> advertised URL of its owner (a partition may be absent mid-rebalance)
    def owner_of(self, partition: int) -> str | None: return self.owners.get(partition)
    def owns(self, partition: int) -> bool: return self.owners.get(partition) == self.self_url
