"""Pod JSON to PodShape: kube-scheduler request rules, GPU/MIG/share/DRA requests, errors naming fields."""

from typing import Any

import pytest

from placement import mig
from placement.errors import PodSpecError
from placement.model import DraRequest, LabelRequirement, Toleration
from placement.podspec import holds_resources, mig_profile_of, pod_requests, requests_from_claim, shape_from_pod
from tests.placement.builders import GIB


def container(name: str = "c", restart: str | None = None, **requests: str) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "resources": {"requests": dict(requests)}}
    if restart:
        c["restartPolicy"] = restart
    return c


def pod(containers: list[dict[str, Any]], init: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": containers, **spec}
    if init is not None:
        body["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": body, "status": {"phase": "Pending"}}


@pytest.mark.parametrize(
    ("p", "cpu_milli", "memory"),
    [
        (pod([container(cpu="1", memory="1Gi"), container(cpu="500m", memory="1Gi")]), 1500, 2 * GIB),
        # init containers: max, not sum
        (pod([container(cpu="1")], [container(cpu="4"), container(cpu="2")]), 4000, 0),
        (pod([container(cpu="3")], [container(cpu="2")]), 3000, 0),
        # a sidecar (restartable init container) runs alongside: added to containers, and to later inits
        (pod([container(cpu="1")], [container("side", "Always", cpu="1"), container(cpu="3")]), 4000, 0),
        (pod([container(cpu="4")], [container("side", "Always", cpu="1"), container(cpu="2")]), 5000, 0),
        # overhead added on top
        (pod([container(cpu="1", memory="1Gi")], overhead={"cpu": "250m", "memory": "120Mi"}), 1250, GIB + 120 * 2**20),
        # pod-level resources replace the containers' sum for cpu/memory
        (pod([container(cpu="1", memory="1Gi")], resources={"requests": {"cpu": "8", "memory": "4Gi"}}), 8000, 4 * GIB),
        (pod([container()]), 0, 0),
    ],
)
def test_requests_as_kube_scheduler(p: dict[str, Any], cpu_milli: int, memory: int) -> None:
    s = shape_from_pod(p)
    assert (s.cpu_milli, s.memory) == (cpu_milli, memory)


def test_extended_resource_given_only_as_limit_counts() -> None:
    c = {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "1"}}}
    assert shape_from_pod(pod([c])).gpus == 2
    assert pod_requests(pod([c]))["cpu"] == 1


def test_gpu_mig_share_and_other_extended() -> None:
    assert shape_from_pod(pod([{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "4"}}}])).gpus == 4
    s = shape_from_pod(pod([{"name": "c", "resources": {"requests": {"nvidia.com/mig-1g.10gb.me": "1"}}}]))
    assert (s.mig_profile, s.mig_count, s.gpus) == ("1g.10gb+me", 1, 0)
    s = shape_from_pod(pod([{"name": "c", "resources": {"requests": {"tandem.dev/gpu-milli": "250"}}}]))
    assert (s.gpus, s.gpu_milli) == (1, 250)
    s = shape_from_pod(
        pod(
            [
                {
                    "name": "c",
                    "resources": {
                        "requests": {"example.com/fpga": "2", "ephemeral-storage": "1Gi", "hugepages-2Mi": "1Gi"}
                    },
                }
            ]
        )
    )
    assert s.extended == (("example.com/fpga", 2),)


def test_mig_profile_of_a_resource_is_the_inverse_of_its_resource_name() -> None:
    for profile in ("1g.10gb", "1g.10gb+me", "3g.40gb", "2g.12gb+me"):
        assert mig_profile_of(mig.resource_name(profile)) == profile
    assert mig_profile_of("nvidia.com/gpu") is None and mig_profile_of("tandem.dev/gpu-milli") is None


def test_gpu_model_from_node_selector_is_lifted() -> None:
    s = shape_from_pod(
        pod([container()], nodeSelector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "zone": "a"})
    )
    assert s.gpu_models == frozenset({"NVIDIA-H100-80GB-HBM3"})
    assert s.node_selector == (("zone", "a"),)


def affinity(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]
            }
        }
    }


def test_gpu_model_from_affinity() -> None:
    prod = {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["A", "B"]}
    zone = {"key": "zone", "operator": "In", "values": ["z"]}
    s = shape_from_pod(pod([container()], affinity=affinity([prod, zone])))
    assert s.gpu_models == frozenset({"A", "B"})
    assert s.affinity == ((LabelRequirement("zone", "In", ("z",)),),)
    # two terms: models are their union, affinity kept whole
    s = shape_from_pod(pod([container()], affinity=affinity([prod], [{**prod, "values": ["C"]}])))
    assert s.gpu_models == frozenset({"A", "B", "C"}) and len(s.affinity) == 2
    # a term without a model constraint allows any model
    assert shape_from_pod(pod([container()], affinity=affinity([prod], [zone]))).gpu_models == frozenset()
    # contradictory selector and affinity: nothing lifted, the selectors refuse every node
    s = shape_from_pod(pod([container()], nodeSelector={"nvidia.com/gpu.product": "Z"}, affinity=affinity([prod])))
    assert s.gpu_models == frozenset() and s.node_selector == (("nvidia.com/gpu.product", "Z"),)


def test_match_fields_on_node_name() -> None:
    aff = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n7"]}]}]
            }
        }
    }
    assert shape_from_pod(pod([container()], affinity=aff)).affinity == (
        (LabelRequirement("metadata.name", "In", ("n7",)),),
    )


def test_tolerations() -> None:
    s = shape_from_pod(
        pod(
            [container()],
            tolerations=[
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {"operator": "Exists"},
            ],
        )
    )
    assert s.tolerations == (Toleration("nvidia.com/gpu", "Exists", "", "NoSchedule"), Toleration("", "Exists", "", ""))


def test_dra_claims_resolved_by_mapping_or_callable() -> None:
    req = DraRequest("gpu.nvidia.com", ("true",), 4)
    p = pod([container()], resourceClaims=[{"name": "gpus", "resourceClaimName": "job-gpus"}])
    assert shape_from_pod(p, {"job-gpus": [req]}).dra == (req,)
    assert shape_from_pod(p, lambda name: [req] if name == "job-gpus" else []).dra == (req,)
    with pytest.raises(PodSpecError) as err:
        shape_from_pod(p, {})
    assert "job-gpus" in str(err.value)
    # template claims: the generated name from status wins, else the template name
    t = pod([container()], resourceClaims=[{"name": "gpus", "resourceClaimTemplateName": "tmpl"}])
    assert shape_from_pod(t, {"tmpl": [req]}).dra == (req,)
    t["status"]["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": "p-gpus-x7"}]
    assert shape_from_pod(t, {"p-gpus-x7": [req]}).dra == (req,)


@pytest.mark.parametrize(
    ("p", "field"),
    [
        (pod([container(cpu="lots")]), "spec.containers[0].resources.requests.cpu"),
        (pod([container()], [container(memory="1GB")]), "spec.initContainers[0].resources.requests.memory"),
        ({"spec": {"containers": "nope"}}, "spec.containers"),
        (pod([container()], overhead={"cpu": "x"}), "spec.overhead.cpu"),
        (pod([{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1.5"}}}]), "requests.nvidia.com/gpu"),
        (
            pod([{"name": "c", "resources": {"requests": {"tandem.dev/gpu-milli": "1500"}}}]),
            "requests.tandem.dev/gpu-milli",
        ),
        (
            pod(
                [
                    {
                        "name": "c",
                        "resources": {"requests": {"nvidia.com/mig-1g.10gb": "1", "nvidia.com/mig-3g.40gb": "1"}},
                    }
                ]
            ),
            "requests.nvidia.com/mig-3g.40gb",
        ),
        (
            pod([{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1", "tandem.dev/gpu-milli": "500"}}}]),
            "requests.tandem.dev/gpu-milli",
        ),
        (pod([container()], tolerations={"key": "x"}), "spec.tolerations"),
        (pod([container()], resourceClaims=[{"name": "x"}]), "spec.resourceClaims[0]"),
    ],
)
def test_malformed_pod_names_the_field(p: dict[str, Any], field: str) -> None:
    with pytest.raises(PodSpecError) as err:
        shape_from_pod(p)
    assert err.value.field == field
    assert isinstance(err.value, ValueError)


@pytest.mark.parametrize(
    ("phase", "node_name", "deleting", "holds"),
    [
        ("Running", "n1", False, True),
        ("Pending", "n1", False, True),  # bound, containers starting
        ("Pending", None, False, False),  # not bound yet
        ("Succeeded", "n1", False, False),
        ("Failed", "n1", False, False),
        ("Running", "n1", True, True),  # terminating still holds
        ("Unknown", "n1", False, True),
    ],
)
def test_holds_resources(phase: str, node_name: str | None, deleting: bool, holds: bool) -> None:
    p = pod([container()])
    p["status"]["phase"] = phase
    if node_name:
        p["spec"]["nodeName"] = node_name
    if deleting:
        p["metadata"]["deletionTimestamp"] = "2026-11-30T07:00:00Z"
    assert holds_resources(p) is holds


def test_requests_from_claim_and_template() -> None:
    claim = {
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "a",
                        "exactly": {
                            "deviceClassName": "gpu.nvidia.com",
                            "count": 2,
                            "selectors": [{"cel": {"expression": "true"}}],
                        },
                    },
                    {
                        "name": "b",
                        "firstAvailable": [
                            {"name": "x", "deviceClassName": "mig.nvidia.com"},
                            {"name": "y", "deviceClassName": "gpu.nvidia.com"},
                        ],
                    },
                ]
            }
        }
    }
    want = (DraRequest("gpu.nvidia.com", ("true",), 2), DraRequest("mig.nvidia.com", (), 1))
    assert requests_from_claim(claim) == want
    assert requests_from_claim({"spec": {"spec": claim["spec"]}}) == want
    with pytest.raises(PodSpecError) as err:
        requests_from_claim(
            {"spec": {"devices": {"requests": [{"exactly": {"deviceClassName": "c", "allocationMode": "All"}}]}}}
        )
    assert err.value.field == "spec.devices.requests[0].exactly.allocationMode"
