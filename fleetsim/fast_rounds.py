"""Fast mode's scheduling rounds: the broker's placer over one view per round (the cluster choices) and multikueue's worker queues."""

from __future__ import annotations

import time

from broker.scheduling.drains import DrainHold
from broker.scheduling.queue import QueueSnapshot
from fleetplan.catalog import Reservation, ReservedReplica
from fleetplan.choice import RoundRobinChoice, usable_clusters
from fleetplan.decide import Choice, Decision, allow_every_cluster
from fleetplan.view import ClusterState, FleetView
from fleetsim.fast_fair import FastFairness
from fleetsim.fast_records import EVENT_DISPATCH, JOB_RESERVED, POD_SET, FastJob

__all__ = ["FastRounds"]


class FastRounds(FastFairness):
    """A scheduling round: decide the queued jobs in queue order, admit by quota, hold each choice in the view."""

    # ------------------------------------------------------------------ rounds

    def _round(self, at: float) -> None:
        if self._round_at != at:
            return  # superseded by an earlier round
        self._round_at = None
        self._last_round = self.now
        if not self.queued:
            return
        for name in self.cells:
            self.catalog.heartbeat(name, self.now)  # agents stay connected: their heartbeats keep reports fresh
        self.catalog.sweep(self.now)
        if self.drains.holds:
            self._refresh_drains()
        view = FleetView(self.catalog, self.now)
        rr = self.choice if isinstance(self.choice, RoundRobinChoice) else None
        if rr is not None:
            # Its cursor moves on every decision, so whom a job asks depends on the round. A round that decided
            # nothing repeats exactly whenever the state and the cursor's phase repeat: then only the cursor moves
            # (one step per queued job, as each skipped decision moves it).
            idle = (self._fingerprint(), rr.turn % self._rr_period)
            if self.memo and idle in self._idle_rounds:
                rr.turn += len(self.queued)
            else:
                decided = len(self.latency)
                self._round_choice(self._snapshot(), view)
                if len(self.latency) == decided:
                    self._idle_rounds.add(idle)
            if self.queued:
                self._wake()
            return
        picks: dict[tuple[int, tuple[str, ...]], str] = {}
        # Nothing to decide unless some job's last "no" may be out of date (a round's own holds only take room);
        # a job found up to date stays so while nothing moved at all.
        fp = self._fingerprint()
        due = any(j.hold is not None and self._hold_over(j) for j in self.queued.values())
        for j in self.queued.values():
            if due:
                break
            if j.checked == fp:
                continue
            if not self._still_no(j, j.failed, self._pick(view, j, picks) if self.policy == "aggregate" else ""):
                due = True
                break
            j.checked = fp
        if due:
            snap = self._snapshot()
            if self.policy == "multikueue":
                self._round_multikueue(snap)
            else:
                self._round_choice(snap, view)
        if self.policy == "tandem-fair":
            self._maybe_preempt()

    def _round_choice(self, snap: QueueSnapshot, view: FleetView) -> None:
        """broker.scheduling.placer.Placer.step over one view: decide in queue order, admit by quota, hold in the view."""
        assert self.choice is not None
        usage = snap.usage
        rr = self.choice if isinstance(self.choice, RoundRobinChoice) else None
        # round-robin's candidates depend on the view's usability and what the request limits (level, clusters):
        # the same for every request alike within one round
        lists: dict[tuple[object, ...], list[ClusterState] | Decision] = {}
        # A "no" holds for every request alike (shape, size, level, tenant) until this round's next hold: the
        # decision and the admission read nothing else of a job.
        asked: dict[tuple[object, ...], tuple[int, tuple[object, ...]]] = {}
        holds = 0
        lifted_before: list[DrainHold] = []
        for entry in snap.order():
            job = self.queued.get(entry.job_id)
            if job is None:
                continue
            if lifted_before:  # what the previous decision lifted is held again first
                self._restore_drains(lifted_before)
                lifted_before = []
                view = FleetView(self.catalog, self.now)
            lifted = (
                self.drains.lifted_for(job.item.name, job.item.max_runtime_s, self.params.start_timeout_s, self.now)
                if self.drains.holds
                else []
            )
            lifted_before = lifted
            if lifted:
                view = FleetView(self.catalog, self.now)
                asked.clear()
                job.failed = None  # a "no" made with the holds in place says nothing about them lifted
            rehold: tuple[Reservation, frozenset[str], float] | None = None
            if job.hold is not None:
                if not self._hold_over(job):
                    continue  # its victims are still leaving: its nodes stay held
                # as the broker's placer: the hold is given back right before its own decision
                rehold, job.hold, job.failed = job.hold, None, None
                self.catalog.drop_reservation(rehold[0].key)
                view = FleetView(self.catalog, self.now)
                asked.clear()
            # The cluster this decision will ask: round-robin's at its cursor, aggregate's top estimate (read
            # after this round's earlier holds), both from the choice's own candidate list; "" for Tandem's.
            pick = ""
            if rr is not None:
                req = job.req
                key = (req.required_level, job.excluded)  # fast mode's requests name no clusters, regions or roles
                cands = lists.get(key)
                if cands is None:
                    cands = lists[key] = usable_clusters(view, req, allow_every_cluster, job.excluded)
                if isinstance(cands, list):
                    pick = cands[rr.turn % len(cands)].name
                if self._still_no(job, job.tried.get(pick), pick):
                    rr.turn += 1  # the same "no" as last time: only the cursor moves, as deciding would move it
                    continue
            elif self.policy == "aggregate":
                pick = self._pick(view, job, {})
                if self._still_no(job, job.failed, pick):
                    continue
            elif self._still_no(job, job.failed, pick):
                continue
            it = job.item
            alike = (
                job.code,
                it.replicas,
                it.min_replicas,
                it.required_level,
                it.tenant,
                it.preemptible,
                job.excluded,
                pick,
            )
            same = asked.get(alike)
            if self.memo and same is not None and same[0] == holds:
                if rr is not None:
                    job.tried[pick] = same[1]
                    rr.turn += 1  # as deciding would move it
                else:
                    job.failed = same[1]
                continue
            t0 = time.perf_counter()
            d = self.choice.decide(view, job.req, excluded_clusters=job.excluded)
            self.latency.append(time.perf_counter() - t0)
            c = d.choice
            refused: Choice | None = None
            if c is not None:
                own_model, own_idle = job.drain_charge  # its held domain's idle GPUs are its own to take
                mine = snap.charge(usage, job.item.tenant, own_model, -own_idle) if own_idle else usage
                adm = snap.admit(job.item.tenant, c.gpu_model, c.gpus, preemptible=job.item.preemptible, usage=mine)
                if not adm.allowed and adm.violation is not None:
                    refused, c = c, None
            if c is None and rehold is not None and self.now < rehold[2]:
                view.hold((rehold[0],))  # no report shows its victims' nodes free yet
                job.hold = rehold
                continue
            if c is None:
                record = self._record(job, pick, refused, snap, usage, view)
                asked[alike] = (holds, record)
                if rr is not None:
                    job.tried[pick] = record
                else:
                    job.failed = record
                continue
            usage = snap.charge(usage, job.item.tenant, c.gpu_model, c.gpus)
            job.attempt += 1
            res = Reservation(
                job.item.name,
                job.attempt,
                c.cluster,
                tuple(ReservedReplica(a.pod_set, a.index, a.node) for a in c.assignments),
                {POD_SET: job.shape},
                c.gpu_model,
            )
            view.hold((res,))  # the next decision of this round sees it taken
            holds += 1
            self.change[c.cluster] += 1
            self._placed(job, c.cluster)
            job.choice = c
            self._charge(job, c.gpu_model, c.gpus)
            self._at(self.now + self.params.dispatch_delay_s, EVENT_DISPATCH, (job, job.attempt))
            if job.item.name in self.drains.holds:
                self._end_drain(job)
                lifted_before = [h for h in lifted_before if h.job_id != job.item.name]
        if lifted_before:
            self._restore_drains(lifted_before)

    def _placed(self, job: FastJob, cluster: str) -> None:
        del self.queued[job.item.name]
        self._queue_version += 1
        job.state = JOB_RESERVED
        job.cell = cluster
        out = job.outcome
        if out.placed_s is None:
            out.placed_s = self.now
        out.dispatches += 1
        self._note("reserve", job.item.name, cluster)

    def _round_multikueue(self, snap: QueueSnapshot) -> None:
        """MultiKueue: a copy to every cluster whose worker queue admits the job now (a flavor per GPU model
        with nominal quota = the cluster's GPUs of that model, charged by admitted copies, blind to background
        pods and topology); the broker's tenant quota is checked for the flavor of each copy."""
        usage = snap.usage
        asked: dict[tuple[object, ...], tuple[int, tuple[object, ...]]] = {}  # as in _round_choice
        sent = 0
        for entry in snap.order():
            job = self.queued.get(entry.job_id)
            if job is None or self._still_no(job, job.failed, ""):
                continue
            it = job.item
            alike = (job.code, it.gpu_cost, it.replicas, it.tenant, it.preemptible, job.excluded)
            same = asked.get(alike)
            if self.memo and same is not None and same[0] == sent:
                job.failed = same[1]
                continue
            t0 = time.perf_counter()
            want = job.item.gpu_cost
            charge = job.item.replicas * job.shape.gpu_cost  # what the broker charges (Choice.gpus)
            flavors: list[tuple[str, str]] = []
            for c in self.fleet.clusters:
                if c.name in job.excluded:
                    continue
                for model in self._flavors(c.name, job):
                    key = (c.name, model)
                    adm = snap.admit(job.item.tenant, model, charge, preemptible=job.item.preemptible, usage=usage)
                    if self.admitted[key] + want <= self.nominal[key] + 1e-9 and (adm.allowed or adm.violation is None):
                        flavors.append(key)
                        break
            self.latency.append(time.perf_counter() - t0)
            if not flavors:
                job.failed = self._record(job, "", None, snap, usage, None)
                asked[alike] = (sent, job.failed)
                continue
            sent += 1
            usage = snap.charge(usage, job.item.tenant, flavors[0][1], charge)
            job.attempt += 1
            self._placed(job, flavors[0][0])
            self._charge(job, flavors[0][1], charge)
            for key in flavors:
                self.admitted[key] += want
            self._at(self.now + self.params.dispatch_delay_s, EVENT_DISPATCH, (job, job.attempt, tuple(flavors)))
