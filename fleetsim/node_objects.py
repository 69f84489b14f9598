"""Each cluster's nodes as real-format Kubernetes Node objects: where every node sits (zone, block, rack, NVLink
clique), the labels GPU feature discovery and the mig-manager put on it, and the MIG layouts a node group may use."""

from __future__ import annotations

import ipaddress
import re
import uuid
from dataclasses import dataclass
from typing import Any

from fleetsim.model import ClusterSpec, NodeGroup
from placement import mig
from placement.model import CLIQUE_LABEL, GPU_MEMORY_LABEL, GPU_PRODUCT_LABEL, HOSTNAME_LABEL, ZONE_LABEL
from placement.podspec import GPU_RESOURCE
from sim.nodes import node_conditions

__all__ = ["NodeLocation", "mig_layout", "node_locations", "node_name", "node_objects"]


def mig_layout(gpu_model: str, layout: str) -> dict[str, int]:
    """MIG instances on each GPU of `gpu_model` under a mig-manager layout ("all-<profile>" or "all-balanced"),
    profile -> count; ValueError when the model has no MIG or no such layout (MIG-GEOMETRY.md §1-2)."""
    family = mig.family_of(gpu_model)
    if family is None:
        raise ValueError(f"{gpu_model!r} has no MIG (MIG-capable: A100, A30, H100, H200, B200, GB200)")
    profiles = mig.FAMILY_PROFILES[family]
    classes = mig.CLASSES_A30 if family == "A30" else mig.CLASSES_8
    by_class: dict[str, str] = {}
    for profile, cls in profiles.items():
        by_class.setdefault(cls, profile)  # GB200: the production-board names come first
    if layout == "all-balanced":
        # mig-parted's default config: two 1g, one 2g (and one 3g on 8-slice GPUs)
        wanted = {"1g": 2, "2g": 1} if family == "A30" else {"1g": 2, "2g": 1, "3g": 1}
        return {by_class[c]: n for c, n in wanted.items()}
    profile = layout.removeprefix("all-")
    cls_name = profiles.get(profile) if layout.startswith("all-") else None
    if cls_name is None or classes[cls_name].media:  # a +me profile exists once per GPU: no "all-" of it
        known = ["all-balanced", *(f"all-{p}" for p, c in profiles.items() if not classes[c].media)]
        raise ValueError(f"unknown MIG layout {layout!r} for {gpu_model} (known: {', '.join(known)})")
    return {profile: classes[cls_name].max_count}


@dataclass(frozen=True, slots=True)
class NodeLocation:
    """Where one node of a cluster sits. Each group starts a new block and rack (a rack holds one kind of
    node); racks, blocks and cliques are numbered through the cluster."""

    name: str
    group: NodeGroup
    index: int
    """Position in the cluster (its addresses come from it)."""
    zone: str
    block: str
    rack: str
    clique: str
    """`nvidia.com/gpu.clique` value ("" = not in an NVLink clique)."""

    def level_value(self, level: str) -> str:
        """The node's value of a level name ("" = no such label on the node)."""
        return {"zone": self.zone, "block": self.block, "rack": self.rack, "nvlink": self.clique, "host": self.name}[
            level
        ]


def node_name(cluster: str, group: str, i: int, count: int) -> str:
    return f"{cluster}-{group}-{i:0{max(3, len(str(count - 1)))}d}"


def node_locations(cluster: ClusterSpec) -> list[NodeLocation]:
    """Every node of a cluster, in order, with its topology."""
    out: list[NodeLocation] = []
    racks = blocks = 0
    for g in cluster.groups:
        fabric = uuid.uuid5(uuid.NAMESPACE_DNS, f"{g.name}.{cluster.name}.fleetsim")  # GFD: <ClusterUUID>.<CliqueId>
        zone = g.zone or f"{cluster.region}-a"
        for i in range(g.nodes):
            rack = i // g.nodes_per_rack
            out.append(
                NodeLocation(
                    name=node_name(cluster.name, g.name, i, g.nodes),
                    group=g,
                    index=len(out),
                    zone=zone,
                    block=f"b{blocks + rack // g.racks_per_block + 1}",
                    rack=f"r{racks + rack + 1}",
                    clique=f"{fabric}.{i // g.clique_nodes + 1}" if g.clique_nodes else "",
                )
            )
        group_racks = -(-g.nodes // g.nodes_per_rack)
        racks += group_racks
        blocks += -(-group_racks // g.racks_per_block)
    return out


# GFD's family and compute capability labels, by product name (most specific first)
_ARCHITECTURES: tuple[tuple[re.Pattern[str], str, int, int], ...] = tuple(
    (re.compile(p, re.IGNORECASE), family, major, minor)
    for p, family, major, minor in (
        (r"B200", "blackwell", 10, 0),
        (r"H100|H200|H800|GH200", "hopper", 9, 0),
        (r"A100|A800|A30\b", "ampere", 8, 0),
        (r"A10\b|A10G|A40|A6000", "ampere", 8, 6),
        (r"V100", "volta", 7, 0),
        (r"T4\b", "turing", 7, 5),
        (r"P100", "pascal", 6, 0),
    )
)
_GRACE = re.compile(r"GB200|GH200", re.IGNORECASE)
"""Superchips whose host CPU is Grace: the node is arm64."""
_HEARTBEAT_S = 1_764_460_800.0
"""Condition times of a fresh node (the fixtures' GFD timestamp); the kubelet stand-in posts its own."""
_NODE_IPS = ipaddress.IPv4Network("10.0.0.0/9")
_POD_CIDRS = ipaddress.IPv4Network("10.128.0.0/9")


def _gfd_labels(g: NodeGroup, mig_strategy: str) -> dict[str, str]:
    """The GPU feature discovery and mig-manager labels of a node of group `g`."""
    family = mig.family_of(g.gpu_model)
    capable = family is not None
    labels = {
        "nvidia.com/gpu.present": "true",
        GPU_PRODUCT_LABEL: g.gpu_model,
        "nvidia.com/gpu.count": str(g.gpus_per_node),
        "nvidia.com/gpu.machine": "generic-server",
        "nvidia.com/cuda.driver-version.major": "580",
        "nvidia.com/cuda.driver-version.full": "580.95.05",
        "nvidia.com/mig.capable": str(capable).lower(),
        "nvidia.com/mig.strategy": mig_strategy,
    }
    if g.gpu_memory_mib:  # 0 = not known (the trace's undisclosed models): no label rather than a wrong one
        labels[GPU_MEMORY_LABEL] = str(g.gpu_memory_mib)
    arch = next(((f, ma, mi) for p, f, ma, mi in _ARCHITECTURES if p.search(g.gpu_model)), None)
    if arch is not None:
        labels.update(
            {
                "nvidia.com/gpu.family": arch[0],
                "nvidia.com/gpu.compute.major": str(arch[1]),
                "nvidia.com/gpu.compute.minor": str(arch[2]),
            }
        )
    if capable and mig_strategy == "mixed":
        labels.update({"nvidia.com/mig.config": g.mig or "all-disabled", "nvidia.com/mig.config.state": "success"})
    if g.mig and family is not None:
        classes = mig.CLASSES_A30 if family == "A30" else mig.CLASSES_8
        for profile, per_gpu in mig_layout(g.gpu_model, g.mig).items():
            slices = str(classes[mig.FAMILY_PROFILES[family][profile]].compute)
            prefix = mig.resource_name(profile)
            # memory and SM counts are left out: MIG-GEOMETRY has no verified figures for every model
            labels.update(
                {
                    f"{prefix}.count": str(per_gpu * g.gpus_per_node),
                    f"{prefix}.product": f"{g.gpu_model}-MIG-{profile}",
                    f"{prefix}.replicas": "1",
                    f"{prefix}.sharing-strategy": "none",
                    f"{prefix}.slices.gi": slices,
                    f"{prefix}.slices.ci": slices,
                }
            )
    return labels


def _node_object(cluster: ClusterSpec, loc: NodeLocation, mig_strategy: str) -> dict[str, Any]:
    g = loc.group
    arch = "arm64" if _GRACE.search(g.gpu_model) else "amd64"
    labels = {
        HOSTNAME_LABEL: loc.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": arch,
        "topology.kubernetes.io/region": cluster.region,
        ZONE_LABEL: loc.zone,
    }
    for level in cluster.levels:
        value = loc.level_value(level.name)
        if value:  # a node outside any clique has no clique label (GFD sets it on fabric-attached GPUs only)
            labels[level.key] = value
    if loc.clique:
        labels[CLIQUE_LABEL] = loc.clique
    labels.update(_gfd_labels(g, mig_strategy))
    resources = {"cpu": str(g.cpu_cores), "memory": f"{g.memory_gib}Gi", "pods": "110", "ephemeral-storage": "1800Gi"}
    if g.mig:  # mixed strategy: every GPU is partitioned, so none is published whole
        for profile, per_gpu in mig_layout(g.gpu_model, g.mig).items():
            resources[mig.resource_name(profile)] = str(per_gpu * g.gpus_per_node)
        resources[GPU_RESOURCE] = "0"
    else:
        resources[GPU_RESOURCE] = str(g.gpus_per_node)
    ip = str(_NODE_IPS.network_address + 1 + loc.index)
    pod_cidr = str(ipaddress.IPv4Network((int(_POD_CIDRS.network_address) + 256 * loc.index, 24)))
    ident = uuid.uuid5(uuid.NAMESPACE_DNS, f"{loc.name}.{cluster.name}.fleetsim")
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": loc.name,
            "labels": labels,
            "annotations": {"volumes.kubernetes.io/controller-managed-attach-detach": "true"},
        },
        "spec": {
            "podCIDR": pod_cidr,
            "podCIDRs": [pod_cidr],
            "taints": [{"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}],
        },
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": node_conditions(None, True, _HEARTBEAT_S),
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": loc.name}],
            "nodeInfo": {
                "kubeletVersion": "v1.35.2",
                "containerRuntimeVersion": "containerd://2.1.4",
                "kernelVersion": "6.8.0-60-generic",
                "osImage": "Ubuntu 24.04.2 LTS",
                "operatingSystem": "linux",
                "architecture": arch,
                "machineID": ident.hex,
                "systemUUID": str(ident),
                "bootID": str(uuid.uuid5(ident, "boot")),
                "kubeProxyVersion": "",
            },
        },
    }


def node_objects(cluster: ClusterSpec) -> list[dict[str, Any]]:
    """The cluster's nodes as a kubelet registers them and `kubectl get node -o json` shows them (without the
    server-set uid, resourceVersion and creationTimestamp): GFD labels, the GPU taint, device-plugin resources
    (MIG instances under the mixed strategy), topology labels of the cluster's levels."""
    mig_strategy = "mixed" if any(g.mig for g in cluster.groups) else "none"
    return [_node_object(cluster, loc, mig_strategy) for loc in node_locations(cluster)]
