"""Deterministic cluster ranking for the broker, with the sort key explained for "why this cluster"."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from placement.model import JobRequest
from placement.reasons import Reason

__all__ = ["ClusterOption", "RankedCluster", "rank_clusters", "eligibility"]


@dataclass(frozen=True, slots=True)
class ClusterOption:
    """What the broker knows about one cluster for one job (all computed by the caller).

    feasible / refusal: outcome of fit_gang over the cluster's effective nodes.
    fragmentation_cost: from the scoring policy (lower is better; 0 = no damage).
    report_age_s: seconds since the last report (the caller owns the clock).
    stale / cordoned: the broker's view of the cluster's link and admin state.
    """

    cluster: str
    region: str = ""
    role: str = ""
    feasible: bool = False
    refusal: Reason | None = None
    fragmentation_cost: float = 0.0
    queue_length: int = 0
    report_age_s: float = 0.0
    stale: bool = False
    cordoned: bool = False


@dataclass(frozen=True, slots=True)
class RankedCluster:
    """One cluster in rank order: whether the job may go there, the sort key and its explanation."""

    cluster: str
    rank: int
    eligible: bool
    reason: Reason | None
    key: tuple[int, float, int, int, int, float, str]
    explanation: str


def eligibility(job: JobRequest, option: ClusterOption) -> Reason | None:
    """Why the job may not go to this cluster at all, or None."""
    if job.allowed_clusters and option.cluster not in job.allowed_clusters:
        return Reason.CLUSTER_NOT_ALLOWED
    if job.allowed_regions and option.region not in job.allowed_regions:
        return Reason.REGION_NOT_ALLOWED
    if job.allowed_roles and option.role not in job.allowed_roles:
        return Reason.ROLE_NOT_ALLOWED
    if option.cordoned:
        return Reason.CLUSTER_CORDONED
    if option.stale:
        return Reason.CLUSTER_STALE
    if not option.feasible:
        return option.refusal or Reason.NO_FEASIBLE_NODE
    return None


def _locality(job: JobRequest, option: ClusterOption) -> int:
    """Position of the cluster (or its region) in the job's data-locality hints; len(hints) if absent."""
    for i, hint in enumerate(job.locality):
        if hint in (option.cluster, option.region):
            return i
    return len(job.locality)


def rank_clusters(
    job: JobRequest, options: Sequence[ClusterOption], *, role_preference: Sequence[str] = ()
) -> tuple[RankedCluster, ...]:
    """Every option in order: eligible (feasible, allowed, fresh) first; then lower fragmentation
    cost, better data locality, preferred role (order of `role_preference`), shorter queue,
    fresher report, and the cluster name so the order is total and deterministic."""
    rows = []
    for opt in options:
        reason = eligibility(job, opt)
        loc = _locality(job, opt)
        role_rank = role_preference.index(opt.role) if opt.role in role_preference else len(role_preference)
        key = (
            0 if reason is None else 1,
            round(opt.fragmentation_cost, 9),
            loc,
            role_rank,
            opt.queue_length,
            round(opt.report_age_s, 3),
            opt.cluster,
        )
        why = (
            ("eligible" if reason is None else f"not eligible: {reason.code}")
            + f"; fragmentation={opt.fragmentation_cost:g}"
            + f"; locality={'hint #' + str(loc + 1) if loc < len(job.locality) else 'none'}"
            + f"; role={opt.role or '-'}"
            + (f" (preference #{role_rank + 1})" if role_rank < len(role_preference) else "")
            + f"; queue={opt.queue_length}; report age={opt.report_age_s:g}s"
        )
        rows.append((key, opt, reason, why))
    rows.sort(key=lambda r: r[0])
    return tuple(
        RankedCluster(opt.cluster, i, reason is None, reason, key, why)
        for i, (key, opt, reason, why) in enumerate(rows)
    )
