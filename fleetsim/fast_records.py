"""Fast mode's records: its parameters, the broker's request for a work item, and the job and pod-copy state a run keeps."""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.scheduling.queue import QueueEntry
from fleetplan.catalog import Reservation
from fleetplan.decide import Choice, ClusterPredicate
from fleetsim.fast_cluster import GPU_TOLERATION, AttemptKey, Cell, PodKey
from fleetsim.model import Outcome, WorkItem
from placement.model import JobRequest, PodSet, PodShape
from placement.topology import DomainId
from placement.usage import shape_gpus

__all__ = [
    "BACKGROUND_CPU_MILLI_PER_GPU",
    "BACKGROUND_GPUS",
    "BACKGROUND_MEMORY_PER_GPU",
    "CAUSE_GANG_TIMEOUT",
    "CAUSE_NODE_TAKEN",
    "EVENT_ARRIVE",
    "EVENT_BG_ARRIVE",
    "EVENT_BG_END",
    "EVENT_DISPATCH",
    "EVENT_FINISH",
    "EVENT_PREEMPTED",
    "EVENT_REPORT",
    "EVENT_ROUND",
    "EVENT_SAMPLE",
    "EVENT_TIMEOUT",
    "JOB_BINDING",
    "JOB_DONE",
    "JOB_FUTURE",
    "JOB_NEVER",
    "JOB_QUEUED",
    "JOB_RESERVED",
    "JOB_RUNNING",
    "PINNED_POLICIES",
    "POD_SET",
    "POLICIES",
    "BackgroundPod",
    "FastParams",
    "GangCopy",
    "FastJob",
    "only_cluster",
    "request_of",
    "shape_of",
]

POLICIES = ("tandem", "tandem-fair", "aggregate", "round-robin", "multikueue", "merged")
"""tandem-fair: Tandem's choice plus the broker's fairness machinery: its preemption decision
(broker.scheduling.fairness.choose_preemption) and its held domains for long-waiting gangs (broker.scheduling.drains.DrainHolds)."""
PINNED_POLICIES = frozenset({"tandem", "tandem-fair", "merged"})
"""The policies whose decisions pin each pod to its node (the others leave placement to the kube-scheduler)."""
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
    """One replica of `item` as the core sees the pod template wire mode submits (fleetsim.wire_jobs.job_spec)."""
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

# job states (plain ints: compared in the hot loop)
JOB_FUTURE, JOB_QUEUED, JOB_RESERVED, JOB_BINDING, JOB_RUNNING, JOB_DONE, JOB_NEVER = range(7)

# event kinds, also the order of events at one instant: releases first, reports after binds, rounds last
(
    EVENT_FINISH,
    EVENT_BG_END,
    EVENT_ARRIVE,
    EVENT_BG_ARRIVE,
    EVENT_DISPATCH,
    EVENT_TIMEOUT,
    EVENT_REPORT,
    EVENT_ROUND,
    EVENT_SAMPLE,
    EVENT_PREEMPTED,
) = range(10)


@dataclass(eq=False, slots=True)
class GangCopy:
    """A gang's pods in one cluster (tandem: all bound at once; otherwise placed one by one, pending meanwhile)."""

    job: FastJob
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
        per = shape_gpus(self.job.shape)
        return sum(now - t for t in self.since) * per


@dataclass(eq=False, slots=True)
class FastJob:
    """One job of fast mode: its work item, what the cluster choice is asked, where it stands and how it ended."""

    item: WorkItem
    seq: int
    req: JobRequest
    """What the cluster choice is asked (baselines: without the required level)."""
    full: JobRequest
    shape: PodShape
    code: int
    outcome: Outcome
    excluded: tuple[str, ...] = ()
    state: int = JOB_FUTURE
    attempt: int = 0
    choice: Choice | None = None
    cell: str = ""
    model: str = ""
    charged: float = 0.0
    failed: tuple[object, ...] | None = None
    """What its last "no" depended on (FastSim._record): it is decided again only once that moved."""
    copies: list[GangCopy] = field(default_factory=list)
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
    """round-robin: per cluster, the record of its last "no" there."""
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

    @property
    def key(self) -> AttemptKey:
        return (self.item.name, self.attempt)


def only_cluster(cluster: str) -> ClusterPredicate:
    """The policy predicate that allows `cluster` alone."""
    return lambda entry: entry.name == cluster
