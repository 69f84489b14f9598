"""Submission: each item checked against the tenancy policy and the fleet, then made durable on its own."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from broker.api import validation
from broker.api.handlers.scope import tenant_of
from broker.api.ports import JobPorts
from broker.api.serde import ParsedItem
from broker.domain import errors
from broker.domain.errors import ErrorDetails, PolicyViolation, QuotaViolation
from broker.tenancy.auth import Caller
from fleetplan.decide import could_ever_fit, within_policy
from fleetplan.view import ClusterState

__all__ = ["ItemOutcome", "submit_jobs"]


@dataclass(frozen=True, slots=True)
class ItemOutcome:
    """One submitted item's result: its job (or the duplicate's), valid (validate_only), or its error."""

    index: int
    key: str
    job_id: str = ""
    duplicate: bool = False
    valid: bool = False
    error: errors.TandemError | None = None


def _policy_check(jobs: JobPorts, item: ParsedItem, tenant: str) -> None:
    """Pod templates (Pod Security level, allow-lists), band, clusters, GPU models and quota ceiling from the
    tenancy policy; then never-fit."""
    pol = jobs.policy.current()
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
    fits, why = could_ever_fit(jobs.fleet_view(), placeable, allows)
    if fits is False:
        raise errors.Unschedulable(
            f"job could not fit in any allowed cluster even if empty: {why}", details=ErrorDetails(reason="UNFITTABLE")
        )


async def submit_jobs(
    jobs: JobPorts, caller: Caller, items: Sequence[ParsedItem], validate_only: bool
) -> list[ItemOutcome]:
    """Items succeed or fail independently; each success is durable before this returns."""
    out: list[ItemOutcome | None] = [None] * len(items)
    todo: list[ParsedItem] = []
    for item in items:
        if item.error is not None:
            out[item.index] = ItemOutcome(item.index, item.key, error=item.error)
            continue
        try:
            assert item.new_job is not None
            tenant = tenant_of(caller, item.new_job.tenant)
            _policy_check(jobs, item, tenant)
        except errors.TandemError as exc:
            out[item.index] = ItemOutcome(item.index, item.key, error=exc)
            continue
        if validate_only:
            out[item.index] = ItemOutcome(item.index, item.key, valid=True)
        else:
            todo.append(item)
    results = await asyncio.gather(*(jobs.store.submit(i.new_job) for i in todo if i.new_job), return_exceptions=True)
    for item, res in zip(todo, results):
        if isinstance(res, errors.TandemError):
            out[item.index] = ItemOutcome(item.index, item.key, error=res)
        elif isinstance(res, BaseException):
            out[item.index] = ItemOutcome(item.index, item.key, error=errors.Internal(f"submit failed: {res!r}"))
        else:
            if item.request is not None:
                jobs.queue.remember(res.job, item.request)
            jobs.queue.observe(res.job)
            out[item.index] = ItemOutcome(item.index, item.key, job_id=res.job.job_id, duplicate=not res.created)
    for o in out:
        assert o is not None
        jobs.submissions.labels("ok" if o.error is None else o.error.details.reason).inc()
    return [o for o in out if o is not None]
