"""The ``Store`` interface the broker's services, placer and dispatcher code against.

Backends: ``sqlite.SqliteStore`` (embedded default: WAL, synchronous=FULL) and
``postgres.PostgresStore`` (HA: one leader per database by advisory lock), both
on ``sql_store.SqlStore``, with the decisions of their writes in ``writes``;
tests/broker/test_store.py runs the same contract tests against both.

Contract (every backend, checked by the shared test suite):

* **Acknowledge after commit.** Every mutating coroutine returns only after
  its transaction committed durably. Concurrent calls are group-committed:
  one transaction for a batch; if that transaction fails, every member gets
  ``errors.BatchFailed`` (UNAVAILABLE, retryable) and nothing of it is kept.
  A member's own logical error (stale CAS, idempotency conflict) fails only
  that member.
* **Idempotent submit.** ``(tenant, idempotency_key)`` is unique. Same key and
  same fingerprint → the original job (``created=False``); same key, other
  fingerprint → ``errors.IdempotencyConflict`` (ALREADY_EXISTS). Keys live as
  long as their job (retention deletes both).
* **Outbox.** Each state change writes its watch event (next store revision)
  and its dispatch orders in the same transaction.
* **Compare-and-set.** ``transition`` applies only if the job is still in
  ``(expect_state, expect_attempt)``; otherwise ``errors.StaleTransition``
  (ABORTED). Edges outside ``states.TRANSITIONS`` raise
  ``errors.InvalidTransition``.
* **Watch.** ``watch_events(r)`` returns events with revision > r in order;
  ``r`` below the compaction revision raises ``errors.RevisionCompacted``
  (OUT_OF_RANGE).
* **Pagination.** Keyset by arrival (``JobRecord.seq``); page tokens are
  opaque and signed: a tampered or foreign token raises
  ``errors.InvalidPageToken`` (INVALID_ARGUMENT).
* **Tenancy.** Methods taking ``tenant`` treat another tenant's job as not
  found (``errors.JobNotFound``), never as forbidden.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from types import TracebackType

from broker.domain.errors import JobNotFound
from broker.domain.job_events import Event
from broker.domain.lifecycle import Reaction
from broker.domain.records import (
    AttemptRecord,
    CompactionResult,
    DispatchOrder,
    GpuHours,
    JobFilter,
    JobPage,
    JobRecord,
    NewJob,
    ReplicaRecord,
    SubmitResult,
    Transition,
    WatchEvent,
    WatchPage,
)
from broker.domain.retry import RetryPolicy
from broker.store.updates import Decide, Respec, Update, decide_hold, decide_priority

__all__ = ["Store", "StoreOptions", "Clock", "IdGen", "Delivery"]

Clock = Callable[[], float]
"""Seconds since the epoch."""
IdGen = Callable[[], str]
"""New job id: a DNS-1035 label of at most 40 characters."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """One outbox order with what its message needs, read together (the dispatcher's batch)."""

    order: DispatchOrder
    job: JobRecord | None
    """None when the job is gone (compacted)."""
    attempt: AttemptRecord | None
    """The order's attempt, None when it does not exist."""


@dataclass(frozen=True, slots=True)
class StoreOptions:
    """Store tuning; every field has a default."""

    max_batch: int = 512
    """Most requests committed in one group-commit transaction (1 = one transaction per request)."""
    retry: RetryPolicy = RetryPolicy()
    """Retry budget and back-off that ``apply_event`` uses."""
    max_page_size: int = 1000
    """Largest ListJobs page (jobs)."""
    default_page_size: int = 100
    """Page size when the caller passes 0 (jobs)."""
    max_watch_batch: int = 1000
    """Most events one ``watch_events`` call returns."""


class Store(abc.ABC):
    """Durable jobs, attempts/reservations, watch events and dispatch outbox. All methods are coroutines."""

    store_id: str = ""
    """Stable identity of this database (set by `open`): part of every dispatch id, so an agent never adopts
    workloads of another (or a rebuilt) database that reuses job ids."""

    # -- lifecycle ---------------------------------------------------------------------------

    @abc.abstractmethod
    async def open(self) -> None:
        """Open (create / migrate the schema); idempotent."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Finish queued requests, then close. Later calls raise StoreUnavailable."""

    async def __aenter__(self) -> Store:
        await self.open()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- submission --------------------------------------------------------------------------

    @abc.abstractmethod
    async def submit(self, job: NewJob) -> SubmitResult:
        """Write a QUEUED job (with its SUBMITTED event) durably; idempotent per (tenant, key)."""

    # -- reads -------------------------------------------------------------------------------

    @abc.abstractmethod
    async def get_job(self, job_id: str, *, tenant: str | None = None) -> JobRecord:
        """The job; JobNotFound if unknown or (when ``tenant`` is given) another tenant's."""

    @abc.abstractmethod
    async def list_attempts(self, job_id: str) -> list[AttemptRecord]:
        """Attempts of a job, oldest first."""

    @abc.abstractmethod
    async def job_history(self, job_id: str) -> list[WatchEvent]:
        """The job's events (state transitions), oldest first."""

    @abc.abstractmethod
    async def list_jobs(self, flt: JobFilter, *, page_size: int = 0, page_token: str = "") -> JobPage:
        """Jobs matching ``flt`` in arrival order, one page; pass ``next_page_token`` back with the same filter."""

    @abc.abstractmethod
    async def active_jobs(self) -> list[JobRecord]:
        """Every non-terminal job in arrival order (the queue and placer rebuild from this after a restart)."""

    @abc.abstractmethod
    async def active_attempts(self) -> list[AttemptRecord]:
        """The current, open attempt of every non-terminal job that has one: with its assignments, the
        reservation it was persisted with (the overlay reloads these after a restart)."""

    async def active_runs(self) -> list[tuple[JobRecord, AttemptRecord]]:
        """Each active attempt with its job, as of one read (the watchdog's sweep).

        Backends override this with a single read; this default composes the calls above."""
        out: list[tuple[JobRecord, AttemptRecord]] = []
        for a in await self.active_attempts():
            try:
                out.append((await self.get_job(a.job_id), a))
            except JobNotFound:
                continue
        return out

    # -- state changes -----------------------------------------------------------------------

    @abc.abstractmethod
    async def transition(self, t: Transition) -> JobRecord:
        """Compare-and-set transition with its attempt changes, event and orders; returns the new job."""

    @abc.abstractmethod
    async def apply_event(self, event: Event) -> tuple[JobRecord, Reaction]:
        """Run ``lifecycle.react`` on the event inside the transaction and apply the reaction.

        Stale or no-op events are not errors: the Reaction says why they were ignored.
        """

    @abc.abstractmethod
    async def cancel_job(
        self, job_id: str, *, tenant: str | None, actor: str, message: str = "", grace_s: float = 30.0
    ) -> JobRecord:
        """Cancel: QUEUED/RESERVED → CANCELLED now; started ones → CANCELLING with a CANCEL order.

        Idempotent on CANCELLING/CANCELLED; JobFinished for SUCCEEDED/FAILED.
        """

    @abc.abstractmethod
    async def cancel_job_set(
        self, tenant: str, job_set: str, *, actor: str, message: str = "", grace_s: float = 30.0
    ) -> list[JobRecord]:
        """Cancel every non-terminal job of the tenant's job set in one transaction; returns those changed."""

    # -- scheduling settings (no state change) ----------------------------------------------

    async def set_priority(
        self,
        job_id: str,
        *,
        tenant: str | None,
        actor: str,
        priority: int | None = None,
        band: str | None = None,
        message: str = "",
        respec: Respec | None = None,
    ) -> JobRecord:
        """Change a non-terminal job's priority and / or band (None = keep) with an UPDATED event; ``respec``
        rewrites the stored spec bytes to carry the new values (called inside the transaction). Unchanged
        values write nothing. JobFinished when terminal. The fingerprint stays: a retry of the original
        submission still finds the job."""

        def decide(job: JobRecord) -> Update | None:
            return decide_priority(job, priority, band, message, respec)

        return (await self._update_job(job_id, tenant, actor, decide))[0]

    async def set_hold(
        self, job_id: str, *, held: bool, tenant: str | None, actor: str, message: str = ""
    ) -> tuple[JobRecord, bool]:
        """Hold or release a non-terminal job with an UPDATED event; returns (job, changed). JobFinished when
        terminal. A tenant caller (``tenant`` given) may release only holds it placed (PermissionDenied,
        reason HELD_BY_ADMIN). While held, ``apply_event`` ignores a Reserve for the job."""

        def decide(job: JobRecord) -> Update | None:
            return decide_hold(job, held, tenant=tenant, actor=actor, message=message)

        return await self._update_job(job_id, tenant, actor, decide)

    @abc.abstractmethod
    async def _update_job(self, job_id: str, tenant: str | None, actor: str, decide: Decide) -> tuple[JobRecord, bool]:
        """What both settings changes run on, in one write: load the job (JobNotFound as ``get_job``), ``decide``,
        write the update with its UPDATED event when there is one; the job as it now is and whether it changed."""

    @abc.abstractmethod
    async def gpu_hours(self, *, since: float, until: float, now: float, tenant: str | None = None) -> list[GpuHours]:
        """GPU-hours per (tenant, GPU model, cluster): each attempt's [running time (start time if it never
        ran), end time (``now`` while open)] overlapped with [since, until], x its GPUs; aggregated by the
        database (no spec is read). Non-zero rows only, sorted by tenant, model, cluster."""

    # -- outbox ------------------------------------------------------------------------------

    @abc.abstractmethod
    async def pending_orders(self, cluster: str, *, after: int = 0, limit: int = 1000) -> list[DispatchOrder]:
        """Undelivered orders for a cluster with order_id > ``after``, in order."""

    @abc.abstractmethod
    async def ack_orders(self, cluster: str, order_ids: Sequence[int]) -> int:
        """Mark orders delivered; returns how many changed."""

    async def pending_deliveries(self, cluster: str, *, limit: int = 1000) -> list[Delivery]:
        """Undelivered orders with their job and attempt as of one read (None when gone), in order.

        Backends override this with a single read; this default composes the calls above."""
        out: list[Delivery] = []
        for o in await self.pending_orders(cluster, limit=limit):
            try:
                job: JobRecord | None = await self.get_job(o.job_id)
            except JobNotFound:
                job = None
            attempt = None
            if job is not None:
                attempt = next((a for a in await self.list_attempts(o.job_id) if a.number == o.attempt), None)
            out.append(Delivery(o, job, attempt))
        return out

    # -- observed status and cluster state ---------------------------------------------------

    @abc.abstractmethod
    async def record_workload(
        self, job_id: str, attempt: int, replicas: Sequence[ReplicaRecord], rendezvous: str = ""
    ) -> bool:
        """Replace the attempt's observed replicas with these (and set its rendezvous address when non-empty);
        False (nothing written) when the attempt does not exist."""

    @abc.abstractmethod
    async def record_feedback(self, job_id: str, attempt: int, feedback: str, at: float) -> bool:
        """Keep the extender's last filter verdict for the attempt; False when the attempt does not exist."""

    @abc.abstractmethod
    async def set_cordon(self, cluster: str, reason: str | None, *, actor: str) -> None:
        """Cordon a cluster with a reason (``None`` lifts the cordon); durable before it returns."""

    @abc.abstractmethod
    async def cordons(self) -> dict[str, str]:
        """Cordoned clusters and their reasons."""

    # -- watch & retention -------------------------------------------------------------------

    @abc.abstractmethod
    async def current_revision(self) -> int:
        """Latest committed revision (0 for an empty store)."""

    async def watch_events(
        self, from_revision: int, *, limit: int = 0, tenant: str | None = None, job_set: str | None = None
    ) -> list[WatchEvent]:
        """Committed events with revision > ``from_revision`` (optionally one tenant / job set), oldest first."""
        return list((await self.watch_page(from_revision, limit=limit, tenant=tenant, job_set=job_set)).events)

    @abc.abstractmethod
    async def watch_page(
        self, from_revision: int, *, limit: int = 0, tenant: str | None = None, job_set: str | None = None
    ) -> WatchPage:
        """Like ``watch_events``, plus the revision the read covered, so a filtered watcher can advance past
        other tenants' events (resume with ``page.revision``; wait with ``wait_for_revision(page.revision)``)."""

    async def watch(
        self,
        from_revision: int,
        *,
        tenant: str | None = None,
        job_set: str | None = None,
        bookmark_s: float = 30.0,
    ) -> AsyncIterator[WatchPage]:
        """Follow the event log from ``from_revision``: pages of matching events as they commit, and an empty
        page (a bookmark carrying the covered revision) after ``bookmark_s`` without any. Never spins on other
        tenants' commits: it resumes from the covered revision, not from the last matching event."""
        rev = from_revision
        while True:
            page = await self.watch_page(rev, tenant=tenant, job_set=job_set)
            rev = page.revision
            if page.events:
                yield page
                continue
            if await self.wait_for_revision(rev, bookmark_s) <= rev:
                yield page  # nothing new for anyone: a bookmark

    @abc.abstractmethod
    async def wait_for_revision(self, after: int, timeout_s: float) -> int:
        """Wait until a revision > ``after`` is committed or the timeout passes; returns the current revision."""

    @abc.abstractmethod
    async def compact(self, *, finished_before: float, limit: int = 10_000) -> CompactionResult:
        """Delete up to ``limit`` terminal jobs that ended before ``finished_before``, oldest first, with their
        attempts, orders, events and idempotency keys, in one transaction (call again while it deletes ``limit``)."""

    @abc.abstractmethod
    async def compacted_revision(self) -> int:
        """Revisions at or below this may be gone; watching from below it raises RevisionCompacted."""
