"""Membership of a histlog cluster in a Kafka consumer group (issue 14, DESIGN.md §9, SERVICE.md).

Kafka decides who owns which partition; this module only takes part. A ``Membership`` is one
member of the consumer group ``group`` on ``topic``:

* **Membership only.** Its ``KafkaConsumer`` subscribes with a rebalance listener and is polled
  on its own daemon thread (``histlog-membership``), which keeps the member in the group. It
  never delivers a record to anyone (every assigned partition is paused the moment it is
  assigned; a record that arrives anyway is dropped and counted in ``stray_records``) and never
  commits an offset (auto commit off, no commit call). The engine reads the partitions it owns
  with its own cursors.
* **Assignment** is cooperative-sticky with every member's ``advertise`` URL in the group's user
  data (``engine.cluster.assignor``): each member learns the whole partition -> owner map and the
  generation, the same on every member of one generation.
* **Promises to the callbacks.** They run one at a time, never concurrently with each other:
  on kafka-python's IO thread while a rebalance completes, or on the membership thread (the
  lease, ``close()``). While one runs the member sends no heartbeat, so each must return well
  within ``session_timeout``.
  - ``on_revoked(parts)`` is called, and has returned, before the member gives ``parts`` up:
    before the next JoinGroup lets another member have them, before ``close()`` leaves the
    group, and as soon as the member may have lost them (the lease below). From then on the
    member must not serve them.
  - ``on_assigned(parts)`` after the member is given ``parts``: a partition moving between live
    members was revoked by its old owner first (cooperative protocol); one taken from a member
    that died or froze was revoked by that member's lease before Kafka could expire its session
    (if that process was running at all).
  - ``on_change(map)`` whenever the ``OwnershipMap`` changes, after the revocations and
    assignments it reflects. The map claims for this member exactly the partitions it serves
    (assigned and not revoked); ``generation`` is -1 while the member is not in the group.
  Each partition alternates strictly: assigned, revoked, assigned, ... A callback that raises is
  logged; its partitions count as revoked (or assigned) all the same.
* **The lease (added on top of kafka-python).** kafka-python reports lost partitions
  (``on_partitions_lost``) only once it has learned, from the coordinator, that it was evicted.
  A member frozen past the session timeout (SIGSTOP, a stall) or cut off from the coordinator
  would meanwhile still believe it owns partitions that Kafka has already given to others. So
  the member holds its partitions on a lease: while the group is stable, a successful heartbeat
  or a received assignment less than ``session_timeout - heartbeat_interval`` ago (the margin
  covers the request's round trip; Kafka cannot have expired the session before that). When the
  lease runs out the member revokes everything first and learns the rest later; if Kafka did
  keep it, the next successful heartbeat renews the lease and ``on_assigned`` gives the
  partitions back. ``lease_valid()`` lets a caller check it at the moment of serving: after a
  freeze, a request thread may run before the membership thread has revoked.
* **Leaving.** ``close()`` revokes, sends LeaveGroup (Kafka reassigns at once) and stops, within
  ``close_timeout``. A member killed with SIGKILL is removed by Kafka after ``session_timeout``.
* **Standbys** (``standbys``: K, the leader's decides): the map of each assignment also says
  which members keep each partition as a standby (``OwnershipMap.standbys``,
  ``engine.cluster.standbys``); applying them is the caller's (``ClusterMember``).
* **State goes with the partitions.** ``held()`` (partition -> checkpoint of the partitions whose
  state this member keeps on disk; called on kafka-python's IO thread at each join, so it must
  answer from memory) goes into the member's subscription; when balance moves partitions, the
  leader moves the ones a member holds state for to that member (``assignor.prefer_state``).
* **Restarts** (``instance_id``, Kafka's static membership, KIP-345): a member that comes back
  with the same ``instance_id`` within ``session_timeout`` takes its place and gets the same
  partitions back, without moving any other. The price: kafka-python sends no LeaveGroup for a
  static member, so its ``close()`` hands over only after ``session_timeout``. Without it (the
  default) a restart is a leave and a join, each moving only what balance needs.

Wiring (the server with ``--group``)::

    membership = Membership(kafka, topic, group, advertise, session_timeout=10.0,
                            on_assigned=engine.assign, on_revoked=engine.revoke,
                            on_change=publish)  # publish: where the Router reads its OwnershipMap

Errors: bad arguments raise ``InvalidConfiguration`` before any I/O; a broker that cannot be
reached when starting raises ``LogUnavailable``; an unknown topic ``InvalidConfiguration``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Set
from typing import Any
from urllib.parse import urlsplit

from kafka import ConsumerRebalanceListener, KafkaConsumer
from kafka.errors import KafkaError
from kafka.structs import MemberState, TopicPartition

from engine.cluster.assignor import OwnershipAssignor
from engine.cluster.ownership import OwnershipMap
from engine.cluster.standbys import DEFAULT_WARMUP_LAG, MAX_STANDBYS
from engine.log.kafka_topic import CLIENT_TUNING, parse_bootstrap
from schemas.errors import InvalidConfiguration, LogUnavailable

__all__ = ["DEFAULT_SESSION_TIMEOUT", "MIN_SESSION_TIMEOUT", "Membership"]

log = logging.getLogger(__name__)

#: SERVICE.md's ``--session-timeout`` default, seconds.
DEFAULT_SESSION_TIMEOUT = 10.0
#: Kafka's default ``group.min.session.timeout.ms``; a broker refuses shorter ones.
MIN_SESSION_TIMEOUT = 6.0
#: How long one poll of the membership thread may block (so stop and lease checks are prompt).
_POLL_MS = 100

Parts = frozenset[int]


def _ignore(_: Any) -> None:
    return None


def _check_url(advertise: object) -> str:
    if not isinstance(advertise, str) or not advertise:
        raise InvalidConfiguration(f"advertise must be this member's URL, e.g. http://10.0.0.5:8420; got {advertise!r}")
    parts = urlsplit(advertise)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        raise InvalidConfiguration(
            f"advertise {advertise!r} must be http(s)://HOST:PORT (no path): other members send requests there")
    return advertise.rstrip("/")


def _check_name(what: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidConfiguration(f"{what} must be a non-empty string; got {value!r}")
    return value


class Membership:
    """One member of the cluster ``group`` on ``topic`` (see the module docstring).

    Joins at once (the constructor starts the membership thread); ``wait_joined`` waits, bounded,
    for the first assignment. ``map`` is the latest ``OwnershipMap``; ``owned`` what the member
    serves. Use as a context manager or call ``close()``.
    """

    def __init__(self, bootstrap: str, topic: str, group: str, advertise: str, *,
                 session_timeout: float = DEFAULT_SESSION_TIMEOUT,
                 on_assigned: Callable[[Parts], None] = _ignore,
                 on_revoked: Callable[[Parts], None] = _ignore,
                 on_change: Callable[[OwnershipMap], None] = _ignore,
                 heartbeat_interval: float | None = None,
                 rebalance_timeout: float = 30.0,
                 request_timeout: float = 10.0,
                 close_timeout: float = 5.0,
                 instance_id: str | None = None,
                 client_id: str | None = None,
                 held: Callable[[], Mapping[int, int]] | None = None,
                 standbys: int = 0,
                 warmup_lag: int = DEFAULT_WARMUP_LAG) -> None:
        bootstrap = parse_bootstrap(bootstrap)
        self.topic = _check_name("topic", topic)
        self.group = _check_name("group", group)
        self.advertise = _check_url(advertise)
        if not isinstance(session_timeout, int | float) or not MIN_SESSION_TIMEOUT <= session_timeout <= 1800:
            raise InvalidConfiguration(f"session_timeout must be {MIN_SESSION_TIMEOUT:g}..1800 seconds "
                                       f"(the broker's group.min.session.timeout.ms); got {session_timeout!r}")
        interval = session_timeout / 6 if heartbeat_interval is None else heartbeat_interval
        if not isinstance(interval, int | float) or not 0.05 <= interval <= session_timeout / 3:
            raise InvalidConfiguration(f"heartbeat_interval must be 0.05..session_timeout/3 seconds; got {interval!r}")
        for name, value in (("rebalance_timeout", rebalance_timeout), ("request_timeout", request_timeout),
                            ("close_timeout", close_timeout)):
            if not isinstance(value, int | float) or not 0 < value <= 3600:
                raise InvalidConfiguration(f"{name} must be a positive number of seconds; got {value!r}")
        if instance_id is not None:
            _check_name("instance_id", instance_id)
        if isinstance(standbys, bool) or not isinstance(standbys, int) or not 0 <= standbys <= MAX_STANDBYS:
            raise InvalidConfiguration(f"standbys must be 0..{MAX_STANDBYS} (replicas per partition besides its "
                                       f"owner); got {standbys!r}")
        if isinstance(warmup_lag, bool) or not isinstance(warmup_lag, int) or warmup_lag < 0:
            raise InvalidConfiguration(f"warmup_lag must be a number of records >= 0; got {warmup_lag!r}")
        for name, callback in (("on_assigned", on_assigned), ("on_revoked", on_revoked), ("on_change", on_change),
                               ("held", held or _ignore)):
            if not callable(callback):
                raise InvalidConfiguration(f"{name} must be callable; got {callback!r}")
        self.session_timeout = float(session_timeout)
        self.heartbeat_interval = float(interval)
        self._lease_s = self.session_timeout - self.heartbeat_interval
        self._rebalance_lease_s = float(rebalance_timeout) - self.heartbeat_interval
        self._stuck_after_s = float(rebalance_timeout) + self.session_timeout
        self._joining_since: float | None = None
        self._close_timeout = float(close_timeout)
        self._on_assigned, self._on_revoked, self._on_change = on_assigned, on_revoked, on_change

        self._lock = threading.Condition()
        self._owned: Parts = frozenset()
        self._map = OwnershipMap(self.group, -1, 0, self.advertise, {})
        self._stray = 0
        self._restarted_joins = 0
        self._stopping = threading.Event()
        self._closed = False

        self._assignor = OwnershipAssignor(self.advertise, self.topic, held, standbys, warmup_lag)
        self._rejoin = threading.Event()
        self._rejoins = 0
        self._consumer_config: dict[str, Any] = dict(
            bootstrap_servers=bootstrap, client_id=client_id or f"histlog-member-{self.group}",
            group_id=self.group, group_instance_id=instance_id,
            enable_auto_commit=False, auto_offset_reset="latest",
            partition_assignment_strategy=[self._assignor],
            session_timeout_ms=int(self.session_timeout * 1000),
            heartbeat_interval_ms=int(self.heartbeat_interval * 1000),
            max_poll_interval_ms=int(rebalance_timeout * 1000),
            request_timeout_ms=int(request_timeout * 1000),
            bootstrap_timeout_ms=int(request_timeout * 1000),
            fetch_max_bytes=1024, max_partition_fetch_bytes=1024, max_poll_records=1,
            allow_auto_create_topics=False, **CLIENT_TUNING)
        try:
            self._consumer = KafkaConsumer(**self._consumer_config)
        except KafkaError as exc:
            raise LogUnavailable(f"no Kafka broker answered at {bootstrap} to join group {group!r} ({exc}); "
                                 "check --kafka and retry") from exc
        try:
            partitions = self._consumer.partitions_for_topic(self.topic)
            if not partitions:
                raise InvalidConfiguration(f"Kafka topic {self.topic!r} does not exist at {bootstrap}: "
                                           "a cluster member joins an existing topic (open the engine first)")
            self._map = OwnershipMap(self.group, -1, len(partitions), self.advertise, {})
            self._consumer.subscribe([self.topic], listener=_Listener(self))
        except KafkaError as exc:
            self._consumer.close(autocommit=False, timeout_ms=1000)
            raise LogUnavailable(f"Kafka at {bootstrap} did not describe topic {self.topic!r} ({exc}); retry") from exc
        except BaseException:
            self._consumer.close(autocommit=False, timeout_ms=1000)
            raise
        self._thread = threading.Thread(target=self._run, name="histlog-membership", daemon=True)
        self._thread.start()

    # -- what callers read --------------------------------------------------------------------

    @property
    def map(self) -> OwnershipMap:
        """The latest ``OwnershipMap`` (also handed to ``on_change``)."""
        with self._lock:
            return self._map

    @property
    def owned(self) -> Parts:
        """The partitions this member serves: assigned to it and not revoked since."""
        with self._lock:
            return self._owned

    @property
    def stray_records(self) -> int:
        """Records the membership consumer fetched anyway and dropped (stays 0)."""
        with self._lock:
            return self._stray

    @property
    def rebalances(self) -> int:
        """Assignments received so far (each completed JoinGroup/SyncGroup round counts one)."""
        return self._assignor.assignments

    @property
    def rejoins(self) -> int:
        """Times this member joined again on purpose (``rejoin``: a warm-up done)."""
        with self._lock:
            return self._rejoins

    def rejoin(self) -> None:
        """Join the group again as a new member (leave, then join), so that the leader decides
        with what this member holds now: how a member that has warmed partitions up asks for
        them (kafka-python 3.0.12 has no public call that starts a rebalance, KIP-568's
        ``enforceRebalance``). Its own partitions are revoked first (``on_revoked``); the others
        take them meanwhile. Asynchronous: the membership thread does it at its next turn."""
        self._rejoin.set()

    @property
    def restarted_joins(self) -> int:
        """Joins started again because one was stuck (``_unstick``): 0 in a healthy member."""
        with self._lock:
            return self._restarted_joins

    def lease_valid(self) -> bool:
        """True while Kafka cannot have taken this member's partitions away (the module docstring).

        Proof of membership: the last successful heartbeat or the last assignment received.
        (kafka-python's own ``last_reset`` is no proof: it is also reset when the coordinator is
        merely looked up again, which a member evicted while frozen does first thing on waking.)
        While a JoinGroup/SyncGroup is in flight the lease holds, up to ``rebalance_timeout``
        (less a heartbeat interval) since the last proof: the broker keeps a member awaiting
        its join alive that long, and under the cooperative protocol its partitions move only
        once that round completes (an eviction is then reported to kafka-python, which calls
        ``on_partitions_lost``, within one round trip); past it the member was dropped.
        """
        try:
            state = self._consumer.group_metadata().state
        except Exception:  # a consumer closed by ``rejoin`` a moment ago: not a member now
            return False
        if state not in (MemberState.REBALANCING, MemberState.STABLE):
            return False
        beat = self._consumer._coordinator.heartbeat  # kafka-python keeps heartbeat times only here
        last: float = max(beat.last_receive, self._assignor.synced_at)
        if state == MemberState.REBALANCING:
            # Bounded all the same: a member that has not completed its join within the
            # rebalance timeout has been dropped from that round, and its partitions given to
            # others. Seen for real: kafka-python 3.0.12 can leave a member REBALANCING for good
            # (a SyncGroup answered, the join never completed, ``poll`` waiting on the
            # coordinator), and an unbounded lease let it serve partitions others owned.
            return time.monotonic() - last < self._rebalance_lease_s
        return time.monotonic() - last < self._lease_s

    def wait_joined(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` s) until the member has had an assignment; True if it has."""
        with self._lock:
            return self._lock.wait_for(lambda: self._map.generation >= 0 or self._closed, timeout) \
                and self._map.generation >= 0

    # -- leaving ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Revoke, leave the group (Kafka reassigns at once) and stop; bounded by ``close_timeout``
        plus a second. Idempotent. From a callback it only asks the thread to stop."""
        self._stopping.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(self._close_timeout + 1.0)
            if self._thread.is_alive():
                log.warning("membership of group %s did not stop within %.1f s", self.group, self._close_timeout + 1)

    def __enter__(self) -> Membership:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- the membership thread -------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                if self._rejoin.is_set():
                    self._restart()
                    continue
                try:
                    records = self._consumer.poll(timeout_ms=_POLL_MS)
                except KafkaError as exc:  # retriable or not, the loop goes on; Kafka decides membership
                    log.warning("group %s: poll failed: %s", self.group, exc)
                    self._stopping.wait(self.heartbeat_interval)
                    records = {}
                if records:
                    with self._lock:
                        self._stray += sum(len(batch) for batch in records.values())
                self._reconcile()
        except Exception:
            log.exception("membership thread of group %s failed; its partitions are revoked", self.group)
        finally:
            self._leave()

    def _reconcile(self) -> None:
        """Revoke everything when the lease ran out; take back what Kafka still assigns once it is
        valid again; publish the map. Leaving (``_leave``) does its own."""
        if self._stopping.is_set():
            return
        self._unstick()
        if not self.lease_valid():
            if self._owned:
                log.warning("group %s: lease expired (no heartbeat for %.1f s); revoking %s",
                            self.group, self._lease_s, sorted(self._owned))
                self._revoke(self._owned)
        elif self._consumer.group_metadata().state == MemberState.STABLE:
            assigned = {tp.partition for tp in self._consumer.assignment() if tp.topic == self.topic}
            if assigned - self._owned:
                self._assign(assigned)
        self._publish()

    def _restart(self) -> None:
        """``rejoin``'s work (membership thread): revoke, leave, and join with a new consumer;
        while no consumer can be opened (the broker away) it retries every heartbeat interval."""
        self._revoke(self._owned, lost=True)
        try:
            self._consumer.close(autocommit=False, timeout_ms=int(self._close_timeout * 1000))
        except Exception as exc:
            log.warning("group %s: leaving to join again failed (%s); joining anyway", self.group, exc)
        while not self._stopping.is_set():
            try:
                consumer = KafkaConsumer(**self._consumer_config)
                consumer.subscribe([self.topic], listener=_Listener(self))
            except KafkaError as exc:
                log.warning("group %s: could not join again (%s); retrying", self.group, exc)
                self._stopping.wait(self.heartbeat_interval)
                continue
            self._consumer = consumer
            break
        self._rejoin.clear()
        self._joining_since = None
        with self._lock:
            self._rejoins += 1
        self._publish()

    def _unstick(self) -> None:
        """Start the join again, as a new member, when one has been in flight for longer than the
        broker could keep it (``rebalance_timeout`` plus a session). kafka-python 3.0.12 can leave
        its join task waiting for good (a SyncGroup answered, the join never completed) and
        re-awaits that same task at every ``poll``, so the member would never rejoin until
        restarted. The lease has revoked everything by then; this only lets the member back in."""
        state = self._consumer.group_metadata().state
        if state == MemberState.STABLE:
            self._joining_since = None
            return
        now = time.monotonic()
        if self._joining_since is None:
            self._joining_since = now
            return
        if now - self._joining_since < self._stuck_after_s:
            return
        log.warning("group %s: a join has been in flight for %.0f s; starting it again as a new member",
                    self.group, now - self._joining_since)
        coordinator = self._consumer._coordinator  # the join task lives only here
        coordinator._join_task = None
        coordinator.reset_generation()
        with self._lock:
            self._restarted_joins += 1
        self._joining_since = now

    def _leave(self) -> None:
        with contextlib.suppress(Exception):
            self._revoke(self._owned)
        try:
            self._consumer.close(autocommit=False, timeout_ms=int(self._close_timeout * 1000))
        except Exception as exc:
            log.warning("group %s: leaving failed (%s); Kafka removes the member after the session timeout",
                        self.group, exc)
        with self._lock:
            self._closed = True
            self._lock.notify_all()

    # -- transitions (membership thread only) ----------------------------------------------------

    def _assign(self, parts: Iterable[int]) -> None:
        new = frozenset(parts) - self._owned
        if not new or self._stopping.is_set():
            return
        with self._lock:
            self._owned = self._owned | new
        self._call(self._on_assigned, new, "on_assigned")

    def _revoke(self, parts: Iterable[int], *, lost: bool = False) -> None:
        gone = frozenset(parts) & self._owned
        if lost:
            self._assignor.forget()
        if not gone:
            return
        with self._lock:
            self._owned = self._owned - gone
        self._call(self._on_revoked, gone, "on_revoked")
        self._publish()  # the map stops claiming them before anything else happens

    def _publish(self) -> None:
        latest = self._assignor.latest
        member = latest is not None and self.lease_valid() and not self._stopping.is_set()
        owners = {} if latest is None else {p: u for p, u in latest.owners.items() if u != self.advertise}
        with self._lock:
            owners.update(dict.fromkeys(self._owned, self.advertise))
            partitions = latest.partitions if latest is not None and latest.partitions else self._map.partitions
            new = OwnershipMap(self.group, latest.generation if member and latest else -1, partitions,
                               self.advertise, dict(sorted(owners.items())),
                               dict(latest.standbys) if latest is not None else {},
                               dict(latest.warmups) if latest is not None else {})
            if new == self._map:
                return
            self._map = new
            self._lock.notify_all()
        self._call(self._on_change, new, "on_change")

    def _call(self, callback: Callable[[Any], None], arg: Any, name: str) -> None:
        try:
            callback(arg)
        except Exception:
            log.exception("group %s: %s(%s) raised; the membership goes on", self.group, name,
                          sorted(arg) if isinstance(arg, Set) else arg)


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    """kafka-python's rebalance callbacks, turned into ``Membership`` transitions. They run on
    kafka-python's IO thread while the membership thread waits in ``poll``."""

    def __init__(self, membership: Membership) -> None:
        self._m = membership

    def _parts(self, tps: Iterable[TopicPartition]) -> Parts:
        return frozenset(tp.partition for tp in tps if tp.topic == self._m.topic)

    def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        self._m._revoke(self._parts(revoked))

    def on_partitions_lost(self, lost: Iterable[TopicPartition]) -> None:
        self._m._revoke(self._parts(lost), lost=True)

    def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        tps = list(assigned)
        self._m._consumer.pause(*tps)  # before poll can fetch: membership never reads records
        if self._m.lease_valid():
            self._m._assign(self._parts(tps))
