"""Fast mode's fairness (tandem-fair): the broker's held domains for long-waiting gangs and its preemption rounds."""

from __future__ import annotations

from collections.abc import Sequence

from broker.domain.states import JobState
from broker.scheduling import fairness
from broker.scheduling.drains import DrainHold
from broker.scheduling.queue import QueueEntry, QueueSnapshot
from fleetplan.catalog import Reservation, ReservedReplica
from fleetplan.drain import BusyJob, choose_drain_domain, enforced_end
from fleetplan.view import FleetView
from fleetsim.fast_pods import FastPods
from fleetsim.fast_records import EVENT_PREEMPTED, EVENT_ROUND, JOB_RUNNING, POD_SET, FastJob
from fleetsim.model import WorkItem

__all__ = ["FastFairness"]


class FastFairness(FastPods):
    """Held domains and preemption, as the broker's preemptor does them (tandem-fair only)."""

    # ------------------------------------------------------------------ held domains (tandem-fair)

    def _drain_kinds(self, cluster: str, nodes: Sequence[str]) -> None:
        """A held domain's room came back to everyone: jobs that found none there may look again."""
        cell = self.cells[cluster]
        for k in {cell.kinds[cell.row[n]] for n in nodes if n in cell.row}:
            self.kind_epoch[k] += 1
        self.change[cluster] += 1

    def _recharge(self, job_id: str) -> None:
        """The holder's charge follows the idle GPUs its domain keeps (broker: the queue entry's drain_hold)."""
        job = self.jobs[job_id]
        hold = self.drains.holds.get(job_id)
        new = (hold.gpu_model, float(hold.idle_gpus)) if hold is not None else ("", 0.0)
        if new == job.drain_charge:
            return
        tenant = job.item.tenant
        old_model, old_gpus = job.drain_charge
        if old_gpus:
            self.usage[(tenant, old_model)] = self.usage.get((tenant, old_model), 0.0) - old_gpus
            self.usage_epoch[tenant] = self.usage_epoch.get(tenant, 0) + 1
        if new[1]:
            self.usage[(tenant, new[0])] = self.usage.get((tenant, new[0]), 0.0) + new[1]
        job.drain_charge = new
        self._usage_version += 1

    def _refresh_drains(self) -> None:
        for job_id in self.drains.refresh(self.now):
            self._recharge(job_id)
        for hold in self.drains.take_released():  # given up at their end, undrained
            self._drain_kinds(hold.domain.cluster, hold.domain.nodes)
            self._note("hold-ended", hold.job_id)

    def _restore_drains(self, lifted: list[DrainHold]) -> None:
        for job_id in self.drains.restore([h for h in lifted if h.job_id in self.drains.holds], self.now):
            self._recharge(job_id)

    def _end_drain(self, job: FastJob) -> None:
        self.drains.end(job.item.name)
        self._recharge(job.item.name)
        for hold in self.drains.take_released():
            self._drain_kinds(hold.domain.cluster, hold.domain.nodes)

    def _maybe_hold(self, snap: QueueSnapshot) -> None:
        """The broker's preemptor round, its held-domain half (broker.scheduling.preemptor.Preemptor._hold)."""
        p = self.params
        room = p.max_held_domains - len(self.drains)
        if room <= 0:
            return
        busy: list[BusyJob] | None = None
        for entry in snap.order():
            job = self.queued.get(entry.job_id)
            if (
                job is None
                or job.hold is not None
                or job.item.name in self.drains.holds
                or job.failed is None
                or job.failed[0] != "room"
                or job.item.gpu_cost < p.hold_min_gpus
                or self.now - job.queued_at < p.hold_after_s
            ):
                continue
            if busy is None:
                busy = [
                    BusyJob(
                        j.item.name,
                        j.cell,
                        frozenset(a.node for a in j.choice.assignments),
                        enforced_end(j.run_start, j.item.max_runtime_s, p.start_timeout_s),
                        j.item.preemptible,
                    )
                    for j in self.jobs.values()
                    if j.state == JOB_RUNNING and j.choice is not None
                ]
            it = job.item

            def model_ok(m: str, it: WorkItem = it) -> bool:
                return snap.admit(it.tenant, m, it.gpu_cost, preemptible=it.preemptible).allowed

            domain = choose_drain_domain(
                FleetView(self.catalog, self.now),
                job.req,
                busy,
                now=self.now,
                hold_until=self.now + p.max_hold_s,
                model_ok=model_ok,
            )
            if domain is None:
                continue
            self.drains.start(job.item.name, domain, self.now, p.max_hold_s)
            self.drains.refresh(self.now, {job.item.name})
            self._recharge(job.item.name)
            self.holds_started += 1
            self._note("hold", job.item.name, f"{domain.cluster}/{'/'.join(domain.path)}")
            room -= 1
            if room <= 0:
                return

    # ------------------------------------------------------------------ preemption (tandem-fair)

    def _hold_over(self, job: FastJob) -> bool:
        """Its victims have left (or they are past the deadline): the held job is decided again."""
        assert job.hold is not None
        _, victims, deadline = job.hold
        return self.now >= deadline or not any(self.jobs[v].preempting for v in victims)

    def _maybe_preempt(self) -> None:
        """The broker's preemptor round (broker.scheduling.preemptor.Preemptor.round) over this state, every interval."""
        p = self.params
        if self.now - self._last_preempt < p.preempt_interval_s:
            return
        self._last_preempt = self.now
        self._preempt_round()
        self._maybe_hold(self._snapshot())
        if any(j.failed is not None and j.hold is None for j in self.queued.values()):
            t = self.now + p.preempt_interval_s  # the next look, even if nothing else wakes the rounds
            if self._round_at is None or t < self._round_at:
                self._round_at = t
                self._at(t, EVENT_ROUND, t)

    def _preempt_round(self) -> None:
        p = self.params
        running: list[fairness.RunningJob] = []
        for j in self.jobs.values():
            if j.state != JOB_RUNNING or not j.item.preemptible or j.preempting or j.choice is None:
                continue
            entry = QueueEntry(
                job_id=j.item.name,
                tenant=j.item.tenant,
                queue="default",
                band="",
                priority=j.item.priority,
                seq=j.seq,
                state=JobState.RUNNING,
                gpus=j.item.gpu_cost,
                gpu_models=j.item.gpu_models,
                preemptible=True,
                charged_model=j.model,
                charged_gpus=j.charged,
            )
            ran = self.now - j.run_start
            lost = ran - (ran // p.checkpoint_s) * p.checkpoint_s if p.checkpoint_s > 0 else ran
            running.append(
                fairness.RunningJob(
                    entry,
                    j.cell,
                    j.attempt,
                    tuple((a.node, j.shape) for a in j.choice.assignments),
                    ran,
                    j.item.gpu_cost * lost / 3600.0,
                )
            )
        if not running:
            return
        snap = self._snapshot()
        shares = fairness.shares_of(snap, float(self.fleet.gpus))
        key = (self._fingerprint(), sum(1 for r in running if r.running_s >= p.preempt_min_runtime_s))
        view = FleetView(self.catalog, self.now)
        taken: set[str] = set()
        plans = 0
        for entry in snap.order()[:16]:
            job = self.queued.get(entry.job_id)
            if job is None or job.hold is not None or job.failed is None or job.failed[0] != "room":
                continue  # only jobs the last decision found no room for (not quota, not undecided)
            if job.searched == key:
                continue
            choice = fairness.choose_preemption(
                view,
                snap,
                shares,
                entry,
                job.req,
                [r for r in running if r.entry.job_id not in taken],
                fairness.TenantKnobs(),
                min_runtime_s=p.preempt_min_runtime_s,
            )
            if choice is None:
                job.searched = key
                continue
            c = choice.plan.choice
            res = Reservation(
                job.item.name,
                job.attempt + 1,
                c.cluster,
                tuple(ReservedReplica(a.pod_set, a.index, a.node) for a in c.assignments),
                {POD_SET: job.shape},
                c.gpu_model,
            )
            view.hold((res,))
            victims = frozenset(r.entry.job_id for r, _ in choice.victims)
            job.hold = (res, victims, self.now + p.preempt_grace_s + p.preempt_release_s)
            for r, why in choice.victims:
                victim = self.jobs[r.entry.job_id]
                victim.preempting = True
                victim.outcome.preemptions += 1
                self.preemptions[why.value] = self.preemptions.get(why.value, 0) + 1
                self._note("preempt", victim.item.name, f"{why.value} for {job.item.name}")
                self._at(self.now + p.preempt_grace_s, EVENT_PREEMPTED, (victim, victim.attempt))
            taken |= victims
            plans += 1
            if plans >= 4:
                break

    def _preempted(self, payload: tuple[FastJob, int]) -> None:
        """A victim's grace period is over: its pods go, the work since its last checkpoint is lost, and it is
        queued again with its original arrival (no retry spent)."""
        job, attempt = payload
        job.preempting = False
        if job.attempt != attempt or job.state != JOB_RUNNING:
            return  # it finished during its grace period
        p = self.params
        ran = self.now - job.run_start
        kept = (ran // p.checkpoint_s) * p.checkpoint_s if p.checkpoint_s > 0 else 0.0
        job.done_s += kept
        out = job.outcome
        out.lost_gpu_s += (ran - kept) * job.item.gpu_cost
        out.ran_s += ran
        for copy in job.copies:
            self._withdraw(copy)
        self._drop_reservation(job)
        self._uncharge(job)
        self.running -= 1
        self._note("preempted", job.item.name)
        self._enqueue(job)
