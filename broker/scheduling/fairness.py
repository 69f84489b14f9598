"""Fair share and the rules of preemption: pure functions over a queue snapshot (no I/O, no clock).

Fair share (FLEET-NOTES F-1) is demand-capped weighted water-filling of the fleet's cost capacity (GPUs x
the model's weight): a tenant never gets a share beyond what it asks for, and what it leaves is split among
the others by weight (Armada's "adjusted fair share"). Quotas are hard and checked first; share only orders
and preempts within what quota allows.

Who may preempt whom (F-2, F-3), for a waiting job P and a running job V of tenant T_V:

* never a job that is not preemptible, and never one whose attempt is already ending;
* PRIORITY_BAND — another tenant's V whose band ranks below P's;
* RECLAIM — T_V borrows above its quota of V's model and P's tenant is within its own quota there (the
  owner takes borrowed GPUs back; the tenant's ``reclaim`` knob: Never / LowerPriority / Any);
* FAIR_SHARE — another tenant, only if P's tenant has ``fair_share_preemption`` on, V ran at least the
  minimum runtime, T_V is above ``protected_fraction`` of its fair share, P's tenant stays within its fair
  share with P, and share(P's tenant with P) <= share(T_V without every victim taken from it) (Kueue's
  LessThanOrEqualToFinalShare): each preemption shrinks the largest gap, so no cycle of preemptions forms;
* WITHIN_TENANT — the same tenant's V, by its ``within_tenant`` knob alone (lower band and priority, or
  equal and newer); the default, Never, keeps a tenant's jobs from preempting each other.

Shares here are current allocation only (F-4): decayed usage orders the queue and never preempts anyone.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from broker.domain.states import JobState
from broker.scheduling.queue import QueueEntry, QueueSnapshot, banded_priority, job_cost
from fleetplan.decide import ClusterPredicate, allow_every_cluster
from fleetplan.preempt import PreemptionPlan, VictimCandidate, plan_preemption
from fleetplan.view import FleetView
from placement.model import JobRequest, PodShape

__all__ = [
    "PreemptReason",
    "TenantKnobs",
    "Shares",
    "water_fill",
    "shares_of",
    "victim_reason",
    "final_share_ok",
    "DecayedUsage",
    "PREEMPTABLE_STATES",
    "TenantUsage",
    "tenant_usage",
    "RunningJob",
    "PreemptionChoice",
    "choose_preemption",
]

_EPS = 1e-9

PREEMPTABLE_STATES = frozenset({JobState.ACCEPTED, JobState.STARTING, JobState.RUNNING})
"""Attempts the broker may preempt: the cluster has them; ones still reserved or dispatched are left alone
(they hold nodes only until their reservation expires or they are accepted)."""


class PreemptReason(enum.StrEnum):
    PRIORITY_BAND = "priority_band"
    RECLAIM = "reclaim"
    FAIR_SHARE = "fair_share"
    WITHIN_TENANT = "within_tenant"


@dataclass(frozen=True, slots=True)
class TenantKnobs:
    """The tenancy policy's preemption knobs for one tenant (the names Kueue operators know)."""

    reclaim: str = "Any"
    """Never | LowerPriority | Any: may this tenant's jobs take back GPUs others borrow from its quota."""
    within_tenant: str = "Never"
    """Never | LowerPriority | LowerOrNewerEqualPriority: may its jobs preempt its own."""
    fair_share_preemption: bool = True
    borrow_preempt_max_priority: int | None = None
    """A job that would itself borrow may preempt other tenants' borrowers at or below this priority only
    (Kueue's borrowWithinCohort.maxPriorityThreshold); None = a borrower never preempts."""
    protected_fraction: float = 1.0
    """At or below this fraction of its fair share the tenant is never a fair-share victim."""


def water_fill(capacity: float, weights: Mapping[str, float], demands: Mapping[str, float]) -> dict[str, float]:
    """Demand-capped weighted water-filling: each tenant gets min(demand, level x weight), the level set so
    that the shares sum to min(capacity, total demand)."""
    share = {t: 0.0 for t in demands}
    left = max(capacity, 0.0)
    active = {t for t, d in demands.items() if d > _EPS and weights.get(t, 0.0) > 0}
    while active and left > _EPS:
        wsum = sum(weights[t] for t in active)
        level = left / wsum
        capped = {t for t in active if demands[t] - share[t] <= level * weights[t] + _EPS}
        if not capped:
            for t in active:
                share[t] += level * weights[t]
            break
        for t in capped:
            left -= demands[t] - share[t]
            share[t] = demands[t]
        active -= capped
    return share


@dataclass(frozen=True, slots=True)
class Shares:
    """Per tenant, in cost units (GPUs x model weight): what it holds now, what it asks for, its fair share."""

    capacity: float
    usage: Mapping[str, float]
    demand: Mapping[str, float]
    fair: Mapping[str, float]
    weights: Mapping[str, float] = field(default_factory=dict)

    def share(self, tenant: str, extra: float = 0.0) -> float:
        """Weighted share (cost / weight) with ``extra`` cost added (negative to take some away)."""
        return (self.usage.get(tenant, 0.0) + extra) / max(self.weights.get(tenant, 1.0), _EPS)

    def deviation(self) -> float:
        """Largest |usage - fair share| over tenants, in cost units."""
        return max((abs(self.usage.get(t, 0.0) - f) for t, f in self.fair.items()), default=0.0)


def shares_of(snap: QueueSnapshot, capacity: float) -> Shares:
    """Usage, demand (usage + every queued job's cost) and water-filled fair share of each active tenant."""
    policy = snap.policy
    demand: dict[str, float] = dict(snap.usage.cost)
    for e in snap.entries.values():
        if e.state is JobState.QUEUED:
            demand[e.tenant] = demand.get(e.tenant, 0.0) + job_cost(e, policy)
    tenants = set(demand) | set(snap.usage.cost)
    weights = {t: policy.tenant_weight(t) for t in tenants}
    fair = water_fill(capacity, weights, {t: demand.get(t, 0.0) for t in tenants})
    return Shares(capacity, dict(snap.usage.cost), demand, fair, weights)


def _rank(snap: QueueSnapshot, e: QueueEntry) -> tuple[int, int]:
    return snap.policy.band_rank(e.band), e.priority


def victim_reason(
    snap: QueueSnapshot,
    shares: Shares,
    preemptor: QueueEntry,
    preemptor_model: str,
    preemptor_cost: float,
    victim: QueueEntry,
    knobs: TenantKnobs,
    *,
    running_s: float,
    min_runtime_s: float,
) -> PreemptReason | None:
    """Why ``preemptor`` (planned on ``preemptor_model``) may preempt ``victim``, or None (rules above)."""
    if not victim.preemptible or victim.state not in PREEMPTABLE_STATES or not victim.charged:
        return None
    if victim.job_id == preemptor.job_id:
        return None
    p_rank, v_rank = _rank(snap, preemptor), _rank(snap, victim)
    if victim.tenant == preemptor.tenant:  # the tenant's own knob alone decides, bands included
        if knobs.within_tenant == "LowerPriority" and v_rank < p_rank:
            return PreemptReason.WITHIN_TENANT
        if knobs.within_tenant == "LowerOrNewerEqualPriority" and (
            v_rank < p_rank or (v_rank == p_rank and victim.seq > preemptor.seq)
        ):
            return PreemptReason.WITHIN_TENANT
        return None
    (p_band, p_prio), (v_band, v_prio) = p_rank, v_rank
    if v_band < p_band:
        return PreemptReason.PRIORITY_BAND
    if v_band > p_band:
        return None
    admission = snap.admit(preemptor.tenant, preemptor_model, preemptor.gpus, preemptible=preemptor.preemptible)
    victim_borrowing = _borrowing(snap, victim)
    if admission.borrowing:
        # A borrower only ever displaces other borrowers, and only below its threshold.
        limit = knobs.borrow_preempt_max_priority
        if victim_borrowing and limit is not None and v_prio <= limit and v_prio < p_prio:
            return PreemptReason.RECLAIM
        return None
    if victim_borrowing and knobs.reclaim != "Never" and (knobs.reclaim == "Any" or v_prio < p_prio):
        return PreemptReason.RECLAIM
    if not knobs.fair_share_preemption or running_s < min_runtime_s:
        return None
    v_fair = shares.fair.get(victim.tenant, 0.0)
    v_used = shares.usage.get(victim.tenant, 0.0)
    if v_used <= knobs.protected_fraction * v_fair + _EPS:
        return None
    p_used = shares.usage.get(preemptor.tenant, 0.0)
    if p_used + preemptor_cost > shares.fair.get(preemptor.tenant, 0.0) + _EPS:
        return None  # the gap is smaller than the job: preempting would only move the excess around
    if shares.share(preemptor.tenant, preemptor_cost) > shares.share(victim.tenant, -victim_cost(snap, victim)) + _EPS:
        return None
    return PreemptReason.FAIR_SHARE


def victim_cost(snap: QueueSnapshot, victim: QueueEntry) -> float:
    """What the victim's tenant is charged for it now (cost units)."""
    return victim.charged_gpus * snap.policy.model_weight(victim.charged_model)


def _borrowing(snap: QueueSnapshot, e: QueueEntry) -> bool:
    """The job's tenant holds more of the job's model than its quota allows (so some of it is borrowed)."""
    limit = snap.policy.quota(e.tenant, e.charged_model)
    return limit is not None and snap.usage.used_under(snap.policy, e.tenant, e.charged_model) > limit + _EPS


def final_share_ok(
    shares: Shares,
    preemptor_tenant: str,
    preemptor_cost: float,
    victims: Iterable[tuple[QueueEntry, PreemptReason, float]],
) -> bool:
    """For a whole set of victims: every tenant that loses jobs for fair share keeps a share at least the
    preemptor's tenant's share with the preemptor (F-3 over the set, not victim by victim)."""
    taken: dict[str, float] = {}
    for v, reason, cost in victims:
        if reason is PreemptReason.FAIR_SHARE:
            taken[v.tenant] = taken.get(v.tenant, 0.0) + cost
    p_share = shares.share(preemptor_tenant, preemptor_cost)
    return all(shares.share(t, -c) + _EPS >= p_share for t, c in taken.items())


class DecayedUsage:
    """Half-life-decayed cost per tenant (Kueue's admission fair sharing): orders the queue, nothing else.

    ``observe(now, usage)`` folds the current usage in: the decayed figure moves toward it with the
    configured half-life, so a tenant that used the fleet heavily yesterday is ordered by what it used
    recently, not forever. A half-life of 0 is the current usage itself.
    """

    def __init__(self, half_life_s: float) -> None:
        self.half_life_s = max(half_life_s, 0.0)
        self._value: dict[str, float] = {}
        self._at: float | None = None

    def observe(self, now: float, usage: Mapping[str, float]) -> Mapping[str, float]:
        if self.half_life_s <= 0:
            self._value = dict(usage)
            self._at = now
            return self._value
        if self._at is None:
            self._value = dict(usage)
        else:
            keep = 0.5 ** (max(now - self._at, 0.0) / self.half_life_s)
            tenants = set(self._value) | set(usage)
            self._value = {t: self._value.get(t, 0.0) * keep + usage.get(t, 0.0) * (1 - keep) for t in tenants}
            self._value = {t: v for t, v in self._value.items() if v > 1e-6 or t in usage}
        self._at = now
        return self._value

    def value(self) -> Mapping[str, float]:
        return self._value


@dataclass(frozen=True, slots=True)
class TenantUsage:
    """One tenant's row of ``tandem usage``: GPUs per model now, against quota, and its share figures."""

    tenant: str
    weight: float
    gpus: Mapping[str, float]
    """GPUs held now per model (reserved and running attempts; a drain hold's idle GPUs)."""
    quotas: Mapping[str, float]
    """Quota per model as the policy states it ("*" = every model without its own entry)."""
    borrowed: Mapping[str, float]
    """GPUs held above quota per model (only preemptible jobs borrow)."""
    usage_cost: float
    fair_share_cost: float
    demand_cost: float
    """Cost units (GPUs x model weight): held now, water-filled fair share, held + queued."""


def tenant_usage(snap: QueueSnapshot, shares: Shares, tenants: Iterable[str] = ()) -> list[TenantUsage]:
    """A row per tenant that is named, holds GPUs, waits, or has a quota; sorted by tenant."""
    policy = snap.policy
    names = set(tenants) | set(shares.demand) | set(shares.usage) | {t for t, _ in policy.quotas}
    rows: list[TenantUsage] = []
    for t in sorted(names):
        gpus = {m: g for (tt, m), g in snap.usage.gpus.items() if tt == t and g > 0}
        quotas = {m: q for (tt, m), q in policy.quotas.items() if tt == t}
        borrowed: dict[str, float] = {}
        for m in gpus:
            limit = policy.quota(t, m)
            if limit is not None:
                over = snap.usage.used_under(policy, t, m) - limit
                if over > _EPS:
                    borrowed["*" if (t, m) not in policy.quotas else m] = over
        rows.append(
            TenantUsage(
                t,
                policy.tenant_weight(t),
                gpus,
                quotas,
                borrowed,
                shares.usage.get(t, 0.0),
                shares.fair.get(t, 0.0),
                shares.demand.get(t, 0.0),
            )
        )
    return rows


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A running attempt as the victim search sees it."""

    entry: QueueEntry
    """Its queue entry (charged for what it holds)."""
    cluster: str
    attempt: int
    replicas: tuple[tuple[str, PodShape], ...]
    """(node, shape) per replica."""
    running_s: float
    """Since it started running (0 while gated)."""
    lost_gpu_hours: float
    """Work lost if it is preempted now (since start, or since its last checkpoint when that is known)."""


@dataclass(frozen=True, slots=True)
class PreemptionChoice:
    plan: PreemptionPlan
    victims: tuple[tuple[RunningJob, PreemptReason], ...]


_STAGE = {JobState.ACCEPTED: 0, JobState.STARTING: 1, JobState.RUNNING: 2}


def choose_preemption(
    view: FleetView,
    snap: QueueSnapshot,
    shares: Shares,
    preemptor: QueueEntry,
    req: JobRequest,
    running: Iterable[RunningJob],
    knobs: TenantKnobs,
    *,
    min_runtime_s: float,
    policy_allows: ClusterPredicate = allow_every_cluster,
    may_take: Callable[[str], bool] = lambda _victim: True,
) -> PreemptionChoice | None:
    """Whom the waiting `preemptor` (its request `req`) should preempt now, and where it goes then, or None.

    The rules above pick the candidates; `fleetplan.preempt` finds the cheapest set that lets the gang fit;
    the set as a whole must leave the preemptor admissible under its quota on the model it gets (its own
    tenant's victims give theirs back) and keep F-3's final-share rule. ``may_take(victim)`` is the shell's
    own veto (the anti-ping-pong memory)."""
    allowed: dict[str, tuple[RunningJob, PreemptReason]] = {}
    cands: list[VictimCandidate] = []
    for r in running:
        v = r.entry
        if not may_take(v.job_id):
            continue
        cost = preemptor.gpus * snap.policy.model_weight(v.charged_model)
        reason = victim_reason(
            snap, shares, preemptor, v.charged_model, cost, v, knobs, running_s=r.running_s, min_runtime_s=min_runtime_s
        )
        if reason is None:
            continue
        allowed[v.job_id] = (r, reason)
        cands.append(
            VictimCandidate(
                v.job_id,
                r.cluster,
                r.replicas,
                _STAGE.get(v.state, 2),
                r.lost_gpu_hours,
                banded_priority(snap.policy.band_rank(v.band), v.priority),
                shares.usage.get(v.tenant, 0.0) - shares.fair.get(v.tenant, 0.0),
            )
        )
    if not cands:
        return None
    plan = plan_preemption(view, req, cands, policy_allows=policy_allows)
    if plan is None:
        return None
    victims = tuple(allowed[v.job_id] for v in plan.victims)
    c = plan.choice
    usage = snap.usage
    for r, _ in victims:
        if r.entry.tenant == preemptor.tenant:
            usage = usage.add(snap.policy, r.entry.tenant, r.entry.charged_model, -r.entry.charged_gpus)
    if not snap.admit(preemptor.tenant, c.gpu_model, c.gpus, preemptible=preemptor.preemptible, usage=usage).allowed:
        return None
    p_cost = c.gpus * snap.policy.model_weight(c.gpu_model)
    if not final_share_ok(
        shares, preemptor.tenant, p_cost, ((r.entry, why, victim_cost(snap, r.entry)) for r, why in victims)
    ):
        return None
    return PreemptionChoice(plan, victims)
