"""Taking a partition on from a peer's state snapshot instead of replaying it (issue 48,
docs/cluster.md "State snapshots").

What ``Restorer`` promises:

* **Only where it pays.** A partition assigned to this member is restored from a snapshot when
  the member holds no state of it (not a standby, nothing applied) and the log holds at least
  ``min_records`` of it; every other partition is taken on as before (``engine.assign``).
* **Never served before it is verified and caught up.** The partition is assigned held
  (``assign(hold=True)``: ``NotReady`` to every call, not applied); a worker thread asks the
  peers for ``GET /v1/partitions/{p}/snapshot`` (with this server's token), the standbys of the
  partition first (they are current), then every other member; the first snapshot that passes
  verification (``projections.snapshots``) is installed, then ``release`` lets the projector
  apply the tail from the snapshot's checkpoint, and the partition is ``catching_up`` until it
  reaches the log end seen at the assignment, like any other.
* **Any failure falls back to a replay.** A peer that holds nothing (404), does not answer, is
  killed mid-transfer, or sends a snapshot that fails verification is skipped; when no peer
  gives a good one the partition is released as it is and replayed from offset 0. A partition
  revoked during its restore installs nothing.
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
        applied, standbys = self.engine.applied_offsets(), self.engine.standbys
        ends = self.engine.log.end_offsets()  # engine.assign reads them too
        cold = frozenset(p for p in parts if p not in standbys and applied[p] == 0 and ends[p] >= self.min_records)
        if cold:
            self.engine.assign(cold, hold=True)
        if parts - cold:
            self.engine.assign(parts - cold)
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

    def _one(self, http: httpx.Client, p: int) -> bool:
        peers = list(self._peers(p))
        if not peers:
            log.info("partition %s: no other member to ask for a snapshot; replaying it from the log", p)
            return False
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
