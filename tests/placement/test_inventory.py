"""Kubernetes objects to core Nodes: state, free resources, shares, extended resources, DRA devices."""

from typing import Any

import pytest

from placement.errors import PodSpecError
from placement.inventory import allocated_devices, dra_devices, node_from_k8s, nodes_from_list
from placement.model import DraVersion, Taint, TopologyLevels


def k8s_node(
    name: str = "n1",
    *,
    gpus: int = 4,
    ready: str = "True",
    unschedulable: bool = False,
    extra: dict[str, str] | None = None,
    cpu: str = "32",
) -> dict[str, Any]:
    allocatable = {"cpu": cpu, "memory": "256Gi", "pods": "110", "nvidia.com/gpu": str(gpus), **(extra or {})}
    return {
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/gpu.memory": "81559",
                "acme/rack": "r9",
            },
        },
        "spec": {
            "unschedulable": unschedulable,
            "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
        },
        "status": {"allocatable": allocatable, "conditions": [{"type": "Ready", "status": ready}]},
    }


def k8s_pod(node: str, phase: str = "Running", **requests: str) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {"name": f"p-{node}"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": dict(requests)}}]},
        "status": {"phase": phase},
    }


def test_state_labels_taints_and_topology() -> None:
    levels = TopologyLevels.default(rack_label="acme/rack")
    n = node_from_k8s(k8s_node(unschedulable=True, ready="False"), levels=levels)
    assert (n.ready, n.cordoned) == (False, True)
    assert n.taints == (Taint("nvidia.com/gpu", "present", "NoSchedule"),)
    assert n.topology == (None, None, "r9", None, None)
    assert n.gpus[0].memory_mib == 81559 and n.gpu_model == "NVIDIA-H100-80GB-HBM3"


def test_free_resources_count_only_holding_pods_on_this_node() -> None:
    pods = [
        k8s_pod("n1", cpu="4", memory="16Gi", **{"nvidia.com/gpu": "2"}),
        k8s_pod("n1", "Succeeded", cpu="8", **{"nvidia.com/gpu": "2"}),
        k8s_pod("other", cpu="8", **{"nvidia.com/gpu": "1"}),
    ]
    n = node_from_k8s(k8s_node(), pods)
    assert n.free_whole_gpus == 2 and [g.milli_used for g in n.gpus] == [1000, 1000, 0, 0]
    assert n.cpu_milli_free == 28_000 and n.memory_free == 240 * 2**30 and n.pods_free == 109


def test_shared_gpu_pods_are_packed_best_fit() -> None:
    pods = [k8s_pod("n1", **{"tandem.dev/gpu-milli": m}) for m in ("500", "300", "600")]
    n = node_from_k8s(k8s_node(gpus=2), pods)
    # largest first, each on the device it fills most: 600 -> gpu0, 500 -> gpu1, 300 -> gpu0 (400 left)
    assert [g.milli_used for g in n.gpus] == [900, 500]


def test_extended_resources_free() -> None:
    pods = [k8s_pod("n1", **{"nvidia.com/mig-1g.10gb": "3"})]
    n = node_from_k8s(k8s_node(gpus=0, extra={"nvidia.com/mig-1g.10gb": "7", "example.com/fpga": "2"}), pods)
    assert n.extended_free == {"nvidia.com/mig-1g.10gb": 4, "example.com/fpga": 2}


def test_bad_allocatable_names_the_field() -> None:
    with pytest.raises(PodSpecError) as err:
        node_from_k8s(k8s_node(cpu="lots"))
    assert err.value.field == "status.allocatable"
    with pytest.raises(PodSpecError):
        node_from_k8s({"metadata": {}})


def test_dra_devices_and_allocations() -> None:
    slice_ = {
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": "n1",
            "pool": {"name": "n1"},
            "devices": [
                {
                    "name": "gpu-0",
                    "attributes": {
                        "productName": {"string": "NVIDIA H200"},
                        "driverVersion": {"version": "580.95.5"},
                        "numa": {"int": 1},
                        "ok": {"bool": True},
                    },
                    "capacity": {"memory": {"value": "141Gi"}},
                },
                {"name": "gpu-1", "attributes": {}, "capacity": {}},
            ],
        }
    }
    claim = {
        "status": {
            "allocation": {"devices": {"results": [{"driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-1"}]}}
        }
    }
    taken = allocated_devices([claim, {"status": {}}])
    assert taken == frozenset({("gpu.nvidia.com", "n1", "gpu-1")})
    d0, d1 = dra_devices([slice_], taken)
    assert d0.attributes == {
        "productName": "NVIDIA H200",
        "driverVersion": DraVersion("580.95.5"),
        "numa": 1,
        "ok": True,
    }
    assert d0.capacity == {"memory": 141 * 2**30} and not d0.allocated and d1.allocated
    (n,) = nodes_from_list([k8s_node(gpus=0), {"kind": "ResourceSlice", **slice_}, {"kind": "ResourceClaim", **claim}])
    assert [d.allocated for d in n.dra_devices] == [False, True]
