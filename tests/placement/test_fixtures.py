"""The shared real-format cluster through inventory, podspec and fit: the README's expected answers."""

from typing import Any

import pytest

from placement.fit import capacity
from placement.inventory import nodes_from_list
from placement.model import Node
from placement.podspec import holds_resources, requests_from_claim, shape_from_pod
from placement.reasons import Reason
from tests.placement.builders import GIB, fixture


@pytest.fixture(scope="module")
def cluster() -> dict[str, Any]:
    data: dict[str, Any] = fixture("cluster.json")
    return data


@pytest.fixture(scope="module")
def nodes(cluster: dict[str, Any]) -> dict[str, Node]:
    return {n.name: n for n in nodes_from_list(cluster)}


@pytest.fixture(scope="module")
def pending(cluster: dict[str, Any]) -> dict[str, Any]:
    claims = {c["metadata"]["name"]: requests_from_claim(c) for c in cluster["items"] if c["kind"] == "ResourceClaim"}
    return {p["metadata"]["name"]: shape_from_pod(p, claims) for p in fixture("pending-pods.json")["items"]}


IN_USE = {
    "h100-r1-n1": 6,
    "h100-r1-n2": 0,  # old-job Succeeded: holds nothing
    "h100-r2-n1": 2,
    "h100-r2-n2": 2,
    "gb200-r5-n1": 4,
    "gb200-r5-n2": 0,
    "gb200-r5-n3": 0,
    "t4-1": 0,
    "h100-notready": 0,
}


@pytest.mark.parametrize(("name", "used"), sorted(IN_USE.items()))
def test_in_use_gpus_per_node(nodes: dict[str, Node], name: str, used: int) -> None:
    n = nodes[name]
    assert n.total_gpus - n.free_whole_gpus == used


def test_old_job_holds_nothing(cluster: dict[str, Any], nodes: dict[str, Node]) -> None:
    old = next(i for i in cluster["items"] if i["metadata"]["name"] == "old-job")
    assert not holds_resources(old)
    n = nodes["h100-r1-n2"]
    assert (n.cpu_milli_free, n.memory_free, n.pods_free) == (n.cpu_milli_allocatable, n.memory_allocatable, 110)


def test_cpu_memory_and_pods_subtracted(nodes: dict[str, Node]) -> None:
    n = nodes["h100-r1-n1"]
    assert n.cpu_milli_allocatable == 192_000 and n.cpu_milli_free == 184_000
    assert n.memory_allocatable == 2113396124 * 1024 and n.memory_free == 2113396124 * 1024 - 64 * GIB
    assert n.pods_free == 109


def test_mig_mixed_counts(nodes: dict[str, Node]) -> None:
    n = nodes["a100-mig-1"]
    assert n.extended_free == {"nvidia.com/mig-1g.10gb": 11, "nvidia.com/mig-3g.40gb": 3}
    assert n.gpus == () and n.gpu_model == "NVIDIA-A100-SXM4-80GB"


def test_dra_devices(nodes: dict[str, Node]) -> None:
    devs = nodes["h200-dra-1"].dra_devices
    assert len(devs) == 8
    assert sorted(d.name for d in devs if d.allocated) == ["gpu-0", "gpu-1"]
    assert devs[0].attribute("productName") == "NVIDIA H200" and devs[0].capacity["memory"] == 141 * GIB


def test_state_and_topology(nodes: dict[str, Node]) -> None:
    assert not nodes["h100-notready"].ready
    assert nodes["h100-r1-n1"].topology == ("zone-a", "b1", "r1", None, "h100-r1-n1")
    assert nodes["gb200-r5-n2"].topology[3] == "7b968a6d-3c2e-4f0a-8d51-0e9a6c4b2f10.1"


EXPECTED_FITS = {
    "want-4-h100": {"h100-r1-n2", "h100-r2-n1", "h100-r2-n2"},
    "want-8": {"h100-r1-n2"},
    "want-mig-3g": {"a100-mig-1"},
    "want-dra-4": {"h200-dra-1"},
}


@pytest.mark.parametrize(("pod", "fits"), sorted(EXPECTED_FITS.items()))
def test_pending_pods_fit_exactly_where_readme_says(
    nodes: dict[str, Node], pending: dict[str, Any], pod: str, fits: set[str]
) -> None:
    results = {name: capacity(n, pending[pod]) for name, n in nodes.items()}
    assert {name for name, f in results.items() if f.count > 0} == fits
    for name, f in results.items():
        if f.count == 0:
            assert f.reason is not None and name in f.detail


@pytest.mark.parametrize("pod", sorted(EXPECTED_FITS))
def test_scheduler_candidates_all_fit(nodes: dict[str, Node], pending: dict[str, Any], pod: str) -> None:
    names = fixture(f"args-{pod}-names.json")["NodeNames"]
    assert names and all(capacity(nodes[n], pending[pod]).count > 0 for n in names)


@pytest.mark.parametrize(
    ("node", "reason"),
    [
        ("h100-r1-n1", Reason.INSUFFICIENT_GPUS),
        ("gb200-r5-n2", Reason.GPU_MODEL_MISMATCH),
        ("t4-1", Reason.GPU_MODEL_MISMATCH),
        ("a100-mig-1", Reason.GPU_MODEL_MISMATCH),
        ("h100-notready", Reason.NOT_READY),
        ("h200-dra-1", Reason.NO_GPU),
        ("cpu-1", Reason.NO_GPU),
    ],
)
def test_want_4_h100_refusal_reasons(
    nodes: dict[str, Node], pending: dict[str, Any], node: str, reason: Reason
) -> None:
    assert capacity(nodes[node], pending["want-4-h100"]).reason is reason


def test_other_refusal_reasons(nodes: dict[str, Node], pending: dict[str, Any]) -> None:
    assert capacity(nodes["gb200-r5-n2"], pending["want-8"]).reason is Reason.GPU_COUNT_TOO_LARGE
    assert capacity(nodes["h100-r2-n1"], pending["want-8"]).reason is Reason.INSUFFICIENT_GPUS
    assert capacity(nodes["h100-r1-n2"], pending["want-mig-3g"]).reason is Reason.NO_MIG_PROFILE
    assert capacity(nodes["h100-r1-n2"], pending["want-dra-4"]).reason is Reason.NO_DRA_DEVICES
    assert capacity(nodes["h200-dra-1"], pending["want-dra-4"]).count == 1  # 6 free devices, 4 each
    assert capacity(nodes["gb200-r5-n2"], pending["no-gpu"]).reason is Reason.TAINT_NOT_TOLERATED


def test_pending_shapes(pending: dict[str, Any]) -> None:
    s = pending["want-4-h100"]
    assert (s.gpus, s.cpu_milli, s.memory, s.gpu_models) == (4, 8000, 64 * GIB, frozenset({"NVIDIA-H100-80GB-HBM3"}))
    assert (pending["want-mig-3g"].mig_profile, pending["want-mig-3g"].mig_count) == ("3g.40gb", 1)
    (req,) = pending["want-dra-4"].dra
    assert (req.device_class, req.count) == ("gpu.nvidia.com", 4)
