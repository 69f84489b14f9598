"""Item 4, part 2: what a Pod update may change, including the gated-pod narrowing rules (A-1)."""

from __future__ import annotations

from typing import Any

from tests.kubeapi_contract.builders import pod
from tests.kubeapi_contract.kubehttp import JSON_PATCH, MERGE_PATCH, STRATEGIC, expect
from tests.kubeapi_contract.targets import Target

TERMS = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms"
FORBIDDEN_PREFIX = (
    "spec: Forbidden: pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions "
    "to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was "
    "previously negative)"
)


async def _gated(target: Target) -> tuple[str, str]:
    ns = await target.namespace()
    body = pod("p", ns, gates=("tandem.dev/gang", "example.com/other"), affinity_nodes=("x",))
    body["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    expect(await target.admin.post(f"/api/v1/namespaces/{ns}/pods", body), 201)
    return ns, f"/api/v1/namespaces/{ns}/pods/p"


def fields(status: dict[str, Any]) -> list[str]:
    return [c["field"] for c in status["details"]["causes"]]


async def test_every_pod_accepts_image_deadline_and_added_tolerations(target: Target) -> None:
    ns = await target.namespace()
    expect(await target.admin.post(f"/api/v1/namespaces/{ns}/pods", pod("p", ns)), 201)
    path = f"/api/v1/namespaces/{ns}/pods/p"
    ops = [
        {"op": "replace", "path": "/spec/containers/0/image", "value": "nvcr.io/nvidia/pytorch:25.11-py3"},
        {"op": "add", "path": "/spec/activeDeadlineSeconds", "value": 3600},
        {
            "op": "add",
            "path": "/spec/tolerations/-",
            "value": {"key": "a", "operator": "Exists", "effect": "NoSchedule"},
        },
    ]
    updated = expect(await target.admin.patch(path, ops, JSON_PATCH), 200)
    assert updated["spec"]["containers"][0]["image"].endswith("25.11-py3")
    longer = [{"op": "replace", "path": "/spec/activeDeadlineSeconds", "value": 7200}]
    status = expect(await target.admin.patch(path, longer, JSON_PATCH), 422)
    assert fields(status) == ["spec.activeDeadlineSeconds"]
    drop = [{"op": "remove", "path": "/spec/tolerations/0"}]
    assert "spec.tolerations" in fields(expect(await target.admin.patch(path, drop, JSON_PATCH), 422))


async def test_other_spec_changes_are_forbidden_with_the_real_message(target: Target) -> None:
    ns = await target.namespace()
    expect(await target.admin.post(f"/api/v1/namespaces/{ns}/pods", pod("p", ns)), 201)
    status = expect(
        await target.admin.patch(
            f"/api/v1/namespaces/{ns}/pods/p", {"spec": {"restartPolicy": "OnFailure"}}, STRATEGIC
        ),
        422,
    )
    assert fields(status) == ["spec"]
    assert status["message"].startswith(f'Pod "p" is invalid: {FORBIDDEN_PREFIX}')


async def test_gated_pod_accepts_node_selector_additions_only(target: Target) -> None:
    _, path = await _gated(target)
    added = expect(
        await target.admin.patch(path, {"spec": {"nodeSelector": {"network.example.com/rack": "r1"}}}, STRATEGIC), 200
    )
    assert added["spec"]["nodeSelector"] == {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "network.example.com/rack": "r1",
    }
    changed = {"spec": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"}}}
    status = expect(await target.admin.patch(path, changed, STRATEGIC), 422)
    assert fields(status) == ["spec.nodeSelector"]
    assert "only additions to spec.nodeSelector are allowed (no mutations or deletions)" in status["message"]


async def test_gated_pod_pins_by_appending_match_fields_to_the_existing_term(target: Target) -> None:
    _, path = await _gated(target)
    current = expect(await target.admin.get(path), 200)
    pin = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": current["metadata"]["resourceVersion"]},
        {
            "op": "add",
            "path": f"{TERMS}/0/matchFields",
            "value": [{"key": "metadata.name", "operator": "In", "values": ["node-0007"]}],
        },
    ]
    pinned = expect(await target.admin.patch(path, pin, JSON_PATCH), 200)
    term = pinned["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ][0]
    assert term["matchFields"] == [{"key": "metadata.name", "operator": "In", "values": ["node-0007"]}]
    new_term = [
        {
            "op": "add",
            "path": f"{TERMS}/-",
            "value": {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["other"]}]},
        }
    ]
    status = expect(await target.admin.patch(path, new_term, JSON_PATCH), 422)
    assert "no additions/deletions to non-empty NodeSelectorTerms list are allowed" in status["message"]
    mutate = [{"op": "replace", "path": f"{TERMS}/0/matchExpressions/0/values", "value": ["r9"]}]
    status = expect(await target.admin.patch(path, mutate, JSON_PATCH), 422)
    assert fields(status) == [
        "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
    ]
    assert "only additions are allowed (no mutations or deletions)" in status["message"]


async def test_gated_pod_without_affinity_accepts_any_and_preferred_is_free(target: Target) -> None:
    ns = await target.namespace()
    expect(await target.admin.post(f"/api/v1/namespaces/{ns}/pods", pod("p", ns, gates=("tandem.dev/gang",))), 201)
    path = f"/api/v1/namespaces/{ns}/pods/p"
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 10, "preference": {"matchExpressions": [{"key": "z", "operator": "Exists"}]}}
            ],
        }
    }
    expect(await target.admin.patch(path, {"spec": {"affinity": affinity}}, MERGE_PATCH), 200)
    preferred = [
        {
            "op": "replace",
            "path": "/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution/0/weight",
            "value": 50,
        }
    ]
    expect(await target.admin.patch(path, preferred, JSON_PATCH), 200)


async def test_gates_may_be_removed_never_added_and_then_directives_freeze(target: Target) -> None:
    _, path = await _gated(target)
    add = [{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": "example.com/late"}}]
    status = expect(await target.admin.patch(path, add, JSON_PATCH), 422)
    assert fields(status) == ["spec.schedulingGates[2].name"]
    assert "only deletion is allowed, but found new scheduling gate 'example.com/late'" in status["message"]
    ungate = [
        {"op": "test", "path": "/spec/schedulingGates/0/name", "value": "tandem.dev/gang"},
        {"op": "remove", "path": "/spec/schedulingGates/0"},
    ]
    expect(await target.admin.patch(path, ungate, JSON_PATCH), 200)
    last = [{"op": "remove", "path": "/spec/schedulingGates/0"}]
    ungated = expect(await target.admin.patch(path, last, JSON_PATCH), 200)
    assert "schedulingGates" not in ungated["spec"]
    status = expect(await target.admin.patch(path, {"spec": {"nodeSelector": {"late": "x"}}}, STRATEGIC), 422)
    assert fields(status) == ["spec"]


async def test_node_name_together_with_gates_is_refused_at_create(target: Target) -> None:
    ns = await target.namespace()
    body = pod("p", ns, gates=("tandem.dev/gang",), node_name="n1")
    status = expect(await target.admin.post(f"/api/v1/namespaces/{ns}/pods", body), 422)
    assert (
        status["message"]
        == 'Pod "p" is invalid: spec.nodeName: Forbidden: cannot be set until all schedulingGates have been cleared'
    )
