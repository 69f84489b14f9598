"""What one domain of an empty cluster holds: a cluster's nodes per rack, block, NVLink clique or zone, how many
replicas of an item fit on a node of a group (whole GPUs, MIG instances, CPU, memory), and so whether an item's gang
fits at its required level anywhere in a fleet."""

from __future__ import annotations

from fleetplan.catalog import Level
from fleetsim.model import ClusterSpec, FleetSpec, NodeGroup, WorkItem
from placement.mig import FAMILY_PROFILES, family_of
from placement.model import CLIQUE_LABEL, HOSTNAME_LABEL, ZONE_LABEL

__all__ = [
    "CLIQUE_NAMES",
    "GIB",
    "MIB",
    "clique_level",
    "domain_capacity",
    "domain_nodes",
    "fits_some_domain",
    "is_clique_level",
    "offers_profile",
    "slices_per_gpu",
]

GIB = 1 << 30
MIB = 1 << 20
"""Byte units of node memory and of what items request."""
CLIQUE_NAMES = frozenset({"clique", "nvlink"})
"""Names an NVLink-clique level goes by (the extender and agent call it "nvlink"); its label key also tells."""


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
        if not offers_profile(group, item.mig_profile):
            return 0
        by_gpu = group.gpus_per_node * slices_per_gpu(group, item.mig_profile) // item.mig_count
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


def offers_profile(group: NodeGroup, profile: str) -> bool:
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


def slices_per_gpu(group: NodeGroup, profile: str) -> int:
    """Instances of a 1g profile one GPU holds under the group's layout: 7 when all-1g, 2 in the balanced layout."""
    return 7 if group.mig == f"all-{profile}" else 2
