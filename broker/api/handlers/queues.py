"""The queue and usage views: why a job waits, fair-share usage, queue counts and GPU-hours, scoped to the caller."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from broker.api.handlers.scope import tenant_of
from broker.api.ports import QueuePorts, QueueReads
from broker.domain.jobstatus import QueueView
from broker.domain.records import GpuHours, JobRecord
from broker.domain.states import JobState
from broker.scheduling import fairness
from broker.tenancy.auth import Caller
from fleetplan.decide import ClusterVerdict

__all__ = ["queue_info", "UsageReport", "usage", "QueueCounts", "queue_counts", "export_usage"]


def queue_info(reads: QueueReads, job: JobRecord, *, clusters: Sequence[ClusterVerdict] = ()) -> QueueView | None:
    """Position among the tenant's own queued jobs and why it waits (own facts and fleet aggregates only),
    with `clusters`: each allowed cluster's verdict (`QueueReads.cluster_verdicts`), when the caller asked."""
    if job.state is not JobState.QUEUED:
        return None
    info = reads.why(job.job_id)
    if job.held:
        held = f"held by {job.held_by}"
        message = info.message if info.message.startswith(held) else "; ".join(x for x in (held, info.message) if x)
        return QueueView(info.position, "HELD", message, tuple(clusters))
    return QueueView(info.position, info.reason.value, info.message, tuple(clusters))


@dataclass(frozen=True, slots=True)
class UsageReport:
    """What GetUsage answers: the tenants' rows, the fleet's weighted capacity and when it was taken."""

    rows: list[fairness.TenantUsage]
    capacity_cost: float
    at: float


def usage(queues: QueuePorts, caller: Caller, tenant: str) -> UsageReport:
    """Usage now from the placer's queue snapshot and fair shares: a tenant's own row, or (admins) every
    tenant's (each tenant of the policy, and any other that holds or waits) or the one named."""
    who = tenant_of(caller, tenant)
    snap, shares = queues.reads.shares()
    named = [who] if who else sorted(queues.policy.current().tenants)
    rows = fairness.tenant_usage(snap, shares, tenants=named)
    if who:
        rows = [r for r in rows if r.tenant == who]
    return UsageReport(rows, shares.capacity, snap.now)


@dataclass(slots=True)
class QueueCounts:
    """Queued jobs, the first reason each waits for, and the GPUs they ask for by model (counts only)."""

    queued: int = 0
    waiting: dict[str, int] = field(default_factory=dict)
    """WaitReason value -> jobs."""
    pending_gpus: dict[str, float] = field(default_factory=dict)
    """Accepted models (' or '-joined; '' = any) -> GPUs asked for."""

    def add(self, reason: str, models: tuple[str, ...], gpus: float) -> None:
        self.queued += 1
        self.waiting[reason] = self.waiting.get(reason, 0) + 1
        if gpus > 0:
            key = " or ".join(models)
            self.pending_gpus[key] = self.pending_gpus.get(key, 0.0) + gpus


def queue_counts(queues: QueuePorts, caller: Caller) -> tuple[dict[str, QueueCounts], QueueCounts]:
    """Per tenant the caller may see (a tenant: its own; an admin: every one), and over the whole fleet (an
    aggregate every caller may see: counts, never job names)."""
    snap = queues.reads.snapshot()
    why = queues.reads.why_all(snap)
    tenants: dict[str, QueueCounts] = {}
    fleet = QueueCounts()
    for e in snap.pending():
        reason = why[e.job_id].reason.value  # why_all_waiting answers for every pending job
        fleet.add(reason, e.gpu_models, e.gpus)
        if caller.may_see_tenant(e.tenant):
            tenants.setdefault(e.tenant, QueueCounts()).add(reason, e.gpu_models, e.gpus)
    return tenants, fleet


async def export_usage(
    queues: QueuePorts, caller: Caller, tenant: str, since: float | None, until: float | None
) -> tuple[list[GpuHours], float, float]:
    """GPU-hours per (tenant, model, cluster) in [since, until] (defaults: 0, now), scoped to the caller."""
    who = tenant_of(caller, tenant) or None
    now = queues.clock()
    lo = 0.0 if since is None else since
    hi = now if until is None else until
    return await queues.store.gpu_hours(since=lo, until=hi, now=now, tenant=who), lo, hi
