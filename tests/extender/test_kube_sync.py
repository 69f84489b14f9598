"""kube.Watcher over every kind: synced only after all first lists, reservations, absent APIs, real disconnects."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kmock as kmock_lib
import pytest
import yaml
from kubernetes.aio import client as kclient

from extender import kube
from tests.extender.kube_fakes import (
    RESERVATION_CONFIGMAP,
    RecordingInventory,
    SleepRecorder,
    event,
    eventually,
    fixture_items,
    hang,
    node_list,
    with_rv,
)

NODES = fixture_items("cluster.json", "Node")
PODS = fixture_items("cluster.json", "Pod")
SLICES = fixture_items("cluster.json", "ResourceSlice")
CLAIMS = fixture_items("cluster.json", "ResourceClaim")

RESERVATION_CM = with_rv(RESERVATION_CONFIGMAP, "42")
DEVICE_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "gpu.nvidia.com", "resourceVersion": "5"},
    "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]},
}

ENDPOINTS = {
    kube.Kind.NODE: ("v1/nodes", "NodeList", NODES),
    kube.Kind.POD: ("v1/pods", "PodList", PODS),
    kube.Kind.RESOURCE_SLICE: ("resource.k8s.io/v1/resourceslices", "ResourceSliceList", SLICES),
    kube.Kind.RESOURCE_CLAIM: ("resource.k8s.io/v1/resourceclaims", "ResourceClaimList", CLAIMS),
    kube.Kind.DEVICE_CLASS: ("resource.k8s.io/v1/deviceclasses", "DeviceClassList", [DEVICE_CLASS]),
    kube.Kind.RESERVATION: ("v1/configmaps", "ConfigMapList", [RESERVATION_CM]),
}


@pytest.fixture
async def api(kmock: Any) -> AsyncIterator[kclient.ApiClient]:
    cfg = kclient.Configuration(host=str(kmock.url).rstrip("/"))
    async with kclient.ApiClient(cfg) as api_client:
        yield api_client


async def run_until(watcher: kube.Watcher, *conditions: Any) -> None:
    task = asyncio.create_task(watcher.run())
    try:
        for cond in conditions:
            await cond()
        assert not task.done(), task
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_synced_only_after_every_kind_listed(kmock: Any, api: kclient.ApiClient) -> None:
    gate = asyncio.Event()  # holds the Pod list back until the test opens it

    async def slow_pods() -> dict[str, Any]:
        await gate.wait()
        return node_list("20", PODS, kind="PodList")

    for kind, (path, list_kind, items) in ENDPOINTS.items():
        if kind is kube.Kind.POD:
            kmock[f"list {path}"] << slow_pods
        else:
            kmock[f"list {path}"] << node_list("10", items, kind=list_kind)
        kmock[f"watch {path}"] << hang
    inv, sleep = RecordingInventory(), SleepRecorder()
    synced_calls: list[int] = []
    loaded_calls: list[int] = []
    watcher = kube.Watcher(
        api,
        inv,
        sleep=sleep,
        on_synced=lambda: synced_calls.append(len(inv.calls)),
        on_reservations_loaded=lambda: loaded_calls.append(len(inv.calls)),
    )

    async def five_listed() -> None:
        await inv.wait_for(lambda: len(inv.kinds_called("replace")) == 5)
        await watcher.reservations_loaded.wait()
        assert not watcher.synced.is_set()
        assert synced_calls == []
        # reservations_loaded fired right after the reservation list, not at sync.
        assert loaded_calls == [inv.kinds_called("replace").index("Reservation") + 1]
        gate.set()

    async def all_synced() -> None:
        await watcher.synced.wait()

    await run_until(watcher, five_listed, all_synced)

    assert sorted(inv.kinds_called("replace")) == sorted(k.value for k in kube.INVENTORY_KINDS)
    assert inv.kinds_called("replace")[-1] == "Pod"
    assert synced_calls == [6]  # called once, right after the sixth (last) list
    assert len(loaded_calls) == 1
    assert inv.objects["Reservation"] == {"tandem-system/reservation-job-7-1": RESERVATION_CM}
    assert inv.objects["ResourceSlice"][f"/{SLICES[0]['metadata']['name']}"] == SLICES[0]
    cm_lists = [r for r in list(kmock) if r.url.path == "/api/v1/namespaces/tandem-system/configmaps"]
    assert cm_lists and all(r.params["labelSelector"] == "tandem.dev/reservation" for r in cm_lists)


async def test_dra_api_not_served_counts_as_empty_and_does_not_block_sync(kmock: Any, api: kclient.ApiClient) -> None:
    for path, list_kind, items in ENDPOINTS.values():
        if path.startswith("resource.k8s.io"):
            (
                kmock[f"list {path}"]
                << 404
                << {
                    "kind": "Status",
                    "code": 404,
                    "reason": "NotFound",
                    "message": "the server could not find the requested resource",
                }
            )
        else:
            kmock[f"list {path}"] << node_list("10", items, kind=list_kind)
            kmock[f"watch {path}"] << hang
    inv, sleep = RecordingInventory(), SleepRecorder()
    settings = kube.KubeSettings(absent_api_retry_s=123.0)
    waiter = asyncio.Event()

    async def parked_sleep(delay: float) -> None:
        sleep.delays.append(delay)
        await waiter.wait()  # park the absent kinds; the test ends before they retry

    watcher = kube.Watcher(api, inv, settings, sleep=parked_sleep)
    await run_until(watcher, watcher.synced.wait)

    for dra_kind in ("ResourceSlice", "ResourceClaim", "DeviceClass"):
        assert inv.objects[dra_kind] == {}
    assert sleep.delays == [123.0, 123.0, 123.0]
    dra_watches = [r for r in list(kmock) if r.action == kmock_lib.action.WATCH and "resource.k8s.io" in r.url.path]
    assert dra_watches == []


async def test_tcp_reset_mid_stream_reconnects_from_last_event(kmock: Any, api: kclient.ApiClient) -> None:
    n1, n2 = NODES[0], NODES[1]

    def cut(request: Any) -> None:
        request._raw_request.transport.abort()  # a real TCP reset, as a dying apiserver or LB does

    kmock["list v1/nodes"] << node_list("100", [n1])
    kmock["watch v1/nodes"] << iter((event("ADDED", with_rv(n2, "130")), cut))
    kmock["watch v1/nodes"] << hang
    inv, sleep = RecordingInventory(), SleepRecorder()
    watcher = kube.Watcher(api, inv, sleep=sleep, rand=lambda: 0.0, kinds=frozenset({kube.Kind.NODE}))

    def watches() -> list[Any]:
        return [r for r in list(kmock) if r.action == kmock_lib.action.WATCH]

    async def reconnected() -> None:
        await eventually(lambda: len(watches()) == 2)

    await run_until(watcher, reconnected)
    assert [r.params["resourceVersion"] for r in watches()] == ["100", "130"]
    assert sleep.delays == [0.25]  # base 0.5 with the jitter at its floor (d/2)
    assert inv.calls[-1] == ("apply", "Node", "ADDED", f"/{n2['metadata']['name']}")


async def test_unreachable_apiserver_backs_off_and_never_syncs() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again before use: connections are refused
    cfg = kclient.Configuration(host=f"http://127.0.0.1:{port}")
    inv = RecordingInventory()
    delays: list[float] = []
    enough = asyncio.Event()

    async def sleep(delay: float) -> None:
        delays.append(delay)
        if len(delays) >= 4:
            enough.set()
            await asyncio.Event().wait()

    async with kclient.ApiClient(cfg) as api:
        settings = kube.KubeSettings(backoff_base_s=1.0, backoff_cap_s=4.0)
        watcher = kube.Watcher(api, inv, settings, sleep=sleep, rand=lambda: 1.0, kinds=frozenset({kube.Kind.NODE}))
        await run_until(watcher, enough.wait)
        assert not watcher.synced.is_set()
    assert delays == [1.0, 2.0, 4.0, 4.0]
    assert inv.calls == []


async def test_load_api_client_from_kubeconfig_reaches_the_server(kmock: Any, tmp_path: Path) -> None:
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": str(kmock.url).rstrip("/")}}],
        "users": [{"name": "u", "user": {"token": "t0ken"}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig))
    kmock["list v1/nodes"] << node_list("1", NODES[:1])
    api = await kube.load_api_client(kubeconfig=str(path))
    async with api:
        resp = await kclient.CoreV1Api(api).list_node_without_preload_content()
        assert resp.status == 200
        resp.release()
    assert list(kmock)[0].headers["Authorization"] == "Bearer t0ken"


async def test_load_api_client_explicit_host_wins() -> None:
    api = await kube.load_api_client(host="http://127.0.0.1:1")
    async with api:
        assert api.configuration.host == "http://127.0.0.1:1"


async def test_reservation_namespace_and_label_come_from_the_config(kmock: Any, api: kclient.ApiClient) -> None:
    from extender.config import ExtenderConfig

    settings = kube.KubeSettings.from_config(
        ExtenderConfig(reservation_namespace="gpu-ops", reservation_label="example.org/held")
    )
    kmock["list v1/configmaps"] << node_list("3", [], kind="ConfigMapList")
    kmock["watch v1/configmaps"] << hang
    watcher = kube.Watcher(api, RecordingInventory(), settings, kinds=frozenset({kube.Kind.RESERVATION}))
    await run_until(watcher, watcher.reservations_loaded.wait, watcher.synced.wait)
    (req,) = [r for r in list(kmock) if r.action == kmock_lib.action.LIST]
    assert req.url.path == "/api/v1/namespaces/gpu-ops/configmaps"
    assert req.params["labelSelector"] == "example.org/held"
