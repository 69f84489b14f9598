"""The scheduling loop: next job by band, fair share and priority; decide over a fleet view; persist, then dispatch."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Mapping

from broker.domain import errors, job_events
from broker.domain.events import JobChanged, ReservationMade, ToDispatcher, ToPlacer
from broker.domain.records import JobRecord
from broker.domain.specs import SpecReader
from broker.scheduling import queue as q
from broker.scheduling.drains import DrainHolds
from broker.scheduling.placer_book import Held, JobBook, WaitHint
from broker.scheduling.placer_holds import Holds, preempting_wait
from broker.store.base import Store
from broker.tenancy.policy import PolicyFile
from fleetplan import catalog as cat
from fleetplan.choice import ClusterChoice, TandemChoice
from fleetplan.decide import Decision, WaitReason
from fleetplan.view import FleetView
from placement.model import JobRequest

__all__ = ["Placer"]

_log = logging.getLogger("tandem.broker.placer")

_SNAPSHOT_SHARE = 5
"""A step waits at least this many times its last snapshot build: rebuilds take at most ~1/(1+5) of the loop."""


class Placer:
    """The scheduling loop: `step()` places what it can now. Owns the job book (what it knows about jobs and
    the queue's order over them) and the holds (capacity kept for waiting jobs); the rest of the broker tells
    it through the methods below, and reads the book and the holds themselves (`book`, `holds`)."""

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
        self.send = send
        """Where reservations go once committed (the hub hands them to the dispatcher)."""
        self.choice = choice or TandemChoice(candidate_domains)
        self.batch = batch
        self.reservation_ttl_s = reservation_ttl_s
        self.metrics = metrics
        self.start_timeout_s = start_timeout_s
        """Default gang start bound: with max runtime, what a backfill job's enforced end is counted from."""
        drains = DrainHolds(catalog)
        self.book = JobBook(
            store,
            catalog,
            policy,
            specs=specs,
            drains=drains,
            clock=clock,
            model_weights=model_weights,
            usage_half_life_s=usage_half_life_s,
        )
        """Jobs, their requests, held capacity, why they wait, the queue's order: what the API, the preemptor
        and the metrics read. Also the store, catalog, policy, spec reader and clock the placer works with."""
        self.holds = Holds(self.book, drains, send=send, metrics=metrics)
        """Preemption holds and held domains: the preemptor starts them, the step consults them."""
        self._stopped = False
        self.snapshot_cost_s = 0.0
        """Seconds the last step spent building the queue snapshot."""

    # ------------------------------------------------------------------ told by the rest of the broker

    async def load(self) -> None:
        """After a restart: queued jobs, holds and reservations come back from the store (inventory does not)."""
        await self.book.load()

    def observe(self, job: JobRecord) -> None:
        """Every committed job change passes here: keeps the holds, the queue and the overlay in step with the
        store (the holds first: a job that left the queue gives its held domain back before it is charged)."""
        self.holds.observe(job)
        self.book.observe(job)

    def on_event(self, event: ToPlacer) -> None:
        """An event from the dispatcher: a job change it committed, or capacity that changed."""
        if isinstance(event, JobChanged):
            self.observe(event.job)
        else:
            self.capacity_changed()

    def capacity_changed(self) -> None:
        """Inventory, cordon or holds changed: every waiting job deserves another look."""
        self.book.capacity_changed()

    def remember(self, job: JobRecord, req: JobRequest) -> None:
        """The request parsed at submission, so the placer does not decode the spec again."""
        self.book.remember(job, req)

    # ------------------------------------------------------------------ the step

    def start_bound_s(self, job: JobRecord) -> float:
        """The gang start bound counted into the job's enforced end: its spec's, or the default (0 without a
        max runtime, whose end is unbounded anyway: its spec is not decoded)."""
        if job.max_runtime_s is None:
            return 0.0
        return self.book.specs.start_timeout_s(job.spec, self.start_timeout_s)

    def decide_one(
        self, job: JobRecord, view: FleetView, snap: q.QueueSnapshot | None = None, usage: q.Usage | None = None
    ) -> Decision:
        """Placement for one job, with the quota checked for the model it would actually get."""
        tenant = self.book.policy.current().tenants.get(job.tenant)
        if tenant is None or not tenant.allows_band(job.priority_band):
            return Decision(
                None,
                WaitReason.NOT_ALLOWED,
                f"the tenancy policy no longer allows tenant {job.tenant} in band {job.priority_band or 'default'}",
            )
        req = self.book.request_of(job)
        now = view.now
        if job.not_before > now:
            return Decision(None, WaitReason.RETRY_BACKOFF, f"retry back-off until {job.not_before:.0f}")
        d = self.choice.decide(view, req, policy_allows=self.book.allows(job))
        if d.choice is not None:
            snap = snap or self.book.snapshot(now)
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
        book, holds, catalog = self.book, self.holds, self.book.catalog
        now = book.clock()
        catalog.sweep(now)
        for job_id in holds.drains.refresh(now):
            if job_id in book.queued:
                book.refresh_entry(book.queued[job_id])
        holds.tell_clusters(now)
        view = FleetView(catalog, now)
        t_snap = time.perf_counter()
        snap = book.snapshot(now)
        self.snapshot_cost_s = time.perf_counter() - t_snap
        usage = snap.usage
        # Only the first `batch` waiting jobs are materialised (the order itself is the snapshot's).
        order = list(
            itertools.islice(
                (book.queued[e.job_id] for e in snap.order() if e.job_id in book.todo and e.job_id in book.queued),
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
                view = FleetView(catalog, now)
            if job.job_id not in book.queued:
                continue  # cancelled (or otherwise moved) while we yielded
            book.todo.discard(job.job_id)
            hold = holds.preempting.get(job.job_id)
            if hold is not None:
                if now < hold.deadline and not holds.victims_gone(hold, snap):
                    book.waits[job.job_id] = preempting_wait(hold.victims, now)
                    continue
                catalog.drop_reservation(hold.reservation.key)  # decided below over what is free now
                view = FleetView(catalog, now)
            lifted = (
                holds.drains.lifted_for(job.job_id, job.max_runtime_s, self.start_bound_s(job), now)
                if holds.drains.holds
                else []
            )
            if lifted:
                view = FleetView(catalog, now)
            t0 = time.perf_counter()
            d = self.decide_one(job, view, snap, holds.usage_without_own_drain(job, snap, usage))
            if self.metrics is not None:
                self.metrics.decision_seconds.observe(time.perf_counter() - t0)  # type: ignore[attr-defined]
            if hold is not None:
                holds.after_decision(job, hold, d, view, now)
            if lifted:
                if d.choice is not None:
                    view.hold(
                        (
                            book.reservation(
                                job, d.choice.cluster, job.attempt + 1, d.choice.assignments, d.choice.gpu_model
                            ),
                        )
                    )
                    holds.drains.end(job.job_id)
                holds.drains.restore([h for h in lifted if h.job_id in holds.drains.holds], now)
                view = FleetView(catalog, now)
            if d.choice is None:
                book.waits[job.job_id] = WaitHint(d.wait or WaitReason.INSUFFICIENT_CAPACITY, d.message, now)
                if d.wait is WaitReason.RETRY_BACKOFF:
                    book.todo.add(job.job_id)
                continue
            c = d.choice
            usage = snap.charge(usage, job.tenant, c.gpu_model, c.gpus)
            # Hold it in the overlay now so the next decision in this batch sees it taken.
            view.hold((book.reservation(job, c.cluster, job.attempt + 1, c.assignments, c.gpu_model),))
            book.held[job.job_id] = Held(job.tenant, c.gpu_model, c.gpus)
            book.queued.pop(job.job_id, None)
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
        if book.todo:
            book.wake.set()
        holds.tell_clusters(now)
        placed = await self._commit(pending, now)
        for n in await asyncio.gather(*commits):
            placed += n
        return placed

    async def _commit(self, pending: list[tuple[JobRecord, job_events.Reserve]], now: float | None = None) -> int:
        """Persist reservations (one group commit); only committed ones are dispatched, the rest are given back."""
        now = self.book.clock() if now is None else now
        placed = 0
        results = await asyncio.gather(*(self.book.store.apply_event(ev) for _, ev in pending), return_exceptions=True)
        for (job, ev), res in zip(pending, results):
            key = (job.job_id, job.attempt + 1)
            if isinstance(res, BaseException) or res[1].transition is None:
                # Lost the race (cancelled meanwhile) or the commit failed: give the capacity back.
                self.book.catalog.drop_reservation(key)
                self.book.held.pop(job.job_id, None)
                if isinstance(res, errors.TandemError) and res.retryable:
                    self.book.queued[job.job_id] = job
                    self.book.todo.add(job.job_id)
                    self.book.wake.set()
                elif not isinstance(res, BaseException):
                    self.observe(res[0])
                else:
                    _log.warning("reserve failed", extra={"job": job.job_id, "error": repr(res)})
                continue
            placed += 1
            self.observe(res[0])  # RESERVED: the queue book stops counting it as waiting
            self.book.waits.pop(job.job_id, None)
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
                await asyncio.wait_for(self.book.wake.wait(), timeout=idle_s)
                # Rebuilding the queue order costs O(active jobs) per step: with a long queue, gather longer
                # so that rebuilds stay a bounded share of the loop (not a cost per submission).
                await asyncio.sleep(max(coalesce_s, _SNAPSHOT_SHARE * self.snapshot_cost_s))
            except TimeoutError:
                self.book.todo.update(j.job_id for j in self.book.queued.values() if j.not_before <= self.book.clock())
            self.book.wake.clear()
            try:
                await self.step()
            except Exception:
                _log.exception("placer step failed")
                await asyncio.sleep(idle_s)

    def stop(self) -> None:
        self._stopped = True
        self.book.wake.set()
