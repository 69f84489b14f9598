"""The workload generator's closed-form fit (`domain_capacity`, `fits_some_domain`: which shapes it emits)
held to the exact fit over the same empty clusters as fast mode builds them (`fast_cluster.nodes_of`).

For every item the generator emits on a random fleet, the replicas one domain of its required level holds
(per cluster, the best domain) are what the core's fit gives over that cluster's empty nodes: the closed
form neither emits a gang no domain can hold nor keeps a cluster's domain smaller than it is."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetplan.catalog import Level
from fleetsim.domains import domain_capacity
from fleetsim.fast import shape_of
from fleetsim.fast_cluster import agent_levels, nodes_of
from fleetsim.mix_shapes import GANG_LEVELS
from fleetsim.model import ClusterSpec, FleetSpec, NodeGroup, TenantSpec, WorkItem
from fleetsim.workload import training_mix
from placement.fit import capacity
from placement.model import TopologyLevels
from placement.topology import domain_of

ZONE = Level("zone", "topology.kubernetes.io/zone")
BLOCK = Level("block", "network.example.com/block")
RACK = Level("rack", "network.example.com/rack")
NVLINK = Level("nvlink", "nvidia.com/gpu.clique")  # level names as the fleet loader takes them (LEVEL_NAMES)
MODELS = (  # (model, GPU memory MiB, MIG layouts the loader accepts for it)
    ("NVIDIA-H100-80GB-HBM3", 81559, ("", "", "all-1g.10gb", "all-balanced")),
    ("NVIDIA-A100-SXM4-80GB", 81920, ("", "", "all-1g.10gb", "all-balanced")),
    ("NVIDIA-GB200", 189471, ("",)),
    ("NVIDIA-L4", 23034, ("",)),
)


@st.composite
def groups(draw: st.DrawFn, name: str, nvlink: bool) -> NodeGroup:
    model, memory, layouts = draw(st.sampled_from(MODELS))
    gpus = draw(st.sampled_from([1, 2, 4, 8, 8, 8]))  # 8-GPU nodes: what the mix's rack and block gangs run on
    per_rack = draw(st.sampled_from([2, 4, 8, 18]))
    # NVLink cliques inside racks (an NVL72 rack is one clique): the closed form counts a clique's nodes whole,
    # which a clique straddling two racks is not (the rack level cuts it) -- a layout no real fabric has.
    # In a cluster with the NVLink level every group has cliques: a node outside any clique is its own domain to
    # the core (a missing label makes it unique) but no domain to the closed form.
    cliques = ([] if nvlink else [0, 0]) + [k for k in (2, 4, 9, 18) if per_rack % k == 0]
    return NodeGroup(
        name,
        model,
        nodes=draw(st.integers(1, 48)),
        gpus_per_node=gpus,
        gpu_memory_mib=memory,
        cpu_cores=draw(st.sampled_from([32, 128, 192])),
        memory_gib=draw(st.sampled_from([128, 1024, 2048])),
        mig=draw(st.sampled_from(layouts)),
        nodes_per_rack=per_rack,
        racks_per_block=draw(st.integers(1, 4)),
        clique_nodes=draw(st.sampled_from(cliques)),
        zone=draw(st.sampled_from(["", "", "z-b"])),
    )


@st.composite
def fleets(draw: st.DrawFn) -> FleetSpec:
    clusters = []
    for c in range(draw(st.integers(1, 2))):
        levels = tuple(lv for lv in (ZONE, BLOCK, RACK, NVLINK) if draw(st.booleans()))
        clusters.append(
            ClusterSpec(
                f"c{c}",
                f"region-{c}",
                "training",
                levels,
                tuple(draw(groups(f"g{k}", NVLINK in levels)) for k in range(draw(st.integers(1, 3)))),
            )
        )
    return FleetSpec("f", tuple(clusters), (TenantSpec("t"),))


def exact_domain_capacity(cluster: ClusterSpec, item: WorkItem) -> int:
    """Replicas of `item` the best domain of its required level holds in the empty cluster, by the core's fit
    (one pod set: per-node capacities add up)."""
    nodes = nodes_of(cluster)
    shape = shape_of(item)
    caps = [capacity(n, shape).count for n in nodes]
    if not item.required_level:
        return sum(caps)
    levels = agent_levels(cluster)
    depth = next((i for i, lv in enumerate(levels) if lv.name == item.required_level), None)
    if depth is None:
        return 0
    keys = TopologyLevels(tuple(lv.key for lv in levels))
    per_domain: dict[tuple[str, ...], int] = defaultdict(int)
    for n, c in zip(nodes, caps):
        per_domain[domain_of(n, keys, depth)] += c
    return max(per_domain.values(), default=0)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets(), st.integers(0, 2**32))
def test_emitted_items_fit_as_the_core_says(fleet: FleetSpec, seed: int) -> None:
    try:
        items = training_mix(fleet, hours=0.5, load=0.5, seed=seed)
    except ValueError:  # a fleet that can run none of the mix's shapes
        return
    shapes: dict[tuple[object, ...], WorkItem] = {}
    for it in items:  # one item of each shape (many arrivals share a template)
        shapes.setdefault(
            (
                it.kind,
                it.replicas,
                it.gpus,
                it.gpu_milli,
                it.mig_profile,
                it.mig_count,
                it.cpu_milli,
                it.memory_bytes,
                it.gpu_models,
                it.required_level,
            ),
            it,
        )
    for it in shapes.values():
        best = 0
        for cluster in fleet.clusters:
            exact = exact_domain_capacity(cluster, it)
            assert domain_capacity(cluster, it) == exact, (cluster, it)
            best = max(best, exact)
        assert best >= it.replicas, it  # every emitted item fits some domain of some empty cluster
        if it.required_level in GANG_LEVELS:  # the generator sizes rack gangs at each of these levels
            for level in GANG_LEVELS:
                at = dataclasses.replace(it, required_level=level)
                for cluster in fleet.clusters:
                    assert domain_capacity(cluster, at) == exact_domain_capacity(cluster, at), (cluster, at)
