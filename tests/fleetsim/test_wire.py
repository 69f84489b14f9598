"""Wire mode end to end: a small fleet (two clusters of six 8-GPU nodes, the real broker, extender and agent
processes) runs seven items in compressed time.

Cluster a spreads its nodes over three racks of two; cluster b has a rack of four (under a site-specific
rack label, so the agent must learn its levels from the spec). A 4 x 8-GPU gang that requires one rack fits
only b's big rack, and must run there unsplit. Background pods, bound by the default-scheduler stand-in,
load cluster a.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from fleetplan.catalog import Level
from fleetsim.model import ClusterSpec, FleetSpec, NodeGroup, TenantSpec, WorkItem
from fleetsim.wire import run_wire
from tests.e2e.fleet import H100, gpu_node

pytestmark = pytest.mark.timeout(180)

COMPRESSION = 100.0
SITE_RACK = "topology.example.org/rack"
"""Cluster b's rack label key (a's is the shipped default, network.example.com/rack)."""


def _levels(rack_key: str) -> tuple[Level, ...]:
    return (
        Level("zone", "topology.kubernetes.io/zone"),
        Level("block", "network.example.com/block"),
        Level("rack", rack_key),
        Level("host", "kubernetes.io/hostname"),
    )


def _group(nodes: int) -> tuple[NodeGroup, ...]:
    return (NodeGroup("hgx", H100, nodes=nodes, gpus_per_node=8, gpu_memory_mib=81559, cpu_cores=224, memory_gib=2048),)


def fleet_and_nodes() -> tuple[FleetSpec, dict[str, list[dict[str, Any]]]]:
    a_nodes = [gpu_node(f"node-a-{r}{i}", rack=f"ra{r}") for r in range(1, 4) for i in range(2)]
    b_nodes = [gpu_node(f"node-b-{i}", rack="r1" if i < 4 else "r2", zone="zone-b") for i in range(6)]
    for node in b_nodes:  # b's site names its racks under another key
        labels = node["metadata"]["labels"]
        labels[SITE_RACK] = labels.pop("network.example.com/rack")
    fleet = FleetSpec(
        name="two-small-clusters",
        clusters=(
            ClusterSpec(
                "a",
                region="eu-west",
                role="training",
                levels=_levels("network.example.com/rack"),
                groups=_group(6),
                background_pods_per_min=0.5,
            ),
            ClusterSpec("b", region="eu-north", role="training", levels=_levels(SITE_RACK), groups=_group(6)),
        ),
        tenants=(TenantSpec("alpha", weight=2.0, namespace="team-a"), TenantSpec("beta", quota=(("*", 64),))),
    )
    return fleet, {"a": a_nodes, "b": b_nodes}


ITEMS = [
    WorkItem("batch-8", "alpha", "batch", arrival_s=0, duration_s=400, gpus=8),
    WorkItem("batch-2", "beta", "batch", arrival_s=30, duration_s=400, gpus=2),
    WorkItem(
        "gang-rack",
        "alpha",
        "gang",
        arrival_s=60,
        duration_s=500,
        replicas=4,
        gpus=8,
        cpu_milli=16_000,
        memory_bytes=64 << 30,
        required_level="rack",
    ),
    WorkItem("inference-1", "beta", "inference", arrival_s=90, duration_s=600, gpus=1),
    WorkItem("elastic-4", "alpha", "elastic", arrival_s=120, duration_s=400, replicas=2, gpus=4, min_replicas=1),
    WorkItem("batch-4", "beta", "batch", arrival_s=150, duration_s=300, gpus=4, preemptible=True),
    WorkItem("pair-zone", "alpha", "gang", arrival_s=180, duration_s=300, replicas=2, gpus=8, required_level="zone"),
]


async def test_a_small_fleet_runs_every_item_and_the_rack_gang_lands_whole_where_it_fits(tmp_path: Path) -> None:
    fleet, nodes = fleet_and_nodes()
    progress: list[tuple[int, int]] = []
    t0 = time.monotonic()
    result = await run_wire(
        fleet,
        nodes,
        ITEMS,
        compression=COMPRESSION,
        workdir=tmp_path,
        seed=7,
        progress=lambda done, total: progress.append((done, total)),
        timeout_s=120,
    )
    wall_s = time.monotonic() - t0
    print(f"wire run: {wall_s:.1f} s wall; notes: {result.notes}")

    assert result.mode == "wire" and result.seed == 7
    by_name = {o.item.name: o for o in result.outcomes}
    assert list(by_name) == [i.name for i in ITEMS]
    unfinished = [n for n, o in by_name.items() if o.finished_s is None]
    assert not unfinished, (unfinished, result.notes)
    assert progress[-1] == (len(ITEMS), len(ITEMS))

    gang = by_name["gang-rack"]
    assert gang.cluster == "b"
    assert gang.domains == ("r1",) * 4 and not gang.split

    for o in result.outcomes:
        assert o.placed_s is not None and o.started_s is not None and o.finished_s is not None
        assert o.submitted_s <= o.placed_s <= o.started_s <= o.finished_s, o
        assert o.item.arrival_s <= o.submitted_s
        # It ran for its duration (in simulated time), give or take the reporting path.
        assert o.finished_s - o.started_s >= o.item.duration_s * 0.95, o
        assert o.dispatches >= o.false_dispatches + 1, o
    zone_pair = by_name["pair-zone"]
    assert len(zone_pair.domains) == 2 and not zone_pair.split

    samples = result.allocation
    assert len(samples) >= 10 and all(set(s) == {"a", "b"} for _, s in samples)
    assert [t for t, _ in samples] == sorted(t for t, _ in samples)
    assert max(s["b"] for _, s in samples) >= 32  # the gang's GPUs were seen allocated
    assert result.background_pods > 0
    assert result.makespan_s == max(o.finished_s for o in result.outcomes if o.finished_s is not None)
    assert any("compressed 100x" in n for n in result.notes)
    assert any(n.startswith("pipeline latency (submit -> all pods bound") and "(S-1)" in n for n in result.notes)
