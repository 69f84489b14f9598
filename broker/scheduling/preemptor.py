"""Fleet-wide preemption: for jobs the placer could not place, find whole gangs to preempt, then hold the
freed nodes for them until the victims are gone (FLEET-NOTES F-3, F-5, F-9).

A round (every ``fairness.interval_s``) takes the queue snapshot and the fleet view once, and walks the
blocked jobs in queue order (the placer's last verdict said capacity or topology, not quota or back-off).
For each, the rules of ``broker.scheduling.fairness`` say which running jobs it may preempt and why; the victim search
(``fleetplan.preempt``) finds the cheapest set that lets the core's gang fit place it, in one cluster and
one domain. Then, in this order: the placer holds the preemptor's nodes (no other placement can take them,
``Holds.hold_for_preemption``), and every victim gets ``PreemptRequested``: the cluster's agent deletes its
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

from broker.config import FairnessConfig
from broker.domain import job_events
from broker.domain.records import AttemptRecord, JobRecord
from broker.scheduling import fairness
from broker.scheduling import queue as q
from broker.scheduling.placer import Placer
from broker.store.base import Store
from broker.tenancy.policy import PolicyFile
from fleetplan.decide import WaitReason
from fleetplan.drain import BusyJob, choose_drain_domain, enforced_end
from fleetplan.view import FleetView

__all__ = ["Preemptor", "Preemption"]

_log = logging.getLogger("tandem.broker.preemptor")

_BLOCKED = frozenset({WaitReason.INSUFFICIENT_CAPACITY, WaitReason.TOPOLOGY_FRAGMENTED})

Apply = Callable[[job_events.Event], Awaitable[JobRecord | None]]


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
        self.book = placer.book
        """What the placer knows of the queue: its order, why jobs wait, their requests."""
        self.holds = placer.holds
        """Where the nodes and domains the preemptor frees are held for their jobs."""
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
        """Preemptions started (the latest 1,000): what tests and operators debugging a round look at."""
        self.losses: list[tuple[float, str, str, float]] = []
        """(time, victim tenant, cluster, GPU-hours lost) of the last hour's preemptions (the rate limit's)."""
        self.rounds = 0
        """Rounds completed (tests wait on it instead of sleeping)."""
        self._stopped = False

    def _knobs(self, tenant: str) -> fairness.TenantKnobs:
        t = self.policy.current().tenants.get(tenant)
        if t is None:
            return fairness.TenantKnobs(reclaim="Never", fair_share_preemption=False)
        p = t.preemption
        return fairness.TenantKnobs(
            p.reclaim, p.within_tenant, p.fair_share_preemption, p.borrow_preempt_max_priority, p.protected_fraction
        )

    def _ping_pong(self, preemptor: str, victim: str, now: float) -> bool:
        """The preemptor was itself preempted for this victim recently: it may not take it back yet."""
        got = self.preempted_for.get(preemptor)
        return got is not None and got[0] == victim and now < got[1]

    async def round(self) -> list[Preemption]:
        """Look at the blocked jobs once; start at most ``max_plans`` preemptions."""
        now = self.clock()
        snap, shares = self.book.shares(now)
        holding = {v for h in self.holds.preempting.values() for v in h.victims}
        blocked = [
            e
            for e in snap.order()
            if e.job_id in self.book.queued
            and e.job_id not in self.holds.preempting
            and (w := self.book.waits.get(e.job_id)) is not None
            and w.reason in _BLOCKED
        ]
        pool = [
            e
            for e in snap.entries.values()
            if e.preemptible and e.state in fairness.PREEMPTABLE_STATES and e.charged and e.job_id not in holding
        ]
        to_hold = self._hold_candidates(blocked, now)
        if not blocked or not (pool or to_hold):
            return []
        runs: dict[str, tuple[JobRecord, AttemptRecord]] = {
            j.job_id: (j, a) for j, a in await self.store.active_runs() if a.number == j.attempt
        }
        running = [r for e in pool if (r := self._running(e, runs, now)) is not None]
        started: list[Preemption] = []
        taken: set[str] = set()
        for e in blocked[: self.cfg.max_searches]:
            if len(started) >= self.cfg.max_plans or not running:
                break
            job = self.book.queued.get(e.job_id)
            if job is None:
                continue

            def may_take(victim: str, preemptor: str = e.job_id) -> bool:
                return not self._ping_pong(preemptor, victim, now)

            choice = fairness.choose_preemption(
                FleetView(self.book.catalog, now),
                snap,
                shares,
                e,
                self.book.request_of(job),
                [r for r in running if r.entry.job_id not in taken],
                self._knobs(e.tenant),
                min_runtime_s=self.cfg.min_runtime_s,
                policy_allows=self.book.allows(job),
                may_take=may_take,
            )
            if choice is not None and self._within_rate(choice, now):
                started.append(await self._start(job, choice, now))
                taken.update(r.entry.job_id for r, _ in choice.victims)
        for e in to_hold:
            job = self.book.queued.get(e.job_id)
            if job is not None and e.job_id not in self.holds.preempting:
                self._hold(job, snap, runs, now)
        return started

    def _running(
        self, e: q.QueueEntry, runs: dict[str, tuple[JobRecord, AttemptRecord]], now: float
    ) -> fairness.RunningJob | None:
        run = runs.get(e.job_id)
        if run is None:
            return None
        job, attempt = run
        since = attempt.running_time or attempt.start_time
        running_s = max(0.0, now - since) if since is not None else 0.0
        shapes = {ps.name: ps.shape for ps in self.book.request_of(job).pod_sets}
        replicas = tuple((a.node, shapes[a.pod_set]) for a in attempt.assignments if a.pod_set in shapes)
        # The broker does not know a job's checkpoints: all work since it started counts as lost.
        return fairness.RunningJob(
            e, attempt.cluster, attempt.number, replicas, running_s, e.charged_gpus * running_s / 3600.0
        )

    def _hold_candidates(self, blocked: list[q.QueueEntry], now: float) -> list[q.QueueEntry]:
        """Blocked gangs, big enough and waiting past the bound, while fewer domains than the cap are held."""
        room = self.cfg.max_held_domains - len(self.holds.drains)
        if room <= 0:
            return []
        out = []
        for e in blocked:
            job = self.book.queued.get(e.job_id)
            if (
                job is not None
                and e.job_id not in self.holds.drains.holds
                and e.gpus >= self.cfg.hold_min_gpus
                and now - job.update_time >= self.cfg.hold_after_s
            ):
                out.append(e)
        return out[:room]

    def _hold(
        self, job: JobRecord, snap: q.QueueSnapshot, runs: dict[str, tuple[JobRecord, AttemptRecord]], now: float
    ) -> None:
        busy = []
        for other, a in runs.values():
            start = a.accept_time or a.dispatch_time or a.reserve_time
            ends_by = enforced_end(start, other.max_runtime_s, self.placer.start_bound_s(other))
            busy.append(
                BusyJob(other.job_id, a.cluster, frozenset(r.node for r in a.assignments), ends_by, other.preemptible)
            )
        hold_until = now + self.cfg.max_hold_s
        domain = choose_drain_domain(
            FleetView(self.book.catalog, now),
            self.book.request_of(job),
            busy,
            now=now,
            hold_until=hold_until,
            policy_allows=self.book.allows(job),
            model_ok=lambda m: snap.admit(job.tenant, m, job.gpus, preemptible=job.preemptible).allowed,
        )
        if domain is not None:
            self.holds.hold_domain(job, domain, now, self.cfg.max_hold_s)
            if self.metrics is not None:
                self.metrics.domain_holds.inc()  # type: ignore[attr-defined]

    async def _start(self, job: JobRecord, choice: fairness.PreemptionChoice, now: float) -> Preemption:
        plan = choice.plan
        victims = tuple((r.entry.job_id, why) for r, why in choice.victims)
        deadline = now + self.grace_s + self.cfg.release_timeout_s
        self.holds.hold_for_preemption(job, plan.choice, frozenset(v for v, _ in victims), deadline)
        for r, why in choice.victims:
            # Another tenant's victim learns why, never which job took its place.
            who = f" for {job.job_id}" if r.entry.tenant == job.tenant else ""
            await self.apply(
                job_events.PreemptRequested(
                    r.entry.job_id, r.attempt, grace_s=self.grace_s, message=f"preempted{who}: {_WHY[why]}"
                )
            )
            self.preempted_for[r.entry.job_id] = (job.job_id, now + self.cfg.ping_pong_s)
            self.losses.append((now, r.entry.tenant, plan.choice.cluster, r.lost_gpu_hours))
            if self.metrics is not None:
                self.metrics.preempted(why.value, r.entry.tenant, r.lost_gpu_hours)  # type: ignore[attr-defined]
        done = Preemption(job.job_id, plan.choice.cluster, victims, plan.lost_gpu_hours)
        self.history = (self.history + [done])[-1000:]
        _log.info(
            "preemption started",
            extra={
                "job": job.job_id,
                "cluster": plan.choice.cluster,
                "victims": [v for v, _ in victims],
                "lost_gpu_hours": round(plan.lost_gpu_hours, 3),
            },
        )
        return done

    def _within_rate(self, choice: fairness.PreemptionChoice, now: float) -> bool:
        """Whether the choice keeps every victim tenant and the cluster within the lost-work rate limit."""
        limit = self.cfg.max_lost_gpu_hours_per_hour
        if limit is None:
            return True
        recent = [x for x in self.losses if x[0] > now - 3600.0]
        cluster = choice.plan.choice.cluster
        by_tenant: dict[str, float] = {}
        for r, _ in choice.victims:
            by_tenant[r.entry.tenant] = by_tenant.get(r.entry.tenant, 0.0) + r.lost_gpu_hours
        if sum(x[3] for x in recent if x[2] == cluster) + sum(by_tenant.values()) > limit:
            return False
        return all(sum(x[3] for x in recent if x[1] == t) + lost <= limit for t, lost in by_tenant.items())

    def _expire(self, now: float) -> None:
        self.preempted_for = {k: v for k, v in self.preempted_for.items() if v[1] > now}
        self.losses = [x for x in self.losses if x[0] > now - 3600.0]

    async def run(self) -> None:
        while not self._stopped:
            await asyncio.sleep(self.cfg.interval_s)
            try:
                self._expire(self.clock())
                await self.round()
                self.rounds += 1
            except Exception:
                _log.exception("preemption round failed")

    def stop(self) -> None:
        self._stopped = True


_WHY = {
    fairness.PreemptReason.PRIORITY_BAND: "a job of a higher priority band needed the GPUs",
    fairness.PreemptReason.RECLAIM: "the GPUs were borrowed beyond your quota and their owner needed them",
    fairness.PreemptReason.FAIR_SHARE: "your tenant is above its fair share and another is below",
    fairness.PreemptReason.WITHIN_TENANT: "a higher-priority job of your tenant needed the GPUs",
}
