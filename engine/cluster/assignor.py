"""The group's assignor: cooperative-sticky placement, plus every member's advertised URL.

Kafka's classic group protocol lets each member put bytes in its subscription and lets the
leader put bytes in each member's assignment. histlog uses both (issue 14):

* subscription ``user_data``: the member's ``--advertise`` URL (``encode_url``);
* assignment ``user_data``: the whole partition -> URL map the leader computed, identical for
  every member of one generation (``encode_owners``), so every member, and ``GET /v1/cluster``,
  knows every owner without asking anyone else.

Placement is kafka-python's ``CooperativeStickyAssignor`` (KIP-429) unchanged: a join or a leave
moves only the partitions balance needs, and a partition moving between two live members is
first taken from its old owner (which revokes it) and given to the new one only in the next
round, so no two members are ever assigned it in the same generation. In that first round the
moving partition is absent from the map (``OwnershipMap`` allows that).

Added on top of kafka-python 3.0.12: ``forget()``. Its cooperative assignor announces, in the
next JoinGroup, the partitions of its last assignment as still owned, even after the member was
evicted and they were reassigned (``on_partitions_lost``); the leader would then see two owners.
The membership calls ``forget()`` when it loses its partitions, so it claims none.

Both formats are JSON with a version number; a member that cannot read a peer's data treats
that peer as having no URL (its partitions are absent from the map), never as an error.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment, ConsumerProtocolSubscription

__all__ = ["ASSIGNOR_NAME", "GroupAssignment", "OwnershipAssignor", "decode_owners", "decode_url",
           "encode_owners", "encode_url"]

log = logging.getLogger(__name__)

#: The protocol name members agree on. Distinct from kafka-python's own "cooperative-sticky" so a
#: plain consumer that joins the group by mistake is refused by the broker (inconsistent protocol)
#: instead of silently taking partitions without a URL.
ASSIGNOR_NAME = "histlog-cooperative-sticky"

_FORMAT = 1


def encode_url(url: str) -> bytes:
    return json.dumps({"v": _FORMAT, "url": url}, separators=(",", ":")).encode()


def decode_url(data: bytes | None) -> str | None:
    try:
        obj = json.loads(data or b"")
        url = obj.get("url") if isinstance(obj, dict) and obj.get("v") == _FORMAT else None
    except (ValueError, UnicodeDecodeError):
        return None
    return url if isinstance(url, str) and url else None


def encode_owners(partitions: int, owners: Mapping[int, str]) -> bytes:
    body = {"v": _FORMAT, "partitions": partitions, "owners": {str(p): u for p, u in sorted(owners.items())}}
    return json.dumps(body, separators=(",", ":")).encode()


def decode_owners(data: bytes | None) -> tuple[int, dict[int, str]] | None:
    try:
        obj = json.loads(data or b"")
        if not (isinstance(obj, dict) and obj.get("v") == _FORMAT):
            return None
        partitions, raw = obj["partitions"], obj["owners"]
        owners = {int(p): u for p, u in raw.items() if isinstance(u, str)}
    except (ValueError, UnicodeDecodeError, KeyError, AttributeError, TypeError):
        return None
    return (partitions, owners) if isinstance(partitions, int) else None


@dataclass(frozen=True, slots=True)
class GroupAssignment:
    """What one SyncGroup told this member: the generation and the leader's whole map."""
    generation: int
    partitions: int
    owners: Mapping[int, str]


class OwnershipAssignor(CooperativeStickyAssignor):  # type: ignore[misc]
    """Cooperative-sticky assignment whose user data carries URLs (see the module docstring).

    One instance per member: ``advertise`` is what this member puts in its subscription; the
    leader's instance reads every member's and writes the map into every assignment. ``latest``
    is the last ``GroupAssignment`` this member received (read from any thread).
    """

    name = ASSIGNOR_NAME

    def __init__(self, advertise: str, topic: str) -> None:
        super().__init__()
        self.advertise = advertise
        self.topic = topic
        self._lock = threading.Lock()
        self._latest: GroupAssignment | None = None
        self._assignments = 0
        self._synced_at = float("-inf")

    @property
    def latest(self) -> GroupAssignment | None:
        with self._lock:
            return self._latest

    @property
    def assignments(self) -> int:
        """How many assignments this member has received (one per rebalance round)."""
        with self._lock:
            return self._assignments

    @property
    def synced_at(self) -> float:
        """``time.monotonic()`` when this member last received an assignment (proof of membership)."""
        with self._lock:
            return self._synced_at

    def forget(self) -> None:
        """The member lost its partitions: claim none in the next JoinGroup (see the module
        docstring), and no longer present the last map as this member's generation."""
        self.member_assignment = None
        with self._lock:
            if self._latest is not None:
                self._latest = GroupAssignment(-1, self._latest.partitions, self._latest.owners)

    def metadata(self, topics: Any) -> ConsumerProtocolSubscription:
        base = super().metadata(topics)
        return ConsumerProtocolSubscription(version=base.version, topics=base.topics,
                                            user_data=encode_url(self.advertise),
                                            owned_partitions=base.owned_partitions)

    def assign(self, cluster: Any, members: Any) -> dict[str, ConsumerProtocolAssignment]:
        placed = super().assign(cluster, members)
        urls = {m.member_id: decode_url(m.metadata.user_data) for m in members}
        owners: dict[int, str] = {}
        for member_id, assignment in placed.items():
            url = urls.get(member_id)
            if url is None:
                log.warning("group member %s advertised no URL; its partitions are left out of the map", member_id)
                continue
            owners.update({tp.partition: url for tp in assignment.partitions() if tp.topic == self.topic})
        partitions = len(cluster.partitions_for_topic(self.topic) or ())
        blob = encode_owners(partitions, owners)
        return {member_id: ConsumerProtocolAssignment(a.version, a.assigned_partitions, blob)
                for member_id, a in placed.items()}

    def on_assignment(self, assignment: ConsumerProtocolAssignment, generation: int) -> None:
        super().on_assignment(assignment, generation)
        decoded = decode_owners(assignment.user_data)
        if decoded is None:
            log.warning("generation %s came without a readable owner map", generation)
            decoded = (0, {})
        with self._lock:
            self._latest = GroupAssignment(generation, decoded[0], decoded[1])
            self._assignments += 1
            self._synced_at = time.monotonic()
