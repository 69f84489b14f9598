"""The synthetic training mix (shapes, load, determinism) and the Alibaba openb pod lists as workload items."""

from __future__ import annotations

import csv
import dataclasses
import re
from collections import Counter
from pathlib import Path

import pytest

from fleetplan.catalog import Level
from fleetsim.domains import domain_capacity, fits_some_domain
from fleetsim.model import ClusterSpec, FleetSpec, NodeGroup, TenantSpec, WorkItem
from fleetsim.openb_workload import alibaba_workload
from fleetsim.workload import expected_gpu_hours, training_mix
from sim.trace import trace_dir

ZONE = Level("zone", "topology.kubernetes.io/zone")
BLOCK = Level("block", "network.example.com/block")
RACK = Level("rack", "network.example.com/rack")
CLIQUE = Level("clique", "nvidia.com/gpu.clique")

H100 = NodeGroup(
    "h100",
    "NVIDIA-H100-80GB-HBM3",
    nodes=64,
    gpus_per_node=8,
    gpu_memory_mib=81559,
    cpu_cores=192,
    memory_gib=2048,
    nodes_per_rack=8,
    racks_per_block=4,
)
GB200 = NodeGroup(
    "gb200",
    "NVIDIA-GB200",
    nodes=36,
    gpus_per_node=4,
    gpu_memory_mib=189471,
    cpu_cores=144,
    memory_gib=960,
    nodes_per_rack=18,
    racks_per_block=1,
    clique_nodes=18,
)
A100_MIG = NodeGroup(
    "a100",
    "NVIDIA-A100-SXM4-80GB",
    nodes=4,
    gpus_per_node=8,
    gpu_memory_mib=81920,
    cpu_cores=128,
    memory_gib=1024,
    mig="all-1g.10gb",
)
L4 = NodeGroup("l4", "NVIDIA-L4", nodes=16, gpus_per_node=2, gpu_memory_mib=23034, cpu_cores=32, memory_gib=128)

TENANTS = (TenantSpec("research", 3.0), TenantSpec("prod", 1.0))
DNS_1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
TRACES = trace_dir()


def fleet(*clusters: ClusterSpec, tenants: tuple[TenantSpec, ...] = TENANTS) -> FleetSpec:
    return FleetSpec("test", clusters, tenants)


def mixed_fleet() -> FleetSpec:
    """Racks of H100 in one cluster; GB200 cliques, A100 MIG nodes and small L4 nodes in the other."""
    return fleet(
        ClusterSpec("east", "us-east", "training", (ZONE, BLOCK, RACK), (H100,)),
        ClusterSpec("west", "us-west", "training", (ZONE, BLOCK, RACK, CLIQUE), (GB200, A100_MIG, L4)),
    )


def small_racks(name: str, nodes: int) -> NodeGroup:
    """`H100` nodes with 96 cores and 1 TiB, 4 to a rack and 2 racks to a block."""
    return dataclasses.replace(
        H100, name=name, nodes=nodes, cpu_cores=96, memory_gib=1024, nodes_per_rack=4, racks_per_block=2
    )


def plain_fleet() -> FleetSpec:
    """Two H100 clusters with racks of 4 and 8 nodes, no cliques, no MIG."""
    return fleet(
        ClusterSpec("a", "eu-west", "training", (ZONE, BLOCK, RACK), (small_racks("h100s", 16),)),
        ClusterSpec("b", "eu-north", "training", (ZONE, BLOCK, RACK), (H100,)),
    )


def test_the_same_seed_gives_the_same_items_and_another_seed_others() -> None:
    one = training_mix(mixed_fleet(), hours=2, load=0.6, seed=11)
    assert one == training_mix(mixed_fleet(), hours=2, load=0.6, seed=11)
    assert one != training_mix(mixed_fleet(), hours=2, load=0.6, seed=12)


@pytest.mark.parametrize("seed", range(4))
def test_offered_gpu_hours_are_within_15_percent_of_the_target(seed: int) -> None:
    f, hours, load = plain_fleet(), 72.0, 0.7
    items = training_mix(f, hours=hours, load=load, seed=seed)
    target = load * f.gpus * hours
    assert abs(expected_gpu_hours(items) / target - 1) <= 0.15


def test_offered_load_scales_with_the_load_argument() -> None:
    f = mixed_fleet()
    low = expected_gpu_hours(training_mix(f, hours=48, load=0.3, seed=5))
    high = expected_gpu_hours(training_mix(f, hours=48, load=0.9, seed=5))
    assert 2.4 < high / low < 3.6
    assert abs(high / (0.9 * f.gpus * 48) - 1) <= 0.15


def test_every_gang_fits_an_empty_domain_of_its_required_level() -> None:
    for f in (mixed_fleet(), plain_fleet()):
        items = training_mix(f, hours=24, load=0.8, seed=3)
        gangs = [i for i in items if i.replicas > 1]
        assert gangs
        assert all(i.required_level for i in gangs)
        assert all(fits_some_domain(f, i) for i in gangs)


def test_gangs_are_8_gpu_pods_in_racks_or_blocks_and_whole_trays_in_cliques() -> None:
    f = mixed_fleet()
    items = training_mix(f, hours=48, load=0.8, seed=4)
    by_level = Counter(i.required_level for i in items if i.replicas > 1)
    assert by_level["rack"] and by_level["block"] and by_level["clique"]
    for item in items:
        if item.required_level in {"rack", "block"}:
            assert item.gpus == 8 and item.gpu_models == ()
            assert 2 <= item.replicas <= 64
        if item.required_level == "clique":
            assert (item.gpus, item.gpu_models) == (4, ("NVIDIA-GB200",))
            assert item.replicas <= GB200.clique_nodes
    # A rack of the east cluster holds 8 pods of 8 GPUs; anything larger must ask for a block.
    assert max(i.replicas for i in items if i.required_level == "rack") <= 8
    assert min(i.replicas for i in items if i.required_level == "block") > 8


def test_a_clique_level_named_nvlink_is_asked_for_by_that_name() -> None:
    nvlink = Level("nvlink", "nvidia.com/gpu.clique")
    f = fleet(ClusterSpec("nvl", "r", "training", (ZONE, nvlink), (GB200,)))
    items = training_mix(f, hours=24, load=0.8, seed=2)
    gangs = [i for i in items if i.replicas > 1]
    assert gangs and {i.required_level for i in gangs} == {"nvlink"}
    assert all(fits_some_domain(f, i) for i in gangs)


def test_sizes_no_cluster_holds_are_never_emitted() -> None:
    # Blocks of 2 racks x 4 nodes hold at most 8 pods: no 16-, 32- or 64-pod gangs.
    f = fleet(ClusterSpec("only", "r", "training", (BLOCK, RACK), (small_racks("h", 8),)))
    items = training_mix(f, hours=200, load=0.8, seed=1)
    assert max(i.replicas for i in items) == 8
    assert all(fits_some_domain(f, i) for i in items)


def test_domain_capacity_counts_nodes_of_one_domain() -> None:
    east = mixed_fleet().clusters[0]
    pod = WorkItem("x", "t", "gang", 0.0, 1.0, replicas=2, gpus=8, cpu_milli=1000, required_level="rack")
    assert domain_capacity(east, pod) == 8
    assert domain_capacity(east, WorkItem("x", "t", "gang", 0.0, 1.0, gpus=8, required_level="block")) == 32
    # No cluster level named "clique": no clique domain at all.
    assert domain_capacity(east, WorkItem("x", "t", "gang", 0.0, 1.0, gpus=8, required_level="clique")) == 0


def test_elastic_gangs_may_start_smaller() -> None:
    items = training_mix(plain_fleet(), hours=48, load=0.8, seed=2)
    elastic = [i for i in items if i.kind == "elastic"]
    assert elastic
    assert all(0 < i.min_replicas < i.replicas for i in elastic)
    assert all(i.min_replicas == 0 for i in items if i.kind != "elastic")


def test_mig_inference_only_on_fleets_with_mig_nodes() -> None:
    with_mig = training_mix(mixed_fleet(), hours=4, load=0.7, seed=1)
    mig = [i for i in with_mig if i.mig_count]
    assert mig
    assert {i.kind for i in mig} == {"inference"}
    assert all(i.mig_profile == "1g.10gb" and 1 <= i.mig_count <= 2 for i in mig)
    assert all(i.gpu_models == ("NVIDIA-A100-SXM4-80GB",) and i.gpus == 0 for i in mig)
    without = training_mix(plain_fleet(), hours=24, load=0.7, seed=1)
    assert not [i for i in without if i.mig_count or i.mig_profile or i.kind == "inference"]


def test_batch_pods_take_one_or_two_gpus_of_any_model() -> None:
    items = training_mix(mixed_fleet(), hours=8, load=0.7, seed=6)
    batch = [i for i in items if i.kind == "batch"]
    assert {i.gpus for i in batch} == {1, 2}
    assert all(i.replicas == 1 and i.gpu_models == () and i.required_level == "" for i in batch)
    # Small enough for the smallest node (2 x L4, 32 cores, 128 GiB).
    assert all(i.cpu_milli * 2 // i.gpus <= 32_000 and i.memory_bytes * 2 // i.gpus <= 128 << 30 for i in batch)


def test_arrivals_lie_in_the_window_sorted_and_durations_are_plausible() -> None:
    items = training_mix(mixed_fleet(), hours=6, load=0.7, seed=8)
    arrivals = [i.arrival_s for i in items]
    assert arrivals == sorted(arrivals)
    assert 0 <= arrivals[0] and arrivals[-1] < 6 * 3600
    training = sorted(i.duration_s for i in items if i.replicas > 1)
    median = training[len(training) // 2]
    assert 20 * 60 <= median <= 40 * 60
    batch = sorted(i.duration_s for i in items if i.kind == "batch")
    assert batch[len(batch) // 2] < median  # batch jobs are shorter than training runs
    serving = sorted(i.duration_s for i in items if i.kind == "inference")
    assert serving and serving[len(serving) // 2] > median  # inference servers are long-lived
    assert min(i.duration_s for i in items) >= 60


def test_tenants_are_drawn_in_proportion_to_weight() -> None:
    items = training_mix(mixed_fleet(), hours=6, load=0.7, seed=9)
    counts = Counter(i.tenant for i in items)
    assert set(counts) == {"research", "prod"}
    assert 2.6 < counts["research"] / counts["prod"] < 3.4


def test_names_are_unique_dns_labels() -> None:
    items = training_mix(mixed_fleet(), hours=4, load=0.7, seed=10)
    names = [i.name for i in items]
    assert len(set(names)) == len(names)
    assert all(DNS_1123.match(n) and len(n) <= 63 for n in names)


def test_a_fleet_without_tenants_is_refused() -> None:
    with pytest.raises(ValueError):
        training_mix(fleet(*plain_fleet().clusters, tenants=()), hours=1, load=0.5, seed=0)


# --------------------------------------------------------------------------- Alibaba


def csv_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_alibaba_default_list_one_item_per_row_with_the_trace_times() -> None:
    path = TRACES / "openb_pod_list_default.csv"
    rows = {r["name"]: r for r in csv_rows(path)}
    items, notes = alibaba_workload(path, tenants=["a", "b", "c"], seed=1)
    assert len(items) == len(rows)
    assert {i.kind for i in items} == {"trace"} and {i.replicas for i in items} == {1}
    assert len({i.name for i in items}) == len(items)
    assert {i.tenant for i in items} == {"a", "b", "c"}
    first = {i.name: i for i in items}["openb-pod-0001"]  # 6 cores, 12 GiB, 0.46 GPU, created at 427061
    assert (first.gpus, first.gpu_milli, first.cpu_milli, first.memory_bytes) == (1, 460, 6000, 12288 << 20)
    assert first.arrival_s == 427061 and first.duration_s == 12902960 - 427061
    cpu_only = [i for i in items if rows[i.name]["num_gpu"] == "0"]
    assert cpu_only and all(i.gpus == 0 and i.gpu_cost == 0 for i in cpu_only)
    # The Pending pods were never scheduled: their run time is synthesised, and the notes say so.
    assert any("Pending" in n and "drawn" in n for n in notes)


def test_alibaba_limit_keeps_the_earliest_arrivals() -> None:
    items, _ = alibaba_workload(TRACES / "openb_pod_list_default.csv", tenants=["a"], seed=1, limit=50)
    assert len(items) == 50
    assert [i.arrival_s for i in items] == sorted(i.arrival_s for i in items)


def test_alibaba_gpu_spec_becomes_gpu_models() -> None:
    path = TRACES / "openb_pod_list_gpuspec10.csv"
    items, _ = alibaba_workload(path, tenants=["a"], seed=1, model_names={"T4": "NVIDIA-T4"})
    spec = {r["name"]: r["gpu_spec"] for r in csv_rows(path)}
    with_spec = [i for i in items if spec[i.name]]
    assert with_spec
    assert all(i.gpu_models for i in with_spec)
    assert any(i.gpu_models == ("NVIDIA-T4",) for i in with_spec)
    assert any(i.gpu_models == ("V100M16", "V100M32") for i in with_spec)


def test_alibaba_list_without_times_gets_synthesised_arrivals_and_durations() -> None:
    path = TRACES / "openb_pod_list_multigpu30.csv"
    items, notes = alibaba_workload(path, tenants=["a", "b"], seed=3, limit=500)
    assert len(items) == 500
    assert any("durations synthesised" in n for n in notes)
    assert any("arrivals synthesised" in n for n in notes)
    again, _ = alibaba_workload(path, tenants=["a", "b"], seed=3, limit=500)
    assert items == again
    assert [i.arrival_s for i in items] == sorted(i.arrival_s for i in items) and items[-1].arrival_s > 0


def test_alibaba_window_start_drops_ended_pods_and_shortens_running_ones(tmp_path: Path) -> None:
    path = tmp_path / "openb_pod_list_tiny.csv"
    path.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
        "creation_time,deletion_time,scheduled_time\n"
        "p-gone,1000,1024,1,1000,,LS,Succeeded,0,50,10\n"
        "p-long,1000,1024,2,1000,,LS,Running,20,500,30\n"
        "p-late,1000,1024,0,0,,BE,Succeeded,200,260,210\n"
    )
    items, notes = alibaba_workload(path, tenants=["t"], seed=0, window_start_s=100)
    assert [(i.name, i.arrival_s, i.duration_s) for i in items] == [("p-long", 0.0, 400.0), ("p-late", 100.0, 50.0)]
    assert any("ended before the window" in n for n in notes)
    assert any("censored" in n for n in notes)
