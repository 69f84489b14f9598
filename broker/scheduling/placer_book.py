"""What the placer knows about jobs: the queued ones, their requests, held capacity, why they wait, their order."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from broker.domain.records import JobRecord
from broker.domain.specs import SpecReader
from broker.domain.states import HOLDS_CAPACITY, JobState
from broker.scheduling import fairness
from broker.scheduling import queue as q
from broker.scheduling.drains import DrainHolds
from broker.store.base import Store
from broker.tenancy.policy import PolicyFile
from fleetplan import catalog as cat
from fleetplan.catalog import ReplicaPlacement
from fleetplan.decide import ClusterPredicate, ClusterVerdict, WaitReason, cluster_verdicts, within_policy
from fleetplan.view import FleetView
from placement.model import JobRequest

__all__ = ["JobBook", "Held", "WaitHint"]


@dataclass(frozen=True, slots=True)
class Held:
    """Capacity a job's current attempt holds (quota and fair share are charged for it)."""

    tenant: str
    gpu_model: str
    gpus: float


@dataclass(frozen=True, slots=True)
class WaitHint:
    """Why the placer's last look left a job waiting (the queue's own reasons are added to it)."""

    reason: WaitReason
    message: str
    evaluated_at: float


class JobBook:
    """The placer's bookkeeping, kept in step with the store by `observe`: queued jobs, their requests as
    placement sees them, the capacity attempts hold, the last verdicts, and the queue's order over them.
    Also which queued jobs deserve another look (`todo`) and the event that wakes the placer's loop."""

    def __init__(
        self,
        store: Store,
        catalog: cat.Catalog,
        policy: PolicyFile,
        *,
        specs: SpecReader,
        drains: DrainHolds,
        clock: Callable[[], float],
        model_weights: Mapping[str, float] | None = None,
        usage_half_life_s: float = 0.0,
    ) -> None:
        self.store = store
        self.catalog = catalog
        self.policy = policy
        self.specs = specs
        self.drains = drains
        """Read here, owned by the placer's holds: a queued job is charged the idle GPUs its held domain keeps."""
        self.clock = clock
        self.model_weights = dict(model_weights or {})
        self.queue = q.QueueBook(q.policy_from_tenancy(policy.current(), model_weights=self.model_weights))
        self.decayed = fairness.DecayedUsage(usage_half_life_s)
        """Tenants' decayed usage: orders the queue between tenants (never quota, never preemption)."""
        self.queued: dict[str, JobRecord] = {}
        self.requests: dict[str, JobRequest] = {}
        self.held: dict[str, Held] = {}
        self.waits: dict[str, WaitHint] = {}
        self.todo: set[str] = set()
        """Queued jobs the next step looks at."""
        self.wake = asyncio.Event()
        """Set when the placer's loop has something to look at."""
        self._policy_seen = policy.current()
        self._version = 0
        self._snap: tuple[int, float, q.QueueSnapshot] | None = None

    # ------------------------------------------------------------------ bookkeeping

    async def load(self) -> None:
        """After a restart: queued jobs, holds and reservations come back from the store (inventory does not)."""
        jobs = {j.job_id: j for j in await self.store.active_jobs()}
        attempts = {a.job_id: a for a in await self.store.active_attempts()}
        for job in jobs.values():
            self.observe(job)
            a = attempts.get(job.job_id)
            if a is not None and job.state in HOLDS_CAPACITY:
                self.held[job.job_id] = Held(job.tenant, a.gpu_model, a.gpus)
                self.refresh_entry(job)
        for a in attempts.values():  # each open attempt is the reservation it was persisted with
            held_job = jobs.get(a.job_id)
            if held_job is not None:
                self.catalog.add_reservation(
                    self.reservation(held_job, a.cluster, a.number, a.assignments, a.gpu_model)
                )

    def request_of(self, job: JobRecord) -> JobRequest:
        """The job's request as placement sees it under the current policy (cached until it ends)."""
        req = self.requests.get(job.job_id)
        if req is None:
            req = self._placeable(job, self.specs.request(job))
            self.requests[job.job_id] = req
        return req

    def _placeable(self, job: JobRecord, req: JobRequest) -> JobRequest:
        """The request as the current policy lets the placer see it: band priority, tenant's GPU models."""
        pol = self.policy.current()
        priority = q.banded_priority(pol.band_priority(job.priority_band) or 0, job.priority)
        tenant = pol.tenants.get(job.tenant)
        models = None if tenant is None or "*" in tenant.gpu_models else tenant.gpu_models
        return within_policy(dataclasses.replace(req, job_id=job.job_id, priority=priority), models)

    def forget_request(self, job_id: str) -> None:
        """Drop the job's cached request: the next look derives it again (its priority or band changed)."""
        self.requests.pop(job_id, None)

    def remember(self, job: JobRecord, req: JobRequest) -> None:
        """The request parsed at submission, so the placer does not decode the spec again."""
        if job.job_id not in self.requests:
            self.requests[job.job_id] = self._placeable(job, req)

    def allows(self, job: JobRecord) -> ClusterPredicate:
        """Which clusters the tenancy policy lets the job's tenant use."""
        tenant = self.policy.current().tenants.get(job.tenant)
        if tenant is None:
            return lambda _c: False
        return lambda entry: tenant.allows_place(entry.name, entry.meta.region, entry.meta.role)

    def reservation(
        self, job: JobRecord, cluster: str, attempt: int, assignments: tuple[ReplicaPlacement, ...], gpu_model: str
    ) -> cat.Reservation:
        """The catalog overlay's reservation for `job`'s attempt on these nodes."""
        req = self.request_of(job)
        shapes = {ps.name: ps.shape for ps in req.pod_sets}
        replicas = tuple(cat.ReservedReplica(a.pod_set, a.index, a.node) for a in assignments)
        return cat.Reservation(job.job_id, attempt, cluster, replicas, shapes, gpu_model)

    def refresh_entry(self, job: JobRecord) -> None:
        """The job's queue entry again, charged for what its attempt holds or, while queued, its held domain."""
        self._version += 1
        held = self.held.get(job.job_id) if job.state in HOLDS_CAPACITY else None
        drain = self.drains.holds.get(job.job_id) if job.state is JobState.QUEUED else None
        model, gpus = (
            (held.gpu_model, held.gpus) if held else (drain.gpu_model, float(drain.idle_gpus)) if drain else ("", 0.0)
        )
        self.queue.upsert(q.QueueEntry.charging(job, model, gpus, drain_hold=drain is not None))

    def observe(self, job: JobRecord) -> None:
        """A committed job change: keeps the queue, held capacity and the catalog overlay in step with the store."""
        if job.state is JobState.QUEUED:
            if job.job_id not in self.queued:
                self.todo.add(job.job_id)
            self.queued[job.job_id] = job
        else:
            self.queued.pop(job.job_id, None)
            self.waits.pop(job.job_id, None)
        if job.state not in HOLDS_CAPACITY:
            if self.held.pop(job.job_id, None) is not None:
                self.capacity_changed()
            # The attempt ended: its reservation no longer holds anything.
            for key in self.catalog.reservations_of_job(job.job_id):
                self.catalog.drop_reservation(key)
        if job.terminal:
            self.forget_request(job.job_id)
        self.refresh_entry(job)
        self.wake.set()

    def capacity_changed(self) -> None:
        """Inventory, cordon or holds changed: every waiting job deserves another look."""
        self.todo.update(self.queued)
        self.wake.set()

    def held_gpus_by_cluster(self) -> dict[str, float]:
        """GPUs held by placed jobs, per cluster their reservation is on (preemption holds count none)."""
        out: dict[str, float] = {}
        for res in self.catalog.reservations.values():
            held = self.held.get(res.job_id)
            out[res.cluster] = out.get(res.cluster, 0.0) + (held.gpus if held else 0.0)
        return out

    # ------------------------------------------------------------------ ordering (the queue's)

    def snapshot(self, now: float | None = None) -> q.QueueSnapshot:
        """The queue's view; reused for a quarter second while no job changed (reads call this per job)."""
        pol = self.policy.current()
        if pol is not self._policy_seen:
            self._policy_seen = pol
            self.queue.set_policy(q.policy_from_tenancy(pol, model_weights=self.model_weights))
            self._version += 1
            self.requests.clear()  # band priorities and allowed models are the policy's: derive them again
            self.capacity_changed()
        t = self.clock() if now is None else now
        cached = self._snap
        if cached is not None and cached[0] == self._version and 0 <= t - cached[1] < 0.25:
            return cached[2]
        snap = self.queue.snapshot(t, self._ordering_cost if self.decayed.half_life_s > 0 else None)
        self._snap = (self._version, t, snap)
        return snap

    def shares(self, now: float | None = None) -> tuple[q.QueueSnapshot, fairness.Shares]:
        """The queue's snapshot and every tenant's usage, demand and fair share of the fleet's capacity now."""
        snap = self.snapshot(now)
        totals = FleetView(self.catalog, snap.now).gpu_totals()
        capacity = sum(n * snap.policy.model_weight(m) for m, n in totals.items())
        return snap, fairness.shares_of(snap, capacity)

    def _ordering_cost(self, now: float, usage: Mapping[str, float]) -> Mapping[str, float]:
        """The larger of usage now and decayed usage: recent heavy use counts against a tenant for about a
        half-life, current use at once."""
        decayed = self.decayed.observe(now, usage)
        return {t: max(usage.get(t, 0.0), decayed.get(t, 0.0)) for t in set(usage) | set(decayed)}

    def ordered(self) -> list[JobRecord]:
        """QUEUED jobs in the queue's order: band, weighted fair share, priority, arrival."""
        return [self.queued[e.job_id] for e in self.snapshot().order() if e.job_id in self.queued]

    def position(self, job_id: str) -> int | None:
        """Jobs ahead of this one in its tenant's own queue order (never reveals other tenants' jobs)."""
        return self.snapshot().position(job_id)

    def why(self, job_id: str) -> q.WaitInfo:
        """Position and why it waits: the queue's reasons plus the placer's last capacity verdict."""
        hint = self.waits.get(job_id)
        return self.snapshot().why_waiting(
            job_id, hint=hint.reason if hint else None, hint_message=hint.message if hint else ""
        )

    def why_all(self, snap: q.QueueSnapshot | None = None) -> dict[str, q.WaitInfo]:
        """`why` for every QUEUED job, from one snapshot (`snap`, or the current one)."""
        hints = {job_id: (h.reason, h.message) for job_id, h in self.waits.items()}
        return (snap or self.snapshot()).why_all_waiting(hints)

    async def cluster_verdicts(self, job: JobRecord) -> tuple[ClusterVerdict, ...]:
        """Each allowed cluster's verdict on a queued job now (the core's fit over its reported inventory).

        One cluster per turn of the event loop, each over a view taken for it: an exact gang fit costs
        tens of milliseconds at 1,000 nodes, so a hundred clusters in one go would stall placement and
        every other call for seconds."""
        req, allows = self.request_of(job), self.allows(job)
        out: list[ClusterVerdict] = []
        for name in sorted(self.catalog.clusters):
            out.extend(cluster_verdicts(FleetView(self.catalog, self.clock()), req, policy_allows=allows, only=name))
            await asyncio.sleep(0)
        return tuple(out)
