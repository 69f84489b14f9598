"""Item 5: the label-selector grammar, the supported field selectors only, and watches that follow matching."""

from __future__ import annotations

import pytest

from tests.kubeapi_contract.builders import configmap, node, pod
from tests.kubeapi_contract.kubehttp import MERGE_PATCH, expect
from tests.kubeapi_contract.targets import Target

LABELS = {
    "a1": {"tier": "a", "n": "1"},
    "a2": {"tier": "a", "n": "2"},
    "b1": {"tier": "b", "n": "1"},
    "plain": {"other": "x"},
}


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("tier=a", ["a1", "a2"]),
        ("tier==a", ["a1", "a2"]),
        ("tier!=a", ["b1", "plain"]),
        ("tier in (a,b)", ["a1", "a2", "b1"]),
        ("tier notin (a)", ["b1", "plain"]),
        ("tier", ["a1", "a2", "b1"]),
        ("!tier", ["plain"]),
        ("tier=a,n=2", ["a2"]),
        ("tier in (b), n in (1, 2)", ["b1"]),
        ("n>1", ["a2"]),
    ],
)
async def test_label_selector_grammar(target: Target, selector: str, expected: list[str]) -> None:
    ns = await target.namespace()
    for name, labels in LABELS.items():
        expect(await target.admin.post(f"/api/v1/namespaces/{ns}/configmaps", configmap(name, ns, labels=labels)), 201)
    listed = expect(await target.admin.get(f"/api/v1/namespaces/{ns}/configmaps", labelSelector=selector), 200)
    assert sorted(i["metadata"]["name"] for i in listed["items"] if i["metadata"]["name"] in LABELS) == expected


async def test_a_malformed_label_selector_is_bad_request(target: Target) -> None:
    ns = await target.namespace()
    status = expect(await target.admin.get(f"/api/v1/namespaces/{ns}/configmaps", labelSelector="tier in (a"), 400)
    assert status["reason"] == "BadRequest" and status["message"].startswith("unable to parse requirement")


async def test_pod_field_selectors(target: Target) -> None:
    ns = await target.namespace()
    path = f"/api/v1/namespaces/{ns}/pods"
    expect(await target.admin.post(path, pod("on-n1", ns, node_name="n1")), 201)
    expect(await target.admin.post(path, pod("unbound", ns)), 201)
    on_n1 = expect(await target.admin.get(path, fieldSelector="spec.nodeName=n1"), 200)
    assert [i["metadata"]["name"] for i in on_n1["items"]] == ["on-n1"]
    unbound = expect(await target.admin.get(path, fieldSelector="spec.nodeName="), 200)
    assert [i["metadata"]["name"] for i in unbound["items"]] == ["unbound"]
    pending = expect(await target.admin.get(path, fieldSelector="status.phase=Pending,metadata.name!=on-n1"), 200)
    assert [i["metadata"]["name"] for i in pending["items"]] == ["unbound"]
    everywhere = expect(await target.admin.get("/api/v1/pods", fieldSelector=f"metadata.namespace={ns}"), 200)
    assert sorted(i["metadata"]["name"] for i in everywhere["items"]) == ["on-n1", "unbound"]


@pytest.mark.parametrize(
    ("path", "label"),
    [
        ("/api/v1/namespaces/default/pods", "spec.containers"),
        ("/api/v1/namespaces/default/configmaps", "data.k"),
        ("/api/v1/nodes", "status.capacity"),
    ],
)
async def test_unsupported_field_labels_are_refused(target: Target, path: str, label: str) -> None:
    status = expect(await target.admin.get(path, fieldSelector=f"{label}=x"), 400)
    assert status["message"] == f"field label not supported: {label}"


async def test_node_field_selector_on_unschedulable(target: Target) -> None:
    body = node(labels={"tandem.dev/contract": "fields"})
    body["spec"]["unschedulable"] = True
    expect(await target.admin.post("/api/v1/nodes", body), 201)
    target.created_cluster_object(f"/api/v1/nodes/{body['metadata']['name']}")
    found = expect(
        await target.admin.get(
            "/api/v1/nodes", fieldSelector="spec.unschedulable=true", labelSelector="tandem.dev/contract=fields"
        ),
        200,
    )
    assert [i["metadata"]["name"] for i in found["items"]] == [body["metadata"]["name"]]


async def test_field_selector_watch_adds_on_bind_and_deletes_when_it_stops_matching(target: Target) -> None:
    ns = await target.namespace()
    path = f"/api/v1/namespaces/{ns}/pods"
    watch = await target.admin.watch(path, fieldSelector="spec.nodeName=n1")
    try:
        expect(await target.admin.post(path, pod("p", ns)), 201)
        expect(await target.admin.post(path, pod("other", ns)), 201)
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": "p"},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"},
        }
        expect(await target.admin.post(f"{path}/p/binding", binding), 201)
        [added] = await watch.until(lambda e: True)
        assert added["type"] == "ADDED" and added["object"]["metadata"]["name"] == "p"
        assert added["object"]["spec"]["nodeName"] == "n1"
    finally:
        watch.close()
    ns_watch = await target.admin.watch(f"/api/v1/namespaces/{ns}/configmaps", labelSelector="tandem.dev/reservation")
    try:
        expect(
            await target.admin.post(
                f"/api/v1/namespaces/{ns}/configmaps", configmap("r", ns, labels={"tandem.dev/reservation": "true"})
            ),
            201,
        )
        assert (await ns_watch.until(lambda e: True))[0]["type"] == "ADDED"
        expect(
            await target.admin.patch(
                f"/api/v1/namespaces/{ns}/configmaps/r",
                {"metadata": {"labels": {"tandem.dev/reservation": None}}},
                MERGE_PATCH,
            ),
            200,
        )
        [gone] = await ns_watch.until(lambda e: True)
        assert gone["type"] == "DELETED" and gone["object"]["metadata"]["name"] == "r"
        assert "tandem.dev/reservation" not in gone["object"]["metadata"].get("labels", {})
    finally:
        ns_watch.close()


async def test_event_field_selectors(target: Target) -> None:
    ns = await target.namespace()
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "p.1"},
        "involvedObject": {"kind": "Pod", "namespace": ns, "name": "p", "apiVersion": "v1"},
        "reason": "FailedScheduling",
        "message": "0/3 nodes are available",
        "type": "Warning",
        "source": {"component": "tandem-scheduler"},
        "count": 1,
        "firstTimestamp": "2026-12-01T10:00:00Z",
        "lastTimestamp": "2026-12-01T10:00:00Z",
    }
    expect(await target.admin.post(f"/api/v1/namespaces/{ns}/events", event), 201)
    found = expect(
        await target.admin.get(
            f"/api/v1/namespaces/{ns}/events",
            fieldSelector="involvedObject.name=p,reason=FailedScheduling,type=Warning",
        ),
        200,
    )
    assert [i["metadata"]["name"] for i in found["items"]] == ["p.1"]
    none = expect(
        await target.admin.get(f"/api/v1/namespaces/{ns}/events", fieldSelector="involvedObject.kind=Job"), 200
    )
    assert none["items"] == []
