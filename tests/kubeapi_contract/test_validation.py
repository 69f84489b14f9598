"""Item 4, part 1: names, labels, Job defaults and rules, MicroTime, fieldValidation, dryRun."""

from __future__ import annotations

from typing import Any

import pytest

from tests.kubeapi_contract.builders import configmap, job, lease, pod, resource_slice, unique
from tests.kubeapi_contract.kubehttp import MERGE_PATCH, expect
from tests.kubeapi_contract.targets import Target


def causes(status: dict[str, Any]) -> list[tuple[str, str]]:
    return [(c["field"], c["reason"]) for c in status["details"]["causes"]]


async def test_service_names_are_dns1035_labels(target: Target) -> None:
    ns = await target.namespace()
    svc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "1-gang"},
        "spec": {"clusterIP": "None", "selector": {"tandem.dev/job": "x"}},
    }
    status = expect(await target.admin.post(f"/api/v1/namespaces/{ns}/services", svc), 422)
    assert causes(status) == [("metadata.name", "FieldValueInvalid")]
    assert (
        "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic "
        "character, and end with an alphanumeric character" in status["message"]
    )
    svc["metadata"]["name"] = "j" * 64
    assert (
        causes(expect(await target.admin.post(f"/api/v1/namespaces/{ns}/services", svc), 422))[0][0] == "metadata.name"
    )
    svc["metadata"]["name"] = "gang-1"
    created = expect(await target.admin.post(f"/api/v1/namespaces/{ns}/services", svc), 201)
    assert created["spec"]["clusterIP"] == "None" and created["spec"]["type"] == "ClusterIP"


async def test_pod_hostname_and_subdomain_are_dns1123_labels(target: Target) -> None:
    ns = await target.namespace()
    body = pod("p", ns)
    body["spec"]["hostname"] = "h" * 64
    body["spec"]["subdomain"] = "Bad.Sub"
    status = expect(await target.admin.post(f"/api/v1/namespaces/{ns}/pods", body), 422)
    fields = [f for f, _ in causes(status)]
    assert "spec.hostname" in fields and "spec.subdomain" in fields
    assert 'spec.hostname: Invalid value: "' + "h" * 64 + '": must be no more than 63 characters' in status["message"]


@pytest.mark.parametrize("labels", [{"bad key!": "v"}, {"ok": "bad value!"}, {"a/b/c": "v"}, {"ok": "v" * 64}])
async def test_label_keys_and_values_are_checked(target: Target, labels: dict[str, str]) -> None:
    ns = await target.namespace()
    status = expect(
        await target.admin.post(f"/api/v1/namespaces/{ns}/configmaps", configmap("c", ns, labels=labels)), 422
    )
    assert causes(status) and all(f == "metadata.labels" for f, _ in causes(status))


async def test_job_defaults_and_generated_selector(target: Target) -> None:
    ns = await target.namespace()
    body = job("bare", ns, indexed=False, suspend=True)
    created = expect(await target.admin.post(f"/apis/batch/v1/namespaces/{ns}/jobs", body), 201)
    spec, uid = created["spec"], created["metadata"]["uid"]
    assert (spec["parallelism"], spec["completions"], spec["backoffLimit"], spec["completionMode"]) == (
        1,
        1,
        6,
        "NonIndexed",
    )
    assert spec["suspend"] is True and spec["podReplacementPolicy"] == "TerminatingOrFailed"
    assert spec["selector"] == {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    labels = spec["template"]["metadata"]["labels"]
    assert {k: labels[k] for k in ("batch.kubernetes.io/controller-uid", "controller-uid")} == {
        "batch.kubernetes.io/controller-uid": uid,
        "controller-uid": uid,
    }
    assert labels["batch.kubernetes.io/job-name"] == "bare" and labels["job-name"] == "bare"
    assert spec["template"]["spec"]["terminationGracePeriodSeconds"] == 30
    assert spec["template"]["spec"]["dnsPolicy"] == "ClusterFirst"


async def test_job_restart_policy_must_be_never_or_on_failure(target: Target) -> None:
    ns = await target.namespace()
    status = expect(
        await target.admin.post(f"/apis/batch/v1/namespaces/{ns}/jobs", job("j", ns, restart="Always")), 422
    )
    assert status["message"] == (
        'Job.batch "j" is invalid: spec.template.spec.restartPolicy: Unsupported value: '
        '"Always": supported values: "OnFailure", "Never"'
    )
    assert status["details"]["kind"] == "Job" and status["details"]["group"] == "batch"


async def test_indexed_job_needs_completions(target: Target) -> None:
    ns = await target.namespace()
    body = job("j", ns)
    del body["spec"]["completions"]
    status = expect(await target.admin.post(f"/apis/batch/v1/namespaces/{ns}/jobs", body), 422)
    assert ("spec.completions", "FieldValueRequired") in causes(status)
    assert "spec.completions: Required value: when completion mode is Indexed" in status["message"]


async def test_a_client_selector_without_manual_selector_is_refused(target: Target) -> None:
    ns = await target.namespace()
    body = job("j", ns)
    body["spec"]["selector"] = {"matchLabels": {"tandem.dev/job": "j"}}
    status = expect(await target.admin.post(f"/apis/batch/v1/namespaces/{ns}/jobs", body), 422)
    assert ("spec.selector", "FieldValueInvalid") in causes(status)
    assert "`selector` not auto-generated" in status["message"]


async def test_job_template_is_immutable(target: Target) -> None:
    ns = await target.namespace()
    expect(await target.admin.post(f"/apis/batch/v1/namespaces/{ns}/jobs", job("j", ns)), 201)
    patch = {"spec": {"template": {"spec": {"containers": [{"name": "trainer", "image": "other:1"}]}}}}
    status = expect(
        await target.admin.patch(
            f"/apis/batch/v1/namespaces/{ns}/jobs/j", patch, "application/strategic-merge-patch+json"
        ),
        422,
    )
    assert ("spec.template", "FieldValueInvalid") in causes(status)
    assert "field is immutable" in status["message"]


async def test_lease_micro_time_needs_six_fractional_digits(target: Target) -> None:
    ns = await target.namespace()
    path = f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
    status = expect(await target.admin.post(path, lease("l", ns, holder="a", renew_time="2026-12-01T10:00:00Z")), 400)
    assert status["reason"] == "BadRequest"
    assert status["message"] == (
        'Lease in version "v1" cannot be handled as a Lease: parsing time '
        '"2026-12-01T10:00:00Z" as "2006-01-02T15:04:05.000000Z07:00": cannot parse "Z" as ".000000"'
    )
    short = expect(
        await target.admin.post(path, lease("l", ns, holder="a", renew_time="2026-12-01T10:00:00.123Z")), 400
    )
    assert 'cannot parse ".123Z" as ".000000"' in short["message"]
    ok = expect(
        await target.admin.post(path, lease("l", ns, holder="a", renew_time="2026-12-01T10:00:00.000000Z")), 201
    )
    assert ok["spec"]["renewTime"] == "2026-12-01T10:00:00.000000Z"
    assert ok["spec"]["acquireTime"] == "2026-12-01T10:00:00.000000Z"


async def test_strict_field_validation_refuses_unknown_fields_and_default_drops_with_a_warning(target: Target) -> None:
    ns = await target.namespace()
    body = pod("strict", ns)
    body["spec"]["foo"] = 1
    path = f"/api/v1/namespaces/{ns}/pods"
    status = expect(await target.admin.post(path, body, fieldValidation="Strict"), 400)
    assert status["message"] == (
        'Pod in version "v1" cannot be handled as a Pod: strict decoding error: unknown field "spec.foo"'
    )
    reply = await target.admin.post(path, body)
    created = expect(reply, 201)
    assert "foo" not in created["spec"]
    assert 'unknown field "spec.foo"' in reply.warnings


async def test_wrong_json_type_is_bad_request(target: Target) -> None:
    ns = await target.namespace()
    body = pod("p", ns)
    body["spec"]["activeDeadlineSeconds"] = "soon"
    status = expect(await target.admin.post(f"/api/v1/namespaces/{ns}/pods", body), 400)
    assert status["message"].startswith(
        'Pod in version "v1" cannot be handled as a Pod: json: cannot unmarshal string '
        "into Go struct field PodSpec.spec.activeDeadlineSeconds of type int64"
    )


async def test_quantities_are_stored_in_canonical_form(target: Target) -> None:
    ns = await target.namespace()
    body = pod("q", ns)
    body["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "0.5", "memory": "2048Mi", "nvidia.com/gpu": 1}}
    created = expect(await target.admin.post(f"/api/v1/namespaces/{ns}/pods", body), 201)
    assert created["spec"]["containers"][0]["resources"]["limits"] == {
        "cpu": "500m",
        "memory": "2Gi",
        "nvidia.com/gpu": "1",
    }
    assert created["spec"]["containers"][0]["resources"]["requests"] == {
        "cpu": "500m",
        "memory": "2Gi",
        "nvidia.com/gpu": "1",
    }


async def test_dry_run_validates_defaults_admits_and_persists_nothing(target: Target) -> None:
    ns = await target.namespace()
    path = f"/api/v1/namespaces/{ns}/pods"
    dry = expect(await target.admin.post(path, pod("dry", ns, gates=("tandem.dev/gang",)), dryRun="All"), 201)
    assert dry["spec"]["priority"] == 0 and dry["spec"]["serviceAccountName"] == "default"
    assert dry["status"]["phase"] == "Pending"
    expect(await target.admin.get(f"{path}/dry"), 404)
    bad = pod("dry", ns)
    bad["spec"]["restartPolicy"] = "Sometimes"
    assert expect(await target.admin.post(path, bad, dryRun="All"), 422)["reason"] == "Invalid"
    expect(await target.admin.post(path, pod("real", ns)), 201)
    expect(
        await target.admin.patch(f"{path}/real", {"metadata": {"labels": {"x": "y"}}}, MERGE_PATCH, dryRun="All"), 200
    )
    assert "x" not in expect(await target.admin.get(f"{path}/real"), 200)["metadata"]["labels"]
    expect(await target.admin.delete(f"{path}/real", dryRun="All"), 200)
    expect(await target.admin.get(f"{path}/real"), 200)


async def test_resource_slices_from_the_fixture_and_their_checks(target: Target) -> None:
    unique_node = unique("dra-node")
    body = resource_slice(unique_node)
    path = "/apis/resource.k8s.io/v1/resourceslices"
    created = expect(await target.admin.post(path, body), 201)
    target.created_cluster_object(f"{path}/{created['metadata']['name']}")
    assert created["spec"]["devices"][0]["capacity"]["memory"]["value"] == "141Gi"
    found = expect(await target.admin.get(path, fieldSelector=f"spec.nodeName={unique_node}"), 200)
    assert [i["metadata"]["name"] for i in found["items"]] == [created["metadata"]["name"]]
    broken = resource_slice(unique_node)
    del broken["spec"]["pool"]
    status = expect(await target.admin.post(path, broken), 422)
    assert "spec.pool.name" in [c["field"] for c in status["details"]["causes"]]


async def test_kubernetes_aio_creates_a_job_and_reads_the_defaults(target: Target) -> None:
    from kubernetes.aio import client as kclient

    ns = await target.namespace()
    async with kclient.ApiClient(target.aio_configuration()) as api:
        batch = kclient.BatchV1Api(api)
        model = kclient.V1Job.from_dict(job("attempt-1-workers", ns, count=4, suspend=True))
        assert model is not None
        created = await batch.create_namespaced_job(ns, model)
        assert created.spec is not None and created.metadata is not None
        assert (created.spec.completion_mode, created.spec.completions, created.spec.parallelism) == ("Indexed", 4, 4)
        assert created.spec.selector is not None and created.spec.selector.match_labels == {
            "batch.kubernetes.io/controller-uid": created.metadata.uid
        }
