"""Plain handler functions behind the gRPC servicers: authorised domain calls in, domain results out."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from broker.api import serde, validation
from broker.api.serde import ParsedItem
from broker.domain import errors, job_events
from broker.domain.errors import ErrorDetails, PolicyViolation, QuotaViolation
from broker.domain.jobstatus import QueueView
from broker.domain.records import AttemptRecord, GpuHours, JobFilter, JobPage, JobRecord, WatchEvent
from broker.domain.states import JobState
from broker.hub import Hub
from broker.scheduling import fairness
from broker.tenancy.auth import Caller, CallerKind
from fleetplan.catalog import ClusterEntry, Usability
from fleetplan.decide import ClusterVerdict, could_ever_fit, within_policy
from fleetplan.view import ClusterState, FleetView

__all__ = [
    "ItemOutcome",
    "submit_jobs",
    "JobView",
    "get_job",
    "list_jobs",
    "watch_jobs",
    "cancel_job",
    "cancel_job_set",
    "Usage",
    "usage",
    "QueueCounts",
    "queue_counts",
    "export_usage",
    "REQUEUEABLE",
    "requeue_job",
    "set_job_priority",
    "hold_job",
    "release_job",
    "cordon",
    "ClusterView",
    "list_clusters",
]


@dataclass(frozen=True, slots=True)
class ItemOutcome:
    index: int
    key: str
    job_id: str = ""
    duplicate: bool = False
    valid: bool = False
    error: errors.TandemError | None = None


def _tenant_of(caller: Caller, requested: str) -> str:
    """The tenant a call acts for: tenants only for themselves, admins for whom they name."""
    if caller.kind is CallerKind.TENANT:
        if requested and requested != caller.name:
            raise errors.PermissionDenied(f"tenant {caller.name} may not act for tenant {requested}")
        return caller.name
    if caller.kind is CallerKind.ADMIN:
        return requested
    raise errors.PermissionDenied("agents may not use the job API")


def _policy_check(hub: Hub, item: ParsedItem, tenant: str) -> None:
    """Pod templates (Pod Security level, allow-lists), band, clusters, GPU models and quota ceiling from the
    tenancy policy; then never-fit."""
    pol = hub.policy.current()
    tp = pol.tenants.get(tenant)
    if tp is None:
        raise errors.PolicyDenied(f"tenant {tenant} is not in the policy")
    assert item.spec is not None and item.request is not None and item.new_job is not None
    band = item.new_job.priority_band
    path = f"items[{item.index}].spec"
    validation.raise_if(validation.check_untrusted(item.spec, tp, path))  # the templates, by this tenant's policy
    if pol.band_priority(band) is None or not tp.allows_band(band):
        raise errors.PolicyDenied(
            f"tenant {tenant} may not use priority band {band}",
            details=ErrorDetails(
                reason="BAND_NOT_ALLOWED",
                policy_violations=(
                    PolicyViolation(
                        "PRIORITY_BAND", f"tenant/{tenant}/band/{band}", f"{path}.priority_band not allowed"
                    ),
                ),
            ),
        )
    for kind, names, allows_name in (
        ("cluster", item.request.allowed_clusters, tp.allows_cluster),
        ("region", item.request.allowed_regions, tp.allows_region),
        ("role", item.request.allowed_roles, tp.allows_role),
    ):
        for name in names:
            if not allows_name(name):
                raise errors.PolicyDenied(
                    f"tenant {tenant} may not use {kind} {name}",
                    details=ErrorDetails(
                        reason=f"{kind.upper()}_NOT_ALLOWED",
                        policy_violations=(
                            PolicyViolation(
                                kind.upper(), f"tenant/{tenant}/{kind}/{name}", f"{path}.cluster_selector.{kind}s"
                            ),
                        ),
                    ),
                )
    models: set[str] = set()
    for ps in item.request.pod_sets:
        for model in ps.shape.gpu_models:
            if not tp.allows_model(model):
                raise errors.PolicyDenied(
                    f"tenant {tenant} may not use GPU model {model}",
                    details=ErrorDetails(
                        reason="GPU_MODEL_NOT_ALLOWED",
                        policy_violations=(
                            PolicyViolation("GPU_MODEL", f"tenant/{tenant}/gpu/{model}", f"{path}.pod_sets"),
                        ),
                    ),
                )
            models.add(model)
    gpus = item.new_job.gpus
    if gpus > 0 and not item.new_job.preemptible:
        candidates = sorted(models) or sorted(k for k in tp.quotas if k != "*") or ["*"]
        limits = [(m, tp.quota_for(m)) for m in candidates]
        if models or "*" in tp.quotas:
            if all(lim is not None and gpus > lim for _, lim in limits):
                m, lim = limits[0]
                raise errors.QuotaExceeded(
                    f"job needs {gpus:g} GPUs, more than tenant {tenant}'s quota of {lim:g} for {m}",
                    details=ErrorDetails(
                        quota_violations=(QuotaViolation(f"tenant/{tenant}", f"gpu/{m}", 0.0, float(lim or 0), gpus),)
                    ),
                )

    def allows(entry: ClusterState) -> bool:
        return tp.allows_place(entry.name, entry.meta.region, entry.meta.role)

    placeable = within_policy(item.request, None if "*" in tp.gpu_models else tp.gpu_models)
    fits, why = could_ever_fit(FleetView(hub.catalog, hub.clock()), placeable, allows)
    if fits is False:
        raise errors.Unschedulable(
            f"job could not fit in any allowed cluster even if empty: {why}", details=ErrorDetails(reason="UNFITTABLE")
        )


async def submit_jobs(hub: Hub, caller: Caller, items: Sequence[ParsedItem], validate_only: bool) -> list[ItemOutcome]:
    """Items succeed or fail independently; each success is durable before this returns."""
    out: list[ItemOutcome | None] = [None] * len(items)
    todo: list[ParsedItem] = []
    for item in items:
        if item.error is not None:
            out[item.index] = ItemOutcome(item.index, item.key, error=item.error)
            continue
        try:
            assert item.new_job is not None
            tenant = _tenant_of(caller, item.new_job.tenant)
            _policy_check(hub, item, tenant)
        except errors.TandemError as exc:
            out[item.index] = ItemOutcome(item.index, item.key, error=exc)
            continue
        if validate_only:
            out[item.index] = ItemOutcome(item.index, item.key, valid=True)
        else:
            todo.append(item)
    results = await asyncio.gather(*(hub.store.submit(i.new_job) for i in todo if i.new_job), return_exceptions=True)
    for item, res in zip(todo, results):
        if isinstance(res, errors.TandemError):
            out[item.index] = ItemOutcome(item.index, item.key, error=res)
        elif isinstance(res, BaseException):
            out[item.index] = ItemOutcome(item.index, item.key, error=errors.Internal(f"submit failed: {res!r}"))
        else:
            if item.request is not None:
                hub.placer.remember(res.job, item.request)
            hub.placer.observe(res.job)
            out[item.index] = ItemOutcome(item.index, item.key, job_id=res.job.job_id, duplicate=not res.created)
    for o in out:
        assert o is not None
        hub.metrics.submissions.labels("ok" if o.error is None else o.error.details.reason).inc()
    return [o for o in out if o is not None]


@dataclass(frozen=True, slots=True)
class JobView:
    job: JobRecord
    attempts: tuple[AttemptRecord, ...]
    history: tuple[WatchEvent, ...]
    queue_info: QueueView | None
    templates: dict[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    """Log URL templates of the clusters its attempts ran on (from their agents' Hello)."""


def _scope(caller: Caller) -> str | None:
    return None if caller.is_admin else caller.name


async def get_job(hub: Hub, caller: Caller, job_id: str, full: bool = True) -> JobView:
    job = await hub.store.get_job(job_id, tenant=_scope(caller))
    attempts = tuple(await hub.store.list_attempts(job_id)) if full else ()
    history = tuple(await hub.store.job_history(job_id)) if full else ()
    templates = {
        a.cluster: e.meta.log_templates
        for a in attempts
        if (e := hub.catalog.clusters.get(a.cluster)) is not None and e.meta.log_templates
    }
    verdicts = await hub.placer.cluster_verdicts(job) if full and job.state is JobState.QUEUED else ()
    return JobView(job, attempts, history, queue_info(hub, job, clusters=verdicts), templates)


def queue_info(hub: Hub, job: JobRecord, *, clusters: Sequence[ClusterVerdict] = ()) -> QueueView | None:
    """Position among the tenant's own queued jobs and why it waits (own facts and fleet aggregates only),
    with `clusters`: each allowed cluster's verdict (`Placer.cluster_verdicts`), when the caller asked."""
    if job.state is not JobState.QUEUED:
        return None
    info = hub.placer.why(job.job_id)
    if job.held:
        held = f"held by {job.held_by}"
        message = info.message if info.message.startswith(held) else "; ".join(x for x in (held, info.message) if x)
        return QueueView(info.position, "HELD", message, tuple(clusters))
    return QueueView(info.position, info.reason.value, info.message, tuple(clusters))


async def list_jobs(
    hub: Hub,
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
    tenant = _tenant_of(caller, flt.tenant or "") or None
    flt = JobFilter(
        tenant=tenant,
        states=flt.states,
        queue=flt.queue,
        job_set=flt.job_set,
        labels=flt.labels,
        cluster=flt.cluster,
        gpu_model=flt.gpu_model,
    )
    revision = await hub.store.current_revision()
    page = await hub.store.list_jobs(flt, page_size=page_size, page_token=page_token)
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
            page = await hub.store.list_jobs(flt, page_size=keep, page_token=page_token)
    return page, revision


async def watch_jobs(
    hub: Hub,
    caller: Caller,
    from_revision: int,
    tenant: str,
    queue: str,
    job_set: str,
    job_ids: frozenset[str],
    bookmark_s: float,
) -> AsyncIterator[tuple[int, WatchEvent | None, JobRecord | None]]:
    """Events after `from_revision` matching the filters, then live ones; (revision, None, None) is a bookmark."""
    scope = _tenant_of(caller, tenant) or None
    rev = from_revision
    if rev == 0:
        rev = await hub.store.current_revision()
        yield rev, None, None
    # The store follows the log from the covered revision, so other tenants' commits never make this spin.
    async for page in hub.store.watch(rev, tenant=scope, job_set=job_set or None, bookmark_s=bookmark_s):
        if not page.events:
            yield page.revision, None, None
            continue
        for ev in page.events:
            if job_ids and ev.job_id not in job_ids:
                continue
            try:
                job = await hub.store.get_job(ev.job_id)
            except errors.JobNotFound:
                job = None
            if queue and (job is None or job.queue != queue):
                continue
            yield ev.revision, ev, job


async def cancel_job(hub: Hub, caller: Caller, job_id: str, reason: str) -> tuple[JobState, bool]:
    before = await hub.store.get_job(job_id, tenant=_scope(caller))
    if before.state.terminal:
        return before.state, True
    actor = f"{caller.kind.value}/{caller.name}"
    job = await hub.store.cancel_job(
        job_id, tenant=_scope(caller), actor=actor, message=reason or "cancelled", grace_s=hub.cfg.grace_period_s
    )
    hub.placer.observe(job)
    await hub.dispatcher.deliver_for(job)
    return job.state, False


async def cancel_job_set(hub: Hub, caller: Caller, tenant: str, job_set: str, reason: str) -> tuple[list[str], int]:
    who = _tenant_of(caller, tenant)
    if not who:
        raise errors.InvalidArgument.fields(errors.FieldViolation("tenant", "admins must name the tenant"))
    page = await hub.store.list_jobs(JobFilter(tenant=who, job_set=job_set), page_size=1000)
    terminal = sum(1 for j in page.jobs if j.state.terminal)
    actor = f"{caller.kind.value}/{caller.name}"
    changed = await hub.store.cancel_job_set(
        who, job_set, actor=actor, message=reason or "cancelled", grace_s=hub.cfg.grace_period_s
    )
    for job in changed:
        hub.placer.observe(job)
    for cluster in {c for c in hub.dispatcher.sessions}:
        await hub.dispatcher.deliver(cluster)
    return [j.job_id for j in changed], terminal


# ----------------------------------------------------------------------------- operations


def _actor(caller: Caller) -> str:
    return f"{caller.kind.value}/{caller.name}"


@dataclass(frozen=True, slots=True)
class Usage:
    rows: list[fairness.TenantUsage]
    capacity_cost: float
    at: float


def usage(hub: Hub, caller: Caller, tenant: str) -> Usage:
    """Usage now from the placer's queue snapshot and fair shares: a tenant's own row, or (admins) every
    tenant's (each tenant of the policy, and any other that holds or waits) or the one named."""
    who = _tenant_of(caller, tenant)
    snap, shares = hub.placer.shares()
    named = [who] if who else sorted(hub.policy.current().tenants)
    rows = fairness.tenant_usage(snap, shares, tenants=named)
    if who:
        rows = [r for r in rows if r.tenant == who]
    return Usage(rows, shares.capacity, snap.now)


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


def queue_counts(hub: Hub, caller: Caller) -> tuple[dict[str, QueueCounts], QueueCounts]:
    """Per tenant the caller may see (a tenant: its own; an admin: every one), and over the whole fleet (an
    aggregate every caller may see: counts, never job names)."""
    snap = hub.placer.snapshot()
    why = hub.placer.why_all(snap)
    tenants: dict[str, QueueCounts] = {}
    fleet = QueueCounts()
    for e in snap.pending():
        reason = why[e.job_id].reason.value  # why_all_waiting answers for every pending job
        fleet.add(reason, e.gpu_models, e.gpus)
        if caller.may_see_tenant(e.tenant):
            tenants.setdefault(e.tenant, QueueCounts()).add(reason, e.gpu_models, e.gpus)
    return tenants, fleet


async def export_usage(
    hub: Hub, caller: Caller, tenant: str, since: float | None, until: float | None
) -> tuple[list[GpuHours], float, float]:
    """GPU-hours per (tenant, model, cluster) in [since, until] (defaults: 0, now), scoped to the caller."""
    who = _tenant_of(caller, tenant) or None
    now = hub.clock()
    lo = 0.0 if since is None else since
    hi = now if until is None else until
    return await hub.store.gpu_hours(since=lo, until=hi, now=now, tenant=who), lo, hi


REQUEUEABLE = frozenset(
    {JobState.RESERVED, JobState.DISPATCHED, JobState.ACCEPTED, JobState.STARTING, JobState.RUNNING}
)
"""States RequeueJob acts on: the job's current attempt holds capacity and is not already ending."""


async def requeue_job(hub: Hub, caller: Caller, job_id: str, reason: str) -> JobRecord:
    """End the current attempt and queue the job again, no retry spent (job_events.RequeueRequested)."""
    job = await hub.store.get_job(job_id, tenant=_scope(caller))
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
    actor = _actor(caller)
    event = job_events.RequeueRequested(
        job_id, job.attempt, actor=actor, grace_s=hub.cfg.grace_period_s, message=reason or f"requeued by {actor}"
    )
    after, reaction = await hub.store.apply_event(event)
    if reaction.transition is None:  # it moved on between the read and the write
        raise errors.FailedPrecondition(
            f"job {job_id} changed meanwhile (now {after.state.value}, attempt {after.attempt}); read it again",
            details=errors.ErrorDetails(reason="NOT_REQUEUEABLE"),
            job_id=job_id,
            state=after.state.value,
        )
    hub.placer.observe(after)
    await hub.dispatcher.deliver_for(after)
    return after


async def set_job_priority(
    hub: Hub, caller: Caller, job_id: str, priority: int | None, band: str, reason: str
) -> JobRecord:
    """New priority and / or band for a job that is not terminal; the band must be one its tenant may use."""
    scope = _scope(caller)
    job = await hub.store.get_job(job_id, tenant=scope)
    if band:
        pol = hub.policy.current()
        tp = pol.tenants.get(job.tenant)
        if pol.band_priority(band) is None or tp is None or not tp.allows_band(band):
            raise errors.InvalidArgument.fields(
                errors.FieldViolation("priority_band", f"tenant {job.tenant} may not use priority band {band}")
            )
    after = await hub.store.set_priority(
        job_id,
        tenant=scope,
        actor=_actor(caller),
        priority=priority,
        band=band or None,
        message=reason,
        respec=serde.respec_priority,
    )
    if after.revision != job.revision:
        hub.placer.requests.pop(job_id, None)  # the cached request carries the old priority
        hub.placer.observe(after)
        hub.placer.capacity_changed()  # the order changed: waiting jobs deserve another look
    return after


async def hold_job(hub: Hub, caller: Caller, job_id: str, reason: str) -> tuple[JobRecord, bool]:
    """Hold a job (idempotent): (job, changed)."""
    job, changed = await hub.store.set_hold(
        job_id, held=True, tenant=_scope(caller), actor=_actor(caller), message=reason
    )
    if changed:
        hub.placer.observe(job)
    return job, changed


async def release_job(hub: Hub, caller: Caller, job_id: str, reason: str) -> tuple[JobRecord, bool]:
    """Lift a hold (idempotent): (job, changed). Tenants may not lift an admin's hold."""
    job, changed = await hub.store.set_hold(
        job_id, held=False, tenant=_scope(caller), actor=_actor(caller), message=reason
    )
    if changed:
        hub.placer.observe(job)
        hub.placer.capacity_changed()  # observe() only queues a look at jobs new to the queue
    return job, changed


# ----------------------------------------------------------------------------- clusters


@dataclass(frozen=True, slots=True)
class ClusterView:
    entry: ClusterEntry
    stale: bool
    active_attempts: int
    cordon_reason: str


def _view(hub: Hub, entry: ClusterEntry, now: float) -> ClusterView:
    use = entry.usability(now, hub.catalog.stale_after_s)
    active = hub.catalog.reservation_count(entry.name)
    return ClusterView(
        entry, use in (Usability.STALE, Usability.DISCONNECTED), active, hub.cordon_reasons.get(entry.name, "")
    )


def list_clusters(hub: Hub, caller: Caller, *, region: str = "", role: str = "") -> list[ClusterView]:
    """The clusters the caller may see, sorted by name; `region` / `role` (from Hello) filter when set."""
    now = hub.clock()
    pol = hub.policy.current().tenants.get(caller.name) if caller.kind is CallerKind.TENANT else None
    out = []
    for name in sorted(hub.catalog.clusters):
        entry = hub.catalog.clusters[name]
        if pol is not None and not pol.allows_place(name, entry.meta.region, entry.meta.role):
            continue
        if (region and entry.meta.region != region) or (role and entry.meta.role != role):
            continue
        out.append(_view(hub, entry, now))
    return out


def get_cluster(hub: Hub, caller: Caller, name: str) -> ClusterView:
    for view in list_clusters(hub, caller):
        if view.entry.name == name:
            return view
    raise errors.NotFound(f"cluster {name} not found", cluster=name)


async def cordon(hub: Hub, caller: Caller, name: str, cordoned: bool, reason: str) -> ClusterView:
    """Durable first (a cordon survives a restart), then in effect for the placer."""
    if not reason:
        raise errors.InvalidArgument.fields(errors.FieldViolation("reason", "required (audit log)"))
    if name not in hub.catalog.clusters:
        raise errors.NotFound(f"cluster {name} not found", cluster=name)
    await hub.store.set_cordon(name, reason if cordoned else None, actor=caller.name)
    hub.catalog.set_cordoned(name, cordoned)
    if cordoned:
        hub.cordon_reasons[name] = reason
    else:
        hub.cordon_reasons.pop(name, None)
    hub.catalog.sweep(hub.clock())
    hub.placer.capacity_changed()
    return _view(hub, hub.catalog.clusters[name], hub.clock())
