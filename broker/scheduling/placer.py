"""The scheduling loop: next job by band, fair share and priority; decide over a fleet view; persist, then dispatch."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from placement.model import JobRequest

from fleetplan import catalog as cat
from fleetplan.catalog import ReplicaPlacement
from fleetplan.choice import ClusterChoice, TandemChoice
from fleetplan.decide import (
    Choice, ClusterPredicate, ClusterVerdict, Decision, WaitReason, cluster_verdicts, within_policy,
)
from fleetplan.drain import DrainDomain
from fleetplan.view import FleetView

from broker.domain.specs import SpecReader
from broker.domain import errors, lifecycle
from broker.scheduling import fairness
from broker.scheduling import queue as q
from broker.scheduling.drains import DrainHolds
from broker.domain.events import HoldReleased, JobChanged, NodesHeld, ReservationMade, ToDispatcher, ToPlacer
from broker.tenancy.policy import PolicyFile
from broker.domain.records import JobRecord
from broker.domain.states import HOLDS_CAPACITY, JobState
from broker.store.base import Store

__all__ = ["Placer", "Held", "WaitInfo", "PreemptionHold"]

_log = logging.getLogger("tandem.broker.placer")

DRAIN_RESEND_S = 60.0
"""A held domain's copy in its cluster is sent again this often (and expires after twice that)."""

_SNAPSHOT_SHARE = 5
"""A step waits at least this many times its last snapshot build: rebuilds take at most ~1/(1+5) of the loop."""


@dataclass(frozen=True, slots=True)
class Held:
    """Capacity a job's current attempt holds (quota and fair share are charged for it)."""

    tenant: str
    gpu_model: str
    gpus: float


@dataclass(frozen=True, slots=True)
class PreemptionHold:
    """Nodes held for a waiting job while the jobs preempted for it leave (FLEET-NOTES F-5).

    The hold is a reservation in the catalog overlay, so no other placement takes the freed GPUs; it is
    given back when its job is decided (placed, or, past the deadline, planned again from scratch)."""

    reservation: cat.Reservation
    victims: frozenset[str]
    deadline: float


@dataclass(frozen=True, slots=True)
class WaitInfo:
    reason: WaitReason
    message: str
    evaluated_at: float


def _preempting(victims: frozenset[str], now: float) -> WaitInfo:
    """Why a job whose victims are still leaving waits (the preemptor's blocked-job filter reads the reason)."""
    return WaitInfo(WaitReason.INSUFFICIENT_CAPACITY,
                    f"preempting {len(victims)} job(s) for it; its nodes are held until they leave", now)


class Placer:
    """Owns the in-memory queue view (QUEUED jobs) and usage; `step()` places what it can now."""

    def __init__(
        self,
        store: Store,
        catalog: cat.Catalog,
        policy: PolicyFile,
        *,
        specs: SpecReader,
        send: Callable[[ToDispatcher], None] = lambda _e: None,
        choice: ClusterChoice | None = None,
        clock: Callable[[], float] = time.time,
        batch: int = 64,
        candidate_domains: int = 8,
        reservation_ttl_s: float = 60.0,
        metrics: object | None = None,
        model_weights: Mapping[str, float] | None = None,
        usage_half_life_s: float = 0.0,
        start_timeout_s: float = 600.0,
    ) -> None:
        self.store = store
        self.catalog = catalog
        self.policy = policy
        self.specs = specs
        """Reads the stored specs (the API room owns their wire format)."""
        self.send = send
        """Where reservations go once committed (the hub hands them to the dispatcher)."""
        self.choice = choice or TandemChoice(candidate_domains)
        self.clock = clock
        self.batch = batch
        self.reservation_ttl_s = reservation_ttl_s
        self.metrics = metrics
        self.model_weights = dict(model_weights or {})
        self.book = q.QueueBook(q.policy_from_tenancy(policy.current(), model_weights=self.model_weights))
        self.decayed = fairness.DecayedUsage(usage_half_life_s)
        """Tenants' decayed usage: orders the queue between tenants (never quota, never preemption)."""
        self._policy_seen = policy.current()
        self._version = 0
        self._snap: tuple[int, float, q.QueueSnapshot] | None = None
        self.queued: dict[str, JobRecord] = {}
        self.requests: dict[str, JobRequest] = {}
        self.held: dict[str, Held] = {}
        self.waits: dict[str, WaitInfo] = {}
        self.start_timeout_s = start_timeout_s
        """Default gang start bound: with max runtime, what a backfill job's enforced end is counted from."""
        self.drains = DrainHolds(catalog)
        """Domains held for long-waiting gangs while they drain (see broker.scheduling.drains)."""
        self.preempting: dict[str, PreemptionHold] = {}
        """Waiting jobs whose victims are leaving: the nodes they will get are held for them meanwhile."""
        self._todo: set[str] = set()
        self._wake = asyncio.Event()
        self._stopped = False
        self.snapshot_cost_s = 0.0
        """Seconds the last step spent building the queue snapshot."""

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
                self._entry(job)
        for res in await self.store.active_reservations():
            held_job = jobs.get(res.job_id)
            if held_job is not None:
                self.catalog.add_reservation(self._reservation(held_job, res.cluster, res.attempt, res.assignments,
                                                               res.gpu_model))

    def _request(self, job: JobRecord) -> JobRequest:
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

    def remember(self, job: JobRecord, req: JobRequest) -> None:
        """The request parsed at submission, so the placer does not decode the spec again."""
        if job.job_id not in self.requests:
            self.requests[job.job_id] = self._placeable(job, req)

    def _reservation(self, job: JobRecord, cluster: str, attempt: int, assignments: tuple[ReplicaPlacement, ...],
                     gpu_model: str) -> cat.Reservation:
        req = self._request(job)
        shapes = {ps.name: ps.shape for ps in req.pod_sets}
        replicas = tuple(cat.ReservedReplica(a.pod_set, a.index, a.node) for a in assignments)
        return cat.Reservation(job.job_id, attempt, cluster, replicas, shapes, gpu_model)

    def _entry(self, job: JobRecord) -> None:
        self._version += 1
        held = self.held.get(job.job_id) if job.state in HOLDS_CAPACITY else None
        drain = self.drains.holds.get(job.job_id) if job.state is JobState.QUEUED else None
        model, gpus = (held.gpu_model, held.gpus) if held else (drain.gpu_model, float(drain.idle_gpus)) if drain \
            else ("", 0.0)
        self.book.upsert(q.QueueEntry(
            job_id=job.job_id, tenant=job.tenant, queue=job.queue, band=job.priority_band, priority=job.priority,
            seq=job.seq, state=job.state, gpus=job.gpus, gpu_models=job.gpu_models, preemptible=job.preemptible,
            not_before=job.not_before, charged_model=model, charged_gpus=gpus, drain_hold=drain is not None,
            held=job.held))

    def observe(self, job: JobRecord) -> None:
        """Every committed job change passes here: keeps the queue, holds and overlay in step with the store."""
        if job.state is JobState.QUEUED:
            if job.job_id not in self.queued:
                self._todo.add(job.job_id)
            self.queued[job.job_id] = job
        else:
            self.queued.pop(job.job_id, None)
            self.waits.pop(job.job_id, None)
            gone = self.preempting.pop(job.job_id, None)
            if gone is not None and job.state is not JobState.RESERVED:
                self._release_hold(gone)  # cancelled (or failed) while its victims were leaving
            self.drains.end(job.job_id)
        if job.state not in HOLDS_CAPACITY:
            for holder, hold in self.preempting.items():
                if job.job_id in hold.victims:
                    self._todo.add(holder)  # one of its victims has left: look at it again
            if self.held.pop(job.job_id, None) is not None:
                self.capacity_changed()
            # The attempt ended: its reservation no longer holds anything.
            for key in self.catalog.reservations_of_job(job.job_id):
                self.catalog.drop_reservation(key)
        if job.terminal:
            self.requests.pop(job.job_id, None)
        self._entry(job)
        self._wake.set()

    def on_event(self, event: ToPlacer) -> None:
        """An event from the dispatcher: a job change it committed, or capacity that changed."""
        if isinstance(event, JobChanged):
            self.observe(event.job)
        else:
            self.capacity_changed()

    def capacity_changed(self) -> None:
        """Inventory, cordon or holds changed: every waiting job deserves another look."""
        self._todo.update(self.queued)
        self._wake.set()

    def kick(self) -> None:
        self._wake.set()

    # ------------------------------------------------------------------ ordering (the queue's)

    def snapshot(self, now: float | None = None) -> q.QueueSnapshot:
        """The queue's view; reused for a quarter second while no job changed (reads call this per job)."""
        pol = self.policy.current()
        if pol is not self._policy_seen:
            self._policy_seen = pol
            self.book.set_policy(q.policy_from_tenancy(pol, model_weights=self.model_weights))
            self._version += 1
            self.requests.clear()  # band priorities and allowed models are the policy's: derive them again
            self.capacity_changed()
        t = self.clock() if now is None else now
        cached = self._snap
        if cached is not None and cached[0] == self._version and 0 <= t - cached[1] < 0.25:
            return cached[2]
        snap = self.book.snapshot(t, self._ordering_cost if self.decayed.half_life_s > 0 else None)
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
            job_id, hint=hint.reason if hint else None, hint_message=hint.message if hint else "")

    def why_all(self, snap: q.QueueSnapshot | None = None) -> dict[str, q.WaitInfo]:
        """`why` for every QUEUED job, from one snapshot (`snap`, or the current one)."""
        hints = {job_id: (h.reason, h.message) for job_id, h in self.waits.items()}
        return (snap or self.snapshot()).why_all_waiting(hints)

    async def cluster_verdicts(self, job: JobRecord) -> tuple[ClusterVerdict, ...]:
        """Each allowed cluster's verdict on a queued job now (the core's fit over its reported inventory).

        One cluster per turn of the event loop, each over a view taken for it: an exact gang fit costs
        tens of milliseconds at 1,000 nodes, so a hundred clusters in one go would stall placement and
        every other call for seconds."""
        req, allows = self._request(job), self._allows(job)
        out: list[ClusterVerdict] = []
        for name in sorted(self.catalog.clusters):
            out.extend(cluster_verdicts(FleetView(self.catalog, self.clock()), req, policy_allows=allows, only=name))
            await asyncio.sleep(0)
        return tuple(out)

    # ------------------------------------------------------------------ the step

    def _allows(self, job: JobRecord) -> ClusterPredicate:
        tenant = self.policy.current().tenants.get(job.tenant)
        if tenant is None:
            return lambda _c: False
        return lambda entry: tenant.allows_place(entry.name, entry.meta.region, entry.meta.role)

    def decide_one(self, job: JobRecord, view: FleetView, snap: q.QueueSnapshot | None = None,
                   usage: q.Usage | None = None) -> Decision:
        """Placement for one job, with the quota checked for the model it would actually get."""
        tenant = self.policy.current().tenants.get(job.tenant)
        if tenant is None or not tenant.allows_band(job.priority_band):
            return Decision(None, WaitReason.NOT_ALLOWED, f"the tenancy policy no longer allows tenant {job.tenant} "
                            f"in band {job.priority_band or 'default'}")
        req = self._request(job)
        now = view.now
        if job.not_before > now:
            return Decision(None, WaitReason.RETRY_BACKOFF, f"retry back-off until {job.not_before:.0f}")
        d = self.choice.decide(view, req, policy_allows=self._allows(job))
        if d.choice is not None:
            snap = snap or self.snapshot(now)
            adm = snap.admit(job.tenant, d.choice.gpu_model, d.choice.gpus, preemptible=job.preemptible, usage=usage)
            if not adm.allowed and adm.violation is not None:
                v = adm.violation
                return Decision(None, WaitReason.QUOTA_EXCEEDED,
                                f"{v.quota}: {v.used:g} held + {v.requested:g} > quota {v.limit:g}")
        return d

    async def step(self) -> int:
        """Decide the next batch of jobs that need a look; persist every reservation before it is dispatched.

        Decisions run over a fleet view taken when the step starts and again after each yield to the event
        loop (reports and releases may land then); the step's own holds go through the view."""
        now = self.clock()
        self.catalog.sweep(now)
        for job_id in self.drains.refresh(now):
            if job_id in self.queued:
                self._entry(self.queued[job_id])
        self._tell_drains(now)
        view = FleetView(self.catalog, now)
        t_snap = time.perf_counter()
        snap = self.snapshot(now)
        self.snapshot_cost_s = time.perf_counter() - t_snap
        usage = snap.usage
        # Only the first `batch` waiting jobs are materialised (the order itself is the snapshot's).
        order = list(itertools.islice((self.queued[e.job_id] for e in snap.order()
                                       if e.job_id in self._todo and e.job_id in self.queued), self.batch))
        pending: list[tuple[JobRecord, lifecycle.Reserve]] = []
        commits: list[asyncio.Task[int]] = []
        loop = asyncio.get_running_loop()
        for i, job in enumerate(order):
            if i and i % 16 == 0:
                if len(pending) >= 32:
                    # Commit what this step decided so far while it decides the rest (one group commit each).
                    commits.append(loop.create_task(self._commit(pending)))
                    pending = []
                await asyncio.sleep(0)  # let RPCs in between decisions; every hold is already in the overlay
                view = FleetView(self.catalog, now)
            if job.job_id not in self.queued:
                continue  # cancelled (or otherwise moved) while we yielded
            self._todo.discard(job.job_id)
            hold = self.preempting.get(job.job_id)
            if hold is not None:
                if now < hold.deadline and not self._victims_gone(hold, snap):
                    self.waits[job.job_id] = _preempting(hold.victims, now)
                    continue
                self.catalog.drop_reservation(hold.reservation.key)  # decided below over what is free now
                view = FleetView(self.catalog, now)
            lifted = self.drains.lifted_for(
                job.job_id, job.max_runtime_s,
                self.specs.start_timeout_s(job.spec, self.start_timeout_s) if job.max_runtime_s is not None else 0.0,
                now) if self.drains.holds else []
            if lifted:
                view = FleetView(self.catalog, now)
            t0 = time.perf_counter()
            d = self.decide_one(job, view, snap, self._without_own_drain(job, snap, usage))
            if self.metrics is not None:
                self.metrics.decision_seconds.observe(time.perf_counter() - t0)  # type: ignore[attr-defined]
            if hold is not None:
                self._after_hold(job, hold, d, view, now)
            if lifted:
                if d.choice is not None:
                    view.hold((self._reservation(job, d.choice.cluster, job.attempt + 1, d.choice.assignments,
                                                 d.choice.gpu_model),))
                    self.drains.end(job.job_id)
                self.drains.restore([h for h in lifted if h.job_id in self.drains.holds], now)
                view = FleetView(self.catalog, now)
            if d.choice is None:
                self.waits[job.job_id] = WaitInfo(d.wait or WaitReason.INSUFFICIENT_CAPACITY, d.message, now)
                if d.wait is WaitReason.RETRY_BACKOFF:
                    self._todo.add(job.job_id)
                continue
            c = d.choice
            usage = snap.charge(usage, job.tenant, c.gpu_model, c.gpus)
            # Hold it in the overlay now so the next decision in this batch sees it taken.
            view.hold((self._reservation(job, c.cluster, job.attempt + 1, c.assignments, c.gpu_model),))
            self.held[job.job_id] = Held(job.tenant, c.gpu_model, c.gpus)
            self.queued.pop(job.job_id, None)
            ev = lifecycle.Reserve(job.job_id, job.attempt, c.cluster, c.domain, c.assignments, c.gpu_model, c.gpus,
                                   expires_at=now + self.reservation_ttl_s)
            pending.append((job, ev))
        if self._todo:
            self._wake.set()
        self._tell_drains(now)
        placed = await self._commit(pending, now)
        for n in await asyncio.gather(*commits):
            placed += n
        return placed

    # ------------------------------------------------------------------ preemption holds

    def hold_for_preemption(self, job: JobRecord, choice: Choice, victims: frozenset[str], deadline: float) -> None:
        """Hold the nodes `job` will get once `victims` have left (the preemptor's plan, FLEET-NOTES F-5)."""
        res = self._reservation(job, choice.cluster, job.attempt + 1, choice.assignments, choice.gpu_model)
        self.catalog.add_reservation(res)
        self.preempting[job.job_id] = PreemptionHold(res, victims, deadline)
        # the cluster keeps them too: its extender holds them against pods outside Tandem meanwhile
        self.send(NodesHeld(choice.cluster, job.job_id, job.attempt + 1, job.spec, choice.assignments, deadline))
        self.waits[job.job_id] = _preempting(victims, self.clock())

    def _victims_gone(self, hold: PreemptionHold, snap: q.QueueSnapshot) -> bool:
        for v in hold.victims:
            e = snap.entries.get(v)
            if e is not None and e.state in HOLDS_CAPACITY:
                return False
        return True

    def _after_hold(self, job: JobRecord, hold: PreemptionHold, d: Decision, view: FleetView, now: float) -> None:
        """The held job was decided: placed (the hold is done), or not yet (hold on until the deadline)."""
        if d.choice is not None:
            self.preempting.pop(job.job_id, None)
            if d.choice.cluster != hold.reservation.cluster:  # its dispatch replaces the hold where it lands
                self._release_hold(hold)
        elif now < hold.deadline:
            view.hold((hold.reservation,))  # its victims left but no report shows their nodes free yet
        else:
            self.preempting.pop(job.job_id, None)
            self._release_hold(hold)
            _log.warning("preempted jobs did not free the held nodes in time; planning again",
                         extra={"job": job.job_id, "victims": sorted(hold.victims)})
            if self.metrics is not None:
                self.metrics.preemption_timeouts.inc()  # type: ignore[attr-defined]

    def _tell_drains(self, now: float) -> None:
        """The clusters keep held domains too: their idle GPUs as they change, and holds that ended."""
        for hold in self.drains.take_released():
            self.send(HoldReleased(hold.domain.cluster, hold.job_id, hold.attempt, drain=True))
        for hold, idle in self.drains.outgoing(now, DRAIN_RESEND_S):
            if idle:
                self.send(NodesHeld(hold.domain.cluster, hold.job_id, hold.attempt, b"", (),
                                    now + 2 * DRAIN_RESEND_S, drain=True, idle=idle))
            else:  # nothing idle to keep (yet): no copy in the cluster
                self.send(HoldReleased(hold.domain.cluster, hold.job_id, hold.attempt, drain=True))

    def _without_own_drain(self, job: JobRecord, snap: q.QueueSnapshot, usage: q.Usage) -> q.Usage:
        """The cycle's usage less the idle GPUs the job's own drain hold is charged (they are its to take)."""
        drain = self.drains.holds.get(job.job_id)
        if drain is None or drain.idle_gpus == 0:
            return usage
        return snap.charge(usage, job.tenant, drain.gpu_model, -float(drain.idle_gpus))

    def hold_domain(self, job: JobRecord, domain: DrainDomain, now: float, max_hold_s: float) -> None:
        """Hold `domain` for the waiting gang `job` while it drains (see broker.scheduling.drains)."""
        self.drains.start(job.job_id, domain, now, max_hold_s, attempt=job.attempt + 1)
        self.drains.refresh(now, {job.job_id})
        self._entry(job)
        self._tell_drains(now)
        self.capacity_changed()

    def _release_hold(self, hold: PreemptionHold) -> None:
        r = hold.reservation
        self.send(HoldReleased(r.cluster, r.job_id, r.attempt))

    def request_of(self, job: JobRecord) -> JobRequest:
        """The job's request as placement sees it under the current policy (cached until it ends)."""
        return self._request(job)

    def allows(self, job: JobRecord) -> ClusterPredicate:
        """Which clusters the tenancy policy lets the job's tenant use."""
        return self._allows(job)

    async def _commit(self, pending: list[tuple[JobRecord, lifecycle.Reserve]], now: float | None = None) -> int:
        """Persist reservations (one group commit); only committed ones are dispatched, the rest are given back."""
        now = self.clock() if now is None else now
        placed = 0
        results = await asyncio.gather(*(self.store.apply_event(ev) for _, ev in pending), return_exceptions=True)
        for (job, ev), res in zip(pending, results):
            key = (job.job_id, job.attempt + 1)
            if isinstance(res, BaseException) or res[1].transition is None:
                # Lost the race (cancelled meanwhile) or the commit failed: give the capacity back.
                self.catalog.drop_reservation(key)
                self.held.pop(job.job_id, None)
                if isinstance(res, errors.TandemError) and res.retryable:
                    self.queued[job.job_id] = job
                    self._todo.add(job.job_id)
                    self._wake.set()
                elif not isinstance(res, BaseException):
                    self.observe(res[0])
                else:
                    _log.warning("reserve failed", extra={"job": job.job_id, "error": repr(res)})
                continue
            placed += 1
            if res[1].transition is not None:
                _log.info("job reserved", extra=lifecycle.log_fields(res[0], res[1].transition))
            self.observe(res[0])  # RESERVED: the queue book stops counting it as waiting
            self.waits.pop(job.job_id, None)
            if self.metrics is not None:
                self.metrics.placed(job, now)  # type: ignore[attr-defined]
            self.send(ReservationMade(ev.cluster, job.job_id, job.attempt + 1))
        return placed

    async def run(self, idle_s: float = 0.5, coalesce_s: float = 0.02) -> None:
        """Run steps whenever woken (submission, report, release) and at least every `idle_s`.

        A wake-up waits `coalesce_s` first, so a burst of submissions is decided in one step
        (one queue snapshot) instead of one step each."""
        while not self._stopped:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=idle_s)
                # Rebuilding the queue order costs O(active jobs) per step: with a long queue, gather longer
                # so that rebuilds stay a bounded share of the loop (not a cost per submission).
                await asyncio.sleep(max(coalesce_s, _SNAPSHOT_SHARE * self.snapshot_cost_s))
            except TimeoutError:
                self._todo.update(j.job_id for j in self.queued.values() if j.not_before <= self.clock())
            self._wake.clear()
            try:
                await self.step()
            except Exception:  # noqa: BLE001 - the loop must survive one bad step
                _log.exception("placer step failed")
                await asyncio.sleep(idle_s)

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()
