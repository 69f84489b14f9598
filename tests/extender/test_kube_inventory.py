"""kube.Watcher feeding the real extender Inventory from kmock: ready after the first lists, then follows events."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes.aio import client as kclient

from extender import kube
from extender.config import ExtenderConfig
from extender.inventory import Inventory
from tests.extender.kube_fakes import event, eventually, fixture_items, hang, node_list, with_rv

CLUSTER = fixture_items("cluster.json")
DEVICE_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "gpu.nvidia.com", "resourceVersion": "5"},
    "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]},
}
PATHS = {
    "Node": "v1/nodes",
    "Pod": "v1/pods",
    "ResourceSlice": "resource.k8s.io/v1/resourceslices",
    "ResourceClaim": "resource.k8s.io/v1/resourceclaims",
    "DeviceClass": "resource.k8s.io/v1/deviceclasses",
    "ConfigMap": "v1/configmaps",
}


@pytest.fixture
async def api(kmock: Any) -> AsyncIterator[kclient.ApiClient]:
    async with kclient.ApiClient(kclient.Configuration(host=str(kmock.url).rstrip("/"))) as api_client:
        yield api_client


async def test_real_inventory_becomes_ready_and_follows_a_cordon(kmock: Any, api: kclient.ApiClient) -> None:
    items = {kind: [o for o in CLUSTER if o["kind"] == kind] for kind in PATHS}
    items["DeviceClass"] = [DEVICE_CLASS]
    node = items["Node"][1]
    cordoned = with_rv({**node, "spec": {**node.get("spec", {}), "unschedulable": True}}, "9001")
    for kind, path in PATHS.items():
        kmock[f"list {path}"] << node_list("1000", items[kind], kind=f"{kind}List")
        if kind == "Node":
            kmock[f"watch {path}"] << iter((event("MODIFIED", cordoned),))
        kmock[f"watch {path}"] << hang

    inv = Inventory(ExtenderConfig())
    assert not inv.ready
    watcher = kube.Watcher(api, inv)
    task = asyncio.create_task(watcher.run())
    try:
        await asyncio.wait_for(watcher.synced.wait(), 10)
        await eventually(lambda: any(n["spec"].get("unschedulable") for n in inv.objects("Node")))
        assert inv.ready
        assert len(inv.objects("Node")) == 12
        assert len(inv.objects("ResourceSlice")) == 1 and len(inv.objects("ResourceClaim")) == 2
        names = {n["metadata"]["name"] for n in inv.objects("Node") if n["spec"].get("unschedulable")}
        assert names == {node["metadata"]["name"]}
        assert inv.errors == []
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
