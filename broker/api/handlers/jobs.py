"""The job calls after submission: read, list and watch jobs; cancel, requeue, reprioritise, hold, release."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from broker.api import serde
from broker.api.handlers.queues import queue_info
from broker.api.handlers.scope import actor_of, scope_of, tenant_of
from broker.api.ports import JobPorts
from broker.domain import errors, job_events
from broker.domain.jobstatus import QueueView
from broker.domain.records import AttemptRecord, JobFilter, JobPage, JobRecord, WatchEvent
from broker.domain.states import JobState
from broker.tenancy.auth import Caller

__all__ = [
    "JobView",
    "get_job",
    "list_jobs",
    "watch_jobs",
    "cancel_job",
    "cancel_job_set",
    "REQUEUEABLE",
    "requeue_job",
    "set_job_priority",
    "hold_job",
    "release_job",
]


@dataclass(frozen=True, slots=True)
class JobView:
    job: JobRecord
    attempts: tuple[AttemptRecord, ...]
    history: tuple[WatchEvent, ...]
    queue_info: QueueView | None
    templates: dict[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    """Log URL templates of the clusters its attempts ran on (from their agents' Hello)."""


async def get_job(jobs: JobPorts, caller: Caller, job_id: str, full: bool = True) -> JobView:
    job = await jobs.store.get_job(job_id, tenant=scope_of(caller))
    attempts = tuple(await jobs.store.list_attempts(job_id)) if full else ()
    history = tuple(await jobs.store.job_history(job_id)) if full else ()
    clusters = jobs.fleet_view().clusters if attempts else {}
    templates = {
        a.cluster: c.meta.log_templates
        for a in attempts
        if (c := clusters.get(a.cluster)) is not None and c.meta.log_templates
    }
    verdicts = await jobs.reads.cluster_verdicts(job) if full and job.state is JobState.QUEUED else ()
    return JobView(job, attempts, history, queue_info(jobs.reads, job, clusters=verdicts), templates)


async def list_jobs(
    jobs: JobPorts,
    caller: Caller,
    flt: JobFilter,
    page_size: int,
    page_token: str,
    *,
    size_of: Callable[[JobRecord], int] | None = None,
    max_bytes: int = 0,
) -> tuple[JobPage, int]:
    """One page of the caller's jobs. With `size_of` and `max_bytes`, the page is cut to the jobs whose encoded
    sizes fit in `max_bytes` (at least one: validation bounds a job's size), with the token that resumes
    after the last one kept, so a page of large jobs never exceeds what the server may send."""
    tenant = tenant_of(caller, flt.tenant or "") or None
    flt = JobFilter(
        tenant=tenant,
        states=flt.states,
        queue=flt.queue,
        job_set=flt.job_set,
        labels=flt.labels,
        cluster=flt.cluster,
        gpu_model=flt.gpu_model,
    )
    revision = await jobs.store.current_revision()
    page = await jobs.store.list_jobs(flt, page_size=page_size, page_token=page_token)
    if size_of is not None and max_bytes > 0:
        used = keep = 0
        for job in page.jobs:
            used += size_of(job)
            if used > max_bytes and keep:
                break
            keep += 1
        if keep < len(page.jobs):
            # The store's own token for "after the last job kept": the same query cut at `keep`. (Jobs only
            # join the order at its end, so the first `keep` are the ones measured unless one changed state.)
            page = await jobs.store.list_jobs(flt, page_size=keep, page_token=page_token)
    return page, revision


async def watch_jobs(
    jobs: JobPorts,
    caller: Caller,
    from_revision: int,
    tenant: str,
    queue: str,
    job_set: str,
    job_ids: frozenset[str],
    bookmark_s: float,
) -> AsyncIterator[tuple[int, WatchEvent | None, JobRecord | None]]:
    """Events after `from_revision` matching the filters, then live ones; (revision, None, None) is a bookmark."""
    scope = tenant_of(caller, tenant) or None
    rev = from_revision
    if rev == 0:
        rev = await jobs.store.current_revision()
        yield rev, None, None
    # The store follows the log from the covered revision, so other tenants' commits never make this spin.
    async for page in jobs.store.watch(rev, tenant=scope, job_set=job_set or None, bookmark_s=bookmark_s):
        if not page.events:
            yield page.revision, None, None
            continue
        for ev in page.events:
            if job_ids and ev.job_id not in job_ids:
                continue
            try:
                job = await jobs.store.get_job(ev.job_id)
            except errors.JobNotFound:
                job = None
            if queue and (job is None or job.queue != queue):
                continue
            yield ev.revision, ev, job


async def cancel_job(jobs: JobPorts, caller: Caller, job_id: str, reason: str) -> tuple[JobState, bool]:
    before = await jobs.store.get_job(job_id, tenant=scope_of(caller))
    if before.state.terminal:
        return before.state, True
    actor = actor_of(caller)
    job = await jobs.store.cancel_job(
        job_id, tenant=scope_of(caller), actor=actor, message=reason or "cancelled", grace_s=jobs.grace_s
    )
    jobs.queue.observe(job)
    await jobs.deliver_for(job)
    return job.state, False


async def cancel_job_set(
    jobs: JobPorts, caller: Caller, tenant: str, job_set: str, reason: str
) -> tuple[list[str], int]:
    who = tenant_of(caller, tenant)
    if not who:
        raise errors.InvalidArgument.fields(errors.FieldViolation("tenant", "admins must name the tenant"))
    page = await jobs.store.list_jobs(JobFilter(tenant=who, job_set=job_set), page_size=1000)
    terminal = sum(1 for j in page.jobs if j.state.terminal)
    actor = actor_of(caller)
    changed = await jobs.store.cancel_job_set(
        who, job_set, actor=actor, message=reason or "cancelled", grace_s=jobs.grace_s
    )
    for job in changed:
        jobs.queue.observe(job)
    await jobs.deliver_all()
    return [j.job_id for j in changed], terminal


REQUEUEABLE = frozenset(
    {JobState.RESERVED, JobState.DISPATCHED, JobState.ACCEPTED, JobState.STARTING, JobState.RUNNING}
)
"""States RequeueJob acts on: the job's current attempt holds capacity and is not already ending."""


async def requeue_job(jobs: JobPorts, caller: Caller, job_id: str, reason: str) -> JobRecord:
    """End the current attempt and queue the job again, no retry spent (job_events.RequeueRequested)."""
    job = await jobs.store.get_job(job_id, tenant=scope_of(caller))
    if job.terminal:
        raise errors.JobFinished(f"job {job_id} already {job.state.value}", job_id=job_id, state=job.state.value)
    if job.state not in REQUEUEABLE:
        raise errors.FailedPrecondition(
            f"job {job_id} is {job.state.value}: only a job holding capacity "
            f"({', '.join(s.value for s in sorted(REQUEUEABLE))}) can be requeued",
            details=errors.ErrorDetails(reason="NOT_REQUEUEABLE"),
            job_id=job_id,
            state=job.state.value,
        )
    actor = actor_of(caller)
    event = job_events.RequeueRequested(
        job_id, job.attempt, actor=actor, grace_s=jobs.grace_s, message=reason or f"requeued by {actor}"
    )
    after, reaction = await jobs.store.apply_event(event)
    if reaction.transition is None:  # it moved on between the read and the write
        raise errors.FailedPrecondition(
            f"job {job_id} changed meanwhile (now {after.state.value}, attempt {after.attempt}); read it again",
            details=errors.ErrorDetails(reason="NOT_REQUEUEABLE"),
            job_id=job_id,
            state=after.state.value,
        )
    jobs.queue.observe(after)
    await jobs.deliver_for(after)
    return after


async def set_job_priority(
    jobs: JobPorts, caller: Caller, job_id: str, priority: int | None, band: str, reason: str
) -> JobRecord:
    """New priority and / or band for a job that is not terminal; the band must be one its tenant may use."""
    scope = scope_of(caller)
    job = await jobs.store.get_job(job_id, tenant=scope)
    if band:
        pol = jobs.policy.current()
        tp = pol.tenants.get(job.tenant)
        if pol.band_priority(band) is None or tp is None or not tp.allows_band(band):
            raise errors.InvalidArgument.fields(
                errors.FieldViolation("priority_band", f"tenant {job.tenant} may not use priority band {band}")
            )
    after = await jobs.store.set_priority(
        job_id,
        tenant=scope,
        actor=actor_of(caller),
        priority=priority,
        band=band or None,
        message=reason,
        respec=serde.respec_priority,
    )
    if after.revision != job.revision:
        jobs.reprioritised(after)
    return after


async def hold_job(jobs: JobPorts, caller: Caller, job_id: str, reason: str) -> tuple[JobRecord, bool]:
    """Hold a job (idempotent): (job, changed)."""
    job, changed = await jobs.store.set_hold(
        job_id, held=True, tenant=scope_of(caller), actor=actor_of(caller), message=reason
    )
    if changed:
        jobs.queue.observe(job)
    return job, changed


async def release_job(jobs: JobPorts, caller: Caller, job_id: str, reason: str) -> tuple[JobRecord, bool]:
    """Lift a hold (idempotent): (job, changed). Tenants may not lift an admin's hold."""
    job, changed = await jobs.store.set_hold(
        job_id, held=False, tenant=scope_of(caller), actor=actor_of(caller), message=reason
    )
    if changed:
        jobs.queue.observe(job)
        jobs.queue.capacity_changed()  # observe() only queues a look at jobs new to the queue
    return job, changed
