"""The kubelet stand-in: status shapes as tables; nodes, leases and pods against the fake API server."""

from __future__ import annotations

import asyncio
import copy
import json
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sim import kuberesources as kr
from sim import nodes as nd
from sim import podstatus as ps
from sim.cluster import SimCluster, eventually
from sim.informer import Informer
from sim.kubeapi import KubeAPIServer, write_kubeconfig
from sim.kubeclient import KubeApiError, KubeClient
from sim.kubelet import EXIT_CODE_ANNOTATION, PULL_ERROR_ANNOTATION
from tests.fixtures import fixture_json

JSON = dict[str, Any]
NOW = 1_800_000_000.0


def fixture_nodes() -> list[JSON]:
    return [o for o in fixture_json("cluster.json")["items"] if o["kind"] == "Node"]


def bound_pod(name: str = "w-0-abcde", node: str = "h100-r1-n1", restart: str = "Never", containers: int = 1) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "team-a", "uid": "u-1"},
        "spec": {
            "nodeName": node,
            "restartPolicy": restart,
            "containers": [{"name": f"c{i}", "image": "nvcr.io/nvidia/pytorch:25.10-py3"} for i in range(containers)],
        },
        "status": {"phase": "Pending", "qosClass": "BestEffort"},
    }


def cond(status: JSON, ctype: str) -> JSON:
    return next(c for c in status["conditions"] if c["type"] == ctype)


def test_running_status_is_what_kubectl_shows_for_a_running_pod() -> None:
    st = ps.running_status(bound_pod(containers=2), "192.0.2.10", "10.244.0.5", NOW)
    assert st["phase"] == "Running" and st["podIP"] == "10.244.0.5" and st["hostIP"] == "192.0.2.10"
    assert st["podIPs"] == [{"ip": "10.244.0.5"}] and st["qosClass"] == "BestEffort"
    assert [c["type"] for c in st["conditions"]] == list(ps.POD_CONDITIONS)
    assert all(c["status"] == "True" for c in st["conditions"])
    for cs in st["containerStatuses"]:
        assert cs["ready"] and cs["started"] and cs["restartCount"] == 0
        assert set(cs["state"]) == {"running"} and cs["containerID"].startswith("containerd://")
        assert cs["imageID"].startswith("nvcr.io/nvidia/pytorch@sha256:")


def test_container_creating_leaves_the_pod_pending_and_not_ready() -> None:
    st = ps.waiting_status(bound_pod(), "192.0.2.10", NOW)
    assert st["phase"] == "Pending" and "podIP" not in st
    assert st["containerStatuses"][0]["state"] == {"waiting": {"reason": "ContainerCreating"}}
    assert (cond(st, "Ready")["status"], cond(st, "Ready")["reason"]) == ("False", "ContainersNotReady")
    assert cond(st, "Ready")["message"] == "containers with unready status: [c0]"


@pytest.mark.parametrize(
    "reason, message_start",
    [
        ("ErrImagePull", 'failed to pull and unpack image "nvcr.io/nvidia/pytorch:25.10-py3"'),
        ("ImagePullBackOff", 'Back-off pulling image "nvcr.io/nvidia/pytorch:25.10-py3"'),
    ],
)
def test_image_pull_errors(reason: str, message_start: str) -> None:
    waiting = ps.waiting_status(bound_pod(), "192.0.2.10", NOW, reason)["containerStatuses"][0]["state"]["waiting"]
    assert waiting["reason"] == reason and waiting["message"].startswith(message_start)


@pytest.mark.parametrize(
    "codes, phase, reason",
    [
        ({"c0": 0, "c1": 0}, "Succeeded", "PodCompleted"),
        ({"c0": 0, "c1": 3}, "Failed", "PodFailed"),
    ],
)
def test_completion_with_exit_codes(codes: dict[str, int], phase: str, reason: str) -> None:
    p = bound_pod(containers=2)
    p["status"] = ps.running_status(p, "192.0.2.10", "10.244.0.5", NOW - 60)
    st = ps.terminated_status(p, "192.0.2.10", "10.244.0.5", codes, NOW)
    assert st["phase"] == phase and cond(st, "Ready")["reason"] == reason
    got = {cs["name"]: cs["state"]["terminated"] for cs in st["containerStatuses"]}
    assert {n: t["exitCode"] for n, t in got.items()} == codes
    assert got["c0"]["startedAt"] == p["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
    assert cond(st, "PodScheduled")["lastTransitionTime"] == cond(p["status"], "PodScheduled")["lastTransitionTime"]


def test_restart_in_place_counts_restarts_and_keeps_the_last_state() -> None:
    p = bound_pod(restart="OnFailure")
    p["status"] = ps.running_status(p, "192.0.2.10", "10.244.0.5", NOW - 60)
    st = ps.restarted_status(p, "192.0.2.10", "10.244.0.5", {"c0": 1}, NOW)
    cs = st["containerStatuses"][0]
    assert st["phase"] == "Running" and cs["restartCount"] == 1
    assert cs["lastState"]["terminated"]["exitCode"] == 1 and "running" in cs["state"]
    assert cs["containerID"] != p["status"]["containerStatuses"][0]["containerID"]


def test_a_deleted_pod_that_never_started_reports_unknown_containers() -> None:
    st = ps.killed_status(bound_pod(), "192.0.2.10", None, 143, NOW)
    term = st["containerStatuses"][0]["state"]["terminated"]
    assert st["phase"] == "Failed" and (term["exitCode"], term["reason"]) == (137, "ContainerStatusUnknown")


def test_a_deleted_running_pod_exits_with_the_signal_code() -> None:
    p = bound_pod()
    p["status"] = ps.running_status(p, "192.0.2.10", "10.244.0.5", NOW - 5)
    st = ps.killed_status(p, "192.0.2.10", "10.244.0.5", 143, NOW)
    assert st["phase"] == "Failed" and st["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 143
    assert ps.killed_status(p, "192.0.2.10", "10.244.0.5", 0, NOW)["phase"] == "Succeeded"


def test_micro_time_has_six_fractional_digits() -> None:
    assert ps.micro_time(NOW + 0.25) == "2027-01-15T08:00:00.250000Z"


def test_node_conditions_refresh_heartbeats_and_keep_transition_times() -> None:
    previous = fixture_nodes()[0]["status"]["conditions"]
    fresh = nd.node_conditions(previous, True, NOW)
    ready = next(c for c in fresh if c["type"] == "Ready")
    assert ready["lastHeartbeatTime"] == "2027-01-15T08:00:00Z"
    assert ready["lastTransitionTime"] == "2026-11-01T00:00:00Z"
    down = next(c for c in nd.node_conditions(fresh, False, NOW + 10) if c["type"] == "Ready")
    assert (down["status"], down["reason"]) == ("False", "KubeletNotReady")
    assert down["lastTransitionTime"] == "2027-01-15T08:00:10Z"
    assert [c["type"] for c in fresh] == ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]


def test_lease_is_owned_by_its_node() -> None:
    n = fixture_nodes()[0]
    lease = nd.lease_body(n, NOW, 40)
    assert lease["metadata"] == {
        "name": "h100-r1-n1",
        "namespace": "kube-node-lease",
        "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "h100-r1-n1", "uid": n["metadata"]["uid"]}],
    }
    assert lease["spec"] == {
        "holderIdentity": "h100-r1-n1",
        "leaseDurationSeconds": 40,
        "renewTime": "2027-01-15T08:00:00.000000Z",
    }


def test_pod_ips_come_from_the_node_pod_cidr() -> None:
    ips = nd.PodIPs()
    n = fixture_nodes()[0]
    assert [ips.allocate(n), ips.allocate(n)] == ["10.244.0.2", "10.244.0.3"]
    assert nd.host_ip(n) == "192.0.2.10"


def test_fixtures_load_from_json_lists_and_yaml_documents(tmp_path: Path) -> None:
    items = fixture_json("cluster.json")["items"]
    (tmp_path / "c.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    nodes, slices = nd.load_fixture(tmp_path / "c.json")
    assert len(nodes) == 12 and len(slices) == 1
    (tmp_path / "n.yaml").write_text(yaml.safe_dump_all(nodes[:2]))
    assert [n["metadata"]["name"] for n in nd.load_fixture(tmp_path / "n.yaml")[0]] == ["h100-r1-n1", "h100-r1-n2"]
    body = nd.registration_body(nodes[0])
    assert "uid" not in body["metadata"] and "resourceVersion" not in body["metadata"]
    assert body["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"


# ---- against the fake API server -----------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]


def pod_on(
    name: str, node: str, *, restart: str = "Never", annotations: dict[str, str] | None = None, grace: int = 30
) -> JSON:
    """A pod created already bound (``spec.nodeName``), as DaemonSet pods are."""
    meta: JSON = {"name": name, "namespace": "team-a"}
    if annotations:
        meta["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "nodeName": node,
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": grace,
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "main", "image": "busybox:1.36"}],
        },
    }


@pytest.fixture
async def cluster() -> AsyncIterator[SimCluster]:
    nodes = [n for n in fixture_nodes() if n["metadata"]["name"] in ("h100-r1-n1", "cpu-1", "h200-dra-1")]
    slices = [o for o in fixture_json("cluster.json")["items"] if o["kind"] == "ResourceSlice"]
    async with SimCluster(nodes, resource_slices=slices, manifests=REPO / "manifests", heartbeat_interval_s=0.2) as c:
        await c.create_namespace("team-a")
        yield c


async def phase_of(c: SimCluster, name: str, phase: str) -> JSON:
    assert c.admin is not None
    admin = c.admin

    async def reached() -> JSON | None:
        p = await admin.get(kr.PODS, name, "team-a")
        return p if p["status"].get("phase") == phase else None

    return await eventually(reached)


async def test_nodes_and_resource_slices_are_registered_from_the_fixture(cluster: SimCluster) -> None:
    assert cluster.admin is not None
    node = await cluster.admin.get(kr.NODES, "h100-r1-n1")
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert node["spec"]["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True" and ready["reason"] == "KubeletReady"
    (rslice,) = (await cluster.admin.list(kr.RESOURCE_SLICES)).items
    owner = await cluster.admin.get(kr.NODES, "h200-dra-1")
    assert rslice["spec"]["nodeName"] == "h200-dra-1" and len(rslice["spec"]["devices"]) == 8
    assert rslice["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]  # the live node, so GC keeps it


async def test_leases_and_ready_conditions_are_renewed(cluster: SimCluster) -> None:
    assert cluster.admin is not None and cluster.kubelet is not None
    admin = cluster.admin
    first = await admin.get(kr.LEASES, "h100-r1-n1", "kube-node-lease")
    assert first["spec"]["holderIdentity"] == "h100-r1-n1" and first["spec"]["leaseDurationSeconds"] == 40
    assert first["metadata"]["ownerReferences"][0]["kind"] == "Node"

    async def renewed() -> JSON | None:
        lease = await admin.get(kr.LEASES, "h100-r1-n1", "kube-node-lease")
        return lease if lease["spec"]["renewTime"] != first["spec"]["renewTime"] else None

    later = await eventually(renewed)
    assert later["metadata"]["resourceVersion"] != first["metadata"]["resourceVersion"]
    assert len(later["spec"]["renewTime"].split(".")[1]) == len("000000Z")
    before = cluster.kubelet.heartbeats

    async def beat_twice() -> bool:
        return cluster.kubelet is not None and cluster.kubelet.heartbeats >= before + 2

    await eventually(beat_twice)
    node = await admin.get(kr.NODES, "h100-r1-n1")
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert ready["lastHeartbeatTime"] != ready["lastTransitionTime"]


async def test_a_bound_pod_runs_with_ips_and_ready_containers(cluster: SimCluster) -> None:
    assert cluster.admin is not None
    await cluster.admin.create(kr.PODS, pod_on("web", "h100-r1-n1"))
    p = await phase_of(cluster, "web", "Running")
    st = p["status"]
    assert st["podIP"].startswith("10.244.0.") and st["hostIP"] == "192.0.2.10" and st["startTime"]
    assert st["containerStatuses"][0]["ready"] is True and "running" in st["containerStatuses"][0]["state"]
    assert {c["type"]: c["status"] for c in st["conditions"]}["Ready"] == "True"


async def test_pods_complete_with_exit_codes(cluster: SimCluster) -> None:
    assert cluster.admin is not None and cluster.kubelet is not None
    await cluster.admin.create(kr.PODS, pod_on("ok", "h100-r1-n1"))
    await cluster.admin.create(kr.PODS, pod_on("bad", "cpu-1"))
    await phase_of(cluster, "ok", "Running")
    await phase_of(cluster, "bad", "Running")
    await cluster.kubelet.complete("team-a", "ok", exit_code=0)
    await cluster.kubelet.complete("team-a", "bad", exit_code=2)
    ok = await phase_of(cluster, "ok", "Succeeded")
    bad = await phase_of(cluster, "bad", "Failed")
    assert ok["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    assert bad["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 2


async def test_on_failure_pods_restart_in_place(cluster: SimCluster) -> None:
    assert cluster.admin is not None and cluster.kubelet is not None
    await cluster.admin.create(kr.PODS, pod_on("retry", "cpu-1", restart="OnFailure"))
    await phase_of(cluster, "retry", "Running")
    await cluster.kubelet.complete("team-a", "retry", exit_code=1)

    async def restarted() -> bool:
        assert cluster.admin is not None
        p = await cluster.admin.get(kr.PODS, "retry", "team-a")
        return bool(p["status"]["phase"] == "Running" and p["status"]["containerStatuses"][0]["restartCount"] == 1)

    await eventually(restarted)


async def test_graceful_deletion_is_finished_with_a_terminal_phase(cluster: SimCluster) -> None:
    assert cluster.admin is not None
    admin = cluster.admin
    await admin.create(kr.PODS, pod_on("leaving", "h100-r1-n1"))
    running = await phase_of(cluster, "leaving", "Running")
    seen: list[JSON] = []
    watcher = Informer(admin, kr.PODS, namespace="team-a", field_selector="metadata.name=leaving")
    watcher.add_handler(lambda old, new: seen.append(new or {"deleted": True}))
    task = asyncio.create_task(watcher.run())
    try:
        await watcher.synced.wait()
        await admin.delete(kr.PODS, "leaving", "team-a")

        async def gone() -> bool:
            return bool(seen) and seen[-1] == {"deleted": True}

        await eventually(gone)
    finally:
        task.cancel()
    last = [p for p in seen if "status" in p][-1]
    assert last["metadata"]["uid"] == running["metadata"]["uid"] and last["metadata"]["deletionTimestamp"]
    assert last["status"]["phase"] == "Failed"
    assert last["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 143


async def test_pending_mode_and_image_pull_errors(cluster: SimCluster) -> None:
    assert cluster.admin is not None and cluster.kubelet is not None
    cluster.kubelet.auto_run = False
    await cluster.admin.create(kr.PODS, pod_on("slow", "cpu-1"))

    async def creating() -> bool:
        assert cluster.admin is not None
        st = (await cluster.admin.get(kr.PODS, "slow", "team-a"))["status"]
        return bool(st.get("containerStatuses", [{}])[0].get("state") == {"waiting": {"reason": "ContainerCreating"}})

    await eventually(creating)
    await cluster.kubelet.image_pull_error("team-a", "slow", "ImagePullBackOff")
    st = (await cluster.admin.get(kr.PODS, "slow", "team-a"))["status"]
    assert st["phase"] == "Pending"
    assert st["containerStatuses"][0]["state"]["waiting"] == {
        "reason": "ImagePullBackOff",
        "message": 'Back-off pulling image "busybox:1.36"',
    }
    await cluster.kubelet.start("team-a", "slow")
    await phase_of(cluster, "slow", "Running")


async def test_annotations_drive_a_pod_without_a_harness(cluster: SimCluster) -> None:
    assert cluster.admin is not None
    await cluster.admin.create(kr.PODS, pod_on("batch", "cpu-1", annotations={EXIT_CODE_ANNOTATION: "7"}))
    failed = await phase_of(cluster, "batch", "Failed")
    assert failed["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 7
    await cluster.admin.create(kr.PODS, pod_on("pull", "cpu-1", annotations={PULL_ERROR_ANNOTATION: "ErrImagePull"}))

    async def pull_error() -> bool:
        assert cluster.admin is not None
        st = (await cluster.admin.get(kr.PODS, "pull", "team-a"))["status"]
        waiting = st.get("containerStatuses", [{}])[0].get("state", {}).get("waiting", {})
        return bool(waiting.get("reason") == "ErrImagePull")

    await eventually(pull_error)


async def test_a_node_can_be_made_not_ready(cluster: SimCluster) -> None:
    assert cluster.admin is not None and cluster.kubelet is not None
    await cluster.kubelet.set_ready("cpu-1", False)
    node = await cluster.admin.get(kr.NODES, "cpu-1")
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "KubeletNotReady")
    before = cluster.kubelet.heartbeats

    async def beat() -> bool:
        return cluster.kubelet is not None and cluster.kubelet.heartbeats > before

    await eventually(beat)  # heartbeats keep it NotReady
    node = await cluster.admin.get(kr.NODES, "cpu-1")
    assert next(c for c in node["status"]["conditions"] if c["type"] == "Ready")["status"] == "False"


async def test_the_command_line_kubelet_registers_nodes_on_a_cluster(tmp_path: Path) -> None:
    node = copy.deepcopy(fixture_nodes()[0])
    node["metadata"]["name"] = "cli-node"
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump(node))
    server = KubeAPIServer(seed=3)
    await server.start("127.0.0.1", 0)
    try:
        write_kubeconfig(tmp_path / "kc", server.url, server.admin_token)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "sim.kubelet",
            "--kubeconfig",
            str(tmp_path / "kc"),
            "--nodes",
            str(tmp_path / "nodes.yaml"),
            "--heartbeat-interval",
            "0.2",
            cwd=REPO,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            async with KubeClient(server.url, server.admin_token) as c:

                async def lease() -> bool:
                    try:
                        await c.get(kr.LEASES, "cli-node", "kube-node-lease")
                    except KubeApiError:
                        return False
                    return True

                await eventually(lease, timeout_s=30)
                assert (await c.get(kr.NODES, "cli-node"))["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()[-2000:]
    finally:
        await server.stop()


async def test_a_deleted_node_is_registered_again(cluster: SimCluster) -> None:
    assert cluster.admin is not None
    admin = cluster.admin
    old = await admin.get(kr.NODES, "cpu-1")
    await admin.delete(kr.NODES, "cpu-1")

    async def back() -> JSON | None:
        try:
            node = await admin.get(kr.NODES, "cpu-1")
        except KubeApiError:
            return None
        return node if node["metadata"]["uid"] != old["metadata"]["uid"] else None

    again = await eventually(back)
    assert again["metadata"]["labels"] == old["metadata"]["labels"]
