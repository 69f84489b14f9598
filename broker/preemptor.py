"""Fleet-wide preemption: for jobs the placer could not place, find whole gangs to preempt, then hold the
freed nodes for them until the victims are gone (FLEET-NOTES F-3, F-5, F-9).

A round (every ``fairness.interval_s``) takes the queue snapshot and the fleet view once, and walks the
blocked jobs in queue order (the placer's last verdict said capacity or topology, not quota or back-off).
For each, the rules of ``broker.fairness`` say which running jobs it may preempt and why; the victim search
(``fleetplan.preempt``) finds the cheapest set that lets the core's gang fit place it, in one cluster and
one domain. Then, in this order: the placer holds the preemptor's nodes (no other placement can take them,
``Placer.hold_for_preemption``), and every victim gets ``PreemptRequested``: the cluster's agent deletes its
pods after the grace period (SIGTERM; the workload checkpoints), and the victim is re-queued with its
original arrival, no retry spent. The preemptor is placed by the placer once every victim has left, on the
nodes a fresh report shows free.

Holds live in memory: after a broker restart the victims (PREEMPTED in the store) still leave and are
re-queued, and the preemptor is planned again from scratch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fleetplan.decide import Wait
from fleetplan.drain import BusyJob, choose_drain_domain
from fleetplan.preempt import PreemptionPlan, VictimCandidate, plan_preemption
from fleetplan.view import FleetView

from broker import fairness, lifecycle, serde
from broker import queue as q
from broker.config import FairnessConfig
from broker.placer import Placer
from broker.policy import PolicyFile
from broker.records import AttemptRecord, JobRecord
from broker.states import JobState
from broker.store.base import Store

__all__ = ["Preemptor", "Preemption"]

_log = logging.getLogger("tandem.broker.preemptor")

_BLOCKED = frozenset({Wait.INSUFFICIENT_CAPACITY, Wait.TOPOLOGY_FRAGMENTED})
_STAGE = {JobState.ACCEPTED: 0, JobState.STARTING: 1, JobState.RUNNING: 2}

Apply = Callable[[lifecycle.Event], Awaitable[JobRecord | None]]


@dataclass(frozen=True, slots=True)
class _Victim:
    """A job the rules let this preemptor take: what the search sees, and what the round must remember."""

    candidate: VictimCandidate
    entry: q.QueueEntry
    reason: fairness.PreemptReason
    cost: float
    attempt: int


@dataclass(frozen=True, slots=True)
class Preemption:
    """One preemption started: the waiting job, its victims with the rule that allowed each, and the cost."""

    preemptor: str
    cluster: str
    victims: tuple[tuple[str, fairness.PreemptReason], ...]
    lost_gpu_hours: float


class Preemptor:
    def __init__(
        self,
        store: Store,
        placer: Placer,
        policy: PolicyFile,
        cfg: FairnessConfig,
        *,
        apply: Apply,
        grace_s: float,
        clock: Callable[[], float] = time.time,
        metrics: object | None = None,
    ) -> None:
        self.store = store
        self.placer = placer
        self.policy = policy
        self.cfg = cfg
        self.apply = apply
        """Applies a lifecycle event and delivers its orders (the dispatcher's)."""
        self.grace_s = grace_s
        self.clock = clock
        self.metrics = metrics
        self.preempted_for: dict[str, tuple[str, float]] = {}
        """victim → (the job it was preempted for, until when it may not preempt that one back)."""
        self.history: list[Preemption] = []
        """Preemptions started (the latest 1,000), for tests, the simulator and `tandem get`."""
        self.rounds = 0
        """Rounds completed (tests wait on it instead of sleeping)."""
        self._stopped = False

    def _knobs(self, tenant: str) -> fairness.TenantKnobs:
        t = self.policy.current().tenants.get(tenant)
        if t is None:
            return fairness.TenantKnobs(reclaim="Never", fair_share_preemption=False)
        p = t.preemption
        return fairness.TenantKnobs(p.reclaim, p.within_tenant, p.fair_share_preemption,
                                    p.borrow_preempt_max_priority, p.protected_fraction)

    def _ping_pong(self, preemptor: str, victim: str, now: float) -> bool:
        """The preemptor was itself preempted for this victim recently: it may not take it back yet."""
        got = self.preempted_for.get(preemptor)
        return got is not None and got[0] == victim and now < got[1]

    async def round(self) -> list[Preemption]:
        """Look at the blocked jobs once; start at most ``max_plans`` preemptions."""
        now = self.clock()
        snap, shares = self.placer.shares(now)
        holding = {v for h in self.placer.preempting.values() for v in h.victims}
        blocked = [e for e in snap.order()
                   if e.job_id in self.placer.queued and e.job_id not in self.placer.preempting
                   and (w := self.placer.waits.get(e.job_id)) is not None and w.reason in _BLOCKED]
        pool = [e for e in snap.entries.values()
                if e.preemptible and e.state in fairness.PREEMPTABLE_STATES and e.charged and e.job_id not in holding]
        to_hold = self._hold_candidates(blocked, now)
        if not blocked or not (pool or to_hold):
            return []
        runs: dict[str, tuple[JobRecord, AttemptRecord]] = {
            j.job_id: (j, a) for j, a in await self.store.active_runs() if a.number == j.attempt}
        started: list[Preemption] = []
        taken: set[str] = set()
        for e in blocked[: self.cfg.max_searches]:
            if len(started) >= self.cfg.max_plans:
                break
            job = self.placer.queued.get(e.job_id)
            if job is None:
                continue
            done = await self._consider(job, e, snap, shares, [v for v in pool if v.job_id not in taken], runs, now)
            if done is not None:
                started.append(done)
                taken.update(v for v, _ in done.victims)
        for e in to_hold:
            job = self.placer.queued.get(e.job_id)
            if job is not None and e.job_id not in self.placer.preempting:
                self._hold(job, runs, now)
        return started

    def _hold_candidates(self, blocked: list[q.QueueEntry], now: float) -> list[q.QueueEntry]:
        """Blocked gangs, big enough and waiting past the bound, while fewer domains than the cap are held."""
        room = self.cfg.max_held_domains - len(self.placer.drains)
        if room <= 0:
            return []
        out = []
        for e in blocked:
            job = self.placer.queued.get(e.job_id)
            if (job is not None and e.job_id not in self.placer.drains.holds and e.gpus >= self.cfg.hold_min_gpus
                    and now - job.update_time >= self.cfg.hold_after_s):
                out.append(e)
        return out[:room]

    def _hold(self, job: JobRecord, runs: dict[str, tuple[JobRecord, AttemptRecord]], now: float) -> None:
        busy = []
        for other, a in runs.values():
            start = a.accept_time or a.dispatch_time or a.reserve_time
            ends_by = None
            if other.max_runtime_s is not None:
                ends_by = start + other.max_runtime_s + serde.start_timeout_s(other.spec, self.placer.start_timeout_s)
            busy.append(BusyJob(other.job_id, a.cluster, frozenset(r.node for r in a.assignments), ends_by,
                                other.preemptible))
        hold_until = now + self.cfg.max_hold_s
        domain = choose_drain_domain(FleetView(self.placer.catalog, now), self.placer.request_of(job), busy,
                                     now=now, hold_until=hold_until, policy_allows=self.placer.allows(job))
        if domain is not None:
            self.placer.hold_domain(job, domain, now, self.cfg.max_hold_s)
            if self.metrics is not None:
                self.metrics.domain_holds.inc()  # type: ignore[attr-defined]

    def _candidates(
        self, e: q.QueueEntry, snap: q.QueueSnapshot, shares: fairness.Shares, pool: list[q.QueueEntry],
        runs: dict[str, tuple[JobRecord, AttemptRecord]], now: float,
    ) -> dict[str, _Victim]:
        knobs = self._knobs(e.tenant)
        out: dict[str, _Victim] = {}
        for v in pool:
            run = runs.get(v.job_id)
            if run is None or self._ping_pong(e.job_id, v.job_id, now):
                continue
            vjob, attempt = run
            since = attempt.running_time or attempt.start_time
            running_s = max(0.0, now - since) if since is not None else 0.0
            p_cost = e.gpus * snap.policy.model_weight(v.charged_model)
            reason = fairness.victim_reason(snap, shares, e, v.charged_model, p_cost, v, knobs,
                                            running_s=running_s, min_runtime_s=self.cfg.min_runtime_s)
            if reason is None:
                continue
            shapes = {ps.name: ps.shape for ps in self.placer.request_of(vjob).pod_sets}
            replicas = tuple((a.node, shapes[a.pod_set]) for a in attempt.assignments if a.pod_set in shapes)
            cost = fairness.victim_cost(snap, v)
            over = shares.usage.get(v.tenant, 0.0) - shares.fair.get(v.tenant, 0.0)
            cand = VictimCandidate(v.job_id, attempt.cluster, replicas, _STAGE.get(v.state, 2),
                                   v.charged_gpus * running_s / 3600.0,
                                   snap.policy.band_rank(v.band) * 10000 + v.priority, over)
            out[v.job_id] = _Victim(cand, v, reason, cost, attempt.number)
        return out

    async def _consider(
        self, job: JobRecord, e: q.QueueEntry, snap: q.QueueSnapshot, shares: fairness.Shares,
        pool: list[q.QueueEntry], runs: dict[str, tuple[JobRecord, AttemptRecord]], now: float,
    ) -> Preemption | None:
        cands = self._candidates(e, snap, shares, pool, runs, now)
        if not cands:
            return None
        view = FleetView(self.placer.catalog, now)
        plan = plan_preemption(view, self.placer.request_of(job), [c.candidate for c in cands.values()],
                               policy_allows=self.placer.allows(job))
        if plan is None or not self._admissible(job, e, snap, shares, plan, cands):
            return None
        return await self._start(job, plan, cands, now)

    def _admissible(
        self, job: JobRecord, e: q.QueueEntry, snap: q.QueueSnapshot, shares: fairness.Shares,
        plan: PreemptionPlan, cands: dict[str, _Victim],
    ) -> bool:
        """The plan as a whole: the preemptor's quota on the model it gets, and F-3's final-share rule."""
        c = plan.choice
        usage = snap.usage
        for v in plan.victims:
            entry = cands[v.job_id].entry
            if entry.tenant == e.tenant:  # its own victims give their GPUs back to the same quota
                usage = usage.add(snap.policy, entry.tenant, entry.charged_model, -entry.charged_gpus)
        if not snap.admit(e.tenant, c.gpu_model, c.gpus, preemptible=job.preemptible, usage=usage).allowed:
            return False
        p_cost = c.gpus * snap.policy.model_weight(c.gpu_model)
        chosen = [(cands[v.job_id].entry, cands[v.job_id].reason, cands[v.job_id].cost) for v in plan.victims]
        return fairness.final_share_ok(shares, e.tenant, p_cost, chosen)

    async def _start(
        self, job: JobRecord, plan: PreemptionPlan,
        cands: dict[str, _Victim], now: float,
    ) -> Preemption:
        victims = tuple((v.job_id, cands[v.job_id].reason) for v in plan.victims)
        deadline = now + self.grace_s + self.cfg.release_timeout_s
        self.placer.hold_for_preemption(job, plan.choice, frozenset(v for v, _ in victims), deadline)
        for v in plan.victims:
            victim = cands[v.job_id]
            entry, reason = victim.entry, victim.reason
            # Another tenant's victim learns why, never which job took its place.
            who = f" for {job.job_id}" if entry.tenant == job.tenant else ""
            await self.apply(lifecycle.PreemptRequested(
                v.job_id, victim.attempt, grace_s=self.grace_s, message=f"preempted{who}: {_WHY[reason]}"))
            self.preempted_for[v.job_id] = (job.job_id, now + self.cfg.ping_pong_s)
            if self.metrics is not None:
                self.metrics.preempted(reason.value, entry.tenant, v.lost_gpu_hours)  # type: ignore[attr-defined]
        done = Preemption(job.job_id, plan.choice.cluster, victims, plan.lost_gpu_hours)
        self.history = (self.history + [done])[-1000:]
        _log.info("preemption started", extra={"job": job.job_id, "cluster": plan.choice.cluster,
                                               "victims": [v for v, _ in victims],
                                               "lost_gpu_hours": round(plan.lost_gpu_hours, 3)})
        return done

    def _expire(self, now: float) -> None:
        self.preempted_for = {k: v for k, v in self.preempted_for.items() if v[1] > now}

    async def run(self) -> None:
        while not self._stopped:
            await asyncio.sleep(self.cfg.interval_s)
            try:
                self._expire(self.clock())
                await self.round()
                self.rounds += 1
            except Exception:  # noqa: BLE001 - one bad round must not end preemption
                _log.exception("preemption round failed")

    def stop(self) -> None:
        self._stopped = True


_WHY = {
    fairness.PreemptReason.PRIORITY_BAND: "a job of a higher priority band needed the GPUs",
    fairness.PreemptReason.RECLAIM: "the GPUs were borrowed beyond your quota and their owner needed them",
    fairness.PreemptReason.FAIR_SHARE: "your tenant is above its fair share and another is below",
    fairness.PreemptReason.WITHIN_TENANT: "a higher-priority job of your tenant needed the GPUs",
}
