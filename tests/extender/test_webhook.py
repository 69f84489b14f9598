"""The mutating webhook served by a real aiohttp app on loopback, with API-server-format AdmissionReviews."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from extender import webhook
from extender.config import ExtenderConfig
from tests.extender.kube_fakes import fixture_items

PENDING = {p["metadata"]["name"]: p for p in fixture_items("pending-pods.json")}
CONFIG = ExtenderConfig(webhook_namespaces=["team-a", "inference"])


def as_created(pod: dict[str, Any], scheduler: str | None = "default-scheduler") -> dict[str, Any]:
    """The pod as the API server hands it to admission at CREATE: defaulted, no uid/status/namespace yet."""
    out = copy.deepcopy(pod)
    meta = out["metadata"]
    for key in ("uid", "resourceVersion", "creationTimestamp", "namespace"):
        meta.pop(key, None)
    out.pop("status", None)
    out["spec"].pop("nodeName", None)
    if scheduler is None:
        out["spec"].pop("schedulerName", None)
    else:
        out["spec"]["schedulerName"] = scheduler
    return out


def admission_review(
    pod: dict[str, Any], namespace: str, operation: str = "CREATE", uid: str = "0f2b8a4e-3c1d-4e5f-9a6b-7c8d9e0f1a2b"
) -> dict[str, Any]:
    gvk = {"group": "", "version": "v1", "kind": "Pod"}
    gvr = {"group": "", "version": "v1", "resource": "pods"}
    return {
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": uid,
            "kind": gvk,
            "resource": gvr,
            "requestKind": gvk,
            "requestResource": gvr,
            "name": pod["metadata"].get("name", ""),
            "namespace": namespace,
            "operation": operation,
            "userInfo": {
                "username": "system:serviceaccount:kube-system:job-controller",
                "uid": "4c2b1a0e-1111-2222-3333-444455556666",
                "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"],
            },
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        },
    }


def apply_json_patch(doc: dict[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 add/replace on object members (all the webhook emits)."""
    out = copy.deepcopy(doc)
    for op in patch:
        assert op["op"] in ("add", "replace"), op
        *parents, leaf = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target = out
        for p in parents:
            target = target[p]
        if op["op"] == "replace":
            assert leaf in target
        target[leaf] = op["value"]
    return out


@pytest.fixture
async def url() -> AsyncIterator[str]:
    app = web.Application()
    webhook.add_routes(app, CONFIG, webhook.WebhookSettings())
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    yield f"http://{host}:{port}/mutate"
    await runner.cleanup()


async def post(url: str, body: Any, raw: bytes | None = None) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as s:
        data = raw if raw is not None else json.dumps(body).encode()
        async with s.post(url, data=data, headers={"Content-Type": "application/json"}) as r:
            return r.status, await r.json()


def decoded_patch(answer: dict[str, Any]) -> list[dict[str, Any]]:
    resp = answer["response"]
    assert resp["patchType"] == "JSONPatch"
    patch: list[dict[str, Any]] = json.loads(base64.b64decode(resp["patch"]))
    return patch


@pytest.mark.parametrize(
    ("name", "namespace"),
    [("want-4-h100", "team-a"), ("want-8", "team-a"), ("want-mig-3g", "inference"), ("want-dra-4", "team-a")],
)
async def test_gpu_pods_in_enabled_namespaces_are_routed(url: str, name: str, namespace: str) -> None:
    pod = as_created(PENDING[name])
    status, answer = await post(url, admission_review(pod, namespace))
    assert status == 200
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == "0f2b8a4e-3c1d-4e5f-9a6b-7c8d9e0f1a2b"
    assert answer["response"]["allowed"] is True
    patched = apply_json_patch(pod, decoded_patch(answer))
    assert patched["spec"]["schedulerName"] == "tandem-scheduler"
    patched["spec"]["schedulerName"] = pod["spec"]["schedulerName"]
    assert patched == pod  # nothing else touched


async def test_pod_without_scheduler_name_field_gets_it_added(url: str) -> None:
    pod = as_created(PENDING["want-8"], scheduler=None)
    _, answer = await post(url, admission_review(pod, "team-a"))
    assert apply_json_patch(pod, decoded_patch(answer))["spec"]["schedulerName"] == "tandem-scheduler"


async def test_gpu_only_in_init_container_limits_is_routed(url: str) -> None:
    pod = as_created(PENDING["no-gpu"])
    pod["spec"]["initContainers"] = [
        {
            "name": "warmup",
            "image": "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04",
            "resources": {"limits": {"nvidia.com/gpu": "1"}},
        }
    ]
    _, answer = await post(url, admission_review(pod, "team-a"))
    assert decoded_patch(answer) == [{"op": "add", "path": "/spec/schedulerName", "value": "tandem-scheduler"}]


@pytest.mark.parametrize(
    ("case", "namespace", "mutate"),
    [
        ("cpu pod", "team-a", lambda p: p),
        ("other namespace", "default", lambda p: p),
        (
            "zero GPUs",
            "team-a",
            lambda p: p["spec"]["containers"][0]["resources"].update(
                {"limits": {"nvidia.com/gpu": "0"}, "requests": {"nvidia.com/gpu": "0"}}
            ),
        ),
        ("already routed", "team-a", lambda p: p["spec"].update(schedulerName="tandem-scheduler")),
        ("bound by hand", "team-a", lambda p: p["spec"].update(nodeName="h100-r1-n2")),
    ],
)
async def test_pods_left_alone(url: str, case: str, namespace: str, mutate: Any) -> None:
    base = "no-gpu" if case == "cpu pod" else "want-4-h100"
    pod = as_created(PENDING[base])
    mutate(pod)
    status, answer = await post(url, admission_review(pod, namespace))
    assert status == 200
    assert answer["response"] == {"uid": "0f2b8a4e-3c1d-4e5f-9a6b-7c8d9e0f1a2b", "allowed": True}, case


async def test_routed_pod_reviewed_again_is_unchanged(url: str) -> None:
    pod = as_created(PENDING["want-4-h100"])
    _, first = await post(url, admission_review(pod, "team-a"))
    routed = apply_json_patch(pod, decoded_patch(first))
    _, second = await post(url, admission_review(routed, "team-a"))
    assert "patch" not in second["response"]


async def test_pod_that_chose_another_scheduler_is_not_taken(url: str) -> None:
    pod = as_created(PENDING["want-8"], scheduler="volcano")
    _, answer = await post(url, admission_review(pod, "team-a"))
    resp = answer["response"]
    assert resp["allowed"] is True and "patch" not in resp
    assert "volcano" in resp["warnings"][0]


async def test_update_is_not_mutated(url: str) -> None:
    pod = as_created(PENDING["want-8"])
    _, answer = await post(url, admission_review(pod, "team-a", operation="UPDATE"))
    assert answer["response"] == {"uid": "0f2b8a4e-3c1d-4e5f-9a6b-7c8d9e0f1a2b", "allowed": True}


async def test_empty_namespace_list_routes_everywhere(url: str) -> None:
    cfg = ExtenderConfig()
    answer = webhook.review(admission_review(as_created(PENDING["want-8"]), "anything"), cfg)
    assert decoded_patch(answer)[0]["value"] == "tandem-scheduler"


@pytest.mark.parametrize(
    ("case", "raw", "uid", "warning"),
    [
        ("not json", b"{not json", "", "not an AdmissionReview object"),
        ("json list", b"[1, 2]", "", "not an AdmissionReview object"),
        (
            "no request",
            json.dumps({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"}).encode(),
            "",
            "not an AdmissionReview request",
        ),
        (
            "no uid",
            json.dumps(
                {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {"operation": "CREATE"}}
            ).encode(),
            "",
            "without request.uid",
        ),
        (
            "object not a pod",
            json.dumps(
                {
                    "kind": "AdmissionReview",
                    "apiVersion": "admission.k8s.io/v1",
                    "request": {
                        "uid": "u-1",
                        "operation": "CREATE",
                        "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "namespace": "team-a",
                        "object": "pod",
                    },
                }
            ).encode(),
            "u-1",
            "not a Pod",
        ),
        ("empty body", b"", "", "not an AdmissionReview object"),
    ],
)
async def test_malformed_reviews_are_allowed_with_a_warning(
    url: str, case: str, raw: bytes, uid: str, warning: str
) -> None:
    status, answer = await post(url, None, raw=raw)
    assert status == 200, case
    resp = answer["response"]
    assert resp["allowed"] is True and resp["uid"] == uid and "patch" not in resp
    assert warning in resp["warnings"][0], case


async def test_garbage_inside_a_pod_does_not_crash(url: str) -> None:
    pod = as_created(PENDING["want-8"])
    pod["spec"]["containers"] = [{"name": "x", "resources": {"limits": ["nvidia.com/gpu"]}}, "not-a-container"]
    status, answer = await post(url, admission_review(pod, "team-a"))
    assert status == 200
    assert answer["response"]["allowed"] is True and "patch" not in answer["response"]


async def test_pod_metadata_of_the_wrong_type_is_still_answered(url: str) -> None:
    review = admission_review(as_created(PENDING["want-8"]), "team-a")
    review["request"]["object"]["metadata"] = ["not", "a", "mapping"]
    status, answer = await post(url, review)
    assert status == 200
    assert decoded_patch(answer)[0]["value"] == "tandem-scheduler"  # the request's namespace decides


async def test_internal_error_allows_unchanged(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(body: Any, config: Any) -> dict[str, Any]:
        raise KeyError("bug")

    monkeypatch.setattr(webhook, "review", broken)
    status, answer = await post(url, admission_review(as_created(PENDING["want-8"]), "team-a"))
    assert status == 200
    assert answer["response"]["uid"] == "0f2b8a4e-3c1d-4e5f-9a6b-7c8d9e0f1a2b"
    assert answer["response"]["allowed"] is True and "patch" not in answer["response"]
    assert "internal error" in answer["response"]["warnings"][0]


def test_wants_gpu_table() -> None:
    def pod(**resources: Any) -> dict[str, Any]:
        return {"spec": {"containers": [{"name": "c", "resources": resources}]}}

    cases = [
        (pod(limits={"nvidia.com/gpu": "1"}), True),
        (pod(requests={"nvidia.com/mig-1g.10gb": "2"}), True),
        (pod(requests={"tandem.dev/gpu-milli": "500"}), True),
        (pod(requests={"cpu": "4", "memory": "8Gi"}), False),
        (pod(limits={"nvidia.com/gpu": "0"}), False),
        (pod(limits={"example.com/fpga": "1"}), False),
        (
            {"spec": {"containers": [], "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "gpu-4"}]}},
            True,
        ),
        ({"spec": None}, False),
    ]
    for obj, expected in cases:
        assert webhook.wants_gpu(obj, CONFIG) is expected, obj
