"""Fast mode's clusters as they really are: placement Nodes with everything bound on them, and the in-cluster
schedulers that bind pods there (kube-scheduler with the extender's scores for unpinned pods, the default
scheduler's least-allocated rule for background pods).

Capacity is taken and given back only through the core (`placement.allocation.allocate` / `release`), so the true
state is exact; the broker sees it only through the inventory reports fast mode builds from it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from extender.config import LEVEL_NAMES
from fleetplan.catalog import Level
from fleetsim.model import ClusterSpec, FleetSpec
from fleetsim.node_objects import mig_layout, node_locations
from placement import mig
from placement.allocation import Allocation, allocate, release
from placement.fit import capacity
from placement.gpuarrays import GpuArrays, PodDemand, fresh_versions
from placement.model import (
    CLIQUE_LABEL,
    GPU_MEMORY_LABEL,
    GPU_PRODUCT_LABEL,
    HOSTNAME_LABEL,
    ZONE_LABEL,
    Gpu,
    Node,
    PodShape,
    Taint,
    Toleration,
    TopologyLevels,
)
from placement.podspec import GPU_RESOURCE
from placement.scoring import Policy, choose_node
from placement.topology import DomainId, domain_of
from placement.usage import shape_gpus

__all__ = [
    "GPU_TAINT",
    "GPU_TOLERATION",
    "AttemptKey",
    "Cell",
    "PodKey",
    "ReplicaKey",
    "agent_levels",
    "demand_of",
    "merged_nodes",
    "nodes_of",
    "owners",
]

GPU_TAINT = Taint(GPU_RESOURCE, "present", "NoSchedule")
"""The taint every GPU node carries (as fleetsim.node_objects' Node objects): every pod here tolerates it. Its key is
the GPU resource name, as Kubernetes' ExtendedResourceToleration admission expects."""
GPU_TOLERATION = Toleration(GPU_RESOURCE, "Exists", "", "NoSchedule")

PodKey = tuple[str, int, int]
"""(job name or background id, attempt, replica index)."""
AttemptKey = tuple[str, int]
ReplicaKey = tuple[str, int]


# --------------------------------------------------------------------------- nodes


def agent_levels(cluster: ClusterSpec) -> tuple[Level, ...]:
    """The levels the cluster's agent reports: the cluster's own, then `host` (the agent always has it)."""
    levels = tuple(cluster.levels)
    if all(lv.name != "host" for lv in levels):
        levels += (Level("host", HOSTNAME_LABEL),)
    return levels


def nodes_of(cluster: ClusterSpec) -> list[Node]:
    """The cluster's nodes, empty, as the core sees them after the extender read fleetsim.node_objects' Node objects:
    topology = the values of `agent_levels` (None where a node has no such label, e.g. outside any clique), MIG
    GPUs published as mixed-strategy extended resources (counts, no whole GPUs), the GPU taint."""
    levels = agent_levels(cluster)
    out: list[Node] = []
    for loc in node_locations(cluster):
        g, name = loc.group, loc.name
        labels = {
            HOSTNAME_LABEL: name,
            "topology.kubernetes.io/region": cluster.region,
            ZONE_LABEL: loc.zone,
            GPU_PRODUCT_LABEL: g.gpu_model,
        }
        if g.gpu_memory_mib:
            labels[GPU_MEMORY_LABEL] = str(g.gpu_memory_mib)
        for level in cluster.levels:
            if loc.level_value(level.name):
                labels[level.key] = loc.level_value(level.name)
        if loc.clique:
            labels[CLIQUE_LABEL] = loc.clique
        topology = tuple(loc.level_value(level.name) or None for level in levels)
        extended: dict[str, int] = {}
        gpus: tuple[Gpu, ...] = ()
        if g.mig:
            for profile, per_gpu in mig_layout(g.gpu_model, g.mig).items():
                extended[mig.resource_name(profile)] = per_gpu * g.gpus_per_node
        else:
            gpus = tuple(Gpu(k, g.gpu_model, g.gpu_memory_mib) for k in range(g.gpus_per_node))
        out.append(
            Node(
                name=name,
                labels=labels,
                taints=(GPU_TAINT,),
                cpu_milli_allocatable=g.cpu_cores * 1000,
                cpu_milli_free=g.cpu_cores * 1000,
                memory_allocatable=g.memory_gib << 30,
                memory_free=g.memory_gib << 30,
                pods_free=110,
                gpus=gpus,
                extended_free=extended,
                topology=topology,
            )
        )
    return out


def merged_nodes(fleet: FleetSpec) -> tuple[tuple[Level, ...], list[Node], dict[str, str]]:
    """Every node of the fleet as one cluster: the union of the clusters' levels (broad to narrow), each value
    prefixed by its cluster so domains stay distinct per original cluster. A level a cluster lacks takes the
    value of its nearest narrower level there (a block-less cluster's block is its rack), so no domain spans
    what the original cluster would not have grouped. Returns (levels, nodes, node -> original cluster)."""
    names: list[str] = []
    keys: dict[str, str] = {}
    for c in fleet.clusters:
        for level in agent_levels(c):
            if level.name not in keys:
                keys[level.name] = level.key
                names.append(level.name)
    names.sort(key=lambda n: LEVEL_NAMES.index(n) if n in LEVEL_NAMES else len(LEVEL_NAMES))
    levels = tuple(Level(n, keys[n]) for n in names)
    nodes: list[Node] = []
    owner: dict[str, str] = {}
    for c in fleet.clusters:
        own = [level.name for level in agent_levels(c)]
        for node in nodes_of(c):
            value = dict(zip(own, node.topology))
            path: list[str | None] = []
            for n in names:
                if n in value:
                    v = value[n]
                else:
                    narrower = [m for m in names[names.index(n) + 1 :] if m in value]
                    v = value[narrower[0]] if narrower else node.name
                path.append(f"{c.name}/{v}" if v is not None else None)
            nodes.append(
                Node(
                    name=node.name,
                    labels=node.labels,
                    taints=node.taints,
                    cpu_milli_allocatable=node.cpu_milli_allocatable,
                    cpu_milli_free=node.cpu_milli_free,
                    memory_allocatable=node.memory_allocatable,
                    memory_free=node.memory_free,
                    pods_free=node.pods_free,
                    gpus=node.gpus,
                    extended_free=node.extended_free,
                    topology=tuple(path),
                )
            )
            owner[node.name] = c.name
    return levels, nodes, owner


# --------------------------------------------------------------------------- one cluster's true state


@dataclass(eq=False)
class Cell:
    """One Kubernetes cluster as it really is (the merged policy has one cell holding every node).

    Rows index the nodes in their cluster order (the order kube-scheduler and the scorers break ties by).
    `dirty` rows changed since the last inventory report; `bound` is what the agent reports per attempt."""

    name: str
    levels: tuple[Level, ...]
    nodes: list[Node]
    owner: list[str]
    """Original cluster of each row (differs from `name` only in the merged cell)."""
    kinds: list[int]
    """Node group of each row, numbered through the fleet (a group's nodes are identical when empty)."""
    policy: Policy | None = None
    """The extender's node scoring for unpinned GPU pods (None: best fit by free GPUs)."""
    names: list[str] = field(init=False)
    row: dict[str, int] = field(init=False)
    topo: TopologyLevels = field(init=False)
    pods: dict[PodKey, tuple[int, Allocation, float]] = field(init=False, default_factory=dict)
    used: dict[str, float] = field(init=False)
    dirty: set[int] = field(init=False, default_factory=set)
    reported: list[Node] = field(init=False)
    bound: dict[AttemptKey, set[ReplicaKey]] = field(init=False, default_factory=dict)
    bound_changed: bool = field(init=False, default=False)
    background_rows: dict[str, list[int]] = field(init=False)
    """Per original cluster, the rows a background pod (whole GPUs) may use: the non-MIG GPU nodes."""
    _cap: dict[tuple[int, int], tuple[Node, int]] = field(init=False, default_factory=dict)
    _members: dict[tuple[int, DomainId], list[int]] = field(init=False, default_factory=dict)
    _domains: dict[int, list[DomainId]] = field(init=False, default_factory=dict)
    arrays: GpuArrays = field(init=False)

    def __post_init__(self) -> None:
        self.names = [n.name for n in self.nodes]
        self.row = {n: i for i, n in enumerate(self.names)}
        self.topo = TopologyLevels(tuple(level.key for level in self.levels))
        self.used = {c: 0.0 for c in dict.fromkeys(self.owner)}
        self.reported = list(self.nodes)
        self.background_rows = {c: [] for c in self.used}
        for i, n in enumerate(self.nodes):
            if n.gpus:
                self.background_rows[self.owner[i]].append(i)
        self.arrays = self._build_arrays()

    # ------------------------------------------------------------------ topology

    def depth_of(self, level: str) -> int | None:
        """Index of a level (by name or label key); None when this cluster has no such level."""
        for i, lv in enumerate(self.levels):
            if level in (lv.name, lv.key):
                return i
        return None

    def domain(self, row: int, depth: int) -> DomainId:
        doms = self._domains.get(depth)
        if doms is None:
            doms = self._domains[depth] = [domain_of(n, self.topo, depth) for n in self.nodes]
        return doms[row]

    def members(self, depth: int, dom: DomainId) -> list[int]:
        key = (depth, dom)
        rows = self._members.get(key)
        if rows is None:
            rows = self._members[key] = [r for r in range(len(self.nodes)) if self.domain(r, depth) == dom]
        return rows

    def level_value(self, row: int, depth: int) -> str:
        return self.nodes[row].topology[depth] or ""

    # ------------------------------------------------------------------ capacity

    def capacity(self, row: int, shape: PodShape, code: int) -> int:
        """Replicas of `shape` (interned as `code`) the node holds now, by the core's fit (memoised per node state)."""
        node = self.nodes[row]
        hit = self._cap.get((row, code))
        if hit is not None and hit[0] is node:
            return hit[1]
        n = capacity(node, shape).count
        self._cap[(row, code)] = (node, n)
        return n

    def bind(self, key: PodKey, row: int, shape: PodShape) -> None:
        """Take one replica's resources on the node (raises CapacityError when it does not fit)."""
        node, alloc = allocate(self.nodes[row], shape, 1)
        cost = shape_gpus(shape)
        self.nodes[row] = node
        self.pods[key] = (row, alloc, cost)
        self.used[self.owner[row]] += cost
        self.dirty.add(row)
        self._sync_row(row)

    def unbind(self, key: PodKey) -> int:
        """Give one replica's resources back; returns its row."""
        row, alloc, cost = self.pods.pop(key)
        self.nodes[row] = release(self.nodes[row], alloc)
        self.used[self.owner[row]] -= cost
        self.dirty.add(row)
        self._sync_row(row)
        return row

    def mark_bound(self, attempt: AttemptKey, replica: ReplicaKey) -> None:
        self.bound.setdefault(attempt, set()).add(replica)
        self.bound_changed = True

    def forget(self, attempt: AttemptKey) -> None:
        if self.bound.pop(attempt, None) is not None:
            self.bound_changed = True

    # ------------------------------------------------------------------ reports

    def take_report(self) -> tuple[list[Node], set[int]]:
        """The nodes changed since the last report, and the node groups where some node gained room."""
        changed: list[Node] = []
        grew: set[int] = set()
        for row in sorted(self.dirty):
            new, old = self.nodes[row], self.reported[row]
            if new is old:
                continue
            if _gained(old, new):
                grew.add(self.kinds[row])
            changed.append(new)
            self.reported[row] = new
        self.dirty.clear()
        return changed, grew

    # ------------------------------------------------------------------ schedulers

    def schedule_pod(
        self, shape: PodShape, code: int, demand: PodDemand | None, depth: int | None, domain: DomainId | None
    ) -> int | None:
        """kube-scheduler for one unpinned pod: feasible nodes by the core's fit, the required topology as pod
        affinity (the gang's first pod picks a node that has the level's label, the rest must share its domain),
        then the extender's score (whole and shared GPUs: its scoring policy; MIG and CPU-only pods: the tightest
        node, as the extender scores them). None: the pod stays pending."""
        if depth is None:
            rows: Sequence[int] = range(len(self.nodes))
        elif domain is None:
            rows = [r for r in range(len(self.nodes)) if self.nodes[r].topology[depth] is not None]
        else:
            rows = self.members(depth, domain)
        fits = [r for r in rows if self.capacity(r, shape, code) > 0]
        if not fits:
            return None
        if len(fits) == 1:
            return fits[0]
        if demand is not None and self.policy is not None:
            feasible = np.zeros(len(self.nodes), np.bool_)
            feasible[fits] = True
            return choose_node(self.policy, self.arrays, demand, feasible)
        if shape.gpus > 0:  # best fit by free GPUs after placement
            return min(fits, key=lambda r: (self.nodes[r].free_whole_gpus, r))
        return min(fits, key=lambda r: (self.capacity(r, shape, code), r))

    def place_background(self, cluster: str, shape: PodShape, code: int) -> int | None:
        """The default scheduler (no extender) for a background pod: the least allocated feasible node."""
        fits = [r for r in self.background_rows.get(cluster, ()) if self.capacity(r, shape, code) > 0]
        if not fits:
            return None
        return max(fits, key=lambda r: (self.nodes[r].free_whole_gpus, self.nodes[r].cpu_milli_free, -r))

    # ------------------------------------------------------------------ scoring columns

    def _build_arrays(self) -> GpuArrays:
        width = max((len(n.gpus) for n in self.nodes), default=1) or 1
        left = np.zeros((len(self.nodes), width), np.int32)
        for i, n in enumerate(self.nodes):
            left[i, : len(n.gpus)] = [g.milli_free for g in n.gpus]
        models = [n.gpu_model or "" for n in self.nodes]
        names = sorted(set(models))
        code = {m: i for i, m in enumerate(names)}
        return GpuArrays(
            self.names,
            [n.cpu_milli_free for n in self.nodes],
            [n.memory_free >> 20 for n in self.nodes],
            left,
            [len(n.gpus) for n in self.nodes],
            [code[m] for m in models],
            names,
        )

    def _sync_row(self, row: int) -> None:
        """Keep the scoring columns equal to the node (as the extender's snapshot rebuilds a changed row)."""
        n = self.nodes[row]
        a = self.arrays
        a.cpu_left[row] = max(n.cpu_milli_free, 0)
        a.mem_left[row] = max(n.memory_free, 0) >> 20
        for k, g in enumerate(n.gpus):
            a.gpu_left[row, k] = g.milli_free
        a.version[row] = fresh_versions(1)[0]


def _gained(old: Node, new: Node) -> bool:
    if new.free_whole_gpus > old.free_whole_gpus or new.cpu_milli_free > old.cpu_milli_free:
        return True
    if new.memory_free > old.memory_free or new.pods_free > old.pods_free:
        return True
    if sum(g.milli_free for g in new.gpus) > sum(g.milli_free for g in old.gpus):
        return True
    return any(v > old.extended_free.get(k, 0) for k, v in new.extended_free.items())


def demand_of(shape: PodShape) -> PodDemand | None:
    """The scorer's view of a pod with whole or shared GPUs (None for MIG and CPU-only pods)."""
    if shape.gpus <= 0 or shape.mig_count or shape.dra:
        return None
    return PodDemand(
        cpu_milli=shape.cpu_milli,
        mem_mib=shape.memory >> 20,
        gpu_count=shape.gpus,
        gpu_milli=shape.gpu_milli,
        models=shape.gpu_models,
    )


def owners(cells: Mapping[str, Cell]) -> dict[str, Cell]:
    """Original cluster -> the cell holding its nodes."""
    return {c: cell for cell in cells.values() for c in cell.used}
