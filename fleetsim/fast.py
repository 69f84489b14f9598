"""Fast mode: the fleet in virtual time, in-process, over the broker's own decision seam.

A discrete-event simulation (one heap of timed events). Every cluster's true state is placement Nodes with what
is bound on them (`fleetsim.fast_cluster.Cell`); the broker sees it only through inventory reports sent every
`report_interval_s` to a `fleetplan.catalog.Catalog`, which also holds the broker's reservations, so its view
lags and background pods (which never go through Tandem) can make it wrong. Every `cycle_s` a scheduling round
takes the queued jobs in the broker's queue order (`broker.scheduling.queue.QueueSnapshot`: weighted fair share, quotas by
`admit`), decides each over one `FleetView` with the configured `fleetplan.choice` and holds each choice in the
view, as `broker.scheduling.placer.Placer.step` does. Only the cluster choice differs between policies; what a cluster
does with the pods it is given is the same for all:

* tandem / merged: pinned dispatch — after `dispatch_delay_s` every replica binds on its assigned node if it
  still fits the true state, else the dispatch was false and the job is re-planned;
* aggregate / round-robin: the choice (asked without the required level: Karmada-style estimators do not see
  topology) picks the cluster; the pods go there unpinned and kube-scheduler places them one by one, the
  required level as pod affinity, gang-unaware; a gang that has not fully bound after `gang_timeout_s` is
  withdrawn and re-planned;
* multikueue: a copy in every cluster whose worker queue admits it (per-GPU-model quota = the cluster's GPUs),
  the first copy to bind whole wins, the others are withdrawn.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import Any

from broker.scheduling import fairness
from fleetsim.fast_records import (
    BACKGROUND_GPUS,
    CAUSE_GANG_TIMEOUT,
    CAUSE_NODE_TAKEN,
    EVENT_ARRIVE,
    EVENT_BG_ARRIVE,
    EVENT_BG_END,
    EVENT_DISPATCH,
    EVENT_FINISH,
    EVENT_PREEMPTED,
    EVENT_REPORT,
    EVENT_ROUND,
    EVENT_SAMPLE,
    EVENT_TIMEOUT,
    JOB_BINDING,
    JOB_NEVER,
    JOB_QUEUED,
    JOB_RESERVED,
    POLICIES,
    BackgroundPod,
    FastParams,
    shape_of,
)
from fleetsim.fast_rounds import FastRounds
from fleetsim.model import FleetSpec, RunResult, WorkItem

__all__ = [
    "CAUSE_GANG_TIMEOUT",
    "CAUSE_NODE_TAKEN",
    "POLICIES",
    "BackgroundPod",
    "FastParams",
    "FastSim",
    "run_fast",
    "shape_of",
]


class FastSim(FastRounds):
    """One fast-mode run; `run()` returns the RunResult. `log` keeps (time, event, job, detail) for tests and
    debugging; `lost_copy_gpu_s` / `timed_out_gpu_s` are the GPU-seconds held by withdrawn pods."""

    # ------------------------------------------------------------------ the event loop

    def run(self) -> RunResult:
        p = self.params
        for job in self.jobs.values():
            self._at(job.item.arrival_s, EVENT_ARRIVE, job)
        self._background_streams()
        self._at(0.0, EVENT_SAMPLE, None)
        handlers: dict[int, Callable[[Any], None]] = {
            EVENT_FINISH: self._finish,
            EVENT_BG_END: self._background_end,
            EVENT_ARRIVE: self._arrive,
            EVENT_BG_ARRIVE: self._background_arrive,
            EVENT_DISPATCH: self._dispatch,
            EVENT_TIMEOUT: self._timeout,
            EVENT_REPORT: self._report,
            EVENT_ROUND: self._round,
            EVENT_SAMPLE: self._sample,
            EVENT_PREEMPTED: self._preempted,
        }
        while self._heap and self.remaining > 0:
            t, kind, _, payload = heapq.heappop(self._heap)
            if p.max_time_s is not None and t > p.max_time_s:
                self.stopped = f"stopped at max_time_s={p.max_time_s:g}"
                break
            if t - self.last_progress > p.stall_s and t >= self.last_arrival and not self.running:
                self.stopped = f"stalled: nothing ran or started for {p.stall_s:g} s"
                break
            self.now = t
            handlers[kind](payload)
            while self._retry_cells:
                name = min(self._retry_cells)
                self._retry_cells.discard(name)
                self._retry(self.cells[name])
        return self._result()

    # ------------------------------------------------------------------ result

    def _sample(self, _: object) -> None:
        sample: dict[str, float] = {}
        for cell in self.cells.values():
            for cluster, used in cell.used.items():
                sample[cluster] = round(used, 6)
        self.samples.append((self.now, sample))
        held: dict[str, float] = {}
        for (tenant, _), gpus in self.usage.items():
            held[tenant] = held.get(tenant, 0.0) + gpus
        demand = dict(held)
        for j in self.queued.values():
            demand[j.item.tenant] = demand.get(j.item.tenant, 0.0) + j.item.gpu_cost
        weights = {t.name: t.weight for t in self.fleet.tenants}
        fair = fairness.water_fill(float(self.fleet.gpus), {t: weights.get(t, 1.0) for t in demand}, demand)
        self.tenant_samples.append(
            (
                self.now,
                {t: (round(held.get(t, 0.0), 6), round(fair.get(t, 0.0), 6)) for t in sorted(set(held) | set(fair))},
            )
        )
        self._at(self.now + self.params.sample_s, EVENT_SAMPLE, None)

    def _result(self) -> RunResult:
        outcomes = [self.jobs[name].outcome for name in self._order]  # the caller's order
        finished = [o.finished_s for o in outcomes if o.finished_s is not None]
        return RunResult(
            mode="fast",
            policy=self.policy,
            fleet=self.fleet,
            seed=self.seed,
            outcomes=outcomes,
            allocation=list(self.samples),
            decision_latency_s=list(self.latency),
            tenant_shares=list(self.tenant_samples),
            preemptions=dict(self.preemptions),
            background_pods=self.background_placed,
            makespan_s=max(finished, default=0.0),
            notes=self._notes(),
        )

    def _notes(self) -> list[str]:
        p = self.params
        never = sum(1 for j in self.jobs.values() if j.state == JOB_NEVER)
        unstarted = sum(1 for j in self.jobs.values() if j.state in (JOB_QUEUED, JOB_RESERVED, JOB_BINDING))
        scoring = "the shipped extender's default policy" if p.pod_scoring == "extender" else "best fit"
        notes = [
            (
                "models: the broker's own decision code (fleetplan Catalog, FleetView, cluster choice) and queue "
                "(broker.scheduling.queue fair-share order, quota admission) in virtual time, one process"
            ),
            (
                f"models: a lagging view: a cluster reports its changed nodes every {p.report_interval_s:g} s, rounds "
                f"run every {p.cycle_s:g} s, pods reach the cluster {p.dispatch_delay_s:g} s after the decision"
            ),
            (
                "models: reservations from the decision until the report that shows the attempt bound; Tandem's pinned "
                "pods bind if they still fit, else a false dispatch, re-planned without excluding nodes"
            ),
            (
                "models: each cluster's true state as placement Nodes with every bound pod (the core's allocate and "
                "release); MIG GPUs as mixed-strategy extended resources, as the agent reports them"
            ),
            (
                f"models: kube-scheduler for unpinned pods, one at a time: the core's fit, the required level as pod "
                f"affinity, {scoring} scores (MIG, CPU-only: the tightest node), gang-unaware; not bound whole "
                f"after {p.gang_timeout_s:g} s: withdrawn and re-planned"
            ),
            (
                "models: baselines choose clusters blind to topology (clusters lacking the required level are left out "
                "as a cluster selector would); multikueue's worker queues admit per GPU model up to the cluster's GPUs"
            ),
            (
                f"models: background pods per cluster (Poisson, {'/'.join(map(str, BACKGROUND_GPUS))} whole GPUs, "
                f"exponential run time, mean {p.background_mean_s:g} s) on the least-allocated node, dropped when none "
                f"fits: {self.background_placed} placed, {self.background_dropped} dropped"
            ),
            (
                "does not model: API-server, watch and agent latency beyond the fixed delays; container start-up; pod "
                "or node failures; cluster disconnects and stale reports"
            ),
            (
                "does not model: retry back-off, reservation expiry, DRA devices"
                + ("" if self.policy == "tandem-fair" else ", preemption, held domains")
            ),
            (
                'decision latency: one sample per decision computed; a waiting job\'s provably repeated "no" is not '
                "recomputed (FastSim.memo); multikueue's samples time its admission check"
            ),
        ]
        if self.policy == "multikueue":
            notes.append(
                f"multikueue: copies that lost held {self.lost_copy_gpu_s:.0f} GPU-seconds; worker queues "
                "admit per GPU model up to the cluster's GPUs (background pods unseen)"
            )
        if self.policy == "tandem-fair":
            notes.append(
                f"tandem-fair: held domains as the broker's (a gang of >= {p.hold_min_gpus:g} GPUs blocked "
                f"{p.hold_after_s:g} s holds the domain that drains soonest, at most "
                f"{p.max_held_domains} at once, for at most {p.max_hold_s:g} s; only jobs whose "
                f"declared max runtime ends before the drain backfill it; background pods bypass Tandem's "
                f"scheduler and its extender, so they still take a held domain's idle GPUs): "
                f"{self.holds_started} held"
            )
            notes.append(
                f"tandem-fair: the broker's preemption decision every {p.preempt_interval_s:g} s "
                f"(tenants' default knobs, minimum runtime {p.preempt_min_runtime_s:g} s); victims leave "
                f"after {p.preempt_grace_s:g} s and lose the work since their last checkpoint (every "
                f"{p.checkpoint_s:g} s of run); the preemptor's nodes are held until they have left"
            )
        if self.policy == "merged":
            notes.append(
                "merged: one cluster holding every node (levels prefixed by their cluster), Tandem's choice: "
                "an upper bound, not a deployable system"
            )
        if self.timed_out_gpu_s:
            notes.append(f"gangs withdrawn at the timeout held {self.timed_out_gpu_s:.0f} GPU-seconds")
        if never:
            notes.append(f"{never} items could not fit any cluster even empty and were never queued")
        if unstarted:
            notes.append(f"{unstarted} items never started ({self.stopped or 'run ended'})")
        elif self.stopped:
            notes.append(self.stopped)
        return notes


def run_fast(
    fleet: FleetSpec, items: Sequence[WorkItem], *, policy: str, seed: int, params: FastParams = FastParams()
) -> RunResult:
    """Run `items` over `fleet` with one cluster-choice policy in virtual time (see the module docstring)."""
    return FastSim(fleet, items, policy=policy, seed=seed, params=params).run()
