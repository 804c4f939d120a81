"""Taking a partition on from a peer's state snapshot instead of replaying it (issue 48,
docs/cluster.md "State snapshots").

What ``Restorer`` promises:

* **Only where it pays.** A partition assigned to this member (``take_on``), or given to it as a
  standby (``add_standbys``: a new standby, or one warming up before a move), is restored from a
  snapshot when the member holds no state of it (not a standby already, nothing applied) and the
  log holds at least ``min_records`` of it; every other one is taken on as before
  (``engine.assign``, ``engine.add_standbys``).
* **Never served before it is verified and caught up.** The partition is assigned held
  (``assign(hold=True)``: ``NotReady`` to every call, not applied; a standby is added held:
  ``add_standbys(hold=True)``, not applied). A worker thread asks the peers for
  ``GET /v1/partitions/{p}/snapshot`` (with this server's token), the peer whose state of the
  partition is furthest along first (each one's ``GET /v1/stats``: the newest snapshot is the
  one restored), ties and peers that do not say in the order ``peers`` gives (the member's: the
  partition's owner and standbys first, then every other member). The first snapshot that
  passes verification (``projections.snapshots``) is installed, then ``release`` lets the
  projector apply the tail from the snapshot's checkpoint, and the partition is ``catching_up``
  until it reaches the log end seen at the assignment, like any other (a standby is kept
  current, as any).
* **Any failure falls back to a replay.** A peer that holds nothing (404), does not answer, is
  killed mid-transfer, or sends a snapshot that fails verification is skipped; when no peer
  gives a good one the partition is released as it is and replayed from offset 0. A partition
  revoked (a standby removed) during its restore installs nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

import httpx

from engine.facade import HistoryEngine
from projections.snapshots import SnapshotRejected
from schemas.errors import HistoryError, NotOwner

__all__ = ["DEFAULT_MIN_RECORDS", "Restorer"]

log = logging.getLogger(__name__)

#: Below this many records a replay is about as quick as a transfer: no snapshot is asked for.
DEFAULT_MIN_RECORDS = 1000
_TIMEOUT_S = 10.0  # connect, and between two chunks of one snapshot
_STATS_TIMEOUT_S = 1.0  # a peer's /v1/stats, asked to rank the peers (a dead one costs this once)


class Restorer:
    """``take_on(parts)`` instead of ``engine.assign(parts)`` (see the module). ``peers(p)``: the
    URLs to ask for partition ``p``'s snapshot, in order; ``token``: this cluster's bearer token."""

    def __init__(self, engine: HistoryEngine, peers: Callable[[int], Iterable[str]], token: str | None,
                 min_records: int = DEFAULT_MIN_RECORDS) -> None:
        self.engine = engine
        self._peers = peers
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.min_records = min_records
        self._lock = threading.Lock()
        self.restored = 0
        """Partitions taken on from a snapshot."""
        self.fell_back = 0
        """Partitions that asked for a snapshot and were replayed instead (no peer gave a good one)."""
        self._closing = threading.Event()

    def take_on(self, parts: frozenset[int]) -> None:
        """Assign ``parts`` to the engine: the cold ones held and restored on a worker thread,
        the others at once. Returns at once (kafka-python's IO thread calls it)."""
        cold = self._cold(parts - self.engine.standbys)
        if cold:
            self.engine.assign(cold, hold=True)
        if parts - cold:
            self.engine.assign(parts - cold)
        self._start(cold)

    def add_standbys(self, parts: frozenset[int]) -> None:
        """Add ``parts`` as standbys to the engine (a new standby, or one warming up before a
        move): the cold ones held and restored on a worker thread, the others applied at once
        from their checkpoints. Returns at once."""
        cold = self._cold(parts - self.engine.standbys - self.engine.owned)
        if cold:
            self.engine.add_standbys(cold, hold=True)
        if parts - cold:
            self.engine.add_standbys(parts - cold)
        self._start(cold)

    def _cold(self, parts: frozenset[int]) -> frozenset[int]:
        """Those of ``parts`` with nothing applied here and at least ``min_records`` in the log
        (the log is asked only when some hold nothing)."""
        applied = self.engine.applied_offsets()
        empty = [p for p in parts if applied[p] == 0]
        if not empty:
            return frozenset()
        ends = self.engine.log.end_offsets()
        return frozenset(p for p in empty if ends[p] >= self.min_records)

    def _start(self, cold: frozenset[int]) -> None:
        if cold:
            threading.Thread(target=self._restore, args=(cold,), name="histlog-restore", daemon=True).start()

    def close(self) -> None:
        """Stop asking peers (a restore in flight ends with its current transfer)."""
        self._closing.set()

    def _restore(self, cold: frozenset[int]) -> None:
        with httpx.Client(timeout=_TIMEOUT_S, headers=self._headers) as http:
            for p in sorted(cold):
                done = False
                try:
                    done = self._one(http, p)
                finally:
                    with self._lock:
                        if done:
                            self.restored += 1
                        else:
                            self.fell_back += 1
                    try:
                        self.engine.release([p])
                    except HistoryError as exc:  # closed or failed meanwhile: nothing to release
                        log.debug("partition %s not released: %s", p, exc)

    def _newest_first(self, http: httpx.Client, p: int, peers: list[str]) -> list[str]:
        """``peers`` ordered by how far each one's state of ``p`` is (its ``GET /v1/stats``
        ``applied_offsets``, at most ``_STATS_TIMEOUT_S`` each), furthest first, so the newest
        snapshot is asked for first; ties keep the given order, and a peer that does not say
        goes last (it is still asked: it may hold one)."""
        ranked: list[tuple[int, int, str]] = []
        for i, peer in enumerate(peers):
            at = -1
            try:
                answer = http.get(f"{peer}/v1/stats", timeout=_STATS_TIMEOUT_S)
                if answer.status_code == 200:
                    at = int(answer.json()["applied_offsets"][p])
            except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
                log.debug("partition %s: %s did not say how far its state is (%s)", p, peer, exc)
            ranked.append((-at, i, peer))
        return [peer for _, _, peer in sorted(ranked)]

    def _one(self, http: httpx.Client, p: int) -> bool:
        peers = list(self._peers(p))
        if not peers:
            log.info("partition %s: no other member to ask for a snapshot; replaying it from the log", p)
            return False
        peers = self._newest_first(http, p, peers)
        for peer in peers:
            if self._closing.is_set():
                return False
            try:
                with http.stream("GET", f"{peer}/v1/partitions/{p}/snapshot") as answer:
                    if answer.status_code != 200:
                        log.info("partition %s: %s has no snapshot for us (%s)", p, peer, answer.status_code)
                        continue
                    offset = self.engine.restore_partition(p, answer.iter_bytes())
            except NotOwner:
                return False  # revoked meanwhile: nothing to restore
            except (SnapshotRejected, httpx.HTTPError, HistoryError) as exc:
                log.warning("partition %s: the snapshot from %s failed (%s); trying the next peer", p, peer, exc)
                continue
            log.info("partition %s restored from %s's snapshot at offset %s; catching up the tail", p, peer,
                        offset)
            return True
        log.warning("partition %s: no peer gave a good snapshot; replaying it from the log", p)
        return False
