"""Item 8: bearer tokens, RBAC from manifests/ and from the API, the real 403 texts, verbs as Kubernetes computes them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.kubeapi_contract.builders import configmap, pod, unique
from tests.kubeapi_contract.kubehttp import KubeHTTP, eventually, expect
from tests.kubeapi_contract.targets import MANIFESTS, Target

SCHEDULER = "system:serviceaccount:tandem-system:tandem-scheduler"
RBAC = "rbac.authorization.k8s.io"


async def _manifest_rbac(target: Target) -> KubeHTTP:
    """The tandem-scheduler identity with the RBAC of manifests/ (loaded at start by the fake; applied on a real cluster)."""
    if not target.is_fake:
        await target.admin.post(
            "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "tandem-system"}}
        )
        for path in sorted(Path(MANIFESTS).rglob("rbac.yaml")):
            for doc in yaml.safe_load_all(path.read_text()):
                group, kind = doc["apiVersion"].split("/")[0], doc["kind"]
                plural = kind.lower() + "s"
                ns = doc["metadata"].get("namespace")
                base = f"/apis/{group}/v1" + (f"/namespaces/{ns}" if ns else "")
                await target.admin.post(f"{base}/{plural}", doc)
    return await target.service_account_client("tandem-system", "tandem-scheduler")


def forbidden(resource_text: str, name: str, user: str, verb: str, resource: str, group: str, scope: str) -> str:
    subject = f'{resource_text} "{name}"' if name else resource_text
    return f'{subject} is forbidden: User "{user}" cannot {verb} resource "{resource}" in API group "{group}" {scope}'


async def test_missing_or_unknown_tokens_are_unauthorized(target: Target) -> None:
    unauthorized = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "Unauthorized",
        "reason": "Unauthorized",
        "code": 401,
    }
    status = expect(await target.client("not-a-token").get("/api/v1/namespaces/default/pods"), 401)
    assert status == unauthorized
    anonymous = await target.client(None).get("/api/v1/namespaces/default/pods")
    if target.is_fake or anonymous.status == 401:
        assert expect(anonymous, 401) == unauthorized
    else:  # a real cluster with anonymous authentication maps a missing token to system:anonymous
        assert 'User "system:anonymous"' in expect(anonymous, 403)["message"]


async def test_manifest_roles_are_enforced_with_the_real_message(target: Target) -> None:
    scheduler = await _manifest_rbac(target)
    ns = await target.namespace("team")
    expect(await target.admin.post(f"/api/v1/namespaces/{ns}/pods", pod("p", ns)), 201)
    expect(await scheduler.get("/api/v1/pods"), 200)  # tandem-extender-read: cluster-wide list
    status = expect(
        await scheduler.patch(
            f"/api/v1/namespaces/{ns}/pods/p", {"metadata": {"labels": {"a": "b"}}}, "application/merge-patch+json"
        ),
        403,
    )
    assert status == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": forbidden("pods", "p", SCHEDULER, "patch", "pods", "", f'in the namespace "{ns}"'),
        "reason": "Forbidden",
        "details": {"name": "p", "kind": "pods"},
        "code": 403,
    }
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "p"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"},
    }
    expect(await scheduler.post(f"/api/v1/namespaces/{ns}/pods/p/binding", binding), 201)  # system:kube-scheduler
    status = expect(await scheduler.get(f"/api/v1/namespaces/{ns}/configmaps"), 403)
    assert status["message"] == forbidden(
        "configmaps", "", SCHEDULER, "list", "configmaps", "", f'in the namespace "{ns}"'
    )
    expect(await scheduler.get("/api/v1/namespaces/tandem-system/configmaps"), 200)
    status = expect(
        await scheduler.post("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "x"}}), 403
    )
    assert status["message"] == forbidden("nodes", "", SCHEDULER, "create", "nodes", "", "at the cluster scope")


async def test_resource_names_limit_get_and_update_but_not_create_or_list(target: Target) -> None:
    scheduler = await _manifest_rbac(target)
    leases = "/apis/coordination.k8s.io/v1/namespaces/tandem-system/leases"
    body = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "tandem-scheduler"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15},
    }
    created = await scheduler.post(leases, body)
    assert created.status in (201, 409)
    expect(await scheduler.get(f"{leases}/tandem-scheduler"), 200)
    status = expect(await scheduler.get(f"{leases}/someone-else"), 403)
    assert status["message"] == forbidden(
        "leases.coordination.k8s.io",
        "someone-else",
        SCHEDULER,
        "get",
        "leases",
        "coordination.k8s.io",
        'in the namespace "tandem-system"',
    )
    assert status["details"] == {"name": "someone-else", "group": "coordination.k8s.io", "kind": "leases"}
    expect(await scheduler.get(leases), 403)
    other = {**body, "metadata": {"name": unique("lease")}}
    assert (await scheduler.post(leases, other)).status == 201  # create cannot be limited by name


async def test_rbac_objects_created_through_the_api_take_effect(target: Target) -> None:
    ns = await target.namespace()
    worker = await target.service_account_client(ns, "worker")
    user = f"system:serviceaccount:{ns}:worker"
    expect(await target.admin.post(f"/api/v1/namespaces/{ns}/configmaps", configmap("c", ns)), 201)
    status = expect(await worker.get(f"/api/v1/namespaces/{ns}/configmaps/c"), 403)
    assert status["message"] == forbidden("configmaps", "c", user, "get", "configmaps", "", f'in the namespace "{ns}"')
    role = {
        "apiVersion": f"{RBAC}/v1",
        "kind": "Role",
        "metadata": {"name": "read-cm"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}],
    }
    expect(await target.admin.post(f"/apis/{RBAC}/v1/namespaces/{ns}/roles", role), 201)
    rb = {
        "apiVersion": f"{RBAC}/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "read-cm"},
        "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": "read-cm"},
        "subjects": [{"kind": "ServiceAccount", "name": "worker", "namespace": ns}],
    }
    expect(await target.admin.post(f"/apis/{RBAC}/v1/namespaces/{ns}/rolebindings", rb), 201)

    async def can_read() -> bool:  # a real authorizer sees new bindings through its informers, a moment later
        return (await worker.get(f"/api/v1/namespaces/{ns}/configmaps/c")).status == 200

    await eventually(can_read)
    expect(await worker.get(f"/api/v1/namespaces/{ns}/configmaps"), 200)
    status = expect(await worker.get(f"/api/v1/namespaces/{ns}/configmaps", watch="true"), 403)
    assert status["message"] == forbidden("configmaps", "", user, "watch", "configmaps", "", f'in the namespace "{ns}"')
    dry = expect(await worker.post(f"/api/v1/namespaces/{ns}/configmaps", configmap("d", ns), dryRun="All"), 403)
    assert dry["message"] == forbidden("configmaps", "", user, "create", "configmaps", "", f'in the namespace "{ns}"')
    status = expect(await worker.delete(f"/api/v1/namespaces/{ns}/configmaps"), 403)
    assert "cannot deletecollection resource" in status["message"]


async def test_a_binding_to_a_missing_cluster_role_grants_nothing(target: Target) -> None:
    ns = await target.namespace()
    worker = await target.service_account_client(ns, "worker")
    missing = unique("missing-role")
    rb = {
        "apiVersion": f"{RBAC}/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "dangling"},
        "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": missing},
        "subjects": [{"kind": "ServiceAccount", "name": "worker", "namespace": ns}],
    }
    expect(await target.admin.post(f"/apis/{RBAC}/v1/namespaces/{ns}/rolebindings", rb), 201)
    status = expect(await worker.get(f"/api/v1/namespaces/{ns}/pods"), 403)
    base = forbidden("pods", "", f"system:serviceaccount:{ns}:worker", "list", "pods", "", f'in the namespace "{ns}"')
    assert status["message"] == f'{base}: RBAC: clusterrole.{RBAC} "{missing}" not found'


async def test_subresources_are_authorized_separately(target: Target) -> None:
    ns = await target.namespace()
    worker = await target.service_account_client(ns, "worker")
    role = {
        "apiVersion": f"{RBAC}/v1",
        "kind": "Role",
        "metadata": {"name": "pods"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "create", "patch"]}],
    }
    expect(await target.admin.post(f"/apis/{RBAC}/v1/namespaces/{ns}/roles", role), 201)
    rb = {
        "apiVersion": f"{RBAC}/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "pods"},
        "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": "pods"},
        "subjects": [{"kind": "ServiceAccount", "name": "worker", "namespace": ns}],
    }
    expect(await target.admin.post(f"/apis/{RBAC}/v1/namespaces/{ns}/rolebindings", rb), 201)

    async def bound() -> bool:  # 404 rather than 403: the binding is in effect
        return (await worker.get(f"/api/v1/namespaces/{ns}/pods/p")).status == 404

    await eventually(bound)
    expect(await worker.post(f"/api/v1/namespaces/{ns}/pods", pod("p", ns)), 201)
    status = expect(
        await worker.patch(
            f"/api/v1/namespaces/{ns}/pods/p/status", {"status": {"message": "x"}}, "application/merge-patch+json"
        ),
        403,
    )
    user = f"system:serviceaccount:{ns}:worker"
    assert status["message"] == forbidden("pods", "p", user, "patch", "pods/status", "", f'in the namespace "{ns}"')
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "p"},
        "target": {"kind": "Node", "name": "n"},
    }
    status = expect(await worker.post(f"/api/v1/namespaces/{ns}/pods/p/binding", binding), 403)
    assert status["message"] == forbidden("pods", "p", user, "create", "pods/binding", "", f'in the namespace "{ns}"')


@pytest.mark.parametrize(
    ("verb", "resource", "subresource", "allowed"),
    [
        ("create", "pods", "binding", True),
        ("patch", "pods", "", False),
        ("list", "pods", "", True),
        ("update", "leases", "", True),
        ("delete", "nodes", "", False),
    ],
)
async def test_self_subject_access_review_answers_from_rbac(
    target: Target, verb: str, resource: str, subresource: str, allowed: bool
) -> None:
    scheduler = await _manifest_rbac(target)
    group = "coordination.k8s.io" if resource == "leases" else ""
    attrs = {"namespace": "tandem-system", "verb": verb, "group": group, "resource": resource}
    if subresource:
        attrs["subresource"] = subresource
    if resource == "leases":
        attrs["name"] = "tandem-scheduler"
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attrs},
    }
    answer = expect(await scheduler.post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review), 201)
    assert answer["status"]["allowed"] is allowed
    if allowed:
        assert answer["status"]["reason"].startswith("RBAC: allowed by ")


async def test_kubernetes_aio_with_a_written_kubeconfig_gets_403(target: Target, tmp_path: Path) -> None:
    from kubernetes.aio import client as kclient
    from kubernetes.aio import config as kconfig
    from kubernetes.aio.client.exceptions import ApiException

    from sim.kubeapi import write_kubeconfig

    server = target.fake("write_kubeconfig holds a token for a fake server (a real one needs its CA too)")
    ns = await target.namespace()
    path = tmp_path / "kubeconfig"
    write_kubeconfig(path, server.url, server.service_account_token(ns, "worker"), namespace=ns)
    cfg = kclient.Configuration()
    await kconfig.load_kube_config(config_file=str(path), client_configuration=cfg)  # type: ignore[no-untyped-call]
    async with kclient.ApiClient(cfg) as api:
        with pytest.raises(ApiException) as raised:
            await kclient.CoreV1Api(api).list_namespaced_pod(ns)
        assert raised.value.status == 403
    admin_path = tmp_path / "admin"
    write_kubeconfig(admin_path, server.url, server.admin_token)
    cfg = kclient.Configuration()
    await kconfig.load_kube_config(config_file=str(admin_path), client_configuration=cfg)  # type: ignore[no-untyped-call]
    async with kclient.ApiClient(cfg) as api:
        pods = await kclient.CoreV1Api(api).list_namespaced_pod(ns)
        assert pods.items == []


async def test_token_requests_need_an_existing_service_account(target: Target) -> None:
    ns = await target.namespace()
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}}
    status = expect(await target.admin.post(f"/api/v1/namespaces/{ns}/serviceaccounts/ghost/token", request), 404)
    assert status["message"] == 'serviceaccounts "ghost" not found'
    expect(
        await target.admin.post(
            f"/api/v1/namespaces/{ns}/serviceaccounts",
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "real"}},
        ),
        201,
    )
    answer = expect(await target.admin.post(f"/api/v1/namespaces/{ns}/serviceaccounts/real/token", request), 201)
    assert answer["kind"] == "TokenRequest" and answer["status"]["token"] and answer["status"]["expirationTimestamp"]
    client = target.client(answer["status"]["token"])
    status = expect(await client.get(f"/api/v1/namespaces/{ns}/secrets"), 403)
    assert f'User "system:serviceaccount:{ns}:real"' in status["message"]
