"""Erasure's slow half beside the projector: ``Eraser`` compacts a cleared conversation's files
(``projections.erasure.finish``) on its own thread and then hands the clear its decision."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from projections.admission import Decision
from projections.erasure import finish
from projections.store import StateStore
from schemas.positions import LogPosition

__all__ = ["Decided", "Eraser", "incomplete"]

log = logging.getLogger("histlog.projector")

Decided = list[tuple[LogPosition, bytes, Decision]]
"""A step's decisions: where, under which record key, what."""


@dataclass(frozen=True, slots=True)
class _Job:
    convs: list[bytes]
    used: dict[bytes, list[str]]
    extra: list[tuple[bytes, bytes]]
    decided: Decided
    done: Callable[[Decided], None]
    deleted: list[bytes]


class Eraser:
    """Runs ``finish`` (the compaction and the last WriteBatch of an erasure) on its own thread,
    beside the projector, so a clear no longer stops every other write of the engine while
    RocksDB rewrites the files that held the conversation (a compaction costs about the size of
    the state files its ranges overlap, not the conversation's size: 400 ms for one clear in a
    state of 20,000 conversations, during which no append of any conversation was decided).

    ``submit`` queues the clears of one committed step, their keys destroyed already
    (``destroy_keys``, in the step), with their decisions; the thread takes every job queued,
    finishes them in one compaction (clears that arrive together share its cost), then hands
    their decisions to their ``done``: a clear's writer hears of it only once no file of the state
    holds the conversation. A failure publishes the decisions with ``erasure incomplete``, as
    when the erasure ran in the step: the ``E`` rows stay, the next clear of each or the next open retries.
    ``lock`` is held around every ``finish``, here and in ``Projector.complete_erasures``: one
    erasure's files at a time. ``stop`` finishes what is queued, then ends the thread; a crash
    leaves the ``E`` rows, and the next open completes them."""

    def __init__(self, store: StateStore) -> None:
        self.store = store
        self.lock = threading.Lock()
        self._cond = threading.Condition()
        self._queue: list[_Job] = []
        self._stopping = False
        self._thread: threading.Thread | None = None

    def submit(self, convs: list[bytes], used: dict[bytes, list[str]], extra: list[tuple[bytes, bytes]],
               decided: Decided, done: Callable[[Decided], None], deleted: list[bytes] | None = None) -> None:
        """Queue the erasure of ``convs`` (and the compaction of ``deleted``: open conversations
        whose messages were deleted); ``done`` gets ``decided`` once it is finished (or failed:
        then with the reason), on the eraser's thread."""
        with self._cond:
            self._queue.append(_Job(convs, used, extra, decided, done, deleted or []))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="histlog-eraser", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if not self._queue:
                    self._thread = None  # stopped, the queue done: a later submit starts another
                    return
                jobs, self._queue = self._queue, []
            convs = [c for job in jobs for c in job.convs]
            error: Exception | None = None
            try:
                with self.lock:
                    finish(self.store, convs, {c: u for job in jobs for c, u in job.used.items()},
                           list(dict.fromkeys(r for job in jobs for r in job.extra)),
                           list(dict.fromkeys(c for job in jobs for c in job.deleted)))
            except Exception as e:
                log.warning("the erasure of %d cleared conversation(s) did not complete (%s); they are closed, and "
                            "the next clear of each, or the next open, completes it", len(convs), e)
                error = e
            for job in jobs:
                try:
                    job.done(job.decided if error is None else incomplete(job.decided, error))
                except Exception:  # pragma: no cover - a bug; the next jobs are still answered
                    log.exception("handing an erasure's decisions out failed")

    def stop(self) -> None:
        """Finish what is queued, then end the thread (a later ``submit`` starts another)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()
        with self._cond:
            self._stopping = False


def incomplete(decided: Decided, error: Exception) -> Decided:
    """``decided`` (clears) with the reason that their erasure did not complete."""
    return [(position, key, Decision(d.outcome, reason=f"erasure incomplete: {error}"[:300]))
            for position, key, d in decided]
