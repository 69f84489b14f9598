"""The fleet simulator's vocabulary: a fleet (clusters of node groups), a workload (items arriving over
time), and what happened to each item. Plain frozen data, shared by the fleet loader, the workload
generators, wire mode, fast mode and the report."""

from __future__ import annotations

from dataclasses import dataclass, field

from fleetplan.catalog import Level
from placement.usage import mig_gpus

__all__ = ["NodeGroup", "ClusterSpec", "TenantSpec", "FleetSpec", "WorkItem", "Outcome", "RunResult"]


@dataclass(frozen=True, slots=True)
class NodeGroup:
    """Identical nodes of one cluster. Racks hold `nodes_per_rack` nodes, blocks `racks_per_block` racks;
    `clique_nodes` > 0 groups consecutive nodes into NVLink cliques (label `nvidia.com/gpu.clique`)."""

    name: str
    gpu_model: str
    """The `nvidia.com/gpu.product` value, e.g. "NVIDIA-H100-80GB-HBM3"."""
    nodes: int
    gpus_per_node: int
    gpu_memory_mib: int
    cpu_cores: int
    memory_gib: int
    mig: str = ""
    """MIG layout of every GPU ("" = MIG off), e.g. "all-1g.10gb" or "all-balanced" (MIG-GEOMETRY)."""
    nodes_per_rack: int = 8
    racks_per_block: int = 4
    clique_nodes: int = 0
    zone: str = ""
    """Zone label value; "" = the cluster's region + "-a"."""


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    name: str
    region: str
    role: str
    levels: tuple[Level, ...]
    """Its topology levels, outermost first: the name a job asks for and the node label that holds it (the same
    levels its agent reports to the broker)."""
    groups: tuple[NodeGroup, ...]
    background_pods_per_min: float = 0.0
    """Pods that never go through Tandem (`schedulerName: default-scheduler`), per simulated minute."""

    @property
    def gpus(self) -> int:
        return sum(g.nodes * g.gpus_per_node for g in self.groups)


@dataclass(frozen=True, slots=True)
class TenantSpec:
    name: str
    weight: float = 1.0
    namespace: str = ""
    """"" = the tenant's name."""
    quota: tuple[tuple[str, int], ...] = ()
    """Nominal GPUs per model ("*" = any model); empty = no quota."""


@dataclass(frozen=True, slots=True)
class FleetSpec:
    name: str
    clusters: tuple[ClusterSpec, ...]
    tenants: tuple[TenantSpec, ...]
    synthesised_topology: bool = False
    """The racks, blocks and cliques were made up (e.g. Alibaba nodes have none): the report says so."""

    @property
    def gpus(self) -> int:
        return sum(c.gpus for c in self.clusters)


@dataclass(frozen=True, slots=True)
class WorkItem:
    """One job of the workload: `replicas` identical pods that start together (a gang when > 1)."""

    name: str
    tenant: str
    kind: str
    """"gang", "elastic", "inference", "batch" or "trace" (an Alibaba pod)."""
    arrival_s: float
    duration_s: float
    replicas: int = 1
    gpus: int = 0
    """Whole GPUs per replica (or the number of GPUs a fractional share spans, normally 1)."""
    gpu_milli: int = 1000
    """Share of each GPU in thousandths (< 1000 = a fractional GPU pod)."""
    mig_profile: str = ""
    mig_count: int = 0
    cpu_milli: int = 1000
    memory_bytes: int = 1 << 30
    gpu_models: tuple[str, ...] = ()
    required_level: str = ""
    """A topology level name every replica must share ("" = none)."""
    min_replicas: int = 0
    """Elastic gangs: the fewest replicas it may start with (0 = all)."""
    preemptible: bool = False
    priority: int = 0
    max_runtime_s: float | None = None
    """The limit the job declares (enforced by the cluster: the Job's activeDeadlineSeconds); None = none."""

    @property
    def gpu_cost(self) -> float:
        """GPUs the item occupies while it runs (MIG instances as the core counts them: compute slices over the
        GPU's slices, `placement.usage.mig_gpus`, on the item's GPU model when it names exactly one)."""
        if self.mig_count:
            models = set(self.gpu_models)
            return mig_gpus(
                self.mig_profile, models.pop() if len(models) == 1 else None, self.replicas * self.mig_count
            )
        return self.replicas * self.gpus * self.gpu_milli / 1000.0


@dataclass(slots=True)
class Outcome:
    """What became of one item (times in simulated seconds from the start of the run)."""

    item: WorkItem
    submitted_s: float
    placed_s: float | None = None
    started_s: float | None = None
    """Every replica bound (the gang could start)."""
    finished_s: float | None = None
    cluster: str = ""
    domains: tuple[str, ...] = ()
    """The required level's values of the nodes its replicas ran on (more than one = a split gang)."""
    dispatches: int = 0
    false_dispatches: int = 0
    """Dispatches the chosen cluster could not carry out (rejected, or timed out unbound) and re-planned."""
    false_dispatch_causes: tuple[str, ...] = ()
    duplicates: int = 0
    """MultiKueue-style: copies created in other clusters and withdrawn."""
    preemptions: int = 0
    lost_gpu_s: float = 0.0
    """GPU-seconds of work lost to preemption (run since the last checkpoint)."""
    ran_s: float = 0.0
    """Run time of its preempted attempts (the last attempt's is finished_s - last_start_s)."""
    last_start_s: float | None = None
    """When its last attempt started (None: as started_s)."""

    @property
    def queueing_delay_s(self) -> float | None:
        return None if self.started_s is None else self.started_s - self.submitted_s

    @property
    def split(self) -> bool:
        return len(set(self.domains)) > 1


@dataclass(slots=True)
class RunResult:
    """One run of one policy over one fleet and workload."""

    mode: str
    """"wire" or "fast"."""
    policy: str
    """The cluster choice: "tandem", "aggregate", "round-robin", "multikueue" or "merged"."""
    fleet: FleetSpec
    seed: int
    outcomes: list[Outcome]
    allocation: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    """(simulated time, cluster -> GPUs allocated) samples, Tandem's and background pods' alike."""
    decision_latency_s: list[float] = field(default_factory=list)
    background_pods: int = 0
    makespan_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    """What the report must say about this run (compression factor, synthesised durations, …)."""
    tenant_shares: list[tuple[float, dict[str, tuple[float, float]]]] = field(default_factory=list)
    """(simulated time, tenant -> (GPUs held, water-filled fair share of the fleet's GPUs)) samples."""
    preemptions: dict[str, int] = field(default_factory=dict)
    """Victims by rule (tandem-preempt)."""
