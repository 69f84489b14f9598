"""Item 6: finalizers, graceful pod deletion, and ownerReference garbage collection (Background, Foreground,
Orphan, the Job default of Orphan, cross-namespace owners)."""

from __future__ import annotations

import functools
from typing import Any

from tests.kubeapi_contract.builders import CONTRACT_LABEL, configmap, job, owner_ref, pod
from tests.kubeapi_contract.kubehttp import JSON_PATCH, MERGE_PATCH, KubeHTTP, eventually, expect
from tests.kubeapi_contract.targets import Target

JOB_WARNING = (
    "child pods are preserved by default when jobs are deleted; set propagationPolicy=Background to "
    "remove them or set propagationPolicy=Orphan to suppress this warning"
)


def cm_path(ns: str, name: str = "") -> str:
    return f"/api/v1/namespaces/{ns}/configmaps" + (f"/{name}" if name else "")


async def gone(client: KubeHTTP, path: str) -> bool:
    return (await client.get(path)).status == 404


async def test_finalizers_hold_the_object_until_removed(target: Target) -> None:
    ns = await target.namespace()
    expect(await target.admin.post(cm_path(ns), configmap("held", ns, finalizers=["example.com/hold"])), 201)
    listed = expect(await target.admin.get(cm_path(ns), labelSelector=CONTRACT_LABEL), 200)
    watch = await target.admin.watch(
        cm_path(ns), resourceVersion=listed["metadata"]["resourceVersion"], labelSelector=CONTRACT_LABEL
    )
    try:
        deleting = expect(await target.admin.delete(cm_path(ns, "held")), 200)
        assert deleting["metadata"]["deletionTimestamp"] and deleting["metadata"]["deletionGracePeriodSeconds"] == 0
        [modified] = await watch.until(lambda e: True)
        assert modified["type"] == "MODIFIED" and modified["object"]["metadata"]["deletionTimestamp"]
        expect(await target.admin.get(cm_path(ns, "held")), 200)
        add = {"metadata": {"finalizers": ["example.com/hold", "example.com/late"]}}
        status = expect(await target.admin.patch(cm_path(ns, "held"), add, MERGE_PATCH), 422)
        assert "no new finalizers can be added if the object is being deleted" in status["message"]
        remove = [{"op": "remove", "path": "/metadata/finalizers/0"}]
        expect(await target.admin.patch(cm_path(ns, "held"), remove, JSON_PATCH), 200)
        [deleted] = await watch.until(lambda e: True)
        assert deleted["type"] == "DELETED"
        assert int(deleted["object"]["metadata"]["resourceVersion"]) > int(
            modified["object"]["metadata"]["resourceVersion"]
        )
    finally:
        watch.close()
    expect(await target.admin.get(cm_path(ns, "held")), 404)


async def test_bound_pods_are_deleted_gracefully_and_grace_only_shortens(target: Target) -> None:
    ns = await target.namespace()
    path = f"/api/v1/namespaces/{ns}/pods"
    expect(await target.admin.post(path, pod("bound", ns, node_name="n1")), 201)
    first = expect(await target.admin.delete(f"{path}/bound"), 200)
    assert first["metadata"]["deletionGracePeriodSeconds"] == 30
    longer = expect(await target.admin.delete(f"{path}/bound", gracePeriodSeconds="120"), 200)
    assert longer["metadata"]["deletionGracePeriodSeconds"] == 30
    assert longer["metadata"]["deletionTimestamp"] == first["metadata"]["deletionTimestamp"]
    shorter = expect(await target.admin.delete(f"{path}/bound", gracePeriodSeconds="10"), 200)
    assert shorter["metadata"]["deletionGracePeriodSeconds"] == 10
    expect(await target.admin.get(f"{path}/bound"), 200)  # still there: only the kubelet finishes it
    expect(await target.admin.delete(f"{path}/bound", gracePeriodSeconds="0"), 200)
    expect(await target.admin.get(f"{path}/bound"), 404)
    expect(await target.admin.post(path, pod("unbound", ns)), 201)
    expect(await target.admin.delete(f"{path}/unbound"), 200)
    expect(await target.admin.get(f"{path}/unbound"), 404)


async def _owner_and_dependents(target: Target, ns: str, n: int = 2) -> tuple[dict[str, Any], list[str]]:
    owner = expect(await target.admin.post(cm_path(ns), configmap("owner", ns)), 201)
    names = [f"dep-{i}" for i in range(n)]
    for name in names:
        body = configmap(name, ns, owners=[owner_ref(owner, controller=(name == names[0]), block=True)])
        expect(await target.admin.post(cm_path(ns), body), 201)
    return owner, names


async def test_background_deletion_removes_dependents_after_the_owner(target: Target) -> None:
    ns = await target.namespace()
    _, deps = await _owner_and_dependents(target, ns)
    expect(await target.admin.delete(cm_path(ns, "owner"), {"propagationPolicy": "Background"}), 200)
    expect(await target.admin.get(cm_path(ns, "owner")), 404)
    for name in deps:
        await eventually(functools.partial(gone, target.admin, cm_path(ns, name)))


async def test_foreground_deletion_waits_for_blocking_dependents(target: Target) -> None:
    ns = await target.namespace()
    owner = expect(await target.admin.post(cm_path(ns), configmap("owner", ns)), 201)
    pods = f"/api/v1/namespaces/{ns}/pods"
    expect(
        await target.admin.post(
            pods, pod("worker", ns, node_name="n1", owners=[owner_ref(owner, controller=True, block=True)])
        ),
        201,
    )
    deleting = expect(await target.admin.delete(cm_path(ns, "owner"), propagationPolicy="Foreground"), 200)
    assert "foregroundDeletion" in deleting["metadata"]["finalizers"] and deleting["metadata"]["deletionTimestamp"]

    async def pod_terminating() -> bool:
        reply = await target.admin.get(f"{pods}/worker")
        return reply.status == 200 and bool(reply.obj["metadata"].get("deletionTimestamp"))

    await eventually(pod_terminating)  # the GC deleted it; a bound pod waits for its kubelet
    expect(await target.admin.get(cm_path(ns, "owner")), 200)
    expect(await target.admin.delete(f"{pods}/worker", gracePeriodSeconds="0"), 200)  # what the kubelet does
    await eventually(lambda: gone(target.admin, cm_path(ns, "owner")))


async def test_orphan_deletion_keeps_dependents_and_drops_their_references(target: Target) -> None:
    ns = await target.namespace()
    owner, deps = await _owner_and_dependents(target, ns)
    expect(await target.admin.delete(cm_path(ns, "owner"), propagationPolicy="Orphan"), 200)
    await eventually(lambda: gone(target.admin, cm_path(ns, "owner")))
    for name in deps:
        dep = expect(await target.admin.get(cm_path(ns, name)), 200)
        assert owner["metadata"]["uid"] not in [r["uid"] for r in dep["metadata"].get("ownerReferences", [])]


async def test_jobs_default_to_orphan_with_the_real_warning(target: Target) -> None:
    ns = await target.namespace()
    jobs = f"/apis/batch/v1/namespaces/{ns}/jobs"
    owner = expect(await target.admin.post(jobs, job("attempt-1", ns, suspend=True)), 201)
    expect(await target.admin.post(cm_path(ns), configmap("dep", ns, owners=[owner_ref(owner, block=True)])), 201)
    reply = await target.admin.delete(f"{jobs}/attempt-1")
    expect(reply, 200)
    assert JOB_WARNING in reply.warnings
    await eventually(lambda: gone(target.admin, f"{jobs}/attempt-1"))
    dep = expect(await target.admin.get(cm_path(ns, "dep")), 200)  # a Background default would have deleted it
    assert not dep["metadata"].get("ownerReferences")


async def test_jobs_deleted_with_background_take_their_dependents(target: Target) -> None:
    ns = await target.namespace()
    jobs = f"/apis/batch/v1/namespaces/{ns}/jobs"
    owner = expect(await target.admin.post(jobs, job("attempt-2", ns, suspend=True)), 201)
    expect(await target.admin.post(cm_path(ns), configmap("dep", ns, owners=[owner_ref(owner, block=True)])), 201)
    reply = await target.admin.delete(f"{jobs}/attempt-2", propagationPolicy="Background")
    expect(reply, 200)
    assert JOB_WARNING not in reply.warnings
    await eventually(lambda: gone(target.admin, cm_path(ns, "dep")))


async def test_a_cross_namespace_owner_is_absent_so_the_dependent_goes(target: Target) -> None:
    ns_owner, ns_dep = await target.namespace(), await target.namespace()
    owner = expect(await target.admin.post(cm_path(ns_owner), configmap("owner", ns_owner)), 201)
    body = configmap("reservation", ns_dep, owners=[owner_ref(owner)])
    expect(await target.admin.post(cm_path(ns_dep), body), 201)
    await eventually(lambda: gone(target.admin, cm_path(ns_dep, "reservation")))
    expect(await target.admin.get(cm_path(ns_owner, "owner")), 200)


async def test_delete_collection_by_label(target: Target) -> None:
    ns = await target.namespace()
    for name, attempt in (("a", "1"), ("b", "1"), ("c", "2")):
        expect(await target.admin.post(cm_path(ns), configmap(name, ns, labels={"tandem.dev/attempt": attempt})), 201)
    expect(await target.admin.delete(cm_path(ns), labelSelector="tandem.dev/attempt=1"), 200)
    left = expect(await target.admin.get(cm_path(ns)), 200)
    assert [i["metadata"]["name"] for i in left["items"] if i["metadata"]["name"] in {"a", "b", "c"}] == ["c"]


async def test_a_deleted_unscheduled_pod_is_held_by_a_finalizer(target: Target) -> None:
    """Unbound: grace 0 at once, yet a finalizer keeps it until its owner removes it — the Job-tracking case
    (a stand-in name: a real Job controller strips batch.kubernetes.io/job-tracking from orphan pods)."""
    ns = await target.namespace()
    path = f"/api/v1/namespaces/{ns}/pods"
    expect(
        await target.admin.post(
            path, pod("gang-0", ns, gates=("tandem.dev/gang",), finalizers=["example.com/job-tracking"])
        ),
        201,
    )
    deleting = expect(await target.admin.delete(f"{path}/gang-0"), 200)
    assert deleting["metadata"]["deletionGracePeriodSeconds"] == 0 and deleting["metadata"]["deletionTimestamp"]
    held = expect(await target.admin.get(f"{path}/gang-0"), 200)
    assert held["metadata"]["finalizers"] == ["example.com/job-tracking"]
    expect(
        await target.admin.patch(f"{path}/gang-0", [{"op": "remove", "path": "/metadata/finalizers"}], JSON_PATCH), 200
    )
    expect(await target.admin.get(f"{path}/gang-0"), 404)


async def test_a_terminating_namespace_refuses_new_content(target: Target) -> None:
    ns = await target.namespace()
    expect(await target.admin.post(cm_path(ns), configmap("held", ns, finalizers=["example.com/hold"])), 201)
    deleting = expect(await target.admin.delete(f"/api/v1/namespaces/{ns}"), 200)
    assert deleting["status"]["phase"] == "Terminating" and deleting["metadata"]["deletionTimestamp"]
    status = expect(await target.admin.post(cm_path(ns), configmap("late", ns)), 403)
    assert status["message"] == (
        f'configmaps "late" is forbidden: unable to create new content in namespace {ns} because it is being terminated'
    )
    assert status["details"]["causes"] == [
        {
            "reason": "NamespaceTerminating",
            "field": "metadata.namespace",
            "message": f"namespace {ns} is being terminated",
        }
    ]
    expect(await target.admin.patch(cm_path(ns, "held"), {"metadata": {"finalizers": None}}, MERGE_PATCH), 200)
