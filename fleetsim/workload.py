"""Workloads for the fleet simulator: a synthetic training mix shaped to a fleet, and the Alibaba openb pod lists.

`training_mix` offers, per GPU-hour, what the fleet's hardware can carry: gangs of whole 8-GPU pods that require one
rack (or, when too large for any rack, one block); on clusters with NVLink cliques (GB200-style 4-GPU trays), gangs of
whole trays that require one clique; elastic gangs; MIG inference pods on MIG nodes; and small batch pods. Every gang
shape it emits fits, at its required level, in one domain of some empty cluster.

`alibaba_workload` turns one openb pod list into one item per pod, with the trace's own times where it has them.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import random
import re
import zlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fleetsim.model import ClusterSpec, FleetSpec, Level, NodeGroup, WorkItem
from placement.gpuarrays import PodDemand
from placement.mig import FAMILY_PROFILES, family_of
from placement.model import CLIQUE_LABEL, HOSTNAME_LABEL, ZONE_LABEL
from sim.trace import parse_demand

__all__ = [
    "TRAINING_MEDIAN_S",
    "TRAINING_SIGMA",
    "BATCH_MEDIAN_S",
    "BATCH_SIGMA",
    "INFERENCE_MEDIAN_S",
    "INFERENCE_SIGMA",
    "INFERENCE_MIG_PROFILE",
    "is_clique_level",
    "clique_level",
    "domain_nodes",
    "domain_capacity",
    "fits_some_domain",
    "expected_gpu_hours",
    "training_mix",
    "alibaba_workload",
]

# Durations are log-normal: median and sigma of ln(duration).
TRAINING_MEDIAN_S = 30 * 60.0
TRAINING_SIGMA = 0.6
"""p10 ≈ 14 min, p90 ≈ 65 min, mean ≈ 36 min."""
BATCH_MEDIAN_S = 20 * 60.0
BATCH_SIGMA = 0.7
INFERENCE_MEDIAN_S = 90 * 60.0
INFERENCE_SIGMA = 0.5
"""Inference replicas are long-lived servers (scaled in and out over hours), not batch jobs: p10 ≈ 47 min,
p90 ≈ 2.9 h."""
MIN_DURATION_S = 60.0
"""Shorter draws are raised to this (≈ 0.15 % of batch draws, fewer of the others)."""

INFERENCE_MIG_PROFILE = "1g.10gb"
TRAINING_GPUS_PER_POD = 8

# Shares of the offered GPU-hours. Inference gets the MIG GPUs' share of the fleet (MIG nodes as loaded as the rest);
# of the remainder, batch gets BATCH_SHARE and gangs the rest, the clique gangs in proportion to the clique GPUs
# among the gang-capable GPUs, and the rack/block part split gang : elastic = 70 : 30.
BATCH_SHARE = 0.15
ELASTIC_SHARE_OF_RACK_GANGS = 0.30

# Gang sizes (pods) and their relative frequency among gangs: mostly small, a few very large.
GANG_SIZES: tuple[tuple[int, float], ...] = ((2, 0.30), (4, 0.25), (8, 0.20), (16, 0.12), (32, 0.08), (64, 0.05))
ELASTIC_SIZES: tuple[tuple[int, float], ...] = ((4, 0.35), (8, 0.30), (16, 0.20), (32, 0.15))
CLIQUE_SIZES: tuple[tuple[int, float], ...] = ((2, 0.35), (4, 0.30), (8, 0.20), (16, 0.10), (18, 0.05))
BATCH_GPUS: tuple[tuple[int, float], ...] = ((1, 0.7), (2, 0.3))
MIG_COUNTS: tuple[tuple[int, float], ...] = ((1, 0.6), (2, 0.4))

# Share of a node's CPU and memory per GPU that a pod asks for (the rest is left for system daemons and sidecars).
TRAINING_HOST_SHARE = 0.75
SMALL_HOST_SHARE = 0.5
SMALL_MAX_CPU_MILLI_PER_GPU = 8000
SMALL_MAX_MEMORY_PER_GPU = 64 << 30
GIB = 1 << 30
MIB = 1 << 20

# Levels a training gang may require, narrowest first.
GANG_LEVELS = ("rack", "block")
CLIQUE_NAMES = frozenset({"clique", "nvlink"})
"""Names an NVLink-clique level goes by (the extender and agent call it "nvlink"); its label key also tells."""


# --------------------------------------------------------------------------- domains


def is_clique_level(level: Level) -> bool:
    return level.key == CLIQUE_LABEL or level.name in CLIQUE_NAMES


def clique_level(cluster: ClusterSpec) -> str:
    """The name of the cluster's NVLink-clique level ("" = none)."""
    return next((lv.name for lv in cluster.levels if is_clique_level(lv)), "")


def domain_nodes(cluster: ClusterSpec, group: NodeGroup, level: str) -> int:
    """Nodes of `group` in its largest domain at level `level` (a level name) when the cluster is empty: 0 when
    the cluster has no such level, or, for cliques, the group has none. Each node group starts its own racks,
    blocks and cliques (as the fleet loader numbers them), so no domain below the zone spans two groups."""
    found = next((lv for lv in cluster.levels if lv.name == level), None)
    if found is None:
        return 0
    if is_clique_level(found):
        return min(group.clique_nodes, group.nodes) if group.clique_nodes > 0 else 0
    if found.key == HOSTNAME_LABEL or level == "host":
        return 1
    if level == "rack":
        return min(group.nodes_per_rack, group.nodes)
    if level == "block":
        return min(group.nodes_per_rack * group.racks_per_block, group.nodes)
    if found.key == ZONE_LABEL or level == "zone":
        zone = _zone(cluster, group)
        return sum(g.nodes for g in cluster.groups if _zone(cluster, g) == zone)
    return 0


def _zone(cluster: ClusterSpec, group: NodeGroup) -> str:
    return group.zone or f"{cluster.region}-a"


def _replicas_per_node(group: NodeGroup, item: WorkItem) -> int:
    if item.mig_count:
        if not _offers_profile(group, item.mig_profile):
            return 0
        by_gpu = group.gpus_per_node * _slices_per_gpu(group, item.mig_profile) // item.mig_count
    else:
        if group.mig or item.gpus > group.gpus_per_node:
            return 0
        by_gpu = group.gpus_per_node // item.gpus if item.gpus else 1 << 30
    if item.gpu_models and group.gpu_model not in item.gpu_models:
        return 0
    by_cpu = group.cpu_cores * 1000 // max(item.cpu_milli, 1)
    by_memory = group.memory_gib * GIB // max(item.memory_bytes, 1)
    return min(by_gpu, by_cpu, by_memory)


def domain_capacity(cluster: ClusterSpec, item: WorkItem) -> int:
    """Most replicas of `item` that one domain of its required level holds in the empty cluster."""
    if item.required_level:
        return max(
            (domain_nodes(cluster, g, item.required_level) * _replicas_per_node(g, item) for g in cluster.groups),
            default=0,
        )
    return sum(g.nodes * _replicas_per_node(g, item) for g in cluster.groups)


def fits_some_domain(fleet: FleetSpec, item: WorkItem) -> bool:
    """Whether all of `item`'s replicas fit at once in one domain of its required level of some empty cluster."""
    return any(domain_capacity(c, item) >= item.replicas for c in fleet.clusters)


# --------------------------------------------------------------------------- MIG


def _offers_profile(group: NodeGroup, profile: str) -> bool:
    """A single-profile layout ("all-1g.10gb") offers only that profile; a mixed one ("all-balanced") offers every
    profile of its family."""
    if not group.mig:
        return False
    family = family_of(group.gpu_model)
    if family is None or profile not in FAMILY_PROFILES[family]:
        return False
    if group.mig.startswith("all-") and group.mig != "all-balanced":
        return group.mig == f"all-{profile}"
    return True


def _slices_per_gpu(group: NodeGroup, profile: str) -> int:
    """Instances of a 1g profile one GPU holds under the group's layout: 7 when all-1g, 2 in the balanced layout."""
    return 7 if group.mig == f"all-{profile}" else 2


def _mig_groups(fleet: FleetSpec) -> list[NodeGroup]:
    groups = [g for c in fleet.clusters for g in c.groups if _offers_profile(g, INFERENCE_MIG_PROFILE)]
    a100 = [g for g in groups if "A100" in g.gpu_model.upper()]
    return a100 or groups


# --------------------------------------------------------------------------- templates


def declared_max_runtime(duration_s: float) -> float:
    """The max runtime a job declares: 1.5 x its run, rounded up to 15 minutes (users ask for a margin, in
    round figures); its run always ends within it."""
    return math.ceil(1.5 * duration_s / 900.0) * 900.0


PREEMPTIBLE_KINDS = frozenset({"elastic", "batch"})
"""The kinds that checkpoint or are short: what a flood is made of (`flood_then_mix`), and what `training_mix`
submits preemptible when asked to (they may then borrow beyond quota, and be preempted)."""


@dataclass(frozen=True, slots=True)
class _Template:
    """One item shape of the mix; `weight` is its frequency within its kind."""

    kind: str
    weight: float
    replicas: int
    gpus: int = 0
    mig_count: int = 0
    min_replicas: int = 0
    required_level: str = ""
    gpu_models: tuple[str, ...] = ()
    cpu_milli: int = 1000
    memory_bytes: int = GIB

    def item(
        self, name: str, tenant: str, arrival_s: float, duration_s: float, *, preemptible: bool = False
    ) -> WorkItem:
        return WorkItem(
            name=name,
            tenant=tenant,
            kind=self.kind,
            arrival_s=arrival_s,
            duration_s=duration_s,
            replicas=self.replicas,
            gpus=self.gpus,
            mig_profile=INFERENCE_MIG_PROFILE if self.mig_count else "",
            mig_count=self.mig_count,
            cpu_milli=self.cpu_milli,
            memory_bytes=self.memory_bytes,
            gpu_models=self.gpu_models,
            required_level=self.required_level,
            min_replicas=self.min_replicas,
            preemptible=preemptible,
            max_runtime_s=declared_max_runtime(duration_s) if duration_s > 0 else None,
        )

    @property
    def gpu_cost(self) -> float:
        return self.item("x", "x", 0.0, 0.0).gpu_cost


@dataclass(frozen=True, slots=True)
class _Kind:
    """One kind of the mix: its templates, its share of the offered GPU-hours and its duration law."""

    name: str
    share: float
    median_s: float
    sigma: float
    templates: tuple[_Template, ...]

    @property
    def mean_gpu_seconds(self) -> float:
        """Expected GPU-seconds of one item of this kind (log-normal mean = median * exp(sigma^2 / 2))."""
        total = sum(t.weight for t in self.templates)
        cost = sum(t.weight * t.gpu_cost for t in self.templates) / total
        return cost * self.median_s * math.exp(self.sigma**2 / 2)


def _host_share(groups: Sequence[NodeGroup], share: float, slices_per_gpu: int = 1) -> tuple[int, int]:
    """(cpu milli, memory bytes) per GPU (or per MIG slice) that every node of `groups` can give."""
    cpu = min(g.cpu_cores * 1000 / (g.gpus_per_node * slices_per_gpu) for g in groups) * share
    memory = min(g.memory_gib * GIB / (g.gpus_per_node * slices_per_gpu) for g in groups) * share
    return max(int(cpu) // 100 * 100, 100), max(int(memory) // MIB * MIB, 64 * MIB)


def _whole_gpu_groups(fleet: FleetSpec, level: str, gpus: int) -> list[NodeGroup]:
    return [
        g
        for c in fleet.clusters
        for g in c.groups
        if not g.mig and g.gpus_per_node >= gpus and domain_nodes(c, g, level) > 0
    ]


def _fitting(fleet: FleetSpec, template: _Template) -> bool:
    return fits_some_domain(fleet, template.item("x", "x", 0.0, 0.0))


def _rack_gang_templates(fleet: FleetSpec, kind: str, sizes: Sequence[tuple[int, float]]) -> list[_Template]:
    """Gangs of 8-GPU pods at the narrowest of rack, block that holds them; sizes no cluster holds are left out."""
    out: list[_Template] = []
    for replicas, weight in sizes:
        for level in GANG_LEVELS:
            groups = _whole_gpu_groups(fleet, level, TRAINING_GPUS_PER_POD)
            if not groups:
                continue
            cpu, memory = _host_share(groups, TRAINING_HOST_SHARE)
            template = _Template(
                kind,
                weight,
                replicas,
                gpus=TRAINING_GPUS_PER_POD,
                min_replicas=max(1, replicas // 2) if kind == "elastic" else 0,
                required_level=level,
                cpu_milli=cpu * TRAINING_GPUS_PER_POD,
                memory_bytes=memory * TRAINING_GPUS_PER_POD,
            )
            if _fitting(fleet, template):
                out.append(template)
                break
    return out


def _clique_gang_templates(fleet: FleetSpec) -> list[_Template]:
    """Gangs of whole trays (one pod per node, all its GPUs) inside one NVLink clique, per clique node group."""
    out: list[_Template] = []
    for cluster in fleet.clusters:
        for group in cluster.groups:
            level = clique_level(cluster)
            if group.mig or not level or domain_nodes(cluster, group, level) < 2:
                continue
            cpu, memory = _host_share([group], TRAINING_HOST_SHARE)
            gpus = group.gpus_per_node
            for replicas, weight in CLIQUE_SIZES:
                template = _Template(
                    "gang",
                    weight * group.nodes * gpus,
                    replicas,
                    gpus=gpus,
                    required_level=level,
                    gpu_models=(group.gpu_model,),
                    cpu_milli=cpu * gpus,
                    memory_bytes=memory * gpus,
                )
                if _fitting(fleet, template):
                    out.append(template)
    return out


def _batch_templates(fleet: FleetSpec) -> list[_Template]:
    out: list[_Template] = []
    for gpus, weight in BATCH_GPUS:
        groups = [g for c in fleet.clusters for g in c.groups if not g.mig and g.gpus_per_node >= gpus]
        if not groups:
            continue
        cpu, memory = _host_share(groups, SMALL_HOST_SHARE)
        cpu, memory = min(cpu, SMALL_MAX_CPU_MILLI_PER_GPU), min(memory, SMALL_MAX_MEMORY_PER_GPU)
        out.append(_Template("batch", weight, 1, gpus=gpus, cpu_milli=cpu * gpus, memory_bytes=memory * gpus))
    return out


def _inference_templates(fleet: FleetSpec) -> list[_Template]:
    groups = _mig_groups(fleet)
    if not groups:
        return []
    models = tuple(sorted({g.gpu_model for g in groups}))
    slices = max(_slices_per_gpu(g, INFERENCE_MIG_PROFILE) for g in groups)
    cpu, memory = _host_share(groups, SMALL_HOST_SHARE, slices)
    # A 1g slice is a seventh of a GPU: it gets no more host than a seventh of a small pod's GPU.
    cpu = min(cpu, max(SMALL_MAX_CPU_MILLI_PER_GPU // 7 // 100 * 100, 100))
    memory = min(memory, SMALL_MAX_MEMORY_PER_GPU // 7 // MIB * MIB)
    return [
        _Template(
            "inference",
            weight,
            1,
            mig_count=count,
            gpu_models=models,
            cpu_milli=cpu * count,
            memory_bytes=memory * count,
        )
        for count, weight in MIG_COUNTS
    ]


def _in_cliques(cluster: ClusterSpec, group: NodeGroup) -> bool:
    level = clique_level(cluster)
    return bool(level) and domain_nodes(cluster, group, level) >= 2


def _mix(fleet: FleetSpec) -> list[_Kind]:
    """The kinds of the mix with their shares of the offered GPU-hours (kinds the fleet cannot run are left out)."""
    mig_gpus = sum(g.nodes * g.gpus_per_node for g in _mig_groups(fleet))
    clique_gpus = sum(
        g.nodes * g.gpus_per_node for c in fleet.clusters for g in c.groups if not g.mig and _in_cliques(c, g)
    )
    rack_gpus = sum(
        g.nodes * g.gpus_per_node
        for c in fleet.clusters
        for g in c.groups
        if not g.mig
        and g.gpus_per_node >= TRAINING_GPUS_PER_POD
        and any(domain_nodes(c, g, level) for level in GANG_LEVELS)
        and not _in_cliques(c, g)
    )
    gangs = _rack_gang_templates(fleet, "gang", GANG_SIZES)
    elastic = _rack_gang_templates(fleet, "elastic", ELASTIC_SIZES)
    cliques = _clique_gang_templates(fleet)
    inference = _inference_templates(fleet)
    batch = _batch_templates(fleet)

    inference_share = mig_gpus / fleet.gpus if inference else 0.0
    rest = 1.0 - inference_share
    rack_capable = rack_gpus if gangs or elastic else 0
    clique_capable = clique_gpus if cliques else 0
    capable = rack_capable + clique_capable
    gang_share = rest * (1.0 - BATCH_SHARE) if capable else 0.0
    clique_share = gang_share * clique_capable / capable if capable else 0.0
    rack_share = gang_share - clique_share
    elastic_share = rack_share * ELASTIC_SHARE_OF_RACK_GANGS if gangs else rack_share
    batch_share = rest - gang_share

    t, s = TRAINING_MEDIAN_S, TRAINING_SIGMA
    kinds = [
        _Kind("gang", rack_share - elastic_share, t, s, tuple(gangs)),
        _Kind("elastic", elastic_share, t, s, tuple(elastic)),
        _Kind("clique-gang", clique_share, t, s, tuple(cliques)),
        _Kind("inference", inference_share, INFERENCE_MEDIAN_S, INFERENCE_SIGMA, tuple(inference)),
        _Kind("batch", batch_share, BATCH_MEDIAN_S, BATCH_SIGMA, tuple(batch)),
    ]
    return [k for k in kinds if k.templates and k.share > 0]


def expected_gpu_hours(items: Sequence[WorkItem]) -> float:
    """Offered GPU-hours of a workload: each item's GPU cost times its duration."""
    return sum(i.gpu_cost * i.duration_s for i in items) / 3600.0


def training_mix(
    fleet: FleetSpec, *, hours: float, load: float, seed: int, preemptible_kinds: Collection[str] = ()
) -> list[WorkItem]:
    """A synthetic training workload for `fleet`, arriving over `hours` simulated hours, sorted by arrival.

    Kinds (`WorkItem.kind`):
    - "gang": 2–64 pods x 8 GPUs, requiring one rack, or one block when no rack of any cluster holds them;
      on clusters with an NVLink clique level (named "clique" or "nvlink", or keyed `nvidia.com/gpu.clique`; the item
      asks for that name), gangs of 2–18 whole trays (e.g. 4-GPU GB200 trays) requiring one clique, limited to that
      model; shapes no empty cluster's domain holds are never emitted;
    - "elastic": 4–32 such pods that may start with half (`min_replicas` = replicas // 2);
    - "inference": one pod with 1–2 MIG `1g.10gb` slices on the A100 MIG models (only when the fleet has MIG nodes);
    - "batch": one pod with 1–2 whole GPUs of any model.
    Items of `preemptible_kinds` (e.g. `PREEMPTIBLE_KINDS`) are submitted preemptible; by default none is.
    Every item declares a max runtime (`declared_max_runtime`: 1.5 x its run, in quarter hours).

    Shares of the offered GPU-hours: inference gets the MIG GPUs' fraction of the fleet (so MIG nodes are as loaded as
    the rest); of the remainder batch gets 15 % and gangs 85 %, split between clique gangs and rack/block gangs in
    proportion to the GPUs that can run each, and the rack/block part 70 : 30 between fixed and elastic gangs. A kind
    the fleet cannot run gives its share to the others. Per-pod CPU and memory are 75 % (training) or 50 % (small
    pods, at most 8 cores and 64 GiB per GPU) of the per-GPU share of the smallest node that can run the shape.

    Durations are log-normal: training median 30 min (sigma 0.6, mean ≈ 36 min), inference median 12 min (sigma 0.5),
    batch median 8 min (sigma 0.7), never under 1 min. Arrivals are one Poisson process whose rate makes the expected
    offered GPU-hours `load` x fleet GPUs x `hours` (MIG slices count 1/7 GPU); the kind of each arrival is drawn in
    proportion to its rate, the tenant in proportion to its weight. Deterministic per `seed`.
    """
    if hours <= 0 or load <= 0:
        raise ValueError("hours and load must be positive")
    tenants = [t for t in fleet.tenants if t.weight > 0]
    if not tenants:
        raise ValueError(f"fleet {fleet.name!r} has no tenant with a positive weight")
    kinds = _mix(fleet) if fleet.gpus > 0 else []
    if not kinds:
        raise ValueError(f"fleet {fleet.name!r} can run none of the mix's shapes")
    # The share that kinds the fleet cannot run would have had goes to the others in proportion.
    total_share = sum(k.share for k in kinds)
    rates = [load * fleet.gpus * k.share / total_share / k.mean_gpu_seconds for k in kinds]
    rate = sum(rates)

    rng = random.Random(seed)
    tenant_names = [t.name for t in tenants]
    tenant_weights = [t.weight for t in tenants]
    horizon_s = hours * 3600.0
    items: list[WorkItem] = []
    arrival_s = rng.expovariate(rate)
    while arrival_s < horizon_s:
        kind = rng.choices(kinds, weights=rates)[0]
        template = rng.choices(kind.templates, weights=[t.weight for t in kind.templates])[0]
        tenant = rng.choices(tenant_names, weights=tenant_weights)[0]
        duration_s = max(rng.lognormvariate(math.log(kind.median_s), kind.sigma), MIN_DURATION_S)
        name = f"{template.kind}-{len(items):06d}"
        items.append(
            template.item(
                name, tenant, round(arrival_s, 3), round(duration_s, 3), preemptible=template.kind in preemptible_kinds
            )
        )
        arrival_s += rng.expovariate(rate)
    return items


def flood_then_mix(
    fleet: FleetSpec,
    *,
    hours: float,
    load: float,
    seed: int,
    flood_tenant: str = "",
    flood_hours: float = 0.25,
    flood_median_s: float = 3 * 3600.0,
) -> list[WorkItem]:
    """The case preemption exists for: one tenant fills the fleet with long preemptible work, then everyone's
    usual work arrives (`training_mix` over the other tenants, `hours` at `load`).

    The flood: the mix's preemptible kinds (elastic gangs and batch pods, sizes and shares as in the mix) from
    `flood_tenant` (default: the lowest-weight tenant, first by name), all preemptible, arriving as a Poisson process over the first
    `flood_hours` with enough offered GPU-seconds to hold every GPU for the flood's median duration
    (log-normal, median `flood_median_s`, sigma 0.3). Names start with "flood-". The others' work is not
    preemptible: they are the owners coming back. Deterministic per `seed`."""
    tenants = sorted(fleet.tenants, key=lambda t: (t.weight, t.name))
    if len(tenants) < 2:
        raise ValueError("a flood needs another tenant to arrive after it")
    flooder = flood_tenant or tenants[0].name
    if flooder not in {t.name for t in tenants}:
        raise ValueError(f"unknown flood tenant {flooder!r}")
    kinds = [k for k in _mix(fleet) if k.templates and k.templates[0].kind in PREEMPTIBLE_KINDS]
    if not kinds:
        raise ValueError(f"fleet {fleet.name!r} runs none of the preemptible kinds")
    rng = random.Random(seed * 7919 + 1)
    shares = [k.share for k in kinds]
    mean_cost = sum(
        sh * sum(t.weight * t.gpu_cost for t in k.templates) / sum(t.weight for t in k.templates)
        for sh, k in zip(shares, kinds)
    ) / sum(shares)
    count = max(1, round(fleet.gpus / mean_cost))
    items: list[WorkItem] = []
    for n in range(count):
        kind = rng.choices(kinds, weights=shares)[0]
        template = rng.choices(kind.templates, weights=[t.weight for t in kind.templates])[0]
        arrival = rng.uniform(0.0, flood_hours * 3600.0)
        duration = max(rng.lognormvariate(math.log(flood_median_s), 0.3), MIN_DURATION_S)
        items.append(
            template.item(
                f"flood-{template.kind}-{n:05d}", flooder, round(arrival, 3), round(duration, 3), preemptible=True
            )
        )
    others = dataclasses.replace(fleet, tenants=tuple(t for t in fleet.tenants if t.name != flooder))
    rest = [
        dataclasses.replace(i, arrival_s=round(i.arrival_s + flood_hours * 3600.0, 3))
        for i in training_mix(others, hours=hours, load=load, seed=seed)
    ]
    return sorted(items + rest, key=lambda i: (i.arrival_s, i.name))


# --------------------------------------------------------------------------- Alibaba openb


# Synthetic times for pod lists without them (the multigpu* files): log-normal run times matched to the default
# list's observed lifetimes (p50 540 s, p90 6,574 s, data/traces/alibaba-gpu-v2023/README.md).
TRACE_MEDIAN_S = 540.0
TRACE_SIGMA = math.log(6574.0 / 540.0) / 1.2816
TRACE_INTERARRIVAL_S = 30.0

_NOT_DNS = re.compile(r"[^a-z0-9-]+")


def _dns_label(raw: str, taken: set[str]) -> str:
    """A DNS-1123 label from a trace name, unique among `taken` (which it joins)."""
    base = _NOT_DNS.sub("-", raw.lower()).strip("-")[:56] or "pod"
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}-{n}"
    taken.add(name)
    return name


def _time(row: Mapping[str, str | None], key: str) -> float | None:
    value = (row.get(key) or "").strip()
    return float(value) if value else None


def alibaba_workload(
    pod_csv_path: Path | str,
    *,
    tenants: Sequence[str],
    seed: int,
    limit: int | None = None,
    window_start_s: float | None = None,
    interarrival_s: float = TRACE_INTERARRIVAL_S,
    model_names: Mapping[str, str] | None = None,
) -> tuple[list[WorkItem], list[str]]:
    """One "trace" item per pod of an openb pod list (sorted by arrival), and notes on what was synthesised.

    Shapes come from `sim.trace.parse_demand` (the replay's parser): whole GPUs, the share of fractional pods, CPU,
    memory and the allowed models (`gpu_spec`, renamed through `model_names` when given).

    Times, where the list has them: arrival = `creation_time` − `window_start_s` (default: the earliest creation);
    duration = `deletion_time` − `scheduled_time`. Pods created before `window_start_s` arrive at 0 with the run time
    they have left. Pods the trace never scheduled (Pending) get a run time drawn from the scheduled pods' run times.
    A list without creation times gets Poisson arrivals (mean `interarrival_s`) in a seeded shuffle of its pods, and
    rows without deletion times a log-normal run time (median 540 s, p90 6,574 s: the default list's lifetimes).
    Tenants are assigned by a hash of the pod name over `tenants`. `limit` keeps the first pods by arrival.
    """
    if not tenants:
        raise ValueError("alibaba_workload needs at least one tenant")
    path = Path(pod_csv_path)
    with path.open(newline="") as f:
        rows = sorted(csv.DictReader(f), key=lambda r: r["name"])
    rng = random.Random(seed)
    notes: list[str] = []
    renames = model_names or {}

    creations = [_time(r, "creation_time") for r in rows]
    origin = 0.0
    real_arrivals = bool(rows) and all(c is not None for c in creations)
    if real_arrivals:
        origin = window_start_s if window_start_s is not None else min(c for c in creations if c is not None)
        order = sorted(range(len(rows)), key=lambda i: (creations[i] or 0.0, rows[i]["name"]))
    else:
        order = list(range(len(rows)))
        rng.shuffle(order)
        notes.append(
            f"{path.name}: no creation times; arrivals synthesised as a Poisson process (mean interarrival "
            f"{interarrival_s:g} s) over a seeded shuffle of the pods (seed {seed})."
        )

    observed = [
        d - s
        for r in rows
        if (s := _time(r, "scheduled_time")) is not None and (d := _time(r, "deletion_time")) is not None and d >= s
    ]
    taken: set[str] = set()
    items: list[WorkItem] = []
    pending = synthetic = censored = started_early = ended_early = 0
    cache: dict[PodDemand, PodDemand] = {}
    arrival_s = 0.0
    for i in order:
        if limit is not None and len(items) >= limit:
            break
        row = rows[i]
        scheduled, deleted = _time(row, "scheduled_time"), _time(row, "deletion_time")
        if real_arrivals:
            arrival_s = (creations[i] or 0.0) - origin
            if deleted is not None and deleted <= origin:
                ended_early += 1  # gone before the window opens
                continue
        else:
            arrival_s += rng.expovariate(1.0 / interarrival_s)
        demand = parse_demand(row, cache)
        if scheduled is not None and deleted is not None and deleted >= scheduled:
            # A pod already running when the window opens only has the rest of its run time left.
            duration_s = deleted - max(scheduled, origin) if real_arrivals else deleted - scheduled
            censored += (row.get("pod_phase") or "") == "Running"
        elif deleted is not None and observed:
            duration_s = rng.choice(observed)
            pending += 1
        else:
            duration_s = rng.lognormvariate(math.log(TRACE_MEDIAN_S), TRACE_SIGMA)
            synthetic += 1
        if arrival_s < 0:
            started_early += 1
            arrival_s = 0.0
        gpu_count = demand.gpu_count
        items.append(
            WorkItem(
                name=_dns_label(row["name"], taken),
                tenant=tenants[zlib.crc32(row["name"].encode()) % len(tenants)],
                kind="trace",
                arrival_s=arrival_s,
                duration_s=max(duration_s, 1.0),
                replicas=1,
                gpus=gpu_count,
                gpu_milli=demand.gpu_milli if gpu_count else 1000,
                cpu_milli=demand.cpu_milli,
                memory_bytes=demand.mem_mib * MIB,
                gpu_models=tuple(sorted(renames.get(m, m) for m in demand.models)),
            )
        )
    items.sort(key=lambda it: (it.arrival_s, it.name))

    if pending:
        notes.append(
            f"{path.name}: {pending} pods were never scheduled in the trace (Pending); their run times were "
            f"drawn from the {len(observed)} scheduled pods' run times (seed {seed})."
        )
    if synthetic:
        notes.append(
            f"{path.name}: {synthetic} pods have no deletion time; durations synthesised as log-normal "
            f"(median {TRACE_MEDIAN_S:g} s, p90 6574 s, as the default list's lifetimes; seed {seed})."
        )
    if censored:
        notes.append(
            f"{path.name}: {censored} pods were still Running when the trace snapshot ends; their "
            f"durations stop there (censored)."
        )
    if started_early:
        notes.append(
            f"{path.name}: {started_early} pods were created before the window start; they arrive at 0 with "
            f"the run time they had left."
        )
    if ended_early:
        notes.append(f"{path.name}: {ended_early} pods ended before the window start and were left out.")
    return items, notes
