"""kube.create_or_get against kmock: creates once, returns the existing object on a repeat, sends the body untouched."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import kmock as kmock_lib
import pytest
from kubernetes.aio import client as kclient

from extender import kube
from tests.extender.kube_fakes import RESERVATION_CONFIGMAP

JOB = {
    "apiVersion": "batch/v1",
    "kind": "Job",
    "metadata": {
        "name": "job-7-1",
        "namespace": "team-a",
        "labels": {"tandem.dev/job": "job-7", "tandem.dev/attempt": "1"},
    },
    "spec": {
        "completionMode": "Indexed",
        "completions": 2,
        "parallelism": 2,
        "backoffLimit": 0,
        "podReplacementPolicy": "Failed",
        # A field newer than the client's models: must reach the server as written.
        "someFutureField": {"enabled": True},
        "template": {
            "metadata": {"labels": {"tandem.dev/job": "job-7"}},
            "spec": {
                "restartPolicy": "Never",
                "schedulingGates": [{"name": "tandem.dev/gang"}],
                "containers": [
                    {"name": "worker", "image": "trainer:1", "resources": {"limits": {"nvidia.com/gpu": "8"}}}
                ],
            },
        },
    },
}


@pytest.fixture
async def api(kmock: Any) -> AsyncIterator[kclient.ApiClient]:
    async with kclient.ApiClient(kclient.Configuration(host=str(kmock.url).rstrip("/"))) as api_client:
        yield api_client


def posts(kmock: Any) -> list[Any]:
    return [r for r in list(kmock) if r.method == kmock_lib.method.POST]


@pytest.mark.parametrize("body", [RESERVATION_CONFIGMAP, JOB], ids=["configmap", "job"])
async def test_create_then_get_existing(kmock: Any, api: kclient.ApiClient, body: dict[str, Any]) -> None:
    sent = copy.deepcopy(body)
    obj, created = await kube.create_or_get(api, sent)
    assert created is True
    assert obj["metadata"]["name"] == body["metadata"]["name"]
    again, created_again = await kube.create_or_get(api, copy.deepcopy(body))
    assert created_again is False
    assert again["metadata"]["name"] == body["metadata"]["name"]
    assert again.get("spec", again.get("data")) == body.get("spec", body.get("data"))
    first, second = posts(kmock)
    assert first.data == body  # raw JSON: no field dropped by a generated model
    group = "batch/v1" if body["kind"] == "Job" else "v1"
    prefix = "/apis/" if "/" in group else "/api/"
    assert (
        first.url.path
        == f"{prefix}{group}/namespaces/{body['metadata']['namespace']}/{'jobs' if body['kind'] == 'Job' else 'configmaps'}"
    )
    assert first.params["fieldManager"] == "tandem-agent"
    assert sent == body  # the caller's dict is not modified
    (get,) = [r for r in list(kmock) if r.method == kmock_lib.method.GET]  # after the 409 of the second POST
    assert get.url.path == f"{first.url.path}/{body['metadata']['name']}"


async def test_other_errors_raise_with_the_status(kmock: Any, api: kclient.ApiClient) -> None:
    (
        kmock["post v1/configmaps"]
        << 403
        << {
            "kind": "Status",
            "code": 403,
            "reason": "Forbidden",
            "message": "configmaps is forbidden: User cannot create resource",
        }
    )
    with pytest.raises(kube.KubeError) as err:
        await kube.create_or_get(api, copy.deepcopy(RESERVATION_CONFIGMAP))
    assert err.value.status == 403
    assert "forbidden" in str(err.value)
