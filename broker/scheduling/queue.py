"""Pure queue bookkeeping: fair-share order, per-(tenant, GPU model) quota admission, position and "why it waits".

No I/O, no clock (``now`` is passed in). The shell feeds job changes into a
``QueueBook`` and asks it for an immutable ``QueueSnapshot`` per scheduling
cycle; the placer walks ``snapshot.order()``, checks ``admit`` inside its
placement decision and ``charge``s each reservation it makes.

Order: priority band (rank, higher first) → weighted share of one cost figure
between tenants (lowest ``cost / weight`` first, re-evaluated after every job
taken, so tenants interleave) → priority (higher first) → arrival. Cost of a
GPU = the model's weight (MIG / shares count as fractions of a GPU). Usage
counts every job holding capacity (reserved, dispatched, accepted, starting,
running, lost, cancelling, preempted), charged for the model it actually got,
plus the idle GPUs of domains held for draining gangs (``drain_hold``).

The order between tenants reads ``ordering_cost`` when given (the placer passes
half-life-decayed usage, ``broker.scheduling.fairness.DecayedUsage``); quotas and
preemption always read current usage. Who may preempt whom is
``broker.scheduling.fairness``.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from broker.domain.errors import QuotaViolation
from broker.domain.records import AttemptRecord, JobRecord
from broker.domain.states import HOLDS_CAPACITY, JobState
from fleetplan.decide import WaitReason

__all__ = [
    "QueuePolicy",
    "BAND_STRIDE",
    "banded_priority",
    "QueueEntry",
    "Usage",
    "Admission",
    "WaitInfo",
    "job_cost",
    "QueueBook",
    "QueueSnapshot",
    "ordinal",
    "policy_from_tenancy",
]

if TYPE_CHECKING:
    from broker.tenancy.policy import Policy

_EPS = 1e-9

OrderingCost = Callable[[float, Mapping[str, float]], Mapping[str, float]]
"""(now, usage cost per tenant) → the cost per tenant the queue order starts from."""


BAND_STRIDE = 10_000
"""Band ranks are this far apart on the core's one priority scale; a job's own priority is bounded well inside
it (validation keeps it within ±1000), so the band always decides first."""


def banded_priority(band_rank: int, priority: int) -> int:
    """The core's priority of a job: its band's rank first, then its own priority within the band."""
    return band_rank * BAND_STRIDE + priority


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """Fair-share weights, model cost weights, quotas and band ranks (built from the tenancy policy)."""

    tenant_weights: Mapping[str, float] = field(default_factory=dict)
    """Fair-share weight per tenant (dimensionless); missing = ``default_tenant_weight``."""
    default_tenant_weight: float = 1.0
    model_weights: Mapping[str, float] = field(default_factory=dict)
    """Cost of one GPU of a model (e.g. H100 = 2.0, A100 = 1.0); missing = ``default_model_weight``."""
    default_model_weight: float = 1.0
    quotas: Mapping[tuple[str, str], float] = field(default_factory=dict)
    """GPU limit per (tenant, model); model ``"*"`` = any model without its own entry; missing = unlimited."""
    band_ranks: Mapping[str, int] = field(default_factory=dict)
    """Band name → rank (higher is placed first); missing band = 0."""
    borrowing_limits: Mapping[tuple[str, str], float] = field(default_factory=dict)
    """GPUs a preemptible job may borrow beyond the (tenant, model) quota; ``"*"`` as for quotas; missing = no limit."""

    def tenant_weight(self, tenant: str) -> float:
        return max(self.tenant_weights.get(tenant, self.default_tenant_weight), _EPS)

    def model_weight(self, model: str) -> float:
        return self.model_weights.get(model, self.default_model_weight)

    def quota(self, tenant: str, model: str) -> float | None:
        q = self.quotas.get((tenant, model))
        return self.quotas.get((tenant, "*")) if q is None else q

    def band_rank(self, band: str) -> int:
        return self.band_ranks.get(band, 0)

    def borrowing_limit(self, tenant: str, model: str) -> float | None:
        b = self.borrowing_limits.get((tenant, model))
        return self.borrowing_limits.get((tenant, "*")) if b is None else b


@dataclass(frozen=True, slots=True)
class QueueEntry:
    """What the queue needs to know about one non-terminal job."""

    job_id: str
    tenant: str
    queue: str
    band: str
    priority: int
    seq: int
    state: JobState
    gpus: float
    """Demand (whole-GPU equivalents)."""
    gpu_models: tuple[str, ...] = ()
    preemptible: bool = False
    not_before: float = 0.0
    charged_model: str = ""
    """Model of the current attempt (when holding capacity)."""
    charged_gpus: float = 0.0
    drain_hold: bool = False
    """A QUEUED gang holding a draining domain: ``charged_*`` (the domain's idle GPUs) count as its usage."""
    held: bool = False
    """Held by an operator (``tandem hold``): out of the order until released."""

    @classmethod
    def of(cls, job: JobRecord, attempt: AttemptRecord | None) -> QueueEntry:
        """The job's entry, charged what its current attempt holds (nothing unless it holds capacity)."""
        if job.state in HOLDS_CAPACITY and attempt is not None and attempt.number == job.attempt:
            return cls.charging(job, attempt.gpu_model, attempt.gpus)
        return cls.charging(job, "", 0.0)

    @classmethod
    def charging(cls, job: JobRecord, model: str, gpus: float, *, drain_hold: bool = False) -> QueueEntry:
        """The job's entry, charged ``gpus`` of ``model`` (its attempt's, or a draining domain's it holds)."""
        return cls(
            job_id=job.job_id,
            tenant=job.tenant,
            queue=job.queue,
            band=job.priority_band,
            priority=job.priority,
            seq=job.seq,
            state=job.state,
            gpus=job.gpus,
            gpu_models=job.gpu_models,
            preemptible=job.preemptible,
            not_before=job.not_before,
            charged_model=model,
            charged_gpus=gpus,
            drain_hold=drain_hold,
            held=job.held,
        )

    @property
    def holds_capacity(self) -> bool:
        return self.state in HOLDS_CAPACITY

    @property
    def charged(self) -> bool:
        """Counts against quota and fair share now."""
        return (self.holds_capacity or (self.drain_hold and self.state is JobState.QUEUED)) and self.charged_gpus > 0


@dataclass(frozen=True, slots=True)
class Usage:
    """GPUs in use per (tenant, model) and weighted cost per tenant."""

    gpus: Mapping[tuple[str, str], float] = field(default_factory=dict)
    cost: Mapping[str, float] = field(default_factory=dict)

    def used(self, tenant: str, model: str) -> float:
        return self.gpus.get((tenant, model), 0.0)

    def used_under(self, policy: QueuePolicy, tenant: str, model: str) -> float:
        """Usage counted against the quota that governs (tenant, model) — the "*" quota pools other models."""
        pooled = model == "*" or ((tenant, model) not in policy.quotas and (tenant, "*") in policy.quotas)
        if not pooled:
            return self.used(tenant, model)
        return sum(g for (t, m), g in self.gpus.items() if t == tenant and (t, m) not in policy.quotas)

    def add(self, policy: QueuePolicy, tenant: str, model: str, gpus: float) -> Usage:
        g = dict(self.gpus)
        g[(tenant, model)] = g.get((tenant, model), 0.0) + gpus
        c = dict(self.cost)
        c[tenant] = c.get(tenant, 0.0) + gpus * policy.model_weight(model)
        return Usage(g, c)


@dataclass(frozen=True, slots=True)
class Admission:
    allowed: bool
    borrowing: bool = False
    """Allowed only because the job is preemptible and may borrow above quota."""
    violation: QuotaViolation | None = None


@dataclass(frozen=True, slots=True)
class WaitInfo:
    """ "Why it waits", from the tenant's own data and anonymous aggregates only."""

    reason: WaitReason
    reasons: tuple[WaitReason, ...]
    position: int | None
    """Jobs of the same tenant ahead of it in the scheduling order (0 = next)."""
    message: str
    quota: str = ""
    """Blocking quota, e.g. ``gpu/H100``."""
    next_eligible: float | None = None


def policy_from_tenancy(
    policy: Policy, *, model_weights: Mapping[str, float] | None = None, default_model_weight: float = 1.0
) -> QueuePolicy:
    """The queue's view of the tenancy policy: tenant weights, quotas (``"*"`` kept) and band ranks."""
    tenants = policy.doc.tenants
    return QueuePolicy(
        tenant_weights={t.name: t.weight for t in tenants},
        model_weights=dict(model_weights or {}),
        default_model_weight=default_model_weight,
        quotas={(t.name, model): limit for t in tenants for model, limit in t.quotas.items()},
        band_ranks=dict(policy.doc.priority_bands),
        borrowing_limits={(t.name, model): b for t in tenants for model, b in t.borrowing_limits.items()},
    )


def ordinal(n: int) -> str:
    if 10 <= n % 100 <= 20:
        suffix = "th"
    else:
        suffix = {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _fmt(x: float) -> str:
    return f"{x:g}"


class QueueBook:
    """Mutable bookkeeping of non-terminal jobs, fed job changes; hands out immutable snapshots."""

    def __init__(self, policy: QueuePolicy) -> None:
        self.policy = policy
        self._entries: dict[str, QueueEntry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def load(self, jobs: Iterable[JobRecord], attempts: Iterable[AttemptRecord]) -> None:
        """Rebuild from the store (``Store.active_jobs`` / ``active_attempts``) after a restart."""
        by_job = {a.job_id: a for a in attempts}
        self._entries.clear()
        for job in jobs:
            self.on_job(job, by_job.get(job.job_id))

    def on_job(self, job: JobRecord, attempt: AttemptRecord | None) -> None:
        """A job changed (submitted, transitioned): upsert it, or drop it once terminal."""
        if job.state.terminal:
            self._entries.pop(job.job_id, None)
        else:
            self._entries[job.job_id] = QueueEntry.of(job, attempt)

    def upsert(self, entry: QueueEntry) -> None:
        if entry.state.terminal:
            self._entries.pop(entry.job_id, None)
        else:
            self._entries[entry.job_id] = entry

    def remove(self, job_id: str) -> None:
        self._entries.pop(job_id, None)

    def set_policy(self, policy: QueuePolicy) -> None:
        self.policy = policy

    def snapshot(self, now: float, ordering_cost: OrderingCost | None = None) -> QueueSnapshot:
        return QueueSnapshot.build(self._entries.values(), self.policy, now, ordering_cost)


@dataclass(frozen=True, slots=True)
class QueueSnapshot:
    """Immutable view for one scheduling cycle."""

    policy: QueuePolicy
    now: float
    entries: Mapping[str, QueueEntry]
    usage: Usage
    _order: tuple[QueueEntry, ...]

    @classmethod
    def build(
        cls, entries: Iterable[QueueEntry], policy: QueuePolicy, now: float, ordering_cost: OrderingCost | None = None
    ) -> QueueSnapshot:
        """``ordering_cost(now, usage cost)``: per tenant, the cost the order between tenants starts from
        (default: usage now)."""
        es = {e.job_id: e for e in entries}
        gpus: dict[tuple[str, str], float] = defaultdict(float)
        cost: dict[str, float] = defaultdict(float)
        for e in es.values():
            if e.charged:
                gpus[(e.tenant, e.charged_model)] += e.charged_gpus
                cost[e.tenant] += e.charged_gpus * policy.model_weight(e.charged_model)
        usage = Usage(dict(gpus), dict(cost))
        start = usage.cost if ordering_cost is None else ordering_cost(now, usage.cost)
        return cls(policy, now, es, usage, _fair_order(es.values(), start, policy, now))

    # -- order ---------------------------------------------------------------------------------

    def order(self) -> tuple[QueueEntry, ...]:
        """Eligible QUEUED jobs (back-off over) in scheduling order."""
        return self._order

    def pending(self) -> list[QueueEntry]:
        """Every QUEUED job, eligible or backing off."""
        return [e for e in self.entries.values() if e.state is JobState.QUEUED]

    def position(self, job_id: str) -> int | None:
        """Jobs of the same tenant ahead of this one (0 = next); None if it is not waiting in the order."""
        target = self.entries.get(job_id)
        if target is None or target.state is not JobState.QUEUED:
            return None
        ahead = 0
        for e in self._order:
            if e.job_id == job_id:
                return ahead
            if e.tenant == target.tenant:
                ahead += 1
        # backing off: behind every eligible job of its tenant
        return ahead

    # -- quotas ----------------------------------------------------------------------------------

    def admit(
        self, tenant: str, model: str, gpus: float, *, preemptible: bool, usage: Usage | None = None
    ) -> Admission:
        """May ``tenant`` take ``gpus`` of ``model`` now? Pass the cycle's running ``usage`` after charges."""
        u = usage or self.usage
        limit = self.policy.quota(tenant, model)
        if limit is None or gpus <= 0:
            return Admission(True)
        used = u.used_under(self.policy, tenant, model)
        if used + gpus <= limit + _EPS:
            return Admission(True)
        violation = QuotaViolation(
            subject=f"tenant/{tenant}", quota=f"gpu/{model}", used=used, limit=limit, requested=gpus
        )
        borrow_limit = self.policy.borrowing_limit(tenant, model)
        if preemptible and (borrow_limit is None or used + gpus <= limit + borrow_limit + _EPS):
            return Admission(True, borrowing=True, violation=violation)
        return Admission(False, violation=violation)

    def charge(self, usage: Usage, tenant: str, model: str, gpus: float) -> Usage:
        """Usage after a reservation made in this cycle."""
        return usage.add(self.policy, tenant, model, gpus)

    def _blocking_quota(self, e: QueueEntry) -> QuotaViolation | None:
        """The quota that blocks every model the job may use, or None if some model is admissible."""
        models = e.gpu_models
        if not models:
            if (e.tenant, "*") not in self.policy.quotas:
                return None  # any model may be used, and some model has no quota
            models = tuple(sorted({m for (t, m) in self.policy.quotas if t == e.tenant}))
        first: QuotaViolation | None = None
        for m in models:
            a = self.admit(e.tenant, m, e.gpus, preemptible=False)
            if a.allowed:
                return None
            first = first or a.violation
        return first

    # -- fair share ------------------------------------------------------------------------------

    def over_fair_share(self, tenant: str) -> bool:
        """True if the tenant uses more than its weighted share of what active tenants use, while others wait."""
        active = {e.tenant for e in self.entries.values()}
        waiting_others = any(e.tenant != tenant and e.state is JobState.QUEUED for e in self.entries.values())
        if tenant not in active or not waiting_others:
            return False
        total = sum(self.usage.cost.get(t, 0.0) for t in active)
        weights = sum(self.policy.tenant_weight(t) for t in active)
        fair = total * self.policy.tenant_weight(tenant) / weights
        return self.usage.cost.get(tenant, 0.0) > fair + _EPS

    # -- why it waits ----------------------------------------------------------------------------

    def why_waiting(self, job_id: str, *, hint: WaitReason | None = None, hint_message: str = "") -> WaitInfo:
        """Typed reasons and a message for a QUEUED job; ``hint`` is the placer's capacity verdict, if any."""
        e = self.entries.get(job_id)
        if e is None or e.state is not JobState.QUEUED:
            return WaitInfo(WaitReason.UNSPECIFIED, (), None, "not waiting")
        return self._why(e, self.position(job_id), self.over_fair_share(e.tenant), hint, hint_message)

    def why_all_waiting(self, hints: Mapping[str, tuple[WaitReason, str]]) -> dict[str, WaitInfo]:
        """`why_waiting` for every QUEUED job at once, in one pass over the order instead of one per job
        (the fleet view counts reasons over thousands of jobs); ``hints``: job id -> (reason, message)."""
        positions: dict[str, int] = {}
        ahead: dict[str, int] = defaultdict(int)
        for e in self._order:
            positions[e.job_id] = ahead[e.tenant]
            ahead[e.tenant] += 1
        pending = self.pending()
        over = {t: self.over_fair_share(t) for t in {e.tenant for e in pending}}
        out = {}
        for e in pending:
            hint, message = hints.get(e.job_id, (None, ""))
            # a backing-off job is behind every eligible job of its tenant (as `position` says)
            out[e.job_id] = self._why(e, positions.get(e.job_id, ahead[e.tenant]), over[e.tenant], hint, message)
        return out

    def _why(
        self, e: QueueEntry, pos: int | None, over_share: bool, hint: WaitReason | None, hint_message: str
    ) -> WaitInfo:
        reasons: list[WaitReason] = [WaitReason.HELD] if e.held else []
        parts: list[str] = []
        if pos is not None:
            parts.append(f"{ordinal(pos + 1)} in your tenant's queue")
        next_eligible = None
        if e.not_before > self.now:
            reasons.append(WaitReason.RETRY_BACKOFF)
            next_eligible = e.not_before
            parts.append(f"retry back-off for {_fmt(round(e.not_before - self.now, 1))}s")
        quota = ""
        if not e.preemptible:
            v = self._blocking_quota(e)
            if v is not None:
                reasons.append(WaitReason.QUOTA_EXCEEDED)
                quota = v.quota
                model = v.quota.removeprefix("gpu/").replace("*", "other models")
                parts.append(
                    f"quota for {model} exhausted: {_fmt(v.used)}/{_fmt(v.limit)} GPUs in use"
                    f" (needs {_fmt(v.requested)})"
                )
        if e.drain_hold:
            reasons.append(WaitReason.DRAINING_DOMAIN)
            parts.append(f"holding a domain while it drains ({_fmt(e.charged_gpus)} idle GPUs charged to you)")
        if hint is not None and hint is not WaitReason.UNSPECIFIED:
            reasons.append(hint)
            if hint_message:
                parts.append(hint_message)
        if over_share:
            reasons.append(WaitReason.FAIR_SHARE)
            parts.append("tenant over fair share")
        if pos:
            reasons.append(WaitReason.QUEUED_BEHIND_OTHERS)
        if not reasons:
            reasons.append(WaitReason.QUEUED_BEHIND_OTHERS)
        return WaitInfo(reasons[0], tuple(reasons), pos, "; ".join(parts), quota, next_eligible)


def job_cost(e: QueueEntry, policy: QueuePolicy) -> float:
    """Projected cost of a queued job: its GPUs at the cheapest model it may use."""
    if e.gpus <= 0:
        return 0.0
    if e.gpu_models:
        return e.gpus * min(policy.model_weight(m) for m in e.gpu_models)
    return e.gpus * policy.default_model_weight


def _fair_order(
    entries: Iterable[QueueEntry], start: Mapping[str, float], policy: QueuePolicy, now: float
) -> tuple[QueueEntry, ...]:
    bands: dict[int, dict[str, list[QueueEntry]]] = defaultdict(lambda: defaultdict(list))
    for e in entries:
        if e.state is JobState.QUEUED and e.not_before <= now and not e.held:
            bands[policy.band_rank(e.band)][e.tenant].append(e)
    projected: dict[str, float] = dict(start)
    out: list[QueueEntry] = []
    for rank in sorted(bands, reverse=True):
        per_tenant = bands[rank]
        heads: list[tuple[float, int, int, str]] = []
        cursors: dict[str, int] = {}
        for tenant, jobs in per_tenant.items():
            jobs.sort(key=lambda j: (-j.priority, j.seq))
            cursors[tenant] = 0
            h = jobs[0]
            heads.append((projected.get(tenant, 0.0) / policy.tenant_weight(tenant), -h.priority, h.seq, tenant))
        heapq.heapify(heads)
        while heads:
            _, _, _, tenant = heapq.heappop(heads)
            jobs = per_tenant[tenant]
            job = jobs[cursors[tenant]]
            out.append(job)
            projected[tenant] = projected.get(tenant, 0.0) + job_cost(job, policy)
            cursors[tenant] += 1
            if cursors[tenant] < len(jobs):
                h = jobs[cursors[tenant]]
                heapq.heappush(heads, (projected[tenant] / policy.tenant_weight(tenant), -h.priority, h.seq, tenant))
    return tuple(out)
