"""The fleet description: the shipped default fleet, the file's rules and their errors, the nodes as the extender
reads them, and the fleet built from the Alibaba openb node list."""

from __future__ import annotations

import copy
import csv
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from extender.agent.config import LEVEL_NAMES
from extender.config import ExtenderConfig
from extender.decide import decide_filter
from extender.inventory import Inventory
from extender.protocol import parse_extender_args
from fleetplan.catalog import Level
from fleetsim.fleet_schema import DEFAULT_LEVEL_KEYS
from fleetsim.model import ClusterSpec, FleetSpec, NodeGroup, TenantSpec
from fleetsim.node_objects import mig_layout, node_locations, node_objects
from fleetsim.openb_fleet import alibaba_fleet
from fleetsim.spec import FleetSpecError, check_fleet, default_fleet, load_fleet, parse_fleet
from sim.kubeapi.schema import decode, root_node
from sim.trace import NODE_LIST, trace_dir
from tests.extender.extender_builders import args, pod
from tests.fixtures import fixture_json

DEFAULT_YAML = Path(__file__).resolve().parents[2] / "fleetsim" / "fleets" / "default.yaml"
OPENB_GPU_NODES = trace_dir() / NODE_LIST
OPENB_ALL_NODES = trace_dir() / "openb_node_list_all_node.csv"
H100, H200, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-H200", "NVIDIA-A100-SXM4-80GB"


def cluster(fleet: FleetSpec, name: str) -> ClusterSpec:
    return next(c for c in fleet.clusters if c.name == name)


def nodes_of(c: ClusterSpec) -> int:
    return sum(g.nodes for g in c.groups)


# --------------------------------------------------------------------------- the default fleet


def test_default_fleet_matches_its_description() -> None:
    fleet = default_fleet()
    assert [c.name for c in fleet.clusters] == ["train-h100", "infer-a100", "batch-mixed", "gb200-nvl"]
    assert 100 <= sum(nodes_of(c) for c in fleet.clusters) <= 150 and 700 <= fleet.gpus <= 1000
    assert {c.name: (nodes_of(c), c.gpus) for c in fleet.clusters} == {
        "train-h100": (48, 384),
        "infer-a100": (24, 192),
        "batch-mixed": (36, 176),
        "gb200-nvl": (36, 144),
    }
    assert not fleet.synthesised_topology

    train = cluster(fleet, "train-h100")
    assert (train.region, train.role) == ("eu-west", "training")
    assert [lv.name for lv in train.levels] == ["zone", "block", "rack"]
    assert [lv.key for lv in train.levels] == [
        "topology.kubernetes.io/zone",
        "network.example.com/block",
        "network.example.com/rack",
    ]
    assert {g.gpu_model for g in train.groups} == {H100, H200}
    assert all(g.gpus_per_node == 8 and 4 <= g.nodes_per_rack <= 8 and not g.mig for g in train.groups)

    infer = cluster(fleet, "infer-a100")
    assert (infer.region, infer.role) == ("us-east", "inference")
    assert {g.gpu_model for g in infer.groups} == {A100}
    assert sorted(g.mig for g in infer.groups) == ["", "all-1g.10gb"]

    batch = cluster(fleet, "batch-mixed")
    assert (batch.region, batch.role) == ("us-east", "batch")
    assert {g.gpu_model for g in batch.groups} == {"Tesla-V100-SXM2-32GB", "Tesla-T4", "NVIDIA-A10"}

    gb = cluster(fleet, "gb200-nvl")
    assert [lv.name for lv in gb.levels] == ["zone", "nvlink"]
    assert [(g.gpu_model, g.gpus_per_node, g.clique_nodes) for g in gb.groups] == [("NVIDIA-GB200", 4, 18)]

    assert all(0.5 <= c.background_pods_per_min <= 2 for c in fleet.clusters)
    assert [(t.name, t.weight) for t in fleet.tenants] == [("research", 2.0), ("product", 1.0), ("analytics", 1.0)]
    models = {g.gpu_model for c in fleet.clusters for g in c.groups}
    assert all(t.quota for t in fleet.tenants)
    assert all(m == "*" or m in models for t in fleet.tenants for m, _ in t.quota)
    check_fleet(fleet)  # what the file gave passes the rules a fleet built in code is held to


def test_load_fleet_reads_the_shipped_file_as_default_fleet_does() -> None:
    assert load_fleet(DEFAULT_YAML) == default_fleet()


def test_agent_level_names_all_have_a_default_key() -> None:
    assert tuple(DEFAULT_LEVEL_KEYS) == LEVEL_NAMES
    assert tuple(DEFAULT_LEVEL_KEYS.values()) == ExtenderConfig().topology.keys


# --------------------------------------------------------------------------- errors


def _default_doc() -> dict[str, Any]:
    doc = yaml.safe_load(DEFAULT_YAML.read_text())
    assert isinstance(doc, dict)
    return doc


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(doc: dict[str, Any]) -> None:
        node: Any = doc
        for p in path[:-1]:
            node = node[p]
        node[path[-1]] = value

    return apply


def _append_copy_of_first_cluster(doc: dict[str, Any]) -> None:
    doc["clusters"].append(copy.deepcopy(doc["clusters"][0]))


def _append_copy_of_first_group(doc: dict[str, Any]) -> None:
    doc["clusters"][0]["groups"].append(copy.deepcopy(doc["clusters"][0]["groups"][0]))


@pytest.mark.parametrize(
    ("change", "field", "text"),
    [
        (
            _set(("clusters", 1, "groups", 0, "nodez"), 3),
            "clusters[1](infer-a100).groups[0](a100-mig).nodez",
            "unknown field 'nodez'; did you mean 'nodes'?",
        ),
        (_set(("tenantz",), []), "tenantz", "unknown field 'tenantz'; did you mean 'tenants'?"),
        (_append_copy_of_first_cluster, "clusters[4](train-h100).name", "duplicate cluster 'train-h100'"),
        (_append_copy_of_first_group, "clusters[0](train-h100).groups[2](h100).name", "duplicate node group 'h100'"),
        (
            _set(("clusters", 2, "groups", 1, "nodes"), -2),
            "clusters[2](batch-mixed).groups[1](t4).nodes",
            "greater than or equal to 1",
        ),
        (
            _set(("clusters", 0, "groups", 0, "gpus_per_node"), 0),
            "clusters[0](train-h100).groups[0](h100).gpus_per_node",
            "greater than or equal to 1",
        ),
        (
            _set(("clusters", 0, "groups", 0, "nodes"), "8"),
            "clusters[0](train-h100).groups[0](h100).nodes",
            "valid integer",
        ),
        (_set(("tenants", 1, "weight"), 0), "tenants[1](product).weight", "greater than 0"),
        (
            _set(("clusters", 0, "background_pods_per_min"), -1.0),
            "clusters[0](train-h100).background_pods_per_min",
            "greater than or equal to 0",
        ),
        (
            _set(("clusters", 3, "levels"), ["zone", "clique"]),
            "clusters[3](gb200-nvl).levels[1].name",
            "unknown level 'clique'",
        ),
        (_set(("clusters", 0, "levels"), ["rack", "zone"]), "clusters[0](train-h100).levels[1].name", "out of order"),
        (
            _set(("clusters", 2, "groups", 1, "mig"), "all-1g.10gb"),
            "clusters[2](batch-mixed).groups[1](t4).mig",
            "'Tesla-T4' has no MIG",
        ),
        (
            _set(("clusters", 1, "groups", 0, "mig"), "all-1g.5gb"),
            "clusters[1](infer-a100).groups[0](a100-mig).mig",
            "unknown MIG layout 'all-1g.5gb'",
        ),
        (_set(("clusters", 0, "name"), "Train_H100"), "clusters[0](Train_H100).name", "not a DNS-1123 label"),
        (
            _set(("tenants", 0, "quota"), {"NVIDIA-H100-80GB": 8}),
            "tenants[0](research).quota.NVIDIA-H100-80GB",
            "did you mean 'NVIDIA-H100-80GB-HBM3'?",
        ),
        (
            _set(("clusters", 0, "groups", 0, "name"), "h" * 50),
            f"clusters[0](train-h100).groups[0]({'h' * 50}).name",
            "over 63",
        ),
    ],
)
def test_a_bad_fleet_file_names_the_file_and_the_field(
    tmp_path: Path, change: Callable[[dict[str, Any]], None], field: str, text: str
) -> None:
    doc = _default_doc()
    change(doc)
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(FleetSpecError) as caught:
        load_fleet(path)
    err = caught.value
    assert isinstance(err, ValueError)
    assert err.source == str(path) and err.field == field
    assert text in str(err) and str(path) in str(err) and field in str(err)


def test_a_key_given_twice_is_an_error_not_the_last_one_winning() -> None:
    text = DEFAULT_YAML.read_text().replace("    weight: 2\n", "    weight: 2\n    weight: 3\n", 1)
    with pytest.raises(FleetSpecError, match=r"line \d+, column \d+: duplicate key 'weight'"):
        parse_fleet(text, "twice.yaml")


def test_unreadable_and_non_mapping_files_are_fleet_errors(tmp_path: Path) -> None:
    with pytest.raises(FleetSpecError, match="cannot read"):
        load_fleet(tmp_path / "missing.yaml")
    with pytest.raises(FleetSpecError, match="a fleet is a mapping"):
        parse_fleet("- just\n- a list\n")


def test_a_fleet_built_in_code_is_held_to_the_same_rules() -> None:
    t4 = NodeGroup(
        "t4",
        "Tesla-T4",
        nodes=2,
        gpus_per_node=4,
        gpu_memory_mib=15360,
        cpu_cores=48,
        memory_gib=192,
        mig="all-1g.10gb",
    )
    fleet = FleetSpec(
        "f",
        (ClusterSpec("c", "r", "batch", (Level("zone", "topology.kubernetes.io/zone"),), (t4,)),),
        (TenantSpec("a"),),
    )
    with pytest.raises(FleetSpecError) as caught:
        check_fleet(fleet, "code")
    assert caught.value.field == "clusters[0](c).groups[0](t4).mig"
    check_fleet(
        FleetSpec(
            fleet.name,
            (
                ClusterSpec(
                    "c", "r", "batch", fleet.clusters[0].levels, (NodeGroup("t4", "Tesla-T4", 2, 4, 15360, 48, 192),)
                ),
            ),
            fleet.tenants,
        )
    )
    dup_quota = FleetSpec(
        fleet.name,
        fleet.clusters[:0]
        + (
            ClusterSpec(
                "c", "r", "batch", fleet.clusters[0].levels, (NodeGroup("t4", "Tesla-T4", 2, 4, 15360, 48, 192),)
            ),
        ),
        (TenantSpec("a", quota=(("*", 1), ("*", 2))),),
    )
    with pytest.raises(FleetSpecError, match="given twice"):
        check_fleet(dup_quota)


# --------------------------------------------------------------------------- MIG layouts


@pytest.mark.parametrize(
    ("model", "layout", "per_gpu"),
    [
        (A100, "all-1g.10gb", {"1g.10gb": 7}),
        ("NVIDIA-A100-SXM4-40GB", "all-1g.10gb", {"1g.10gb": 4}),  # the double-slice 1g on a 40GB part
        (H100, "all-3g.40gb", {"3g.40gb": 2}),
        (H100, "all-7g.80gb", {"7g.80gb": 1}),
        (H200, "all-balanced", {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}),
        ("NVIDIA-A30", "all-1g.6gb", {"1g.6gb": 4}),
        ("NVIDIA-A30", "all-balanced", {"1g.6gb": 2, "2g.12gb": 1}),
        ("NVIDIA-GB200", "all-1g.23gb", {"1g.23gb": 7}),
    ],
)
def test_mig_layouts(model: str, layout: str, per_gpu: dict[str, int]) -> None:
    assert mig_layout(model, layout) == per_gpu


@pytest.mark.parametrize(
    ("model", "layout"),
    [("Tesla-T4", "all-1g.10gb"), (A100, "all-1g.10gb+me"), (A100, "1g.10gb"), (H100, "all-disabled")],
)
def test_impossible_mig_layouts(model: str, layout: str) -> None:
    with pytest.raises(ValueError):
        mig_layout(model, layout)


# --------------------------------------------------------------------------- node objects


def _fixture_node(name: str) -> dict[str, Any]:
    node: dict[str, Any] = next(o for o in fixture_json("cluster.json")["items"] if o["metadata"]["name"] == name)
    return node


@pytest.mark.parametrize("name", ["train-h100", "infer-a100", "batch-mixed", "gb200-nvl"])
def test_node_objects_are_real_format(name: str) -> None:
    c = cluster(default_fleet(), name)
    nodes = node_objects(c)
    assert len(nodes) == nodes_of(c)
    fixture = _fixture_node("h100-r1-n1")
    schema = root_node("", "v1", "Node")
    assert schema is not None
    for n in nodes:
        _, unknown = decode(schema, n, drop_unknown=False)  # the 1.36 strict schema, as the sim API server has it
        assert unknown == []
        assert (n["apiVersion"], n["kind"]) == ("v1", "Node")
        assert set(n["status"]) == set(fixture["status"])
        assert set(n["status"]["nodeInfo"]) == set(fixture["status"]["nodeInfo"])
        assert [cond["type"] for cond in n["status"]["conditions"]] == [
            cond["type"] for cond in fixture["status"]["conditions"]
        ]
        assert {"type": "Ready", "status": "True"}.items() <= n["status"]["conditions"][-1].items()
        assert n["spec"]["taints"] == fixture["spec"]["taints"]
        labels = n["metadata"]["labels"]
        assert labels["kubernetes.io/hostname"] == n["metadata"]["name"]
        assert labels["topology.kubernetes.io/region"] == c.region
        assert labels["nvidia.com/gpu.present"] == "true"
    assert len({n["metadata"]["name"] for n in nodes}) == len(nodes)
    assert len({n["spec"]["podCIDR"] for n in nodes}) == len(nodes)  # the kubelet stand-in gives pod IPs from it
    assert len({n["status"]["addresses"][0]["address"] for n in nodes}) == len(nodes)


def test_mig_node_has_the_fixture_mig_node_resources_and_labels() -> None:
    infer = cluster(default_fleet(), "infer-a100")
    nodes = {n["metadata"]["name"]: n for n in node_objects(infer)}
    mig_node, whole = nodes["infer-a100-a100-mig-000"], nodes["infer-a100-a100-000"]
    fixture = _fixture_node("a100-mig-1")
    strategy = fixture["metadata"]["labels"]["nvidia.com/mig.strategy"]
    assert strategy == "mixed"
    assert {n["metadata"]["labels"]["nvidia.com/mig.strategy"] for n in (mig_node, whole)} == {strategy}
    assert mig_node["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] == "56"
    assert mig_node["status"]["allocatable"]["nvidia.com/gpu"] == "0"
    assert mig_node["metadata"]["labels"]["nvidia.com/mig-1g.10gb.count"] == "56"
    assert mig_node["metadata"]["labels"]["nvidia.com/mig.config"] == "all-1g.10gb"
    assert whole["metadata"]["labels"]["nvidia.com/mig.config"] == "all-disabled"
    assert whole["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert not any(k.startswith("nvidia.com/mig-") for k in whole["status"]["allocatable"])


def _inventory(c: ClusterSpec) -> Inventory:
    inv = Inventory(ExtenderConfig())
    inv.load_list({"kind": "List", "items": node_objects(c)})
    return inv


@pytest.mark.parametrize("name", ["train-h100", "infer-a100", "batch-mixed", "gb200-nvl"])
def test_the_extender_reads_every_node_as_described(name: str) -> None:
    c = cluster(default_fleet(), name)
    inv = _inventory(c)
    snap = inv.snapshot()
    assert inv.errors == [] and len(snap) == nodes_of(c)
    declared = {lv.name for lv in c.levels}
    gpus = 0
    for loc in node_locations(c):
        facts = snap.facts_by_name(loc.name)
        assert facts is not None
        node, g = facts.node, loc.group
        assert node.ready and not node.cordoned
        assert node.gpu_model == g.gpu_model
        assert node.cpu_milli_allocatable == g.cpu_cores * 1000 and node.memory_allocatable == g.memory_gib << 30
        if g.mig:
            assert node.gpus == ()
            assert dict(node.extended_free) == {
                f"nvidia.com/mig-{p}": n * g.gpus_per_node for p, n in mig_layout(g.gpu_model, g.mig).items()
            }
            gpus += int(node.labels["nvidia.com/gpu.count"])
        else:
            assert len(node.gpus) == node.free_whole_gpus == g.gpus_per_node
            assert {(gpu.model, gpu.memory_mib) for gpu in node.gpus} == {(g.gpu_model, g.gpu_memory_mib)}
            assert dict(node.extended_free) == {}
            gpus += len(node.gpus)
        # the extender's levels: zone, block, rack, clique, hostname
        assert node.topology == (
            loc.zone,
            loc.block if "block" in declared else None,
            loc.rack if "rack" in declared else None,
            loc.clique or None,
            loc.name,
        )
    assert gpus == c.gpus


def test_topology_domains_of_the_default_fleet() -> None:
    fleet = default_fleet()

    def domains(name: str, level: int) -> Counter[tuple[str | None, ...]]:
        snap = _inventory(cluster(fleet, name)).snapshot()
        return Counter(f.node.topology[: level + 1] for f in snap.facts)

    train = domains("train-h100", 2)
    assert len(train) == 6 and set(train.values()) == {8}  # racks of 8: 4 of H100, 2 of H200
    train_blocks = domains("train-h100", 1)
    assert sorted(train_blocks.values()) == [16, 16, 16]
    snap = _inventory(cluster(fleet, "train-h100")).snapshot()
    first_h200 = snap.facts_by_name("train-h100-h200-000")
    last_h100 = snap.facts_by_name("train-h100-h100-031")
    assert first_h200 is not None and last_h100 is not None
    assert last_h100.node.topology[:3] == ("eu-west-a", "b2", "r4")
    assert first_h200.node.topology[:3] == ("eu-west-a", "b3", "r5")  # a new group starts a new block and rack
    cliques = Counter(f.node.topology[3] for f in _inventory(cluster(fleet, "gb200-nvl")).snapshot().facts)
    assert len(cliques) == 2 and set(cliques.values()) == {18} and None not in cliques
    assert sorted(domains("batch-mixed", 2).values()) == [6, 6, 8, 8, 8]  # v100 (1) and t4 (2) racks of 8, a10 of 6


def _filter(inv: Inventory, p: dict[str, Any], names: list[str]) -> list[str]:
    reply = json.loads(decide_filter(inv, parse_extender_args(json.dumps(args(p, names)).encode())).body)
    passed: list[str] = reply["NodeNames"] or []
    return passed


def test_the_extender_filter_tells_mig_nodes_from_whole_gpu_nodes() -> None:
    infer = cluster(default_fleet(), "infer-a100")
    inv = _inventory(infer)
    names = [loc.name for loc in node_locations(infer)]
    mig_nodes = [n for n in names if "-a100-mig-" in n]
    assert len(mig_nodes) == 8
    slice_pod = pod("slice", cpu="4", memory="16Gi", extra={"nvidia.com/mig-1g.10gb": "1"}, namespace="product")
    assert _filter(inv, slice_pod, names) == mig_nodes
    whole_pod = pod("whole", gpus=8, namespace="product")
    assert _filter(inv, whole_pod, names) == [n for n in names if n not in mig_nodes]
    untolerated = pod("untolerated", gpus=1, namespace="product", tolerate_gpu=False)
    assert _filter(inv, untolerated, names) == []  # the GPU taint is on every node


# --------------------------------------------------------------------------- the Alibaba openb fleet


def _csv_gpus(path: Path) -> tuple[int, int]:
    """(GPU nodes, GPUs) of a node list, read here without the loader."""
    with path.open(newline="") as f:
        gpus = [int(r["gpu"]) for r in csv.DictReader(f)]
    return sum(1 for g in gpus if g > 0), sum(gpus)


def test_alibaba_fleet_holds_every_gpu_of_the_trace() -> None:
    fleet = alibaba_fleet(OPENB_GPU_NODES)
    nodes, gpus = _csv_gpus(OPENB_GPU_NODES)
    assert (nodes, gpus) == (1213, 6212)
    assert fleet.gpus == gpus and sum(nodes_of(c) for c in fleet.clusters) == nodes
    assert fleet.synthesised_topology
    assert len(fleet.clusters) == 4 and len(fleet.tenants) == 3
    clusters_of_model: dict[str, set[str]] = {}
    for c in fleet.clusters:
        assert [lv.name for lv in c.levels] == ["zone", "block", "rack"]
        shapes = [(g.gpu_model, g.gpus_per_node, g.cpu_cores, g.memory_gib) for g in c.groups]
        assert len(set(shapes)) == len(shapes)  # identical nodes make one group
        for g in c.groups:
            clusters_of_model.setdefault(g.gpu_model, set()).add(c.name)
    assert all(len(v) == 1 for v in clusters_of_model.values())  # a model is never split over clusters
    assert clusters_of_model["V100M16"] == clusters_of_model["V100M32"]
    assert clusters_of_model["T4"] == clusters_of_model["A10"]
    g2 = cluster(fleet, next(iter(clusters_of_model["G2"])))
    assert (g2.role, g2.gpus) == ("training", 549 * 8)


def test_alibaba_fleet_skips_cpu_only_nodes() -> None:
    nodes, gpus = _csv_gpus(OPENB_ALL_NODES)
    with OPENB_ALL_NODES.open(newline="") as f:
        assert sum(1 for _ in csv.DictReader(f)) > nodes  # the file does hold CPU-only nodes
    fleet = alibaba_fleet(OPENB_ALL_NODES)
    assert fleet.gpus == gpus and sum(nodes_of(c) for c in fleet.clusters) == nodes


@pytest.mark.parametrize("clusters", [1, 2, 3, 5, 6, 7])
def test_alibaba_fleet_of_any_size_keeps_the_gpus(clusters: int) -> None:
    fleet = alibaba_fleet(OPENB_GPU_NODES, clusters=clusters, seed=3)
    assert len(fleet.clusters) == clusters and len({c.name for c in fleet.clusters}) == clusters
    assert fleet.gpus == 6212
    assert fleet == alibaba_fleet(OPENB_GPU_NODES, clusters=clusters, seed=3)


def test_alibaba_fleet_refuses_more_clusters_than_nodes() -> None:
    with pytest.raises(ValueError, match="clusters must be"):
        alibaba_fleet(OPENB_GPU_NODES, clusters=0)
    with pytest.raises(ValueError, match="clusters must be"):
        alibaba_fleet(OPENB_GPU_NODES, clusters=5000)


def test_alibaba_nodes_load_into_the_extender() -> None:
    fleet = alibaba_fleet(OPENB_GPU_NODES)
    c = min(fleet.clusters, key=nodes_of)
    snap = _inventory(c).snapshot()
    assert len(snap) == nodes_of(c)
    assert sum(len(f.node.gpus) for f in snap.facts) == c.gpus
    assert {f.node.gpu_model for f in snap.facts} == {g.gpu_model for g in c.groups}
    assert all(f.node.topology[1] is not None and f.node.topology[2] is not None for f in snap.facts)
