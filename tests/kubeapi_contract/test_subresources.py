"""Item 3: status is a separate subresource; create clears status (Pods, Jobs) or keeps it (Nodes); pods/binding."""

from __future__ import annotations

from tests.kubeapi_contract.builders import job, node, pod
from tests.kubeapi_contract.kubehttp import MERGE_PATCH, expect
from tests.kubeapi_contract.targets import Target


def pods(ns: str, name: str = "", sub: str = "") -> str:
    return f"/api/v1/namespaces/{ns}/pods" + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")


def binding(name: str, node_name: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node_name},
    }


async def test_pod_create_clears_status_and_marks_gated_pods(target: Target) -> None:
    ns = await target.namespace()
    body = pod("gated", ns, gates=("tandem.dev/gang",), gpus=1)
    body["status"] = {"phase": "Running", "podIP": "10.0.0.1"}
    created = expect(await target.admin.post(pods(ns), body), 201)
    status = created["status"]
    assert status["phase"] == "Pending" and status["qosClass"] == "BestEffort" and "podIP" not in status
    [scheduled] = [c for c in status["conditions"] if c["type"] == "PodScheduled"]
    assert (scheduled["status"], scheduled["reason"]) == ("False", "SchedulingGated")
    assert scheduled["message"] == "Scheduling is blocked due to non-empty scheduling gates"
    bound = expect(
        await target.admin.post(pods(ns), pod("bound", ns, node_name="some-node", cpu="1", memory="1Gi")), 201
    )
    assert bound["spec"]["nodeName"] == "some-node"
    assert bound["status"]["phase"] == "Pending" and bound["status"]["qosClass"] == "Guaranteed"
    assert not [c for c in bound["status"].get("conditions", []) if c["type"] == "PodScheduled"]


async def test_job_create_clears_status_and_node_create_keeps_it(target: Target) -> None:
    ns = await target.namespace()
    body = job("j", ns, suspend=True)
    body["status"] = {"succeeded": 3}
    created = expect(await target.admin.post(f"/apis/batch/v1/namespaces/{ns}/jobs", body), 201)
    assert "succeeded" not in created.get("status", {})
    nbody = node()
    made = expect(await target.admin.post("/api/v1/nodes", nbody), 201)
    target.created_cluster_object(f"/api/v1/nodes/{nbody['metadata']['name']}")
    assert made["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert [c["type"] for c in made["status"]["conditions"]][-1] == "Ready"


async def test_main_resource_writes_ignore_status_and_status_writes_ignore_spec(target: Target) -> None:
    ns = await target.namespace()
    created = expect(await target.admin.post(pods(ns), pod("p", ns, gates=("tandem.dev/gang",))), 201)
    changed = {**created, "status": {**created["status"], "phase": "Running"}}
    after_put = expect(await target.admin.put(pods(ns, "p"), changed), 200)
    assert after_put["status"]["phase"] == "Pending"
    image = "nvcr.io/nvidia/pytorch:25.11-py3"
    current = expect(await target.admin.get(pods(ns, "p")), 200)
    both = {
        **current,
        "spec": {**current["spec"], "containers": [{**current["spec"]["containers"][0], "image": image}]},
        "status": {**current["status"], "phase": "Running", "podIP": "10.244.9.9"},
    }
    after_status = expect(await target.admin.put(pods(ns, "p", "status"), both), 200)
    assert after_status["status"]["phase"] == "Running" and after_status["status"]["podIP"] == "10.244.9.9"
    assert after_status["spec"]["containers"][0]["image"] == current["spec"]["containers"][0]["image"]
    labelled = expect(
        await target.admin.patch(
            pods(ns, "p", "status"), {"metadata": {"labels": {"x": "y"}}, "status": {"message": "hello"}}, MERGE_PATCH
        ),
        200,
    )
    assert labelled["status"]["message"] == "hello" and "x" not in labelled["metadata"].get("labels", {})


async def test_binding_sets_node_name_and_pod_scheduled(target: Target) -> None:
    ns = await target.namespace()
    expect(await target.admin.post(pods(ns), pod("p", ns)), 201)
    status = expect(await target.admin.post(pods(ns, "p", "binding"), binding("p", "node-a")), 201)
    assert status == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
    bound = expect(await target.admin.get(pods(ns, "p")), 200)
    assert bound["spec"]["nodeName"] == "node-a"
    [scheduled] = [c for c in bound["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert scheduled["status"] == "True"
    again = expect(await target.admin.post(pods(ns, "p", "binding"), binding("p", "node-b")), 409)
    assert again["reason"] == "Conflict"
    assert (
        again["message"]
        == 'Operation cannot be fulfilled on pods/binding "p": pod p is already assigned to node "node-a"'
    )


async def test_binding_of_a_gated_or_terminating_pod_is_conflict(target: Target) -> None:
    ns = await target.namespace()
    expect(await target.admin.post(pods(ns), pod("gated", ns, gates=("tandem.dev/gang",))), 201)
    status = expect(await target.admin.post(pods(ns, "gated", "binding"), binding("gated", "node-a")), 409)
    assert status["message"] == (
        'Operation cannot be fulfilled on pods/binding "gated": pod gated has non-empty .spec.schedulingGates'
    )
    held = pod("held", ns, finalizers=["example.com/hold"])
    expect(await target.admin.post(pods(ns), held), 201)
    expect(await target.admin.delete(pods(ns, "held")), 200)
    status = expect(await target.admin.post(pods(ns, "held", "binding"), binding("held", "node-a")), 409)
    assert status["message"] == (
        'Operation cannot be fulfilled on pods/binding "held": pod held is being deleted, cannot be assigned to a host'
    )
    expect(await target.admin.patch(pods(ns, "held"), {"metadata": {"finalizers": None}}, MERGE_PATCH), 200)


async def test_kubernetes_aio_patches_node_status(target: Target) -> None:
    from kubernetes.aio import client as kclient

    body = node()
    name = body["metadata"]["name"]
    expect(await target.admin.post("/api/v1/nodes", body), 201)
    target.created_cluster_object(f"/api/v1/nodes/{name}")
    async with kclient.ApiClient(target.aio_configuration()) as api:
        core = kclient.CoreV1Api(api)
        ready = {
            "type": "Ready",
            "status": "False",
            "reason": "KubeletNotReady",
            "message": "stopped",
            "lastHeartbeatTime": "2026-12-01T10:00:00Z",
            "lastTransitionTime": "2026-12-01T10:00:00Z",
        }
        patched = await core.patch_node_status(name, {"status": {"conditions": [ready]}})
        assert patched.status is not None and patched.status.conditions is not None
        by_type = {c.type: c for c in patched.status.conditions}
        assert by_type["Ready"].status == "False"
        assert by_type["MemoryPressure"].status == "False"  # strategic merge by condition type keeps the others
        await core.patch_node(name, {"status": {"conditions": [{**ready, "status": "True"}]}})
        again = await core.read_node(name)
        assert again.status is not None and again.status.conditions is not None
        assert {c.type: c.status for c in again.status.conditions}["Ready"] == "False"  # main resource ignores status
