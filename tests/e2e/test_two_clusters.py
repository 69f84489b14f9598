"""The fleet end to end: two clusters, one broker, the real extender and agent per cluster.

Cluster a has the most free GPUs in total but no rack with 8 free 8-GPU nodes; cluster b has one. An
8 x 8-GPU gang that requires one rack must land in b, go gated -> pinned -> ungated on Start -> bound on
exactly the assigned nodes (by node name: the nodes' hostname labels differ from their names), run and
succeed; a gang that fits nowhere says why per cluster; a dispatched gang whose pods stay pending shows
kube-scheduler's own message.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from broker.launcher.client import SubmitItem
from extender.podreq import pinned_node
from jsonlogs import FIXED_KEYS, JsonLineFormatter
from sim import kuberesources as kr
from tandem.v1 import job_pb2
from tests.broker.hub_builders import Broker, policy_doc, start_broker
from tests.e2e.fleet import (
    TENANT_NAMESPACE,
    Cluster,
    PodHistory,
    busy_pod,
    gang,
    gpu_node,
    start_cluster,
    wait_for,
    watch_pods,
)

pytestmark = pytest.mark.timeout(240)


def fleet_nodes() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    # a: 18 free 8-GPU nodes (144 GPUs) over three racks of 6: no rack holds 8 nodes.
    a = [gpu_node(f"node-a-{r}{i}", rack=f"r{r}") for r in range(1, 4) for i in range(6)]
    # b: 64 GPUs, all in rack r7.
    b = [gpu_node(f"node-b-{i:04d}", rack="r7") for i in range(8)]
    return a, b


REAL = os.environ.get("TANDEM_REAL_KUBECONFIG", "")
"""With it (`make e2e-real`), cluster b is that real control plane, a stays simulated: the same tests."""


@pytest.fixture(params=["simulated", *([pytest.param("real", marks=pytest.mark.realcluster)] if REAL else [])])
async def fleet(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[tuple[Broker, Cluster, Cluster]]:
    broker = await start_broker(tmp_path, policy=policy_doc(), heartbeat_interval_s=1.0)
    clusters: list[Cluster] = []
    try:
        a_nodes, b_nodes = fleet_nodes()
        clusters.append(await start_cluster("a", a_nodes, broker, tmp_path))
        clusters.append(
            await start_cluster(
                "b", b_nodes, broker, tmp_path, real_kubeconfig=REAL if request.param == "real" else None
            )
        )
        yield broker, clusters[0], clusters[1]
    finally:
        for c in clusters:
            await c.stop()
        await broker.close()


async def _job(broker: Broker, job_id: str) -> job_pb2.Job:
    return await broker.client("alpha").get(job_id)


async def test_the_gang_lands_in_the_cluster_with_a_rack_and_runs_to_success(
    fleet: tuple[Broker, Cluster, Cluster],
) -> None:
    broker, a, b = fleet
    history = PodHistory()
    watcher = asyncio.get_running_loop().create_task(watch_pods(b, history))
    procs = a.procs + b.procs
    broker_log = io.StringIO()  # the broker runs in this process: its log lines through the processes' format
    capture = logging.StreamHandler(broker_log)
    capture.setFormatter(JsonLineFormatter())
    logging.getLogger("tandem.broker").addHandler(capture)
    logging.getLogger("tandem.broker").setLevel(logging.INFO)
    try:
        client = broker.client("alpha")
        t0 = time.monotonic()
        [j] = await client.submit("run-1", [SubmitItem("k1", gang(8, 8))])
        job = await wait_for(lambda: _attempted(broker, j.job_id), 60, "the gang placed", procs)
        attempt = job.status.attempts[0]
        assert attempt.cluster == "b" and [s.value for s in attempt.domain.segments][-1] == "r7"
        assigned = {(p.pod_set, p.index): p.node for p in attempt.assignments}
        assert len(assigned) == 8 and len(set(assigned.values())) == 8

        admin = b.sim.client()
        name = f"{j.job_id}-1"

        async def all_bound() -> list[dict[str, Any]] | None:
            pods = (await admin.list(kr.PODS, TENANT_NAMESPACE, label_selector=f"tandem.dev/job={j.job_id}")).items
            return pods if len(pods) == 8 and all((p.get("spec") or {}).get("nodeName") for p in pods) else None

        pods = await wait_for(all_bound, 90, "all 8 pods bound", procs)
        bound_after_s = time.monotonic() - t0
        (k8s_job,) = (await admin.list(kr.JOBS, TENANT_NAMESPACE, label_selector=f"tandem.dev/job={j.job_id}")).items
        assert k8s_job["metadata"]["name"] == f"{name}-workers"
        assert (
            k8s_job["spec"]["completionMode"],
            k8s_job["spec"]["completions"],
            k8s_job["spec"]["parallelism"],
            k8s_job["spec"]["backoffLimit"],
            k8s_job["spec"]["podReplacementPolicy"],
        ) == ("Indexed", 8, 8, 0, "Failed")
        service = await admin.get(kr.Resource("v1", "services", "Service", True), name, TENANT_NAMESPACE)
        assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
        for pod in pods:
            labels = pod["metadata"]["labels"]
            key = (labels["tandem.dev/pod-set"], int(labels["batch.kubernetes.io/job-completion-index"]))
            assert pod["spec"]["nodeName"] == assigned[key] == pinned_node(pod)
            assert pod["spec"]["schedulerName"] == "tandem-scheduler"
            assert pod["spec"]["subdomain"] == name and pod["spec"]["priorityClassName"] == "tandem-gang"
            env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
            assert env["PET_NNODES"] == "8" and env["PET_NPROC_PER_NODE"] == "8"
            assert env["TANDEM_JOB_ID"] == j.job_id and env["TANDEM_ATTEMPT"] == "1"
        await wait_for(
            lambda: all(history.states.get(p["metadata"]["name"], [])[-1:] == ["bound"] for p in pods),
            10,
            "the watch saw every pod bound",
        )
        for pod in pods:  # never bound before its pin and its Start; never unpinned
            seq = history.states[pod["metadata"]["name"]]
            assert seq[0] == "gated" and seq[-1] == "bound", seq
            assert seq.index("gated+pinned") < seq.index("ungated+pinned") < seq.index("bound"), seq
        assert not await _agent_pods(a)  # nothing was created in cluster a

        for pod in pods:
            await b.sim.kubelet.start(TENANT_NAMESPACE, pod["metadata"]["name"])  # type: ignore[union-attr]
        await wait_for(lambda: _state_is(broker, j.job_id, job_pb2.JOB_STATE_RUNNING), 60, "job RUNNING", procs)
        job = await _job(broker, j.job_id)
        attempt = job.status.attempts[0]
        assert attempt.rendezvous_address.startswith(f"{name}-workers-0.{name}:")
        assert {r.node for r in attempt.replicas} == set(assigned.values())
        for pod in pods:
            await b.sim.kubelet.complete(TENANT_NAMESPACE, pod["metadata"]["name"], 0)  # type: ignore[union-attr]
        await wait_for(lambda: _state_is(broker, j.job_id, job_pb2.JOB_STATE_SUCCEEDED), 60, "job SUCCEEDED", procs)
        print(f"submit to all 8 pods bound: {bound_after_s:.2f} s")

        # One correlation id from submission to the pods: the job id, logged under "job" by both processes.
        assert all(p["metadata"]["labels"]["tandem.dev/job"] == j.job_id for p in pods)
        said = [line for line in _json_lines(broker_log.getvalue()) if line.get("job") == j.job_id]
        assert {"job submitted", "job reserved", "job state changed"} <= {line["message"] for line in said}
        assert [line["state"] for line in said if line["message"] == "job state changed"][-1] == "SUCCEEDED"
        agent_said = [
            line
            for proc in b.agents
            for line in _json_lines(proc.log.read_text(errors="replace"))
            if line.get("job") == j.job_id
        ]
        assert {"dispatch accepted", "gang started"} <= {line["message"] for line in agent_said}
        assert {line["attempt"] for line in agent_said if line["message"] == "dispatch accepted"} == {1}
    finally:
        watcher.cancel()
        logging.getLogger("tandem.broker").removeHandler(capture)


def _json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON log lines of a process's output, each with the fixed keys (other output is not a log line)."""
    out = []
    for raw in text.splitlines():
        if raw.startswith("{"):
            line = json.loads(raw)
            assert list(line)[:4] == list(FIXED_KEYS), line
            out.append(line)
    return out


async def _agent_pods(c: Cluster) -> list[dict[str, Any]]:
    return (await c.sim.client().list(kr.PODS, TENANT_NAMESPACE)).items


async def _attempted(broker: Broker, job_id: str) -> job_pb2.Job | None:
    job = await _job(broker, job_id)
    return job if job.status.attempts else None


async def _state_is(broker: Broker, job_id: str, state: int) -> bool:
    return (await _job(broker, job_id)).status.state == state


async def test_a_gang_that_fits_nowhere_now_says_why_in_each_cluster(fleet: tuple[Broker, Cluster, Cluster]) -> None:
    """Other work holds three of b's nodes: neither cluster has a rack with 8 free nodes now (the gang would
    fit b empty, so it is queued, not refused); each cluster's verdict comes from the core's own fit."""
    broker, a, b = fleet
    for i in range(3):
        await b.sim.apply(busy_pod(f"inference-{i}", f"node-b-{i:04d}", 8))
        await b.sim.kubelet.start("default", f"inference-{i}")  # type: ignore[union-attr]
    await wait_for(lambda: _free_gpus(broker, "b") == 40, 30, "b's report shows the busy nodes", b.procs)
    client = broker.client("alpha")
    [j] = await client.submit("run-2", [SubmitItem("k2", gang(8, 8))])
    assert j.job_id, j

    async def verdicts() -> dict[str, job_pb2.ClusterVerdict] | None:
        job = await _job(broker, j.job_id)
        got = {v.cluster: v for v in job.status.queue_info.clusters}
        return got if set(got) == {"a", "b"} else None

    got = await wait_for(verdicts, 30, "a verdict per cluster", a.procs + b.procs)
    assert got["a"].reason == job_pb2.CLUSTER_VERDICT_REASON_TOPOLOGY_FRAGMENTED  # 18 free nodes, 6 per rack
    assert got["b"].reason == job_pb2.CLUSTER_VERDICT_REASON_INSUFFICIENT_CAPACITY  # 5 free in r7
    assert "rack" in got["a"].message and "room for 6 replicas" in got["a"].message and "needs 8" in got["a"].message
    assert "room for 5 replicas" in got["b"].message
    assert (await _job(broker, j.job_id)).status.state == job_pb2.JOB_STATE_QUEUED


def _free_gpus(broker: Broker, cluster: str) -> int:
    entry = broker.hub.catalog.clusters.get(cluster)
    if entry is None or entry.arrays is None:
        return -1
    return int(entry.arrays.eff_free_gpu().sum())


async def test_a_dispatched_gang_whose_pods_stay_pending_shows_kube_schedulers_message(
    fleet: tuple[Broker, Cluster, Cluster],
) -> None:
    """Tandem does not model ephemeral storage; kube-scheduler does: the pod is placed by the broker and
    refused by kube-scheduler's own filter, whose message (with the extender's) reaches GetJob."""
    broker, a, b = fleet
    client = broker.client("alpha")
    spec = gang(1, 8, level="", extra={"ephemeral-storage": "5000Gi"})
    [j] = await client.submit("run-3", [SubmitItem("k3", spec)])

    async def explained() -> str | None:
        job = await _job(broker, j.job_id)
        return job.status.message if "ephemeral-storage" in job.status.message else None

    message = await wait_for(explained, 60, "kube-scheduler's message in GetJob", a.procs + b.procs)
    assert "0/" in message and "nodes are available" in message and "Insufficient ephemeral-storage" in message
