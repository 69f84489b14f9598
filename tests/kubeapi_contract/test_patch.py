"""Item 7: JSON Patch, JSON merge patch (lists replaced) and strategic merge (lists merged by key); apply is 415."""

from __future__ import annotations

from typing import Any

from tests.kubeapi_contract.builders import configmap, pod
from tests.kubeapi_contract.kubehttp import JSON_PATCH, MERGE_PATCH, STRATEGIC, expect
from tests.kubeapi_contract.targets import Target

UNAPPLIED = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": "the server rejected our request due to an error in our request",
    "reason": "Invalid",
    "details": {},
    "code": 422,
}


async def _two_gates(target: Target) -> str:
    ns = await target.namespace()
    expect(
        await target.admin.post(
            f"/api/v1/namespaces/{ns}/pods", pod("p", ns, gates=("tandem.dev/gang", "example.com/other"))
        ),
        201,
    )
    return f"/api/v1/namespaces/{ns}/pods/p"


def gate_names(obj: dict[str, Any]) -> list[str]:
    return [g["name"] for g in obj["spec"].get("schedulingGates", [])]


async def test_json_patch_test_and_remove_ungates(target: Target) -> None:
    path = await _two_gates(target)
    ungate = [
        {"op": "test", "path": "/spec/schedulingGates/0/name", "value": "tandem.dev/gang"},
        {"op": "remove", "path": "/spec/schedulingGates/0"},
    ]
    assert gate_names(expect(await target.admin.patch(path, ungate, JSON_PATCH), 200)) == ["example.com/other"]
    assert expect(await target.admin.patch(path, ungate, JSON_PATCH), 422) == UNAPPLIED  # the test now fails
    missing = [{"op": "remove", "path": "/spec/affinity"}]
    assert expect(await target.admin.patch(path, missing, JSON_PATCH), 422) == UNAPPLIED


async def test_json_patch_add_append_replace_move_copy(target: Target) -> None:
    ns = await target.namespace()
    expect(
        await target.admin.post(
            f"/api/v1/namespaces/{ns}/configmaps", configmap("c", ns, labels={"a": "1"}, data={"x": "1"})
        ),
        201,
    )
    path = f"/api/v1/namespaces/{ns}/configmaps/c"
    ops = [
        {"op": "add", "path": "/metadata/annotations", "value": {"tandem.dev/dispatch": "s/j/1"}},
        {"op": "copy", "from": "/data/x", "path": "/data/y"},
        {"op": "move", "from": "/data/x", "path": "/data/z"},
        {"op": "replace", "path": "/metadata/labels/a", "value": "2"},
        {"op": "add", "path": "/metadata/finalizers", "value": []},
        {"op": "add", "path": "/metadata/finalizers/-", "value": "example.com/one"},
        {"op": "add", "path": "/metadata/finalizers/-", "value": "example.com/two"},
    ]
    patched = expect(await target.admin.patch(path, ops, JSON_PATCH), 200)
    assert patched["data"] == {"y": "1", "z": "1"}
    assert patched["metadata"]["labels"]["a"] == "2"
    assert patched["metadata"]["annotations"] == {"tandem.dev/dispatch": "s/j/1"}
    assert patched["metadata"]["finalizers"] == ["example.com/one", "example.com/two"]
    expect(await target.admin.patch(path, {"metadata": {"finalizers": None}}, MERGE_PATCH), 200)


async def test_merge_patch_replaces_lists_whole(target: Target) -> None:
    path = await _two_gates(target)
    patched = expect(
        await target.admin.patch(path, {"spec": {"schedulingGates": [{"name": "example.com/other"}]}}, MERGE_PATCH), 200
    )
    assert gate_names(patched) == ["example.com/other"]  # the other controller's gate list was replaced


async def test_strategic_merge_deletes_one_gate_by_name(target: Target) -> None:
    path = await _two_gates(target)
    body = {"spec": {"schedulingGates": [{"name": "tandem.dev/gang", "$patch": "delete"}]}}
    assert gate_names(expect(await target.admin.patch(path, body, STRATEGIC), 200)) == ["example.com/other"]


async def test_strategic_merge_of_maps_finalizers_and_owner_references(target: Target) -> None:
    path = await _two_gates(target)
    ns = path.split("/")[4]
    expect(await target.admin.patch(path, {"spec": {"nodeSelector": {"a": "1"}}}, STRATEGIC), 200)
    merged = expect(
        await target.admin.patch(
            path, {"spec": {"nodeSelector": {"b": "2"}}, "metadata": {"labels": {"extra": "x"}}}, STRATEGIC
        ),
        200,
    )
    assert merged["spec"]["nodeSelector"] == {"a": "1", "b": "2"}
    assert merged["metadata"]["labels"] == {"app": "trainer", "extra": "x"}
    expect(
        await target.admin.post(
            f"/api/v1/namespaces/{ns}/configmaps", configmap("c", ns, finalizers=["example.com/one"])
        ),
        201,
    )
    cm_path = f"/api/v1/namespaces/{ns}/configmaps/c"
    fin = expect(await target.admin.patch(cm_path, {"metadata": {"finalizers": ["example.com/two"]}}, STRATEGIC), 200)
    assert fin["metadata"]["finalizers"] == ["example.com/one", "example.com/two"]
    owner = expect(await target.admin.post(f"/api/v1/namespaces/{ns}/configmaps", configmap("o", ns)), 201)
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "o", "uid": owner["metadata"]["uid"]}
    with_ref = expect(await target.admin.patch(cm_path, {"metadata": {"ownerReferences": [ref]}}, STRATEGIC), 200)
    flagged = expect(
        await target.admin.patch(
            cm_path,
            {"metadata": {"ownerReferences": [{"uid": owner["metadata"]["uid"], "blockOwnerDeletion": True}]}},
            STRATEGIC,
        ),
        200,
    )
    assert with_ref["metadata"]["ownerReferences"] == [ref]
    assert flagged["metadata"]["ownerReferences"] == [{**ref, "blockOwnerDeletion": True}]
    expect(
        await target.admin.patch(
            cm_path,
            {"metadata": {"$deleteFromPrimitiveList/finalizers": ["example.com/one", "example.com/two"]}},
            STRATEGIC,
        ),
        200,
    )
    assert "finalizers" not in expect(await target.admin.get(cm_path), 200)["metadata"]


async def test_strategic_merge_replaces_lists_without_a_merge_strategy(target: Target) -> None:
    """Tolerations carry no patch strategy, so a strategic patch replaces them (what the real server does)."""
    path = await _two_gates(target)
    current = expect(await target.admin.get(path), 200)
    extra = {"key": "example.com/x", "operator": "Exists", "effect": "NoSchedule"}
    patched = expect(
        await target.admin.patch(path, {"spec": {"tolerations": [*current["spec"]["tolerations"], extra]}}, STRATEGIC),
        200,
    )
    assert patched["spec"]["tolerations"][-1] == extra
    assert len(patched["spec"]["tolerations"]) == len(current["spec"]["tolerations"]) + 1


async def test_apply_patches_are_unsupported_media_type(target: Target) -> None:
    target.fake("a real server implements server-side apply; the fake refuses it")
    path = await _two_gates(target)
    reply = await target.admin.request(
        "PATCH",
        path,
        "metadata:\n  labels:\n    a: b\n",
        content_type="application/apply-patch+yaml",
        params={"fieldManager": "t"},
    )
    status = expect(reply, 415)
    assert status["reason"] == "UnsupportedMediaType"


async def test_kubernetes_aio_sends_dicts_as_strategic_merge_and_lists_as_json_patch(target: Target) -> None:
    from kubernetes.aio import client as kclient

    path = await _two_gates(target)
    ns = path.split("/")[4]
    async with kclient.ApiClient(target.aio_configuration()) as api:
        core = kclient.CoreV1Api(api)
        smp = await core.patch_namespaced_pod(
            "p", ns, {"spec": {"schedulingGates": [{"name": "example.com/other", "$patch": "delete"}]}}
        )
        assert smp.spec is not None and smp.spec.scheduling_gates is not None
        assert [g.name for g in smp.spec.scheduling_gates] == ["tandem.dev/gang"]
        ops = [
            {"op": "test", "path": "/spec/schedulingGates/0/name", "value": "tandem.dev/gang"},
            {"op": "remove", "path": "/spec/schedulingGates/0"},
        ]
        ungated = await core.patch_namespaced_pod("p", ns, ops, _content_type="application/json-patch+json")
        assert ungated.spec is not None and not ungated.spec.scheduling_gates


async def test_a_strict_patch_with_an_unknown_field_is_invalid(target: Target) -> None:
    path = await _two_gates(target)
    reply = await target.admin.patch(path, {"spec": {"nodeSelectr": {"a": "1"}}}, MERGE_PATCH, fieldValidation="Strict")
    status = expect(reply, 422)
    assert status["reason"] == "Invalid" and [c["field"] for c in status["details"]["causes"]] == ["patch"]
    assert status["message"].startswith(' "" is invalid: patch: Invalid value: ')
    assert status["message"].endswith('strict decoding error: unknown field "spec.nodeSelectr"')
    lenient = await target.admin.patch(path, {"spec": {"nodeSelectr": {"a": "1"}}}, MERGE_PATCH)
    assert "nodeSelectr" not in expect(lenient, 200)["spec"]
    assert 'unknown field "spec.nodeSelectr"' in lenient.warnings
