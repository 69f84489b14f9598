"""The scheduling loop: next job by band, fair share and priority; decide over a fleet view; persist, then dispatch."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Mapping

from broker.domain import errors, job_events
from broker.domain.events import ReservationMade, ToDispatcher
from broker.domain.records import JobRecord
from broker.domain.specs import SpecReader
from broker.scheduling import fairness
from broker.scheduling import queue as q
from broker.scheduling.drains import DrainHolds

# What the placer knows about jobs and the holds it keeps live in their own modules (bases of Placer);
# the records stay importable from here.
from broker.scheduling.placer_book import Held, PreemptionHold, WaitInfo
from broker.scheduling.placer_holds import PlacerHolds, preempting_wait
from broker.store.base import Store
from broker.tenancy.policy import PolicyFile
from fleetplan import catalog as cat
from fleetplan.choice import ClusterChoice, TandemChoice
from fleetplan.decide import Decision, WaitReason
from fleetplan.view import FleetView

__all__ = ["Placer", "Held", "WaitInfo", "PreemptionHold"]

_log = logging.getLogger("tandem.broker.placer")

_SNAPSHOT_SHARE = 5
"""A step waits at least this many times its last snapshot build: rebuilds take at most ~1/(1+5) of the loop."""


class Placer(PlacerHolds):
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
        self._snap = None
        self.queued = {}
        self.requests = {}
        self.held = {}
        self.waits = {}
        self.start_timeout_s = start_timeout_s
        """Default gang start bound: with max runtime, what a backfill job's enforced end is counted from."""
        self.drains = DrainHolds(catalog)
        """Domains held for long-waiting gangs while they drain (see broker.scheduling.drains)."""
        self.preempting = {}
        """Waiting jobs whose victims are leaving: the nodes they will get are held for them meanwhile."""
        self._todo = set()
        self._wake = asyncio.Event()
        self._stopped = False
        self.snapshot_cost_s = 0.0
        """Seconds the last step spent building the queue snapshot."""

    # ------------------------------------------------------------------ the step

    def decide_one(
        self, job: JobRecord, view: FleetView, snap: q.QueueSnapshot | None = None, usage: q.Usage | None = None
    ) -> Decision:
        """Placement for one job, with the quota checked for the model it would actually get."""
        tenant = self.policy.current().tenants.get(job.tenant)
        if tenant is None or not tenant.allows_band(job.priority_band):
            return Decision(
                None,
                WaitReason.NOT_ALLOWED,
                f"the tenancy policy no longer allows tenant {job.tenant} in band {job.priority_band or 'default'}",
            )
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
                return Decision(
                    None, WaitReason.QUOTA_EXCEEDED, f"{v.quota}: {v.used:g} held + {v.requested:g} > quota {v.limit:g}"
                )
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
        order = list(
            itertools.islice(
                (self.queued[e.job_id] for e in snap.order() if e.job_id in self._todo and e.job_id in self.queued),
                self.batch,
            )
        )
        pending: list[tuple[JobRecord, job_events.Reserve]] = []
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
                    self.waits[job.job_id] = preempting_wait(hold.victims, now)
                    continue
                self.catalog.drop_reservation(hold.reservation.key)  # decided below over what is free now
                view = FleetView(self.catalog, now)
            lifted = (
                self.drains.lifted_for(
                    job.job_id,
                    job.max_runtime_s,
                    self.specs.start_timeout_s(job.spec, self.start_timeout_s)
                    if job.max_runtime_s is not None
                    else 0.0,
                    now,
                )
                if self.drains.holds
                else []
            )
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
                    view.hold(
                        (
                            self._reservation(
                                job, d.choice.cluster, job.attempt + 1, d.choice.assignments, d.choice.gpu_model
                            ),
                        )
                    )
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
            ev = job_events.Reserve(
                job.job_id,
                job.attempt,
                c.cluster,
                c.domain,
                c.assignments,
                c.gpu_model,
                c.gpus,
                expires_at=now + self.reservation_ttl_s,
            )
            pending.append((job, ev))
        if self._todo:
            self._wake.set()
        self._tell_drains(now)
        placed = await self._commit(pending, now)
        for n in await asyncio.gather(*commits):
            placed += n
        return placed

    async def _commit(self, pending: list[tuple[JobRecord, job_events.Reserve]], now: float | None = None) -> int:
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
            except Exception:
                _log.exception("placer step failed")
                await asyncio.sleep(idle_s)

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()
