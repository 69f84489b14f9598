"""Item 4, part 3: Priority, ResourceQuota and LimitRange admission of pods (gated or not), dry run included."""

from __future__ import annotations

from typing import Any

from tests.kubeapi_contract.builders import pod, unique
from tests.kubeapi_contract.kubehttp import eventually, expect
from tests.kubeapi_contract.targets import Target


async def _priority_class(target: Target, value: int, *, policy: str = "PreemptLowerPriority") -> str:
    name = unique("tandem-gang")
    body = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
        "preemptionPolicy": policy,
        "description": "contract test",
    }
    expect(await target.admin.post("/apis/scheduling.k8s.io/v1/priorityclasses", body), 201)
    target.created_cluster_object(f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")
    return name


async def test_unknown_priority_class_is_forbidden(target: Target) -> None:
    ns = await target.namespace()
    status = expect(await target.admin.post(f"/api/v1/namespaces/{ns}/pods", pod("p", ns, priority_class="nope")), 403)
    assert status == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'pods "p" is forbidden: no PriorityClass with name nope was found',
        "reason": "Forbidden",
        "details": {"name": "p", "kind": "pods"},
        "code": 403,
    }


async def test_priority_and_preemption_policy_come_from_the_class(target: Target) -> None:
    ns = await target.namespace()
    name = await _priority_class(target, 1_000_000, policy="Never")
    created = expect(await target.admin.post(f"/api/v1/namespaces/{ns}/pods", pod("p", ns, priority_class=name)), 201)
    assert created["spec"]["priority"] == 1_000_000 and created["spec"]["preemptionPolicy"] == "Never"
    plain = expect(await target.admin.post(f"/api/v1/namespaces/{ns}/pods", pod("plain", ns)), 201)
    assert plain["spec"]["priority"] == 0 and "priorityClassName" not in plain["spec"]
    body = pod("mismatch", ns, priority_class=name)
    body["spec"]["priority"] = 5
    status = expect(await target.admin.post(f"/api/v1/namespaces/{ns}/pods", body), 403)
    assert status["message"] == (
        'pods "mismatch" is forbidden: the integer value of priority (5) must not be provided '
        "in pod spec; priority admission controller computed 1000000 from the given "
        "PriorityClass name"
    )


async def test_a_global_default_class_applies_to_pods_without_one(target: Target) -> None:
    target.fake("a global default PriorityClass would change every pod created on a shared real cluster")
    ns = await target.namespace()
    name = unique("default-class")
    body = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": 42,
        "globalDefault": True,
    }
    expect(await target.admin.post("/apis/scheduling.k8s.io/v1/priorityclasses", body), 201)
    created = expect(await target.admin.post(f"/api/v1/namespaces/{ns}/pods", pod("p", ns)), 201)
    assert created["spec"]["priorityClassName"] == name and created["spec"]["priority"] == 42


async def _quota(target: Target, ns: str, hard: dict[str, str]) -> None:
    body = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpus"}, "spec": {"hard": hard}}
    expect(await target.admin.post(f"/api/v1/namespaces/{ns}/resourcequotas", body), 201)

    async def status_ready() -> bool:
        quota = expect(await target.admin.get(f"/api/v1/namespaces/{ns}/resourcequotas/gpus"), 200)
        return bool(quota.get("status", {}).get("used"))

    await eventually(status_ready)


async def _used(target: Target, ns: str) -> dict[str, Any]:
    quota = expect(await target.admin.get(f"/api/v1/namespaces/{ns}/resourcequotas/gpus"), 200)
    used: dict[str, Any] = quota.get("status", {}).get("used", {})
    return used


async def test_quota_charges_gated_pods_and_refuses_the_excess(target: Target) -> None:
    ns = await target.namespace()
    await _quota(target, ns, {"requests.nvidia.com/gpu": "2", "pods": "3"})
    path = f"/api/v1/namespaces/{ns}/pods"
    expect(await target.admin.post(path, pod("a", ns, gates=("tandem.dev/gang",), gpus=2)), 201)
    await eventually(lambda: _check_used(target, ns, {"requests.nvidia.com/gpu": "2", "pods": "1"}))
    status = expect(await target.admin.post(path, pod("b", ns, gates=("tandem.dev/gang",), gpus=1)), 403)
    assert status["message"] == (
        'pods "b" is forbidden: exceeded quota: gpus, requested: requests.nvidia.com/gpu=1, '
        "used: requests.nvidia.com/gpu=2, limited: requests.nvidia.com/gpu=2"
    )
    dry = expect(await target.admin.post(path, pod("b", ns, gpus=1), dryRun="All"), 403)
    assert dry["message"] == status["message"]
    expect(await target.admin.delete(f"{path}/a"), 200)  # unbound: goes at once
    await eventually(lambda: _check_used(target, ns, {"requests.nvidia.com/gpu": "0", "pods": "0"}))
    expect(await target.admin.post(path, pod("b", ns, gates=("tandem.dev/gang",), gpus=1)), 201)


async def _check_used(target: Target, ns: str, want: dict[str, str]) -> bool:
    return await _used(target, ns) == want


async def test_quota_on_cpu_needs_every_container_to_request_it(target: Target) -> None:
    ns = await target.namespace()
    await _quota(target, ns, {"requests.cpu": "4"})
    status = expect(await target.admin.post(f"/api/v1/namespaces/{ns}/pods", pod("p", ns, gpus=1)), 403)
    assert status["message"] == 'pods "p" is forbidden: failed quota: gpus: must specify requests.cpu for: trainer'


async def test_limit_range_defaults_are_applied_at_pod_create(target: Target) -> None:
    ns = await target.namespace()
    body = {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": {"name": "defaults"},
        "spec": {
            "limits": [{"type": "Container", "default": {"cpu": "2", "memory": "4Gi"}, "defaultRequest": {"cpu": "1"}}]
        },
    }
    expect(await target.admin.post(f"/api/v1/namespaces/{ns}/limitranges", body), 201)
    created = expect(await target.admin.post(f"/api/v1/namespaces/{ns}/pods", pod("p", ns, gpus=1)), 201)
    resources = created["spec"]["containers"][0]["resources"]
    assert resources["limits"] == {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"}
    assert resources["requests"] == {"cpu": "1", "memory": "4Gi", "nvidia.com/gpu": "1"}
    assert created["metadata"]["annotations"]["kubernetes.io/limit-ranger"].startswith("LimitRanger plugin set: ")


async def test_pods_need_their_service_account(target: Target) -> None:
    ns = await target.namespace()
    body = pod("p", ns)
    body["spec"]["serviceAccountName"] = "missing"
    status = expect(await target.admin.post(f"/api/v1/namespaces/{ns}/pods", body), 403)
    assert status["message"] == (
        f'pods "p" is forbidden: error looking up service account {ns}/missing: serviceaccount "missing" not found'
    )
