"""The shapes of the synthetic training mix (`fleetsim.workload.training_mix`): per kind (rack and block gangs,
elastic gangs, NVLink-clique gangs, MIG inference, batch) the item shapes a fleet's hardware can carry, their
frequencies, duration laws and shares of the offered GPU-hours."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from fleetsim.domains import GIB, MIB, clique_level, domain_nodes, fits_some_domain, offers_profile, slices_per_gpu
from fleetsim.model import ClusterSpec, FleetSpec, NodeGroup, WorkItem

__all__ = [
    "BATCH_MEDIAN_S",
    "BATCH_SIGMA",
    "GANG_LEVELS",
    "INFERENCE_MEDIAN_S",
    "INFERENCE_MIG_PROFILE",
    "INFERENCE_SIGMA",
    "TRAINING_MEDIAN_S",
    "TRAINING_SIGMA",
    "Kind",
    "Template",
    "declared_max_runtime",
    "mix_kinds",
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

# Levels a training gang may require, narrowest first.
GANG_LEVELS = ("rack", "block")


def _mig_groups(fleet: FleetSpec) -> list[NodeGroup]:
    groups = [g for c in fleet.clusters for g in c.groups if offers_profile(g, INFERENCE_MIG_PROFILE)]
    a100 = [g for g in groups if "A100" in g.gpu_model.upper()]
    return a100 or groups


def declared_max_runtime(duration_s: float) -> float:
    """The max runtime a job declares: 1.5 x its run, rounded up to 15 minutes (users ask for a margin, in
    round figures); its run always ends within it."""
    return math.ceil(1.5 * duration_s / 900.0) * 900.0


_UNNAMED = WorkItem(name="", tenant="", kind="", arrival_s=0.0, duration_s=0.0)
"""An item with no name, tenant or times: each template's shape is made from it."""


@dataclass(frozen=True, slots=True)
class Template:
    """One item shape of the mix: `shape` is the item but for its name, tenant and times; `weight` is its frequency
    within its kind."""

    weight: float
    shape: WorkItem

    @property
    def kind(self) -> str:
        return self.shape.kind

    @property
    def gpu_cost(self) -> float:
        return self.shape.gpu_cost

    def item(
        self, name: str, tenant: str, arrival_s: float, duration_s: float, *, preemptible: bool = False
    ) -> WorkItem:
        return dataclasses.replace(
            self.shape,
            name=name,
            tenant=tenant,
            arrival_s=arrival_s,
            duration_s=duration_s,
            preemptible=preemptible,
            max_runtime_s=declared_max_runtime(duration_s) if duration_s > 0 else None,
        )


@dataclass(frozen=True, slots=True)
class Kind:
    """One kind of the mix: its templates, its share of the offered GPU-hours and its duration law."""

    name: str
    share: float
    median_s: float
    sigma: float
    templates: tuple[Template, ...]

    @property
    def mean_gpu_seconds(self) -> float:
        """Expected GPU-seconds of one item of this kind (log-normal mean = median * exp(sigma^2 / 2))."""
        total = sum(t.weight for t in self.templates)
        cost = sum(t.weight * t.gpu_cost for t in self.templates) / total
        return cost * self.median_s * math.exp(self.sigma**2 / 2)


def _host_share(groups: Sequence[NodeGroup], share: float, slices: int = 1) -> tuple[int, int]:
    """(cpu milli, memory bytes) per GPU (or per MIG slice, `slices` of them per GPU) that every node of `groups`
    can give."""
    cpu = min(g.cpu_cores * 1000 / (g.gpus_per_node * slices) for g in groups) * share
    memory = min(g.memory_gib * GIB / (g.gpus_per_node * slices) for g in groups) * share
    return max(int(cpu) // 100 * 100, 100), max(int(memory) // MIB * MIB, 64 * MIB)


def _whole_gpu_groups(fleet: FleetSpec, level: str, gpus: int) -> list[NodeGroup]:
    return [
        g
        for c in fleet.clusters
        for g in c.groups
        if not g.mig and g.gpus_per_node >= gpus and domain_nodes(c, g, level) > 0
    ]


def _fitting(fleet: FleetSpec, template: Template) -> bool:
    return fits_some_domain(fleet, template.shape)


def _rack_gang_templates(fleet: FleetSpec, kind: str, sizes: Sequence[tuple[int, float]]) -> list[Template]:
    """Gangs of 8-GPU pods at the narrowest of rack, block that holds them; sizes no cluster holds are left out."""
    out: list[Template] = []
    for replicas, weight in sizes:
        for level in GANG_LEVELS:
            groups = _whole_gpu_groups(fleet, level, TRAINING_GPUS_PER_POD)
            if not groups:
                continue
            cpu, memory = _host_share(groups, TRAINING_HOST_SHARE)
            template = Template(
                weight,
                dataclasses.replace(
                    _UNNAMED,
                    kind=kind,
                    replicas=replicas,
                    gpus=TRAINING_GPUS_PER_POD,
                    min_replicas=max(1, replicas // 2) if kind == "elastic" else 0,
                    required_level=level,
                    cpu_milli=cpu * TRAINING_GPUS_PER_POD,
                    memory_bytes=memory * TRAINING_GPUS_PER_POD,
                ),
            )
            if _fitting(fleet, template):
                out.append(template)
                break
    return out


def _clique_gang_templates(fleet: FleetSpec) -> list[Template]:
    """Gangs of whole trays (one pod per node, all its GPUs) inside one NVLink clique, per clique node group."""
    out: list[Template] = []
    for cluster in fleet.clusters:
        for group in cluster.groups:
            level = clique_level(cluster)
            if group.mig or not level or domain_nodes(cluster, group, level) < 2:
                continue
            cpu, memory = _host_share([group], TRAINING_HOST_SHARE)
            gpus = group.gpus_per_node
            for replicas, weight in CLIQUE_SIZES:
                template = Template(
                    weight * group.nodes * gpus,
                    dataclasses.replace(
                        _UNNAMED,
                        kind="gang",
                        replicas=replicas,
                        gpus=gpus,
                        required_level=level,
                        gpu_models=(group.gpu_model,),
                        cpu_milli=cpu * gpus,
                        memory_bytes=memory * gpus,
                    ),
                )
                if _fitting(fleet, template):
                    out.append(template)
    return out


def _batch_templates(fleet: FleetSpec) -> list[Template]:
    out: list[Template] = []
    for gpus, weight in BATCH_GPUS:
        groups = [g for c in fleet.clusters for g in c.groups if not g.mig and g.gpus_per_node >= gpus]
        if not groups:
            continue
        cpu, memory = _host_share(groups, SMALL_HOST_SHARE)
        cpu, memory = min(cpu, SMALL_MAX_CPU_MILLI_PER_GPU), min(memory, SMALL_MAX_MEMORY_PER_GPU)
        shape = dataclasses.replace(_UNNAMED, kind="batch", gpus=gpus, cpu_milli=cpu * gpus, memory_bytes=memory * gpus)
        out.append(Template(weight, shape))
    return out


def _inference_templates(fleet: FleetSpec) -> list[Template]:
    groups = _mig_groups(fleet)
    if not groups:
        return []
    models = tuple(sorted({g.gpu_model for g in groups}))
    slices = max(slices_per_gpu(g, INFERENCE_MIG_PROFILE) for g in groups)
    cpu, memory = _host_share(groups, SMALL_HOST_SHARE, slices)
    # A 1g slice is a seventh of a GPU: it gets no more host than a seventh of a small pod's GPU.
    cpu = min(cpu, max(SMALL_MAX_CPU_MILLI_PER_GPU // 7 // 100 * 100, 100))
    memory = min(memory, SMALL_MAX_MEMORY_PER_GPU // 7 // MIB * MIB)
    return [
        Template(
            weight,
            dataclasses.replace(
                _UNNAMED,
                kind="inference",
                mig_profile=INFERENCE_MIG_PROFILE,
                mig_count=count,
                gpu_models=models,
                cpu_milli=cpu * count,
                memory_bytes=memory * count,
            ),
        )
        for count, weight in MIG_COUNTS
    ]


def _in_cliques(cluster: ClusterSpec, group: NodeGroup) -> bool:
    level = clique_level(cluster)
    return bool(level) and domain_nodes(cluster, group, level) >= 2


def mix_kinds(fleet: FleetSpec) -> list[Kind]:
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
        Kind("gang", rack_share - elastic_share, t, s, tuple(gangs)),
        Kind("elastic", elastic_share, t, s, tuple(elastic)),
        Kind("clique-gang", clique_share, t, s, tuple(cliques)),
        Kind("inference", inference_share, INFERENCE_MEDIAN_S, INFERENCE_SIGMA, tuple(inference)),
        Kind("batch", batch_share, BATCH_MEDIAN_S, BATCH_SIGMA, tuple(batch)),
    ]
    return [k for k in kinds if k.templates and k.share > 0]
