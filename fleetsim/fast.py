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

import dataclasses
import heapq
import math
import random
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from broker.domain.states import JobState
from broker.scheduling import fairness
from broker.scheduling.drains import DrainHold, DrainHolds
from broker.scheduling.queue import QueueEntry, QueuePolicy, QueueSnapshot, Usage
from fleetplan.catalog import Catalog, ClusterMeta, InventoryReport, Reservation, ReservedReplica
from fleetplan.choice import AggregateChoice, ClusterChoice, RoundRobinChoice, make_choice, usable_clusters
from fleetplan.decide import Choice, ClusterPredicate, Decision, could_ever_fit, within_policy
from fleetplan.drain import BusyJob, choose_drain_domain, enforced_end
from fleetplan.view import ClusterState, FleetView
from fleetsim.fast_cluster import (
    GPU_TOLERATION,
    AttemptKey,
    Cell,
    PodKey,
    agent_levels,
    demand_of,
    gpus_held,
    merged_nodes,
    nodes_of,
    owners,
)
from fleetsim.model import FleetSpec, Outcome, RunResult, WorkItem
from placement.fit import capacity
from placement.model import JobRequest, Node, PodSet, PodShape
from placement.scoring import Policy
from placement.topology import DomainId

__all__ = [
    "CAUSE_GANG_TIMEOUT",
    "CAUSE_NODE_TAKEN",
    "POLICIES",
    "BackgroundPod",
    "FastParams",
    "FastSim",
    "nodes_of",
    "request_of",
    "run_fast",
    "shape_of",
]

POLICIES = ("tandem", "tandem-fair", "aggregate", "round-robin", "multikueue", "merged")
"""tandem-fair: Tandem's choice plus the broker's fairness machinery: its preemption decision
(broker.scheduling.fairness.choose_preemption) and its held domains for long-waiting gangs (broker.scheduling.drains.DrainHolds)."""
_PINNED = frozenset({"tandem", "tandem-fair", "merged"})
CAUSE_NODE_TAKEN = "node taken by a pod outside Tandem"
CAUSE_GANG_TIMEOUT = "gang did not fully bind before the timeout"
POD_SET = "workers"
BACKGROUND_GPUS = (1, 1, 2, 4)
"""GPUs per background pod, drawn uniformly (wire mode's mix: mostly small)."""
BACKGROUND_CPU_MILLI_PER_GPU = 2000
BACKGROUND_MEMORY_PER_GPU = 16 << 30


@dataclass(frozen=True, slots=True)
class BackgroundPod:
    """One scripted background pod (added to the Poisson streams): `gpus` whole GPUs on `cluster` from `at_s`."""

    at_s: float
    cluster: str
    gpus: int
    duration_s: float


@dataclass(frozen=True, slots=True)
class FastParams:
    report_interval_s: float = 1.0
    """An agent's inventory report period (its coalescing plus the wire); a cluster reports only when it changed."""
    cycle_s: float = 1.0
    """Scheduling rounds run on multiples of this, when something may have changed."""
    dispatch_delay_s: float = 0.5
    """From a decision to its pods reaching the cluster's scheduler."""
    gang_timeout_s: float = 300.0
    """Unpinned gangs (aggregate, round-robin, multikueue) not fully bound by then are withdrawn and re-planned."""
    background_mean_s: float = 1800.0
    """Mean (exponential) run time of a background pod."""
    background_streams: bool = True
    """Poisson background pods at each cluster's `background_pods_per_min` (False: only `background`)."""
    background: tuple[BackgroundPod, ...] = ()
    sample_s: float = 60.0
    """Allocation sample period."""
    stale_after_s: float = 30.0
    """The catalog's staleness bound (never reached: agents heartbeat every report interval)."""
    candidate_domains: int = 8
    """The choices' exact-fit limit per cluster (the broker's `candidate_domains`)."""
    pod_scoring: str = "extender"
    """Unpinned GPU pods: "extender" (the shipped extender's default scoring policy) or "bestfit"."""
    stall_s: float = 3600.0
    """Stop when every item has arrived, none runs and none started for this long: the rest wait for room that
    only background churn could free (the report counts them as never started)."""
    max_time_s: float | None = None
    """Stop at this simulated time (None: when every item finished or the run stalls)."""
    preempt_interval_s: float = 10.0
    """tandem-fair: how often blocked jobs are looked at for preemption (the broker's `fairness.interval_s`)."""
    preempt_grace_s: float = 30.0
    """tandem-fair: a victim's pods leave this long after it is preempted (their grace period)."""
    preempt_min_runtime_s: float = 900.0
    """tandem-fair: the broker's `fairness.min_runtime_s` (fair-share victims only)."""
    preempt_release_s: float = 120.0
    """tandem-fair: victims not gone this long after their grace: the preemptor's hold is given up."""
    hold_after_s: float = 1800.0
    """tandem-fair: the broker's `fairness.hold_after_s`: a gang blocked this long holds a domain."""
    hold_min_gpus: float = 16.0
    max_held_domains: int = 2
    max_hold_s: float = 4 * 3600.0
    start_timeout_s: float = 600.0
    """tandem-fair: the gang start bound counted into a job's enforced end (the broker's default)."""
    checkpoint_s: float = 1800.0
    """tandem-fair: a preemptible job checkpoints every this many seconds of its run; preemption loses the
    work since the last one (0 = it never checkpoints: everything since its start is lost)."""


def shape_of(item: WorkItem) -> PodShape:
    """One replica of `item` as the core sees the pod template wire mode submits (fleetsim.wire.job_spec)."""
    gpus, milli = item.gpus, 1000
    if item.mig_profile:
        gpus = 0
    elif item.gpus and item.gpu_milli < 1000:
        gpus, milli = 1, item.gpu_milli  # a share is asked of one GPU
    return PodShape(
        gpus=gpus,
        gpu_milli=milli,
        gpu_models=frozenset(item.gpu_models),
        mig_profile=item.mig_profile or None,
        mig_count=item.mig_count if item.mig_profile else 0,
        cpu_milli=item.cpu_milli,
        memory=item.memory_bytes,
        tolerations=(GPU_TOLERATION,),
    )


def request_of(item: WorkItem) -> JobRequest:
    """The broker's request for `item`: one pod set, the level by name, `min_available` for elastic gangs."""
    elastic = 0 < item.min_replicas < item.replicas
    return JobRequest(
        job_id=item.name,
        pod_sets=(PodSet(POD_SET, item.replicas, shape_of(item)),),
        tenant=item.tenant,
        queue="default",
        priority=item.priority,
        preemptible=item.preemptible,
        min_available=item.min_replicas if elastic else None,
        required_level=item.required_level or None,
    )


# --------------------------------------------------------------------------- the simulation's records

# job states
_FUTURE, _QUEUED, _RESERVED, _BINDING, _RUNNING, _DONE, _NEVER = range(7)

# event kinds, also the order of events at one instant: releases first, reports after binds, rounds last
(
    _E_FINISH,
    _E_BG_END,
    _E_ARRIVE,
    _E_BG_ARRIVE,
    _E_DISPATCH,
    _E_TIMEOUT,
    _E_REPORT,
    _E_ROUND,
    _E_SAMPLE,
    _E_PREEMPTED,
) = range(10)


@dataclass(eq=False, slots=True)
class _Copy:
    """A gang's pods in one cluster (tandem: all bound at once; otherwise placed one by one, pending meanwhile)."""

    job: _Job
    cell: Cell
    attempt: int
    count: int
    depth: int | None
    domain: DomainId | None = None
    keys: list[PodKey] = field(default_factory=list)
    since: list[float] = field(default_factory=list)
    flavor: str = ""
    """multikueue: the worker's GPU model flavor it was admitted under."""

    @property
    def complete(self) -> bool:
        return len(self.keys) == self.count

    def held_gpu_s(self, now: float) -> float:
        per = gpus_held(self.job.shape)
        return sum(now - t for t in self.since) * per


@dataclass(eq=False, slots=True)
class _Job:
    item: WorkItem
    seq: int
    req: JobRequest
    """What the cluster choice is asked (baselines: without the required level)."""
    full: JobRequest
    shape: PodShape
    code: int
    outcome: Outcome
    excluded: tuple[str, ...] = ()
    state: int = _FUTURE
    attempt: int = 0
    choice: Choice | None = None
    cell: str = ""
    model: str = ""
    charged: float = 0.0
    failed: tuple[object, ...] | None = None
    """What its last "no" depended on (FastSim._record): it is decided again only once that moved."""
    copies: list[_Copy] = field(default_factory=list)
    entry: QueueEntry | None = None
    homes: tuple[str, ...] = ()
    """The broker's clusters it may be decided for again when their state moves (see FastSim._record)."""
    kinds: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Per broker cluster, the node groups where one replica fits an empty node, in clusters that could hold the
    whole of what the choice is asked (merged: in every cluster, a gang may span them there): only room freed
    there can turn a "no room" into a placement."""
    checked: tuple[object, ...] = ()
    """The state fingerprint at which its last "no" was last found up to date."""
    tried: dict[str, tuple[object, ...]] = field(default_factory=dict)
    done_s: float = 0.0
    """Run time saved by checkpoints of preempted attempts (the next attempt runs only the rest)."""
    run_start: float = 0.0
    """When the current attempt started running."""
    preempting: bool = False
    """Preempted: its pods are in their grace period."""
    hold: tuple[Reservation, frozenset[str], float] | None = None
    """Nodes held for it while its victims leave: the reservation, the victims, the deadline."""
    searched: tuple[object, ...] = ()
    """State fingerprint of its last victim search that found nothing."""
    queued_at: float = 0.0
    drain_charge: tuple[str, float] = ("", 0.0)
    """(model, idle GPUs) its held domain is charged to it now."""
    """round-robin: per cluster, the record of its last "no" there."""

    @property
    def key(self) -> AttemptKey:
        return (self.item.name, self.attempt)


class FastSim:
    """One fast-mode run; `run()` returns the RunResult. `log` keeps (time, event, job, detail) for tests and
    debugging; `lost_copy_gpu_s` / `timed_out_gpu_s` are the GPU-seconds held by withdrawn pods."""

    def __init__(
        self, fleet: FleetSpec, items: Sequence[WorkItem], *, policy: str, seed: int, params: FastParams = FastParams()
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}: one of {', '.join(POLICIES)}")
        names = [i.name for i in items]
        if len(set(names)) != len(names):
            raise ValueError("work item names must be unique")
        self.fleet = fleet
        self.policy = policy
        self.seed = seed
        self.params = params
        self.now = 0.0
        self.memo = True
        """Skip decisions provably equal to an earlier "no" (see _record); False decides every queued job in every
        round, as the broker's placer would, for tests that the memo changes no outcome."""
        self.log: list[tuple[float, str, str, str]] = []
        self.latency: list[float] = []
        self.lost_copy_gpu_s = 0.0
        self.timed_out_gpu_s = 0.0
        self.background_placed = 0
        self.background_dropped = 0
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self._shapes: dict[PodShape, int] = {}

        # node groups through the fleet: (cluster, group) -> id, and each node's group
        self.kind_of: dict[tuple[str, str], int] = {}
        node_kind: dict[str, int] = {}
        for c in fleet.clusters:
            for g, node in zip((grp for grp in c.groups for _ in range(grp.nodes)), nodes_of(c)):
                node_kind[node.name] = self.kind_of.setdefault((c.name, g.name), len(self.kind_of))
        self.kind_epoch = [0] * len(self.kind_of)
        """Per node group, bumped when the broker's view of it may have gained room (a report with a release, a
        reservation dropped): a job that found no room is decided again only once one of its groups moved."""

        self.cells: dict[str, Cell] = {}
        metas: dict[str, ClusterMeta] = {}
        if policy == "merged":
            levels, nodes, owner = merged_nodes(fleet)
            self.cells["merged"] = Cell(
                "merged",
                levels,
                nodes,
                [owner[n.name] for n in nodes],
                [node_kind[n.name] for n in nodes],
                self._scorer(),
            )
            metas["merged"] = ClusterMeta("merged", levels=levels)
        else:
            for c in fleet.clusters:
                levels = agent_levels(c)
                nodes = nodes_of(c)
                self.cells[c.name] = Cell(
                    c.name, levels, nodes, [c.name] * len(nodes), [node_kind[n.name] for n in nodes], self._scorer()
                )
                metas[c.name] = ClusterMeta(c.name, c.region, c.role, levels=levels)
        self.home = owners(self.cells)
        self._pending: dict[str, list[_Copy]] = {name: [] for name in self.cells}
        """Per cell, gangs with pods kube-scheduler has not bound yet, oldest first."""
        self._retry_cells: set[str] = set()
        """Cells where capacity freed during the current event: their pending pods are retried after it."""

        # The broker's side: its catalog (fed by reports), the cluster choice, the queue's policy.
        self.catalog = Catalog(stale_after_s=params.stale_after_s)
        self._report_seq: dict[str, int] = {}
        self._bound_sent: dict[str, dict[AttemptKey, frozenset[tuple[str, int]]]] = {}
        for name, cell in self.cells.items():
            self._report_seq[name] = 1
            self._bound_sent[name] = {}
            self.catalog.apply_report(InventoryReport(name, 1, True, 0.0, tuple(cell.nodes), meta=metas[name]), 0.0)
        self._rr_period = math.lcm(*range(1, len(self.cells) + 1))
        """The cursor's phase that fixes whom every job asks (candidate lists are 1..clusters long)."""
        self.choice: ClusterChoice | None = None
        if policy != "multikueue":
            self.choice = make_choice("tandem" if policy in _PINNED else policy, params.candidate_domains)
        self.qpolicy = QueuePolicy(
            tenant_weights={t.name: t.weight for t in fleet.tenants},
            quotas={(t.name, model): float(limit) for t in fleet.tenants for model, limit in t.quota},
        )
        self.usage: dict[tuple[str, str], float] = {}
        self.usage_epoch: dict[str, int] = {}
        self.change: dict[str, int] = {name: 0 for name in self.cells}
        """Per cluster, bumped on any change the broker sees (aggregate's pick depends on relative room)."""
        self._phase = {name: i * params.report_interval_s / len(self.cells) for i, name in enumerate(self.cells)}
        self._report_at: dict[str, float | None] = {name: None for name in self.cells}
        self._last_report: dict[str, float] = {name: 0.0 for name in self.cells}
        self._round_at: float | None = None
        self._queue_version = 0
        self._usage_version = 0
        self._snap: tuple[tuple[int, int], QueueSnapshot] | None = None
        """The queue's snapshot and the (queue, usage) versions it was built at: the order reads nothing else."""
        self._quota_watch: set[str] = set()
        """Clusters some "quota" record was made for: their `change` is part of the state fingerprint."""
        self._idle_rounds: set[tuple[object, ...]] = set()
        """round-robin: (state fingerprint, cursor phase) of rounds that decided nothing (see _round)."""
        self._last_round = -1.0
        self._last_preempt = -math.inf
        self.drains = DrainHolds(self.catalog)
        """tandem-fair: domains held for long-waiting gangs."""
        self.holds_started = 0
        self.preemptions: dict[str, int] = {}
        """tandem-fair: victims by rule."""
        self.tenant_samples: list[tuple[float, dict[str, tuple[float, float]]]] = []

        # multikueue's worker queues: nominal GPUs per (cluster, model) and what admitted copies hold
        self.nominal: dict[tuple[str, str], float] = {}
        self.admitted: dict[tuple[str, str], float] = {}
        for c in fleet.clusters:
            for g in c.groups:
                key = (c.name, g.gpu_model)
                self.nominal[key] = self.nominal.get(key, 0.0) + g.nodes * g.gpus_per_node
                self.admitted.setdefault(key, 0.0)
        self.worker_release = {key: 0 for key in self.admitted}
        """Per worker flavor, bumped when a copy leaves it (its admitted GPUs drop)."""

        # "could it ever fit" is judged on the original clusters, empty, with the full request (all policies)
        self._empty = Catalog(stale_after_s=math.inf)
        for c in fleet.clusters:
            levels = agent_levels(c)
            self._empty.apply_report(
                InventoryReport(
                    c.name, 1, True, 0.0, tuple(nodes_of(c)), meta=ClusterMeta(c.name, c.region, c.role, levels=levels)
                ),
                0.0,
            )
        self._ever: dict[tuple[object, ...], tuple[str, ...]] = {}
        self._flavor_fit: dict[tuple[str, int], tuple[str, ...]] = {}
        self._kind_fit: dict[tuple[int, int], bool] = {}
        self._kind_node: dict[int, Node] = {}
        for c in fleet.clusters:
            for node in nodes_of(c):
                self._kind_node.setdefault(node_kind[node.name], node)
        self._kind_model = {k: n.gpu_model or "" for k, n in self._kind_node.items()}

        self._order = names
        self.jobs: dict[str, _Job] = {}
        self.queued: dict[str, _Job] = {}
        for seq, item in enumerate(sorted(items, key=lambda i: (i.arrival_s, i.name))):
            self.jobs[item.name] = self._job(item, seq)
        self.remaining = len(self.jobs)
        self.running = 0
        """Jobs running now (a gang cycling through dispatch and timeout is not progress)."""
        self.last_arrival = max((i.arrival_s for i in items), default=0.0)
        self.last_progress = 0.0
        self.stopped = ""

    # ------------------------------------------------------------------ setup helpers

    def _scorer(self) -> Policy | None:
        if self.params.pod_scoring == "bestfit":
            return None
        if self.params.pod_scoring != "extender":
            raise ValueError(f"pod_scoring is 'extender' or 'bestfit', not {self.params.pod_scoring!r}")
        from extender.config import ExtenderConfig
        from extender.snapshot import make_scoring_policy

        return make_scoring_policy(ExtenderConfig())  # one per cluster: its memo is per node table

    def _code(self, shape: PodShape) -> int:
        return self._shapes.setdefault(shape, len(self._shapes))

    def _job(self, item: WorkItem, seq: int) -> _Job:
        full = request_of(item)
        req = full
        excluded: tuple[str, ...] = ()
        if self.policy in ("aggregate", "round-robin", "multikueue") and full.required_level:
            # Topology-blind choice; clusters that lack the level are left out as a cluster selector would.
            level = full.required_level
            req = dataclasses.replace(full, required_level=None)
            excluded = tuple(
                c.name for c in self.fleet.clusters if all(level not in (lv.name, lv.key) for lv in agent_levels(c))
            )
        shape = full.pod_sets[0].shape
        return _Job(item, seq, req, full, shape, self._code(shape), Outcome(item, item.arrival_s), excluded)

    # ------------------------------------------------------------------ the event loop

    def _at(self, t: float, kind: int, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, kind, self._seq, payload))

    def run(self) -> RunResult:
        p = self.params
        for job in self.jobs.values():
            self._at(job.item.arrival_s, _E_ARRIVE, job)
        self._background_streams()
        self._at(0.0, _E_SAMPLE, None)
        handlers: dict[int, Callable[[Any], None]] = {
            _E_FINISH: self._finish,
            _E_BG_END: self._background_end,
            _E_ARRIVE: self._arrive,
            _E_BG_ARRIVE: self._background_arrive,
            _E_DISPATCH: self._dispatch,
            _E_TIMEOUT: self._timeout,
            _E_REPORT: self._report,
            _E_ROUND: self._round,
            _E_SAMPLE: self._sample,
            _E_PREEMPTED: self._preempted,
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

    def _note(self, event: str, job: str, detail: str = "") -> None:
        self.log.append((self.now, event, job, detail))

    def _wake(self) -> None:
        """Something the placer reads changed: a round at the next cycle boundary."""
        cycle = self.params.cycle_s
        k = math.ceil(self.now / cycle - 1e-9)
        t = k * cycle
        if t <= self._last_round:
            t = (k + 1) * cycle
        if self._round_at is None or t < self._round_at:
            self._round_at = t
            self._at(t, _E_ROUND, t)

    def _dirty(self, cell: Cell) -> None:
        """The cell changed: its agent reports at its next report slot (multikueue decides without the catalog)."""
        if self.policy == "multikueue":
            cell.dirty.clear()
            return
        if self._report_at[cell.name] is not None:
            return
        interval, phase = self.params.report_interval_s, self._phase[cell.name]
        t = phase + math.ceil((self.now - phase) / interval - 1e-9) * interval
        if t <= self._last_report[cell.name]:
            t += interval
        self._report_at[cell.name] = t
        self._at(t, _E_REPORT, cell)

    # ------------------------------------------------------------------ arrivals, the queue

    def _arrive(self, job: _Job) -> None:
        if not self._homes(job, job.full):
            job.state = _NEVER
            self.remaining -= 1
            self._note("never", job.item.name, "no cluster could hold it even empty")
            return
        # The clusters the choice may yet place it in: where what it is asked (baselines: without the level) could
        # ever fit, as a cluster selector allows.
        homes = [c for c in self._homes(job, job.req) if c not in job.excluded]
        # aggregate's pick weighs every allowed cluster against the others: any of them matters
        job.homes = (
            tuple(c for c in self.cells if c not in job.excluded)
            if self.policy == "aggregate"
            else tuple(dict.fromkeys(self.home[c].name for c in homes))
        )
        # merged: replicas may land on any original cluster's nodes, whichever could hold the whole gang
        for cluster in homes if self.policy != "merged" else [c.name for c in self.fleet.clusters]:
            kinds = tuple(k for (c, g), k in self.kind_of.items() if c == cluster and self._fits_empty(k, job))
            cell = self.home[cluster].name
            job.kinds[cell] = job.kinds.get(cell, ()) + kinds
        self.last_progress = max(self.last_progress, self.now)
        self._enqueue(job)

    def _homes(self, job: _Job, req: JobRequest) -> tuple[str, ...]:
        """Original clusters that could hold the whole of `req` if they were empty."""
        it = job.item
        key = (job.code, it.replicas, it.min_replicas, req.required_level)
        got = self._ever.get(key)
        if got is None:
            view = FleetView(self._empty, 0.0)
            got = self._ever[key] = tuple(
                c.name for c in self.fleet.clusters if could_ever_fit(view, req, _only(c.name))[0]
            )
        return got

    def _enqueue(self, job: _Job) -> None:
        job.state = _QUEUED
        job.queued_at = self.now
        job.failed = None
        job.tried = {}
        job.choice = None
        job.copies = []
        if job.entry is None:
            it = job.item
            job.entry = QueueEntry(
                job_id=it.name,
                tenant=it.tenant,
                queue="default",
                band="",
                priority=it.priority,
                seq=job.seq,
                state=JobState.QUEUED,
                gpus=it.gpu_cost,
                gpu_models=it.gpu_models,
                preemptible=it.preemptible,
            )
        self.queued[job.item.name] = job
        self._queue_version += 1
        self._wake()

    def _snapshot(self) -> QueueSnapshot:
        key = (self._queue_version, self._usage_version)
        if self._snap is None or self._snap[0] != key:
            self._snap = (key, self._build_snapshot())
        return self._snap[1]

    def _build_snapshot(self) -> QueueSnapshot:
        """The queue's snapshot over the queued jobs plus one entry per (tenant, model) carrying what is in use:
        the same order and admission as a snapshot over every active job, at the cost of the queue alone."""
        entries = [j.entry for j in self.queued.values() if j.entry is not None]
        for k, ((tenant, model), gpus) in enumerate(self.usage.items()):
            if gpus > 1e-9:
                entries.append(
                    QueueEntry(
                        job_id=f"\x00usage-{k}",
                        tenant=tenant,
                        queue="default",
                        band="",
                        priority=0,
                        seq=-1,
                        state=JobState.RUNNING,
                        gpus=gpus,
                        charged_model=model,
                        charged_gpus=gpus,
                    )
                )
        return QueueSnapshot.build(entries, self.qpolicy, self.now)

    def _charge(self, job: _Job, model: str, gpus: float) -> None:
        job.model, job.charged = model, gpus
        key = (job.item.tenant, model)
        self.usage[key] = self.usage.get(key, 0.0) + gpus
        self._usage_version += 1

    def _uncharge(self, job: _Job) -> None:
        if job.charged:
            key = (job.item.tenant, job.model)
            self.usage[key] = self.usage.get(key, 0.0) - job.charged
            self._usage_version += 1
            tenant = job.item.tenant
            self.usage_epoch[tenant] = self.usage_epoch.get(tenant, 0) + 1
        job.charged = 0.0

    # ------------------------------------------------------------------ when a "no" may have changed

    # A job the choice could not place (or whose choice the quota refused) is decided again only once something its
    # answer depended on moved; deciding it earlier would give the same answer (tests/fleetsim/test_fast.py checks
    # that outcomes are the same with this memo off). A record names what the answer depended on (epochs only grow,
    # so it keeps their sum):
    # * ("room", pick, kinds, epochs, usage): no room in the cluster asked (pick; "" = every cluster, Tandem's
    #   choice) can only turn into room where a replica fits an empty node: `kind_epoch` of those node groups;
    # * the same record when the quota refused the choice and no placement on a model the quota admits exists
    #   now (the broker's own narrowing, `within_policy`, finds none): then only room on those models' groups helps;
    # * ("quota", pick, clusters, epochs, usage): the quota refused the choice though an admissible placement
    #   exists: any change the broker sees there, a decrease included (`change`), may move the choice to it;
    # * ("quota-all", pick, usage): the quota refuses every GPU model it could land on in the cluster asked: only its
    #   tenant's usage dropping (`usage_epoch`) can help;
    # * ("workers", flavors, epochs, usage): multikueue's worker queues were full for every flavor it could use:
    #   only a copy leaving one of them (`worker_release`) helps.
    # round-robin asks the cluster at its cursor, aggregate the one its estimate ranks first: a record holds only
    # while the decision would ask the same cluster.

    def _fits_empty(self, kind: int, job: _Job) -> bool:
        key = (kind, job.code)
        fits = self._kind_fit.get(key)
        if fits is None:
            fits = self._kind_fit[key] = capacity(self._kind_node[kind], job.shape).count > 0
        return fits

    def _record(
        self, job: _Job, pick: str, refused: Choice | None, snap: QueueSnapshot, usage: Usage, view: FleetView | None
    ) -> tuple[object, ...]:
        tenant = job.item.tenant
        used = self.usage_epoch.get(tenant, 0)
        if self.policy == "multikueue":
            flavors = tuple(
                (c.name, m)
                for c in self.fleet.clusters
                if c.name not in job.excluded
                for m in self._flavors(c.name, job)
            )
            return ("workers", flavors, sum(map(self.worker_release.__getitem__, flavors)), used)
        kinds = job.kinds.get(pick, ()) if pick else tuple(k for ks in job.kinds.values() for k in ks)
        if refused is None:
            return ("room", pick, kinds, sum(map(self.kind_epoch.__getitem__, kinds)), used)
        least = job.full.min_replicas * job.shape.gpu_cost  # an elastic gang may shrink to pass
        admissible = {
            m
            for m in {self._kind_model[k] for k in kinds}
            if snap.admit(tenant, m, least, preemptible=job.item.preemptible, usage=usage).allowed
        }
        if not admissible:
            return ("quota-all", pick, used)
        clusters = (pick,) if pick else job.homes
        assert view is not None
        if not self._admissible_room(view, job, admissible, clusters):
            kinds = tuple(k for k in kinds if self._kind_model[k] in admissible)
            return ("room", pick, kinds, sum(map(self.kind_epoch.__getitem__, kinds)), used)
        self._quota_watch.update(clusters)
        return ("quota", pick, clusters, sum(map(self.change.__getitem__, clusters)), used)

    def _admissible_room(self, view: FleetView, job: _Job, models: set[str], clusters: Sequence[str]) -> bool:
        """Whether a domain of some cluster could hold the job on nodes of `models` by the view's numpy columns:
        the first test of `fleetplan.decide.decide_in` (no candidate domain, no choice there), with the request
        narrowed to those models as the broker narrows it (`within_policy`). False proves no admissible choice."""
        narrowed = within_policy(job.req, models)
        req = narrowed.pod_sets[0]
        count = narrowed.min_replicas if narrowed.min_available is not None else req.count  # decide_in shrinks
        for c in clusters:
            arrays = view.arrays(c)
            depth = self.cells[c].depth_of(narrowed.required_level) if narrowed.required_level else None
            if arrays is None or (narrowed.required_level and depth is None):
                continue
            if arrays.candidate_domains([(req.shape, count)], depth, 1):
                return True
        return False

    def _still_no(self, job: _Job, record: tuple[object, ...] | None, pick: str) -> bool:
        """Whether deciding the job now (asking `pick`) would give the same "no" as when `record` was made."""
        if record is None or not self.memo:
            return False
        used = self.usage_epoch.get(job.item.tenant, 0)
        tag = record[0]
        if record[-1] != used:
            return False
        if tag == "quota-all":
            return record[1] == pick
        if tag == "workers":
            flavors = cast(tuple[tuple[str, str], ...], record[1])
            return record[2] == sum(map(self.worker_release.__getitem__, flavors))
        if record[1] != pick:
            return False
        if tag == "room":
            return record[3] == sum(map(self.kind_epoch.__getitem__, cast(tuple[int, ...], record[2])))
        return record[3] == sum(map(self.change.__getitem__, cast(tuple[str, ...], record[2])))

    def _fingerprint(self) -> tuple[object, ...]:
        """Changes whenever anything a "no" depends on moved (every epoch only grows) or the queue changed."""
        # `change` (every report bumps it) only where a "quota" record reads it, or aggregate's pick does
        watch = self.change.keys() if self.policy == "aggregate" else self._quota_watch
        fp = (
            sum(self.kind_epoch),
            sum(map(self.change.__getitem__, watch)),
            sum(self.usage_epoch.values()),
            sum(self.worker_release.values()),
            self._queue_version,
            self._usage_version,
        )
        if not self._idle_rounds or next(iter(self._idle_rounds))[0] != fp:
            self._idle_rounds.clear()  # rounds of an older state never repeat
        return fp

    def _pick(self, view: FleetView, job: _Job, picks: dict[tuple[int, tuple[str, ...]], str]) -> str:
        """The cluster aggregate's estimate ranks first for the job, as fleetplan.choice.AggregateChoice ranks
        them (the most replicas free, summed node by node); memoised per shape within one view."""
        key = (job.code, job.excluded)
        got = picks.get(key)
        if got is None:
            cands = usable_clusters(view, job.req, _allow_all, job.excluded)
            got = ""
            if isinstance(cands, list):
                got = AggregateChoice.rank_first(view, job.req, cands)
            picks[key] = got
        return got

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
                    cands = lists[key] = usable_clusters(view, req, _allow_all, job.excluded)
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
            self._at(self.now + self.params.dispatch_delay_s, _E_DISPATCH, (job, job.attempt))
            if job.item.name in self.drains.holds:
                self._end_drain(job)
                lifted_before = [h for h in lifted_before if h.job_id != job.item.name]
        if lifted_before:
            self._restore_drains(lifted_before)

    def _placed(self, job: _Job, cluster: str) -> None:
        del self.queued[job.item.name]
        self._queue_version += 1
        job.state = _RESERVED
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
            self._at(self.now + self.params.dispatch_delay_s, _E_DISPATCH, (job, job.attempt, tuple(flavors)))

    def _flavors(self, cluster: str, job: _Job) -> tuple[str, ...]:
        """GPU models of the cluster, in node order, on whose empty nodes one replica of the job fits."""
        key = (cluster, job.code)
        got = self._flavor_fit.get(key)
        if got is None:
            models = [
                self._kind_model[k] for (c, _), k in self.kind_of.items() if c == cluster and self._fits_empty(k, job)
            ]
            got = self._flavor_fit[key] = tuple(dict.fromkeys(models))
        return got

    # ------------------------------------------------------------------ dispatch

    def _dispatch(self, payload: tuple[Any, ...]) -> None:
        job, attempt = payload[0], payload[1]
        if job.attempt != attempt or job.state != _RESERVED:
            return
        if self.policy in _PINNED:
            self._bind_pinned(job)
            return
        job.state = _BINDING
        if self.policy == "multikueue":
            flavors: tuple[tuple[str, str], ...] = payload[2]
            for cluster, model in flavors:
                self._copy(job, self.home[cluster], flavor=model)
        else:
            assert job.choice is not None  # the choice's cluster and gang size; its node assignment is dropped
            self._copy(job, self.cells[job.choice.cluster], len(job.choice.assignments))
        self._at(self.now + self.params.gang_timeout_s, _E_TIMEOUT, (job, attempt))
        for copy in list(job.copies):
            self._pending[copy.cell.name].append(copy)
            if job.state == _BINDING:
                self._schedule_copy(copy)

    def _copy(self, job: _Job, cell: Cell, count: int = 0, flavor: str = "") -> _Copy:
        depth = cell.depth_of(job.full.required_level) if job.full.required_level else None
        copy = _Copy(job, cell, job.attempt, count or job.item.replicas, depth, flavor=flavor)
        job.copies.append(copy)
        return copy

    def _bind_pinned(self, job: _Job) -> None:
        """The extender honours the pin: each replica binds on its node if it still fits the true state."""
        assert job.choice is not None
        cell = self.cells[job.choice.cluster]
        copy = self._copy(job, cell, len(job.choice.assignments))
        for a in job.choice.assignments:
            row = cell.row[a.node]
            if cell.capacity(row, job.shape, job.code) < 1:
                self._note("false", job.item.name, f"{a.node}: {CAUSE_NODE_TAKEN}")
                self._withdraw(copy)
                self._replan(job, CAUSE_NODE_TAKEN)
                return
            self._bind(copy, row, a.index)
        self._start(job, copy)

    def _bind(self, copy: _Copy, row: int, index: int) -> None:
        key: PodKey = (copy.job.item.name, copy.attempt, index)
        copy.cell.bind(key, row, copy.job.shape)
        copy.keys.append(key)
        copy.since.append(self.now)
        copy.cell.mark_bound((copy.job.item.name, copy.attempt), (POD_SET, index))
        self._dirty(copy.cell)

    def _schedule_copy(self, copy: _Copy) -> None:
        """kube-scheduler, one pod at a time; pods that do not fit stay pending (the bound ones hold on)."""
        job, cell = copy.job, copy.cell
        demand = demand_of(job.shape)
        while not copy.complete:
            row = cell.schedule_pod(job.shape, job.code, demand, copy.depth, copy.domain)
            if row is None:
                return
            if copy.depth is not None and copy.domain is None:
                copy.domain = cell.domain(row, copy.depth)
            self._bind(copy, row, len(copy.keys))
        self._pending[cell.name].remove(copy)
        losers = [other for other in job.copies if other is not copy]
        job.copies = [copy]
        job.cell = cell.name
        if copy.flavor and copy.flavor != job.model:  # multikueue charged the first copy's flavor until one won
            self._uncharge(job)
            self._charge(job, copy.flavor, job.item.replicas * job.shape.gpu_cost)
        self._start(job, copy)
        for other in losers:
            self.lost_copy_gpu_s += other.held_gpu_s(self.now)
            job.outcome.duplicates += 1
            self._withdraw(other)

    def _withdraw(self, copy: _Copy) -> None:
        """Delete the copy's pods: bound ones give their resources back, pending ones just go."""
        cell = copy.cell
        for key in copy.keys:
            cell.unbind(key)
        if copy.keys:
            self._retry_cells.add(cell.name)
            self._dirty(cell)
        copy.keys.clear()
        copy.since.clear()
        cell.forget((copy.job.item.name, copy.attempt))
        pending = self._pending[cell.name]
        if copy in pending:
            pending.remove(copy)
        if copy.flavor:
            self.admitted[(cell.name, copy.flavor)] -= copy.job.item.gpu_cost
            self.worker_release[(cell.name, copy.flavor)] += 1
            self._wake()

    def _retry(self, cell: Cell) -> None:
        """Capacity freed in the cell: kube-scheduler retries its pending pods, oldest gang first."""
        for copy in list(self._pending[cell.name]):
            if copy.job.state == _BINDING and copy in self._pending[cell.name]:
                self._schedule_copy(copy)

    def _replan(self, job: _Job, cause: str) -> None:
        """A false dispatch: give everything back and queue the job again (re-planned at the next round)."""
        out = job.outcome
        out.false_dispatches += 1
        out.false_dispatch_causes = (*out.false_dispatch_causes, cause)
        self._drop_reservation(job)
        self._uncharge(job)
        self._enqueue(job)

    def _drop_reservation(self, job: _Job) -> None:
        res = self.catalog.reservations.get(job.key)
        if res is not None:
            self.catalog.drop_reservation(job.key)
            cell = self.cells[res.cluster]
            for k in {cell.kinds[cell.row[r.node]] for r in res.replicas}:
                self.kind_epoch[k] += 1
            self.change[res.cluster] += 1
            self._wake()

    def _timeout(self, payload: tuple[_Job, int]) -> None:
        job, attempt = payload
        if job.attempt != attempt or job.state != _BINDING:
            return
        self._note("false", job.item.name, CAUSE_GANG_TIMEOUT)
        for copy in job.copies:
            self.timed_out_gpu_s += copy.held_gpu_s(self.now)
            self._withdraw(copy)
        self._replan(job, CAUSE_GANG_TIMEOUT)

    # ------------------------------------------------------------------ running

    def _start(self, job: _Job, copy: _Copy) -> None:
        out = job.outcome
        cell = copy.cell
        rows = [cell.pods[k][0] for k in copy.keys]
        level = job.full.required_level
        depth = cell.depth_of(level) if level else None
        out.domains = tuple(cell.level_value(r, depth) for r in rows) if depth is not None else ()
        if depth is not None and self.policy in _PINNED and len({cell.domain(r, depth) for r in rows}) > 1:
            raise AssertionError(f"Tandem split gang {job.item.name} across {level} domains {sorted(set(out.domains))}")
        clusters = {cell.owner[r] for r in rows}
        out.cluster = clusters.pop() if len(clusters) == 1 else cell.name
        if out.started_s is None:
            out.started_s = self.now
        out.last_start_s = job.run_start = self.now
        job.state = _RUNNING
        self.running += 1
        self.last_progress = self.now
        self._note("start", job.item.name, out.cluster)
        self._at(self.now + job.item.duration_s - job.done_s, _E_FINISH, (job, job.attempt))

    def _finish(self, payload: tuple[_Job, int]) -> None:
        job, attempt = payload
        if job.attempt != attempt or job.state != _RUNNING:
            return
        for copy in job.copies:
            self._withdraw(copy)
        self._drop_reservation(job)
        self._uncharge(job)
        job.state = _DONE
        self.running -= 1
        job.outcome.finished_s = self.now
        self.remaining -= 1
        self.last_progress = self.now
        self._note("finish", job.item.name)
        self._wake()

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

    def _end_drain(self, job: _Job) -> None:
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
                    if j.state == _RUNNING and j.choice is not None
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

    def _hold_over(self, job: _Job) -> bool:
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
                self._at(t, _E_ROUND, t)

    def _preempt_round(self) -> None:
        p = self.params
        running: list[fairness.RunningJob] = []
        for j in self.jobs.values():
            if j.state != _RUNNING or not j.item.preemptible or j.preempting or j.choice is None:
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
                self._at(self.now + p.preempt_grace_s, _E_PREEMPTED, (victim, victim.attempt))
            taken |= victims
            plans += 1
            if plans >= 4:
                break

    def _preempted(self, payload: tuple[_Job, int]) -> None:
        """A victim's grace period is over: its pods go, the work since its last checkpoint is lost, and it is
        queued again with its original arrival (no retry spent)."""
        job, attempt = payload
        job.preempting = False
        if job.attempt != attempt or job.state != _RUNNING:
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

    # ------------------------------------------------------------------ reports

    def _report(self, cell: Cell) -> None:
        """The agent's inventory delta: changed nodes and, per reserved attempt, the replicas bound."""
        self._report_at[cell.name] = None
        self._last_report[cell.name] = self.now
        nodes, grew = cell.take_report()
        bound = before = self._bound_sent[cell.name]
        if cell.bound_changed:
            bound = self._bound_sent[cell.name] = {k: frozenset(v) for k, v in cell.bound.items()}
            cell.bound_changed = False
            if self.policy not in _PINNED:
                # Unpinned pods bind where kube-scheduler puts them: once reported bound, their reservation stops
                # holding its own nodes, which gain room in the view though the report shows no change there.
                for key, replicas in bound.items():
                    res = self.catalog.reservations.get(key)
                    new = replicas - before.get(key, frozenset())
                    if res is not None and new:
                        grew |= {cell.kinds[cell.row[r.node]] for r in res.replicas if (r.pod_set, r.index) in new}
        seq = self._report_seq[cell.name] + 1
        self._report_seq[cell.name] = seq
        self.catalog.apply_report(
            InventoryReport(cell.name, seq, False, self.now, tuple(nodes), bound=bound, base_sequence=seq - 1), self.now
        )
        # An attempt whose replicas this report shows bound needs no reservation any more: its pods are in the
        # reported nodes now (the overlay stopped subtracting them as the report landed, so the view is the same).
        for key, replicas in bound.items():
            res = self.catalog.reservations.get(key)
            if res is not None and all((r.pod_set, r.index) in replicas for r in res.replicas):
                self.catalog.drop_reservation(key)
                cell.forget(key)
        self.change[cell.name] += 1
        for k in grew:
            self.kind_epoch[k] += 1
        if grew or self.policy == "aggregate":
            self._wake()

    # ------------------------------------------------------------------ background pods

    def _background_streams(self) -> None:
        p = self.params
        for bg in p.background:
            if bg.cluster not in self.home:
                raise ValueError(f"background pod for unknown cluster {bg.cluster!r}")
            self._at(bg.at_s, _E_BG_ARRIVE, (bg.cluster, bg.gpus, bg.duration_s, None))
        if not p.background_streams:
            return
        for c in self.fleet.clusters:
            if c.background_pods_per_min > 0 and any(not g.mig for g in c.groups):
                # one stream per cluster, seeded by (seed, cluster): the same pods under every policy
                rng = random.Random(zlib.crc32(f"{self.seed}/{c.name}".encode()))
                self._next_background(c.name, rng, 0.0)

    def _next_background(self, cluster: str, rng: random.Random, t: float) -> None:
        rate = next(c.background_pods_per_min for c in self.fleet.clusters if c.name == cluster) / 60.0
        at = t + rng.expovariate(rate)
        gpus = rng.choice(BACKGROUND_GPUS)
        duration = rng.expovariate(1.0 / self.params.background_mean_s)
        self._at(at, _E_BG_ARRIVE, (cluster, gpus, duration, rng))

    def _background_arrive(self, payload: tuple[str, int, float, random.Random | None]) -> None:
        cluster, gpus, duration, rng = payload
        if rng is not None:
            self._next_background(cluster, rng, self.now)
        cell = self.home[cluster]
        shape = PodShape(
            gpus=gpus,
            cpu_milli=BACKGROUND_CPU_MILLI_PER_GPU * gpus,
            memory=BACKGROUND_MEMORY_PER_GPU * gpus,
            tolerations=(GPU_TOLERATION,),
        )
        row = cell.place_background(cluster, shape, self._code(shape))
        if row is None:
            self.background_dropped += 1
            return
        self.background_placed += 1
        key: PodKey = (f"\x00bg-{cluster}", self.background_placed, 0)
        cell.bind(key, row, shape)
        self._note("background", cluster, cell.names[row])
        self._dirty(cell)
        self._at(self.now + duration, _E_BG_END, (cell, key))

    def _background_end(self, payload: tuple[Cell, PodKey]) -> None:
        cell, key = payload
        cell.unbind(key)
        self._dirty(cell)
        self._retry_cells.add(cell.name)

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
        self._at(self.now + self.params.sample_s, _E_SAMPLE, None)

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
        never = sum(1 for j in self.jobs.values() if j.state == _NEVER)
        unstarted = sum(1 for j in self.jobs.values() if j.state in (_QUEUED, _RESERVED, _BINDING))
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


def _allow_all(_entry: ClusterState) -> bool:
    return True


def _only(cluster: str) -> ClusterPredicate:
    return lambda entry: entry.name == cluster


def run_fast(
    fleet: FleetSpec, items: Sequence[WorkItem], *, policy: str, seed: int, params: FastParams = FastParams()
) -> RunResult:
    """Run `items` over `fleet` with one cluster-choice policy in virtual time (see the module docstring)."""
    return FastSim(fleet, items, policy=policy, seed=seed, params=params).run()
