"""Item 2: AlreadyExists vs Conflict, preconditions, generateName, server-set fields, Status bodies, faults."""

from __future__ import annotations

import re

from tests.kubeapi_contract.builders import configmap, job, pod
from tests.kubeapi_contract.kubehttp import MERGE_PATCH, expect
from tests.kubeapi_contract.targets import Target

UID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def cm_path(ns: str, name: str = "") -> str:
    return f"/api/v1/namespaces/{ns}/configmaps" + (f"/{name}" if name else "")


async def test_create_of_an_existing_name_is_already_exists(target: Target) -> None:
    ns = await target.namespace()
    expect(await target.admin.post(cm_path(ns), configmap("dup", ns)), 201)
    status = expect(await target.admin.post(cm_path(ns), configmap("dup", ns)), 409)
    assert status == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'configmaps "dup" already exists',
        "reason": "AlreadyExists",
        "details": {"name": "dup", "kind": "configmaps"},
        "code": 409,
    }
    jobs = f"/apis/batch/v1/namespaces/{ns}/jobs"
    expect(await target.admin.post(jobs, job("j", ns, suspend=True)), 201)
    status = expect(await target.admin.post(jobs, job("j", ns, suspend=True)), 409)
    assert status["message"] == 'jobs.batch "j" already exists'
    assert status["details"] == {"name": "j", "group": "batch", "kind": "jobs"}


async def test_stale_resource_version_on_put_or_patch_is_conflict(target: Target) -> None:
    ns = await target.namespace()
    created = expect(await target.admin.post(cm_path(ns), configmap("c", ns)), 201)
    expect(await target.admin.put(cm_path(ns, "c"), {**created, "data": {"k": "1"}}), 200)
    status = expect(await target.admin.put(cm_path(ns, "c"), {**created, "data": {"k": "2"}}), 409)
    assert status["reason"] == "Conflict"
    assert status["message"] == (
        'Operation cannot be fulfilled on configmaps "c": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )
    assert status["details"] == {"name": "c", "kind": "configmaps"}
    stale = created["metadata"]["resourceVersion"]
    patched = await target.admin.patch(
        cm_path(ns, "c"), {"metadata": {"resourceVersion": stale}, "data": {"k": "3"}}, MERGE_PATCH
    )
    assert expect(patched, 409)["reason"] == "Conflict"
    unconditional = {
        **created,
        "metadata": {k: v for k, v in created["metadata"].items() if k != "resourceVersion"},
        "data": {"k": "4"},
    }
    assert expect(await target.admin.put(cm_path(ns, "c"), unconditional), 200)["data"] == {"k": "4"}


async def test_an_unchanged_update_does_not_take_a_new_resource_version(target: Target) -> None:
    ns = await target.namespace()
    created = expect(await target.admin.post(cm_path(ns), configmap("c", ns)), 201)
    again = expect(await target.admin.put(cm_path(ns, "c"), created), 200)
    assert again["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


async def test_delete_preconditions_on_uid_and_resource_version(target: Target) -> None:
    ns = await target.namespace()
    created = expect(await target.admin.post(cm_path(ns), configmap("c", ns)), 201)
    uid, rv = created["metadata"]["uid"], created["metadata"]["resourceVersion"]
    wrong_uid = {
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "preconditions": {"uid": "00000000-0000-0000-0000-000000000000"},
    }
    status = expect(await target.admin.delete(cm_path(ns, "c"), wrong_uid), 409)
    assert status["message"] == (
        'Operation cannot be fulfilled on configmaps "c": Precondition failed: UID in '
        f"precondition: 00000000-0000-0000-0000-000000000000, UID in object meta: {uid}"
    )
    expect(await target.admin.patch(cm_path(ns, "c"), {"data": {"k": "new"}}, MERGE_PATCH), 200)
    stale_rv = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"resourceVersion": rv}}
    status = expect(await target.admin.delete(cm_path(ns, "c"), stale_rv), 409)
    assert (
        status["reason"] == "Conflict" and "Precondition failed: ResourceVersion in precondition" in status["message"]
    )
    done = expect(await target.admin.delete(cm_path(ns, "c"), {"preconditions": {"uid": uid}}), 200)
    assert done["status"] == "Success" and done["details"] == {"name": "c", "kind": "configmaps", "uid": uid}
    expect(await target.admin.get(cm_path(ns, "c")), 404)


async def test_generate_name_appends_five_random_characters(target: Target) -> None:
    ns = await target.namespace()
    body = configmap("", ns)
    del body["metadata"]["name"]
    body["metadata"]["generateName"] = "reservation-"
    names = {expect(await target.admin.post(cm_path(ns), body), 201)["metadata"]["name"] for _ in range(20)}
    assert len(names) == 20
    assert all(re.fullmatch(r"reservation-[a-z0-9]{5}", n) for n in names)


async def test_generate_name_retries_on_a_collision(target: Target) -> None:
    server = target.fake("the name generator is forced to collide through the fake's random source")
    ns = await target.namespace()
    expect(await target.admin.post(cm_path(ns), configmap("gen-aaaaa", ns)), 201)
    suffixes = iter(["aaaaa", "bbbbb"])
    server.state.random_suffix = lambda n=5: next(suffixes)  # type: ignore[method-assign]
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "gen-", "namespace": ns}}
    assert expect(await target.admin.post(cm_path(ns), body), 201)["metadata"]["name"] == "gen-bbbbb"


async def test_server_sets_uid_timestamp_generation(target: Target) -> None:
    ns = await target.namespace()
    body = job("j", ns, suspend=True)
    body["metadata"].update({"uid": "client-chosen", "creationTimestamp": "2000-01-01T00:00:00Z", "generation": 9})
    created = expect(await target.admin.post(f"/apis/batch/v1/namespaces/{ns}/jobs", body), 201)
    meta = created["metadata"]
    assert UID.match(meta["uid"]) and TIMESTAMP.match(meta["creationTimestamp"])
    assert meta["creationTimestamp"] != "2000-01-01T00:00:00Z" and meta["generation"] == 1
    path = f"/apis/batch/v1/namespaces/{ns}/jobs/j"
    labelled = expect(await target.admin.patch(path, {"metadata": {"labels": {"a": "b"}}}, MERGE_PATCH), 200)
    assert labelled["metadata"]["generation"] == 1
    resumed = expect(await target.admin.patch(path, {"spec": {"suspend": False}}, MERGE_PATCH), 200)
    assert resumed["metadata"]["generation"] == 2


async def test_invalid_name_is_422_with_causes_naming_the_field(target: Target) -> None:
    ns = await target.namespace()
    status = expect(await target.admin.post(cm_path(ns), configmap("Bad_Name", ns)), 422)
    detail = (
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
        "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
        "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
    )
    assert status == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f'ConfigMap "Bad_Name" is invalid: metadata.name: Invalid value: "Bad_Name": {detail}',
        "reason": "Invalid",
        "details": {
            "name": "Bad_Name",
            "kind": "ConfigMap",
            "causes": [
                {
                    "reason": "FieldValueInvalid",
                    "message": f'Invalid value: "Bad_Name": {detail}',
                    "field": "metadata.name",
                }
            ],
        },
        "code": 422,
    }


async def test_not_found_and_missing_namespace(target: Target) -> None:
    ns = await target.namespace()
    status = expect(await target.admin.get(cm_path(ns, "nope")), 404)
    assert status == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'configmaps "nope" not found',
        "reason": "NotFound",
        "details": {"name": "nope", "kind": "configmaps"},
        "code": 404,
    }
    status = expect(await target.admin.post(cm_path("no-such-ns"), configmap("c", "no-such-ns")), 404)
    assert status["message"] == 'namespaces "no-such-ns" not found'
    assert status["details"] == {"name": "no-such-ns", "kind": "namespaces"}
    assert expect(await target.admin.get("/apis/example.com/v1/widgets"), 404)["reason"] == "NotFound"


async def test_injected_429_with_retry_after_then_recovery(target: Target) -> None:
    server = target.fake("faults are injected into the fake")
    ns = await target.namespace()
    server.inject_fault("list", "pods", status=429, retry_after_s=2)
    reply = await target.admin.get(f"/api/v1/namespaces/{ns}/pods")
    status = expect(reply, 429)
    assert reply.headers["Retry-After"] == "2"
    assert status == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "Too many requests, please try again later.",
        "reason": "TooManyRequests",
        "details": {"retryAfterSeconds": 2},
        "code": 429,
    }
    expect(await target.admin.get(f"/api/v1/namespaces/{ns}/pods"), 200)


async def test_injected_500_counts_and_namespace_filter(target: Target) -> None:
    server = target.fake("faults are injected into the fake")
    ns, other = await target.namespace(), await target.namespace()
    server.inject_fault("create", "pods", status=500, count=2, namespace=ns)
    expect(await target.admin.post(f"/api/v1/namespaces/{other}/pods", pod("p", other)), 201)
    for _ in range(2):
        status = expect(await target.admin.post(f"/api/v1/namespaces/{ns}/pods", pod("p", ns)), 500)
        assert status["reason"] == "InternalError" and status["code"] == 500
    expect(await target.admin.get(f"/api/v1/namespaces/{ns}/pods/p"), 404)  # nothing was written
    expect(await target.admin.post(f"/api/v1/namespaces/{ns}/pods", pod("p", ns)), 201)


async def test_a_partitioned_client_hangs_and_its_lost_writes_never_apply(target: Target) -> None:

    server = target.fake("partitions are simulated by the fake")
    ns = await target.namespace()
    agent = target.client(server.service_account_token(ns, "agent"))
    rb = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "agent"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": "agent", "namespace": ns}],
    }
    expect(await target.admin.post(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings", rb), 201)
    listed = expect(await agent.get(cm_path(ns)), 200)
    watch = await agent.watch(
        cm_path(ns), resourceVersion=listed["metadata"]["resourceVersion"], labelSelector="tandem.dev/contract"
    )
    try:
        server.drop_requests_from(agent.token or "")
        try:
            await agent.request("POST", cm_path(ns), configmap("lost", ns), timeout=0.5)
            raise AssertionError("a partitioned client got an answer")
        except TimeoutError:
            pass
        expect(await target.admin.post(cm_path(ns), configmap("seen-later", ns)), 201)
        assert await watch.quiet(0.5) == []  # nothing reaches the partitioned watch
        server.drop_requests_from(agent.token or "", dropped=False)
        [event] = await watch.until(lambda e: True)
        assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "seen-later")
        expect(await agent.get(cm_path(ns, "lost")), 404)  # the request sent during the partition never applied
    finally:
        watch.close()
