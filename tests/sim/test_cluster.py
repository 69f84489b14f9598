"""SimCluster bootstrap and identities, the raw client and the informer, against the fake API server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sim import kuberesources as kr
from sim.cluster import SimCluster, eventually
from sim.informer import Informer
from sim.kubeapi import KubeAPIServer
from sim.kubeclient import KubeApiError, KubeClient, TokenBucket
from sim.kubeconfig import load_kubeconfig

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"

JSON = dict[str, Any]


def configmap(name: str, ns: str = "default", **data: str) -> JSON:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns}, "data": data}


@pytest.fixture
async def server() -> AsyncIterator[KubeAPIServer]:
    srv = KubeAPIServer(event_window=20, watch_delay_max_s=0.0, seed=7)
    await srv.start("127.0.0.1", 0)
    try:
        yield srv
    finally:
        await srv.stop()


class Sleeps:
    """Records the delays the client was asked to wait (the delay itself is skipped)."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


# ---- the raw client ------------------------------------------------------------------------------


async def test_errors_carry_the_servers_status(server: KubeAPIServer) -> None:
    async with KubeClient(server.url, server.admin_token) as c:
        await c.create(kr.CONFIG_MAPS, configmap("a"))
        with pytest.raises(KubeApiError) as exists:
            await c.create(kr.CONFIG_MAPS, configmap("a"))
        assert exists.value.already_exists and exists.value.status["kind"] == "Status"
        with pytest.raises(KubeApiError) as missing:
            await c.get(kr.CONFIG_MAPS, "nope", "default")
        assert missing.value.not_found and missing.value.reason == "NotFound"
        stale = await c.get(kr.CONFIG_MAPS, "a", "default")
        await c.replace(kr.CONFIG_MAPS, stale | {"data": {"v": "1"}})
        with pytest.raises(KubeApiError) as conflict:
            await c.replace(kr.CONFIG_MAPS, stale | {"data": {"v": "2"}})
        assert conflict.value.conflict
    async with KubeClient(server.url, "not-a-token") as anonymous:
        with pytest.raises(KubeApiError) as unauthorized:
            await anonymous.list(kr.NAMESPACES)
        assert unauthorized.value.code == 401


async def test_429_is_retried_after_retry_after(server: KubeAPIServer) -> None:
    sleeps = Sleeps()
    server.inject_fault("list", "configmaps", status=429, retry_after_s=3, count=2)
    async with KubeClient(server.url, server.admin_token, sleep=sleeps) as c:
        result = await c.list(kr.CONFIG_MAPS, "default")
    assert result.items == [] and sleeps.delays == [3.0, 3.0]


async def test_a_500_without_retry_after_is_not_retried(server: KubeAPIServer) -> None:
    server.inject_fault("get", "configmaps", status=500, count=1)
    async with KubeClient(server.url, server.admin_token, sleep=Sleeps()) as c:
        with pytest.raises(KubeApiError) as failed:
            await c.get(kr.CONFIG_MAPS, "x", "default")
    assert failed.value.code == 500


async def test_list_follows_continue_tokens(server: KubeAPIServer) -> None:
    async with KubeClient(server.url, server.admin_token) as c:
        for i in range(7):
            await c.create(kr.CONFIG_MAPS, configmap(f"cm-{i}", team="a" if i % 2 else "b"))
        page = await c.list_page(kr.CONFIG_MAPS, "default", limit=3)
        assert len(page["items"]) == 3 and page["metadata"]["continue"]
        everything = await c.list(kr.CONFIG_MAPS, "default", limit=3)
        assert sorted(o["metadata"]["name"] for o in everything.items) == [f"cm-{i}" for i in range(7)]
        assert int(everything.resource_version) > 0


async def test_watch_resumes_after_a_resource_version_and_410_when_compacted(server: KubeAPIServer) -> None:
    async with KubeClient(server.url, server.admin_token) as c:
        before = await c.list(kr.CONFIG_MAPS, "default")
        await c.create(kr.CONFIG_MAPS, configmap("w1"))
        await c.patch(kr.CONFIG_MAPS, "w1", {"data": {"k": "v"}}, patch_type="merge", namespace="default")
        await c.delete(kr.CONFIG_MAPS, "w1", "default")
        seen = []
        async for ev in c.watch(kr.CONFIG_MAPS, "default", resource_version=before.resource_version, timeout_seconds=1):
            if ev.type != "BOOKMARK":
                seen.append((ev.type, ev.object["metadata"]["name"]))
            if len(seen) == 3:
                break
        assert seen == [("ADDED", "w1"), ("MODIFIED", "w1"), ("DELETED", "w1")]
        for i in range(30):  # beyond the 20-event window
            await c.create(kr.CONFIG_MAPS, configmap(f"fill-{i}"))
        with pytest.raises(KubeApiError) as gone:
            async for _ in c.watch(
                kr.CONFIG_MAPS, "default", resource_version=before.resource_version, timeout_seconds=1
            ):
                pass
        assert gone.value.gone


async def test_patch_media_types(server: KubeAPIServer) -> None:
    async with KubeClient(server.url, server.admin_token) as c:
        await c.create(kr.CONFIG_MAPS, configmap("p", a="1", b="2"))
        merged = await c.patch(kr.CONFIG_MAPS, "p", {"data": {"a": None}}, patch_type="merge", namespace="default")
        assert merged["data"] == {"b": "2"}
        patched = await c.patch(
            kr.CONFIG_MAPS,
            "p",
            [{"op": "test", "path": "/data/b", "value": "2"}, {"op": "replace", "path": "/data/b", "value": "3"}],
            patch_type="json",
            namespace="default",
        )
        assert patched["data"] == {"b": "3"}
        with pytest.raises(KubeApiError):
            await c.patch(
                kr.CONFIG_MAPS,
                "p",
                [{"op": "test", "path": "/data/b", "value": "2"}],
                patch_type="json",
                namespace="default",
            )


async def test_delete_honours_the_uid_precondition(server: KubeAPIServer) -> None:
    async with KubeClient(server.url, server.admin_token) as c:
        made = await c.create(kr.CONFIG_MAPS, configmap("d"))
        with pytest.raises(KubeApiError) as wrong:
            await c.delete(kr.CONFIG_MAPS, "d", "default", preconditions={"uid": "not-it"})
        assert wrong.value.code == 409
        await c.delete(kr.CONFIG_MAPS, "d", "default", preconditions={"uid": made["metadata"]["uid"]})
        with pytest.raises(KubeApiError):
            await c.get(kr.CONFIG_MAPS, "d", "default")


async def test_kubeconfig_with_a_token_user(server: KubeAPIServer, tmp_path: Path) -> None:
    from sim.kubeapi import write_kubeconfig

    write_kubeconfig(tmp_path / "kc", server.url, server.admin_token)
    creds = load_kubeconfig(tmp_path / "kc")
    assert creds.server == server.url and creds.token == server.admin_token and creds.ssl_context() is False
    async with KubeClient.from_kubeconfig(str(tmp_path / "kc")) as c:
        names = {n["metadata"]["name"] for n in (await c.list(kr.NAMESPACES)).items}
    assert {"default", "kube-system"} <= names


def test_token_bucket_allows_a_burst_then_the_rate() -> None:
    now = [0.0]
    bucket = TokenBucket(20.0, 30, clock=lambda: now[0])
    assert [bucket.reserve() for _ in range(30)] == [0.0] * 30
    assert bucket.reserve() == pytest.approx(0.05)  # the 31st waits one token (1/20 s)
    now[0] += 1.0  # a second later 20 tokens are back, minus the one lent
    assert sum(1 for _ in range(19) if bucket.reserve() == 0.0) == 19
    assert bucket.reserve() > 0


async def test_informer_relists_after_410_and_reports_the_difference(server: KubeAPIServer) -> None:
    async with KubeClient(server.url, server.admin_token) as c:
        await c.create(kr.CONFIG_MAPS, configmap("keep"))
        await c.create(kr.CONFIG_MAPS, configmap("drop"))
        inf = Informer(c, kr.CONFIG_MAPS, namespace="default", watch_timeout_s=1)
        seen: list[tuple[str | None, str | None]] = []

        def record(old: JSON | None, new: JSON | None) -> None:
            seen.append((old["metadata"]["name"] if old else None, new["metadata"]["name"] if new else None))

        inf.add_handler(record)
        await inf._list()
        stale_rv = inf.resource_version
        await c.delete(kr.CONFIG_MAPS, "drop", "default")
        for i in range(30):
            await c.create(kr.CONFIG_MAPS, configmap(f"new-{i}"))
        inf.resource_version = stale_rv
        task = asyncio.create_task(inf.run())
        try:

            async def relisted() -> bool:
                return "default/drop" not in inf.store and "default/new-29" in inf.store

            await eventually(relisted)
        finally:
            task.cancel()
        assert ("drop", None) in seen and (None, "new-29") in seen


# ---- the cluster ---------------------------------------------------------------------------------


@pytest.fixture
async def cluster() -> AsyncIterator[SimCluster]:
    async with SimCluster([], manifests=MANIFESTS, heartbeat_interval_s=60.0) as c:
        yield c


async def test_bootstrap_creates_what_an_installer_would(cluster: SimCluster) -> None:
    admin = cluster.admin
    assert admin is not None
    names = {n["metadata"]["name"] for n in (await admin.list(kr.NAMESPACES)).items}
    assert {"kube-system", "kube-node-lease", "default", "tandem-system"} <= names
    classes = {p["metadata"]["name"]: p["value"] for p in (await admin.list(kr.PRIORITY_CLASSES)).items}
    assert classes["tandem-gang"] == 1000000 and classes["tandem-scheduler-critical"] == 1000000000
    await admin.get(kr.SERVICE_ACCOUNTS, "tandem-scheduler", "tandem-system")
    for sa in ("job-controller", "pod-garbage-collector", "sim-kubelet"):
        await admin.get(kr.SERVICE_ACCOUNTS, sa, "kube-system")
    role = await admin.get(kr.CLUSTER_ROLES, "system:controller:job-controller")
    assert {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch", "create", "delete", "patch"]} in role[
        "rules"
    ]


async def test_each_controller_has_only_its_own_permissions(cluster: SimCluster) -> None:
    from sim import identities as ids

    job_controller = cluster.client(cluster.token_for(ids.JOB_CONTROLLER))
    with pytest.raises(KubeApiError) as denied:
        await job_controller.delete(kr.NODES, "any")
    assert denied.value.code == 403 and 'cannot delete resource "nodes"' in denied.value.message
    kubelet = cluster.client(cluster.token_for(ids.KUBELET))
    with pytest.raises(KubeApiError) as no_jobs:
        await kubelet.list(kr.JOBS, "default")
    assert no_jobs.value.code == 403
    scheduler = cluster.client(await cluster.service_account_token("tandem-system", "tandem-scheduler"))
    await scheduler.list(kr.NODES)  # the shipped RBAC: system:kube-scheduler
    with pytest.raises(KubeApiError):
        await scheduler.create(kr.JOBS, {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x"}}, "default")


async def test_namespaces_and_kubeconfigs(cluster: SimCluster, tmp_path: Path) -> None:
    made = await cluster.create_namespace("team-a", labels={"tandem.dev/gpu-routing": "enabled"})
    assert made["metadata"]["labels"]["tandem.dev/gpu-routing"] == "enabled"
    token = await cluster.service_account_token("team-a", "launcher")
    path = cluster.kubeconfig(tmp_path / "team-a.kubeconfig", token)
    async with KubeClient.from_kubeconfig(str(path)) as c:
        with pytest.raises(KubeApiError) as denied:
            await c.list(kr.PODS, "team-a")
    assert denied.value.code == 403 and "system:serviceaccount:team-a:launcher" in denied.value.message


async def test_the_extender_url_can_be_set_after_start(cluster: SimCluster) -> None:
    assert cluster.scheduler is not None
    cluster.set_extender_url("http://127.0.0.1:9")
    (ext,) = cluster.scheduler._extenders
    assert ext.settings.url(ext.base_url, "filter") == "http://127.0.0.1:9/tandem/filter"
