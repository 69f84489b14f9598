"""Inventory: k8s objects -> per-node facts, watch events, readiness, incremental rebuilds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from extender.config import ExtenderConfig, TopologyConfig
from extender.errors import InventoryError
from extender.inventory import Inventory, normalise_kind
from extender.main import load_inventory_files
from tests.extender.extender_builders import node, pod
from tests.extender.extender_support import ALL_NODES, FIXTURES, cluster_items, make_inventory


def facts(inv: Inventory, name: str):  # type: ignore[no-untyped-def]
    f = inv.snapshot().facts_by_name(name)
    assert f is not None
    return f


def test_fixture_cluster_facts() -> None:
    inv = make_inventory()
    snap = inv.snapshot()
    assert sorted(f.name for f in snap.facts) == sorted(ALL_NODES)
    assert facts(inv, "h100-r1-n1").node.free_whole_gpus == 2
    assert facts(inv, "h100-r1-n2").node.free_whole_gpus == 8  # old-job Succeeded: holds nothing
    assert facts(inv, "h100-r2-n1").node.free_whole_gpus == 6
    assert facts(inv, "gb200-r5-n1").node.free_whole_gpus == 0
    assert facts(inv, "h100-r1-n1").node.gpu_model == "NVIDIA-H100-80GB-HBM3"
    assert facts(inv, "h100-r1-n1").node.gpu_memory_mib == 81559
    a100 = facts(inv, "a100-mig-1").node
    assert a100.extended_free["nvidia.com/mig-1g.10gb"] == 11
    assert a100.extended_free["nvidia.com/mig-3g.40gb"] == 3
    h200 = facts(inv, "h200-dra-1").node
    assert len(h200.dra_devices) == 8
    assert sorted(d.name for d in h200.dra_devices if d.allocated) == ["gpu-0", "gpu-1"]
    assert h200.dra_devices[0].attribute("productName") == "NVIDIA H200"
    assert not facts(inv, "h100-notready").node.ready
    assert facts(inv, "h100-r2-n1").node.cpu_milli_free == 192_000 - 8_000


def test_topology_path_uses_configured_levels() -> None:
    inv = make_inventory()
    gb = facts(inv, "gb200-r5-n2").node
    assert gb.topology == ("zone-a", "b2", "r5", "7b968a6d-3c2e-4f0a-8d51-0e9a6c4b2f10.1", "gb200-r5-n2")
    assert facts(inv, "h100-r1-n1").node.topology[3] is None  # HGX: no clique label
    cfg = ExtenderConfig(topology=TopologyConfig(block="example.org/pod", rack="example.org/row"))
    inv2 = make_inventory([node(name="custom", labels={"example.org/row": "row-9"})], config=cfg)
    assert facts(inv2, "custom").node.topology[2] == "row-9"


def test_a_level_the_cluster_does_not_have_is_switched_off() -> None:
    """Racks under one spine (no block label): with `block: ""` the level is gone, so racks group nodes; left
    configured, every node would be a domain of its own below the missing block."""
    from extender.agent.config import AgentConfig
    from placement.model import TopologyLevels
    from placement.topology import group_by_level

    labels = [{"topology.kubernetes.io/zone": "z", "network.example.com/rack": "r1"}] * 2
    nodes = [node(name=f"n{i}", labels=dict(l)) for i, l in enumerate(labels)]
    for n in nodes:
        n["metadata"]["labels"].pop("network.example.com/block", None)
    cfg = ExtenderConfig(topology=TopologyConfig(block="", clique=""))
    assert cfg.topology.keys == ("topology.kubernetes.io/zone", "network.example.com/rack", "kubernetes.io/hostname")
    assert [n for n, _ in cfg.topology.levels] == ["zone", "rack", "host"]
    inv = make_inventory(nodes, config=cfg)
    got = [facts(inv, f"n{i}").node for i in range(2)]
    assert got[0].topology == ("z", "r1", "n0")
    assert len(group_by_level(got, TopologyLevels(cfg.topology.keys), 1)) == 1  # one rack of two nodes
    default = make_inventory(nodes)
    full = [facts(default, f"n{i}").node for i in range(2)]
    assert len(group_by_level(full, TopologyLevels(ExtenderConfig().topology.keys), 2)) == 2  # no block: alone
    agent = AgentConfig.model_validate({"cluster_name": "c", "broker": "b:1", "extender": {"topology": {"block": ""}}})
    assert [n for n, _ in agent.topology_levels()] == ["zone", "rack", "nvlink", "host"]
    with pytest.raises(ValueError):
        TopologyConfig(hostname="")


def test_pod_events_update_only_their_node() -> None:
    inv = make_inventory()
    before = {f.name: f for f in inv.snapshot().facts}
    v0 = inv.version
    p = pod("new", gpus=2, node_name="h100-r1-n2", phase="Running")
    inv.apply("Pod", "ADDED", p)
    assert inv.version > v0
    after = {f.name: f for f in inv.snapshot().facts}
    assert after["h100-r1-n2"].node.free_whole_gpus == 6
    assert all(after[n] is before[n] for n in before if n != "h100-r1-n2")  # memo tokens survive
    p["status"]["phase"] = "Succeeded"
    inv.apply("Pod", "MODIFIED", p)
    assert facts(inv, "h100-r1-n2").node.free_whole_gpus == 8
    inv.apply("Pod", "MODIFIED", {**p, "status": {"phase": "Running"}})
    inv.apply("Pod", "DELETED", p)
    assert facts(inv, "h100-r1-n2").node.free_whole_gpus == 8


def test_pending_unbound_pods_hold_nothing_bound_pending_pods_do() -> None:
    inv = make_inventory([pod("waiting", gpus=8)])
    assert facts(inv, "h100-r1-n2").node.free_whole_gpus == 8
    inv.apply("Pod", "ADDED", pod("bound", gpus=3, node_name="h100-r1-n2", phase="Pending"))
    assert facts(inv, "h100-r1-n2").node.free_whole_gpus == 5


def test_node_events() -> None:
    inv = make_inventory()
    inv.apply("Node", "MODIFIED", node("h100-r1-n2", cordoned=True))
    assert facts(inv, "h100-r1-n2").node.cordoned
    inv.apply("Node", "ADDED", node(name="h100-r9-n1"))
    assert facts(inv, "h100-r9-n1").node.free_whole_gpus == 8
    inv.apply("Node", "DELETED", node(name="h100-r9-n1"))
    assert inv.snapshot().facts_by_name("h100-r9-n1") is None
    inv.apply("Node", "BOOKMARK", node(name="h100-r9-n2"))  # ignored
    assert inv.snapshot().facts_by_name("h100-r9-n2") is None


def test_slice_and_claim_events() -> None:
    inv = make_inventory()
    slice_obj = next(o for o in cluster_items() if o["kind"] == "ResourceSlice")
    inv.apply("ResourceSlice", "DELETED", slice_obj)
    assert facts(inv, "h200-dra-1").node.dra_devices == ()
    inv.apply("ResourceSlice", "ADDED", slice_obj)
    assert len(facts(inv, "h200-dra-1").node.dra_devices) == 8
    claim_obj = next(o for o in cluster_items() if o["kind"] == "ResourceClaim" and o["status"])
    inv.apply("ResourceClaim", "DELETED", claim_obj)
    assert not any(d.allocated for d in facts(inv, "h200-dra-1").node.dra_devices)


def test_readiness_needs_every_kind_and_reservations() -> None:
    inv = Inventory(ExtenderConfig())
    assert not inv.synced and not inv.ready
    items = cluster_items()
    for kind in ("Node", "Pod", "ResourceSlice", "ResourceClaim"):
        inv.replace(kind, [o for o in items if o["kind"] == kind])
    assert not inv.synced
    inv.replace("deviceclasses", [])
    assert inv.synced and not inv.reservations_loaded and not inv.ready
    inv.replace("Reservation", [])
    assert inv.ready


def test_replace_drops_objects_gone_from_the_new_list() -> None:
    inv = make_inventory()
    pods = [o for o in cluster_items() if o["kind"] == "Pod" and o["metadata"]["name"] != "llm-pretrain-0"]
    inv.replace("Pod", pods)
    assert facts(inv, "h100-r1-n1").node.free_whole_gpus == 8


@pytest.mark.parametrize("kind", ["Node", "nodes", "node", "ResourceSlices", "Reservation", "configmaps"])
def test_kind_aliases(kind: str) -> None:
    assert normalise_kind(kind) in ("Node", "ResourceSlice", "ConfigMap")


def test_unknown_kind_is_an_error() -> None:
    with pytest.raises(InventoryError):
        Inventory(ExtenderConfig()).apply("Deployment", "ADDED", {})


def test_device_classes_from_cluster_override_fallbacks() -> None:
    inv = make_inventory()
    assert "gpu.nvidia.com" in inv.device_classes()
    inv.apply(
        "DeviceClass",
        "ADDED",
        {
            "kind": "DeviceClass",
            "metadata": {"name": "gpu.nvidia.com"},
            "spec": {"selectors": [{"cel": {"expression": "true"}}]},
        },
    )
    assert inv.device_classes()["gpu.nvidia.com"] == ("true",)


def test_load_several_files(tmp_path: Path) -> None:
    items = json.loads((FIXTURES / "cluster.json").read_text())["items"]
    nodes = {"apiVersion": "v1", "kind": "List", "items": [o for o in items if o["kind"] == "Node"]}
    rest = {"apiVersion": "v1", "kind": "List", "items": [o for o in items if o["kind"] != "Node"]}
    (tmp_path / "a.json").write_text(json.dumps(nodes))
    (tmp_path / "b.json").write_text(json.dumps(rest))
    inv = Inventory(ExtenderConfig())
    load_inventory_files(inv, [tmp_path / "a.json", tmp_path / "b.json"])
    assert inv.ready
    assert facts(inv, "h100-r1-n1").node.free_whole_gpus == 2


def test_node_with_bad_quantity_is_skipped_not_fatal() -> None:
    bad = node(name="broken")
    bad["status"]["allocatable"]["cpu"] = "lots"
    inv = make_inventory([bad])
    assert inv.snapshot().facts_by_name("broken") is None
    assert any("broken" in e for e in inv.errors)
    assert inv.snapshot().facts_by_name("h100-r1-n1") is not None


def test_unbound_pending_pods_do_not_bump_the_version() -> None:
    inv = make_inventory()
    snap = inv.snapshot()
    inv.apply("Pod", "ADDED", pod("waiting", gpus=8))
    assert inv.version == snap.version and inv.snapshot() is snap
    inv.apply("Pod", "ADDED", pod("bound", gpus=1, node_name="h100-r1-n2", phase="Running"))
    assert inv.version > snap.version
    new = inv.snapshot()
    assert new.index is snap.index  # same node list: the index is shared, only one row changed
    assert new.facts_by_name("h100-r1-n2") is not snap.facts_by_name("h100-r1-n2")
    assert new.facts_by_name("h100-r2-n1") is snap.facts_by_name("h100-r2-n1")
