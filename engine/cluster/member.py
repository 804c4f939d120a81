"""A cluster member: the wiring between a ``Membership`` and one server's engine and router
(``histlog serve --group``, SERVICE.md "Cluster", docs/cluster.md).

What ``ClusterMember`` promises:

* **Kafka decides, the engine follows.** The engine is opened owning nothing; ``on_assigned``
  becomes ``engine.assign`` (each partition resumes from its own checkpoint and is ``NotReady``
  until caught up with the log end seen at assignment) and ``on_revoked`` becomes
  ``engine.revoke`` (its calls fail with ``NotOwner`` from the moment it begins; it returns once
  the projector no longer applies the partition). Revoked state is kept (``drop=False``): a
  partition that comes back resumes from its checkpoint instead of replaying from offset 0.
  And it comes back by preference: the member tells the group which partitions it holds state
  for (``held``: the checkpoints it opened with, and every partition assigned since), and the
  leader moves those to it when balance moves partitions at all (``assignor.prefer_state``); a
  member restarted after its session expired gets back the partitions whose state it kept.
  Both callbacks run on kafka-python's IO thread and return promptly (``assign`` returns at
  once; ``revoke`` waits only for the projector's step in progress). After a revoke the
  ``on_revoked`` listeners run (the server ends the event streams of those partitions, so each
  EventSource reconnects with ``Last-Event-ID`` and is forwarded to the new owner).
* **The router's map is checked against the lease at serve time** (``ownership``). After a
  freeze (SIGSTOP, a stall) a request thread may run before the membership thread has noticed
  the lease ran out and revoked; ``ownership()`` then returns a map with no owner, so the router
  answers ``NotReady`` (503; ``NotOwner``, 421, for a forwarded request) rather than serve state
  another member may already be changing. The same holds while the member is cut off from
  Kafka (a broker down): it knows no current owner, so it neither serves nor forwards.
* **Readiness** (``ClusterReadiness``, ``/readyz``): ready while the member is in the group with
  a valid lease and every partition it owns is caught up. Unlike a single server's readiness it
  never latches: after an assignment the member is ``NotReady`` again until the new partitions
  are caught up, so a load balancer stops sending it traffic it would only forward or refuse.
* **Metrics** (``ClusterCollector``): owned partitions, rebalances, the generation, the lease,
  the records still to apply on partitions catching up, and the standbys with their lag.
* **Warm-up** (``warmup_lag``, ``--warmup-lag``; with standbys): a partition balance would move
  here while this member's state of it is far behind stays with its owner and is warmed here as
  a standby (``standbys.defer_cold_moves``); a thread checks once a second and, when every
  partition warmed is within the lag, joins again so the leader moves them (``rejoin``).
* **Snapshots** (``snapshots``, on unless ``--no-snapshots``): a partition assigned with no
  state here is restored from a peer's snapshot, then only its tail replayed
  (``engine.cluster.restore``); any failure falls back to the replay.
* **Standbys** (``standbys``: K, ``--standbys``): each new generation's map says which partitions
  this member keeps as standbys (``engine.cluster.standbys``); the engine applies exactly those
  (``add_standbys``/``remove_standbys``, state kept), and a partition given up goes on being
  applied until that map says (it is warm if it stays a standby). ``held`` announces the applied
  offsets of all of them, so a failover goes to the standby that is furthest along.
* ``close()`` leaves the group first (revoking everything, so Kafka reassigns at once) and is
  idempotent; the caller closes the engine afterwards.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine.cluster.membership import DEFAULT_SESSION_TIMEOUT, Membership
from engine.cluster.ownership import OwnershipMap
from engine.cluster.restore import Restorer
from engine.cluster.standbys import DEFAULT_WARMUP_LAG
from engine.facade import HistoryEngine
from engine.service.health import Readiness
from engine.service.metrics import StatsProbe
from schemas.errors import NotReady

__all__ = ["ClusterCollector", "ClusterMember", "ClusterReadiness"]

log = logging.getLogger(__name__)

_WARMUP_CHECK_S = 1.0  # how often a member warming partitions up checks how far behind it is
_REJOIN_EVERY_S = 5.0  # the fewest seconds between two of its rejoins (each is a rebalance)


class ClusterMember:
    """``engine`` as a member of ``group`` on ``topic`` (see the module docstring). Joins at once."""

    def __init__(self, engine: HistoryEngine, bootstrap: str, topic: str, group: str, advertise: str, *,
                 session_timeout: float = DEFAULT_SESSION_TIMEOUT, instance_id: str | None = None,
                 standbys: int = 0, warmup_lag: int = DEFAULT_WARMUP_LAG, token: str | None = None,
                 snapshots: bool = True) -> None:
        self.engine = engine
        self.restorer = Restorer(engine, self._peers_of, token) if snapshots else None
        """Takes cold partitions on from a peer's snapshot (``engine.cluster.restore``); None: replay."""
        self.standbys = standbys
        self.warmup_lag = warmup_lag
        self._closing = threading.Event()
        self._standby_generation = -1  # the generation whose standbys the engine applies
        self._fenced: tuple[OwnershipMap, OwnershipMap] | None = None  # (a map, it without owners)
        self.on_revoked: list[Callable[[frozenset[int]], None]] = []
        """Called (IO thread, after the engine stopped serving them) with the partitions given up:
        e.g. the event hub ends their streams so clients reconnect to the new owner."""
        self._lock = threading.Lock()
        # The checkpoints this engine opened with (its kept state; the broker answers here, or the
        # membership could not join either), then every partition assigned since: never a log
        # call at join time, when kafka-python asks for them.
        opened = engine.stats().applied_offsets
        self._held: set[int] = {p for p, o in enumerate(opened) if o > 0}
        self._seen: set[str] = set()  # every member URL any map named: who may hold state to restore from
        # rebalance_timeout = session_timeout: a member stuck in a join (see Membership.lease_valid)
        # stops serving as soon as a frozen one would, not 30 s later.
        self.membership = Membership(bootstrap, topic, group, advertise, session_timeout=session_timeout,
                                     rebalance_timeout=session_timeout,
                                     on_assigned=self._assigned, on_revoked=self._revoked,
                                     instance_id=instance_id, client_id=f"histlog-member-{group}",
                                     held=self.held, standbys=standbys, on_change=self._changed,
                                     warmup_lag=warmup_lag)
        self._warmer = threading.Thread(target=self._watch_warmups, name="histlog-warmup", daemon=True)
        self._warmer.start()

    # -- the callbacks (kafka-python's IO thread, one at a time) ----------------------------------
    def _assigned(self, parts: frozenset[int]) -> None:
        with self._lock:
            self._held |= parts  # state from now on
        if self.restorer is not None:
            self.restorer.take_on(parts)  # a cold one from a peer's snapshot; a standby where it stands
        else:
            self.engine.assign(parts)  # a standby is promoted where it stands

    def _peers_of(self, partition: int) -> list[str]:
        """Whom to ask for ``partition``'s snapshot: its owner and standbys (current; the owner
        is another member when this one restores a standby), then the members of
        the map, then every member seen in an earlier map (one evicted, say after a stall, still
        holds its state and serves snapshots)."""
        latest = self.membership.map
        owner = latest.owners.get(partition)
        first = [u for u in (owner, *latest.standbys.get(partition, ())) if u and u != latest.self_url]
        now = sorted({u for u in latest.owners.values() if u != latest.self_url} - set(first))
        with self._lock:
            before = sorted(self._seen - set(first) - set(now) - {latest.self_url})
        return first + now + before

    def held(self) -> dict[int, int]:
        """Partition -> checkpoint (the applied offset, from memory: never a log call) of the
        partitions whose state this member keeps: what it tells the group at each join
        (``Membership(held=...)``), so moves, and failovers, go where the state is."""
        applied = self.engine.applied_offsets()
        with self._lock:
            return {p: applied[p] for p in sorted(self._held)}

    def _revoked(self, parts: frozenset[int]) -> None:
        # With standbys, a partition given up goes on being applied until the next assignment
        # says whether this member keeps it as a standby (``_changed``): it is warm either way.
        self.engine.revoke(parts, drop=False, standby=self.standbys > 0)
        for listener in list(self.on_revoked):
            listener(parts)

    def _changed(self, latest: OwnershipMap) -> None:
        """A new map: once per generation, apply exactly the standbys it gives this member (a
        standby removed keeps its state, so it stays a preferred destination; ``held``)."""
        with self._lock:
            self._seen |= {*latest.owners.values(), *(u for us in latest.standbys.values() for u in us)}
        if latest.generation < 0 or latest.generation == self._standby_generation:
            return
        self._standby_generation = latest.generation
        wanted = latest.standby_here() - self.engine.owned
        have = self.engine.standbys
        if have - wanted:
            self.engine.remove_standbys(have - wanted)
        if wanted - have:
            with self._lock:
                self._held |= wanted
            if self.restorer is not None:
                self.restorer.add_standbys(wanted - have)  # a cold one from a peer's snapshot
            else:
                self.engine.add_standbys(wanted - have)

    def _watch_warmups(self) -> None:
        """Once a second, while the map says this member warms partitions up: when each is
        within ``warmup_lag`` records of the log end, join again (``Membership.rejoin``) so the
        leader moves them here; at most one rejoin per ``_REJOIN_EVERY_S``. Its own thread: the
        log's end offsets are a call to the broker."""
        last = float("-inf")
        while not self._closing.wait(_WARMUP_CHECK_S):
            warming = self.membership.map.warming_here()
            if not warming or time.monotonic() - last < _REJOIN_EVERY_S:
                continue
            try:
                ends = self.engine.log.end_offsets()
            except Exception as exc:  # the broker away: try again at the next turn
                log.debug("warm-up check: no end offsets (%s)", exc)
                continue
            applied = self.engine.applied_offsets()
            behind = {p: ends[p] - applied[p] for p in warming}
            if all(b <= self.warmup_lag for b in behind.values()):
                log.info("warmed up partitions %s (records behind: %s); joining again to take them on",
                         sorted(warming), behind)
                last = time.monotonic()
                self.membership.rejoin()

    @property
    def standby_partitions(self) -> frozenset[int]:
        """The partitions this member applies as standbys now."""
        return self.engine.standbys

    # -- what the server reads --------------------------------------------------------------------
    @property
    def advertise(self) -> str:
        return self.membership.advertise

    def ownership(self) -> OwnershipMap:
        """The map the router decides by: the membership's latest while its lease is valid; else
        (evicted without knowing it yet, or cut off from Kafka) a map with no owner at all, so
        every routed request is ``NotReady`` (503, clients retry) rather than served from state
        another member may be changing, or forwarded on knowledge that is no longer current."""
        latest = self.membership.map
        if not latest.owners or self.membership.lease_valid():
            return latest
        with self._lock:
            if self._fenced is None or self._fenced[0] is not latest:
                self._fenced = (latest, OwnershipMap(latest.group, -1, latest.partitions, latest.self_url, {}))
            return self._fenced[1]

    def wait_joined(self, timeout: float) -> bool:
        """Wait (bounded) for the first assignment; True once the member has had one."""
        return self.membership.wait_joined(timeout)

    def close(self) -> None:
        """Leave the group (revoke everything first, then LeaveGroup); idempotent."""
        self._closing.set()
        if self.restorer is not None:
            self.restorer.close()
        self.membership.close()

    def __enter__(self) -> ClusterMember:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class ClusterReadiness(Readiness):
    """``/readyz`` of a member: in the group with a valid lease, and every owned partition caught
    up (never latched: see the module docstring)."""

    def __init__(self, member: ClusterMember) -> None:
        super().__init__(member.engine, targets=[])
        self.member = member
        self.probe: StatsProbe | None = None
        """Where the lag shown in the answer comes from once the server has its metrics
        (``ServiceMetrics.probe``: never a wait on the log); without it, ``stats()``."""

    def check(self) -> NotReady | None:
        m = self.member.membership
        if m.map.generation < 0 or not m.lease_valid():
            return NotReady(f"this member has not joined group {m.group!r} yet (or lost its lease); retry shortly")
        engine = self.member.engine
        catching = sorted(p for p in engine.owned if engine.partition_state(p) == "catching_up")
        if catching:
            if self.probe is None:
                lag = engine.stats().lag
            else:
                reading = self.probe.read()
                lag = reading.stats.lag if reading.stats is not None else []
            shown = ", ".join(f"partition {p}: {lag[p] if p < len(lag) else '?'} records" for p in catching[:8])
            return NotReady(f"catching up on the partitions just assigned ({shown} behind); retry shortly")
        return None


class ClusterCollector(Collector):
    """``/metrics`` of a member: ``histlog_cluster_owned_partitions``, ``histlog_cluster_generation``,
    ``histlog_cluster_lease_valid``, ``histlog_cluster_rebalances_total``,
    ``histlog_cluster_catch_up_remaining_records`` (on partitions still catching up),
    ``histlog_cluster_standby_partitions``, ``histlog_cluster_standby_lag_records``,
    ``histlog_cluster_warmup_rejoins_total``, ``histlog_cluster_snapshot_restores_total``,
    ``histlog_cluster_snapshot_fallbacks_total`` and ``histlog_cluster_snapshot_streams``."""

    def __init__(self, member: ClusterMember, probe: StatsProbe | None = None) -> None:
        self.member = member
        self.probe = probe

    def collect(self) -> Iterator[Metric]:
        m, engine = self.member.membership, self.member.engine
        owned = engine.owned
        yield GaugeMetricFamily("histlog_cluster_owned_partitions", "Partitions this member owns and serves",
                                value=len(owned))
        yield GaugeMetricFamily("histlog_cluster_generation", "The group generation of this member's map (-1: none)",
                                value=m.map.generation)
        yield GaugeMetricFamily("histlog_cluster_lease_valid", "1 while this member's heartbeat lease holds",
                                value=1 if m.lease_valid() else 0)
        rebalances = CounterMetricFamily("histlog_cluster_rebalances", "Assignments received from the group")
        rebalances.add_metric([], m.rebalances)
        yield rebalances
        rejoins = CounterMetricFamily("histlog_cluster_warmup_rejoins",
                                      "Joins again after warming partitions up, to take them over")
        rejoins.add_metric([], m.rejoins)
        yield rejoins
        restorer = self.member.restorer
        restored = CounterMetricFamily("histlog_cluster_snapshot_restores",
                                       "Partitions taken on from a peer's state snapshot instead of a replay")
        restored.add_metric([], 0 if restorer is None else restorer.restored)
        yield restored
        fell_back = CounterMetricFamily("histlog_cluster_snapshot_fallbacks",
                                        "Partitions that asked for a snapshot and were replayed (no peer gave one)")
        fell_back.add_metric([], 0 if restorer is None else restorer.fell_back)
        yield fell_back
        yield GaugeMetricFamily("histlog_cluster_snapshot_streams", "Partition snapshots this member is sending to "
                                "peers now", value=engine.snapshots_sending)
        catching = [p for p in owned if engine.partition_state(p) == "catching_up"]
        standbys = engine.standbys
        lag = self._lag() if catching or standbys else []  # behind the log end, every partition
        remaining = sum(lag[p] for p in catching if p < len(lag))
        yield GaugeMetricFamily("histlog_cluster_catch_up_remaining_records",
                                "Records still to apply on the partitions catching up", value=remaining)
        yield GaugeMetricFamily("histlog_cluster_standby_partitions",
                                "Partitions this member applies as a standby replica (--standbys)", value=len(standbys))
        yield GaugeMetricFamily("histlog_cluster_standby_lag_records",
                                "Records the standbys have not applied yet (what a failover to this member "
                                "would catch up)", value=sum(lag[p] for p in standbys if p < len(lag)))

    def _lag(self) -> list[int]:
        """Records behind the log end per partition (owned or not: ``stats().lag`` shows 0 for
        partitions not owned), from this scrape's reading (``ServiceMetrics.probe``, read just
        before: never a wait on the log; empty before its first reading); without a probe,
        ``stats()`` itself."""
        s = self.member.engine.stats() if self.probe is None else self.probe.latest().stats
        if s is None:
            return []
        return [max(e - a, 0) for e, a in zip(s.end_offsets, s.applied_offsets, strict=True)]
