"""The group's assignor: cooperative-sticky placement, plus every member's advertised URL.

Kafka's classic group protocol lets each member put bytes in its subscription and lets the
leader put bytes in each member's assignment. histlog uses both (issue 14):

* subscription ``user_data``: the member's ``--advertise`` URL and the partitions it holds state
  for, with each one's checkpoint (``encode_url``; ``held`` below);
* assignment ``user_data``: the whole partition -> URL map the leader computed, identical for
  every member of one generation (``encode_owners``), so every member, and ``GET /v1/cluster``,
  knows every owner without asking anyone else; with ``--standbys K``, also each partition's
  standbys (``engine.cluster.standbys``: the leader's K decides).

Placement is kafka-python's ``CooperativeStickyAssignor`` (KIP-429): a join or a leave moves
only the partitions balance needs, and a partition moving between two live members is first
taken from its old owner (which revokes it) and given to the new one only in the next round, so
no two members are ever assigned it in the same generation. In that first round the moving
partition is absent from the map (``OwnershipMap`` allows that).

**Moves go where the state is** (``prefer_state``). Stickiness keeps a partition on its current
owner, but a member restarted after its session expired owns nothing and joins as a new member:
balance gives it *some* partitions, and kafka-python's choice of which ignores that its disk
holds caught-up state for the ones it owned before (they resume from their checkpoints; any other
replays from offset 0). So between the sticky placement and the two-phase split, the leader
re-chooses *which* partitions move, never how many nor to whom: every member gets as many
partitions as the sticky placement gave it (balance, max - min <= 1, is kafka-python's) and as
many partitions change owner. Two exchanges, each while it makes a moving partition land on a
member that holds its state:

* two moving partitions swap destinations;
* a member that keeps ``p`` and gives up ``q`` gives up ``p`` instead (to a member holding
  ``p``'s state) and keeps ``q``.

Each exchange lowers the number of moving partitions landing where there is no state, so it ends.
Among partitions a member holds state for, the one with the higher checkpoint goes first.

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
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
from kafka.coordinator.assignors.sticky.sticky_assignor import StickyAssignmentExecutor
from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment, ConsumerProtocolSubscription
from kafka.structs import TopicPartition

from engine.cluster.standbys import DEFAULT_WARMUP_LAG, defer_cold_moves, place_standbys

__all__ = ["ASSIGNOR_NAME", "GroupAssignment", "OwnershipAssignor", "decode_owners", "decode_standbys",
           "decode_state", "decode_url", "decode_warmups", "encode_owners", "encode_url", "prefer_state"]

log = logging.getLogger(__name__)

#: The protocol name members agree on. Distinct from kafka-python's own "cooperative-sticky" so a
#: plain consumer that joins the group by mistake is refused by the broker (inconsistent protocol)
#: instead of silently taking partitions without a URL.
ASSIGNOR_NAME = "histlog-cooperative-sticky"

_FORMAT = 1


def encode_url(url: str, held: Mapping[int, int] | None = None) -> bytes:
    """A subscription's user data: the URL and, if any, ``held``: partition -> checkpoint of the
    partitions this member holds state for (a reader that predates ``state`` ignores it)."""
    body: dict[str, object] = {"v": _FORMAT, "url": url}
    if held:
        body["state"] = {str(p): int(o) for p, o in sorted(held.items())}
    return json.dumps(body, separators=(",", ":")).encode()


def decode_state(data: bytes | None) -> dict[int, int]:
    """The ``held`` of ``encode_url`` (``{}`` when absent or unreadable: no preference)."""
    try:
        obj = json.loads(data or b"")
        raw = obj.get("state") if isinstance(obj, dict) and obj.get("v") == _FORMAT else None
        return {int(p): int(o) for p, o in raw.items()} if isinstance(raw, dict) else {}
    except (ValueError, UnicodeDecodeError, AttributeError, TypeError):
        return {}


def decode_url(data: bytes | None) -> str | None:
    try:
        obj = json.loads(data or b"")
        url = obj.get("url") if isinstance(obj, dict) and obj.get("v") == _FORMAT else None
    except (ValueError, UnicodeDecodeError):
        return None
    return url if isinstance(url, str) and url else None


def encode_owners(partitions: int, owners: Mapping[int, str],
                  standbys: Mapping[int, Sequence[str]] | None = None,
                  warmups: Mapping[int, str] | None = None) -> bytes:
    """An assignment's user data: the owner map and, if any, each partition's standbys' URLs and
    the partitions being warmed up -> the URL of the member warming them (a reader that predates
    ``standbys`` or ``warmups`` ignores them)."""
    body: dict[str, object] = {"v": _FORMAT, "partitions": partitions,
                               "owners": {str(p): u for p, u in sorted(owners.items())}}
    if standbys:
        body["standbys"] = {str(p): list(us) for p, us in sorted(standbys.items()) if us}
    if warmups:
        body["warmups"] = {str(p): u for p, u in sorted(warmups.items())}
    return json.dumps(body, separators=(",", ":")).encode()


def decode_warmups(data: bytes | None) -> dict[int, str]:
    """The ``warmups`` of ``encode_owners`` (``{}`` when absent or unreadable)."""
    try:
        obj = json.loads(data or b"")
        raw = obj.get("warmups") if isinstance(obj, dict) and obj.get("v") == _FORMAT else None
        return {int(p): u for p, u in raw.items() if isinstance(u, str)} if isinstance(raw, dict) else {}
    except (ValueError, UnicodeDecodeError, AttributeError, TypeError):
        return {}


def decode_standbys(data: bytes | None) -> dict[int, tuple[str, ...]]:
    """The ``standbys`` of ``encode_owners`` (``{}`` when absent or unreadable: no standbys)."""
    try:
        obj = json.loads(data or b"")
        raw = obj.get("standbys") if isinstance(obj, dict) and obj.get("v") == _FORMAT else None
        if not isinstance(raw, dict):
            return {}
        return {int(p): tuple(u for u in us if isinstance(u, str)) for p, us in raw.items() if isinstance(us, list)}
    except (ValueError, UnicodeDecodeError, AttributeError, TypeError):
        return {}


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


def prefer_state(final: Mapping[int, str], current: Mapping[int, str],
                 held: Mapping[str, Mapping[int, int]]) -> dict[int, str]:
    """``final`` (partition -> member, the sticky placement) with the partitions that change
    owner re-chosen so that as many as possible land on a member holding their state (the module
    docstring). ``current``: partition -> its owner now (absent: nobody); ``held``: member ->
    {partition: checkpoint} it holds state for. Every member keeps its count of partitions and
    the count of partitions changing owner does not grow. Deterministic (sorted orders)."""
    out = dict(final)

    def moving(p: int) -> bool:
        return current.get(p) != out[p]

    def exchange() -> bool:
        for y in sorted(held):
            mine = held[y]
            wanted = sorted((p for p in mine if p in out and out[p] != y), key=lambda p: (-mine[p], p))
            for q in sorted(q for q, m in out.items() if m == y and moving(q) and q not in mine):
                for p in wanted:
                    z = out[p]
                    theirs = held.get(z, {})
                    if moving(p):
                        if p in theirs and q not in theirs:
                            continue  # z would trade a partition with its state for one without
                    elif current.get(q) != z:
                        continue  # p stays with z: only z's own departing partition may take its place
                    out[p], out[q] = y, z
                    return True
        return False

    while exchange():
        pass
    return out


@dataclass(frozen=True, slots=True)
class GroupAssignment:
    """What one SyncGroup told this member: the generation and the leader's whole map."""
    generation: int
    partitions: int
    owners: Mapping[int, str]
    standbys: Mapping[int, tuple[str, ...]] = field(default_factory=dict)  # partition -> standbys' URLs
    warmups: Mapping[int, str] = field(default_factory=dict)  # partition -> the URL of the member warming it


class OwnershipAssignor(CooperativeStickyAssignor):  # type: ignore[misc]
    """Cooperative-sticky assignment whose user data carries URLs (see the module docstring).

    One instance per member: ``standbys`` is K, the standbys per partition the leader places
    (``engine.cluster.standbys``); ``advertise`` (and ``held()``: partition -> checkpoint of the
    partitions whose state this member keeps, called on kafka-python's IO thread at each join, so
    it must not block) is what this member puts in its subscription; the leader's instance reads
    every member's and writes the map into every assignment. ``latest`` is the last
    ``GroupAssignment`` this member received (read from any thread).
    """

    name = ASSIGNOR_NAME

    def __init__(self, advertise: str, topic: str, held: Callable[[], Mapping[int, int]] | None = None,
                 standbys: int = 0, warmup_lag: int = DEFAULT_WARMUP_LAG) -> None:
        super().__init__()
        self.advertise = advertise
        self.standbys = standbys
        self.warmup_lag = warmup_lag
        self.topic = topic
        self._held = held
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
        held: Mapping[int, int] = {}
        if self._held is not None:
            try:
                held = self._held()
            except Exception:  # no preference is no error: placement stays kafka-python's
                log.exception("could not say which partitions' state this member holds")
        return ConsumerProtocolSubscription(version=base.version, topics=base.topics,
                                            user_data=encode_url(self.advertise, held),
                                            owned_partitions=base.owned_partitions)

    def assign(self, cluster: Any, members: Any) -> dict[str, ConsumerProtocolAssignment]:
        held = {m.member_id: decode_state(m.metadata.user_data) for m in members}
        placed, final, warming = self._cooperative(cluster, members, held)
        urls = {m.member_id: decode_url(m.metadata.user_data) for m in members}
        owners: dict[int, str] = {}
        for member_id, assignment in placed.items():
            url = urls.get(member_id)
            if url is None:
                log.warning("group member %s advertised no URL; its partitions are left out of the map", member_id)
                continue
            owners.update({tp.partition: url for tp in assignment.partitions() if tp.topic == self.topic})
        partitions = len(cluster.partitions_for_topic(self.topic) or ())
        reachable = [m for m, u in urls.items() if u is not None]
        placed_standbys = place_standbys(final, reachable, held, self.standbys)
        for p, m in warming.items():  # the member warming a partition applies it as a standby
            placed_standbys[p] = tuple(sorted({*placed_standbys.get(p, ()), m}))
        standbys = {p: tuple(sorted(str(urls[m]) for m in ms if urls.get(m))) for p, ms in placed_standbys.items()}
        warmups = {p: str(urls[m]) for p, m in warming.items() if urls.get(m)}
        blob = encode_owners(partitions, owners, standbys, warmups)
        return {member_id: ConsumerProtocolAssignment(a.version, a.assigned_partitions, blob)
                for member_id, a in placed.items()}

    def _cooperative(self, cluster: Any, members: Any, held: Mapping[str, Mapping[int, int]]
                     ) -> tuple[dict[str, ConsumerProtocolAssignment], dict[int, str], dict[int, str]]:
        """``CooperativeStickyAssignor.assign`` of kafka-python 3.0.12 with ``prefer_state``
        between its sticky placement and its two-phase split: a partition whose final owner is not
        its current owner is left out of this round (its owner revokes it; the next round gives
        it to the new owner). With standbys (K > 0), a move to a member too far behind waits for
        its warm-up (``standbys.defer_cold_moves``). Also returned: the final placement of this
        topic (partition -> member id), where the standbys are placed from, and the partitions
        being warmed -> the member warming them."""
        parsed = {m.member_id: self.parse_member_metadata(m.metadata) for m in members}
        executor = StickyAssignmentExecutor(cluster, parsed)
        executor.perform_initial_assignment()
        executor.balance()
        current = {tp: member_id for member_id, meta in parsed.items() for tp in meta.partitions}
        final = {(topic, p): m.member_id for m in members
                 for topic, parts in executor.get_final_assignment(m.member_id) for p in parts}
        mine = {p: member_id for (topic, p), member_id in final.items() if topic == self.topic}
        now = {tp.partition: member_id for tp, member_id in current.items() if tp.topic == self.topic}
        chosen = prefer_state(mine, now, held)
        warming: dict[int, str] = {}
        if self.standbys > 0:
            chosen, warming = defer_cold_moves(chosen, now, held, self.warmup_lag)
        for p, member_id in chosen.items():
            final[(self.topic, p)] = member_id
        rounds: dict[str, dict[str, list[int]]] = {m.member_id: defaultdict(list) for m in members}
        for (topic, p), member_id in final.items():
            owner = current.get(TopicPartition(topic, p))
            if owner is None or owner == member_id:
                rounds[member_id][topic].append(p)
        return {member_id: ConsumerProtocolAssignment(self.version, sorted((t, sorted(ps)) for t, ps in by.items()),
                                                      b"")
                for member_id, by in rounds.items()}, chosen, warming

    def on_assignment(self, assignment: ConsumerProtocolAssignment, generation: int) -> None:
        super().on_assignment(assignment, generation)
        decoded = decode_owners(assignment.user_data)
        if decoded is None:
            log.warning("generation %s came without a readable owner map", generation)
            decoded = (0, {})
        standbys, warmups = decode_standbys(assignment.user_data), decode_warmups(assignment.user_data)
        with self._lock:
            self._latest = GroupAssignment(generation, decoded[0], decoded[1], standbys, warmups)
            self._assignments += 1
            self._synced_at = time.monotonic()
