"""Preemption end to end through the real agent and extender on a simulated control plane: a higher band's
gang takes a rack from a preemptible one. The victim's pods get their grace period (they are Terminating
meanwhile and the preemptor is not dispatched) while the cluster holds the preemptor's nodes (a GPU pod
outside Tandem scheduled then never lands on them), then the victim's Job and pods are gone, it is re-queued
without spending a retry, and the preemptor's gang binds on exactly the freed nodes."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from broker.config import FairnessConfig
from broker.launcher.client import SubmitItem
from sim import kuberesources as kr
from sim.kubeclient import KubeApiError
from tandem.v1 import job_pb2
from tests.broker.hub_builders import Broker, policy_doc, start_broker
from tests.e2e.fleet import Cluster, gang, gpu_node, start_cluster, wait_for

pytestmark = pytest.mark.timeout(240)

GRACE_S = 3.0


async def _job(broker: Broker, job_id: str) -> job_pb2.Job:
    return await broker.client("admin").get(job_id)


async def _pods(c: Cluster, ns: str, job_id: str) -> list[dict[str, Any]]:
    return (await c.sim.client().list(kr.PODS, ns, label_selector=f"tandem.dev/job={job_id}")).items


async def _bound(c: Cluster, ns: str, job_id: str, n: int) -> list[dict[str, Any]] | None:
    pods = await _pods(c, ns, job_id)
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    return live if len(live) == n and all(p["spec"].get("nodeName") for p in live) else None


async def test_a_higher_band_takes_the_rack_after_the_victims_grace(tmp_path: Path) -> None:
    doc = policy_doc()
    doc["priority_bands"] = {"default": 0, "high": 100}
    broker = await start_broker(
        tmp_path, policy=doc, heartbeat_interval_s=1.0, grace_period_s=GRACE_S, fairness=FairnessConfig(interval_s=0.2)
    )
    nodes = [gpu_node(f"node-{i}", rack="r1") for i in range(2)]
    c = await start_cluster("a", nodes, broker, tmp_path, tenants={"alpha": ["team-a"], "beta": ["team-b"]})
    assert c.sim.kubelet is not None
    c.sim.kubelet.termination_delay_s = GRACE_S  # containers take the whole grace period to stop
    procs = c.procs
    try:
        low = gang(2, 8)
        low.preemptible = True
        [v] = await broker.client("beta").submit("low", [SubmitItem("k1", low)])
        pods = await wait_for(lambda: _bound(c, "team-b", v.job_id, 2), 60, "the victim's pods bound", procs)
        for p in pods:
            await c.sim.kubelet.start("team-b", p["metadata"]["name"])
        await wait_for(lambda: _is(broker, v.job_id, job_pb2.JOB_STATE_RUNNING), 60, "victim RUNNING", procs)
        victim_nodes = sorted(p["spec"]["nodeName"] for p in pods)

        high = gang(2, 8)
        high.priority_band = "high"
        [p] = await broker.client("alpha").submit("high", [SubmitItem("k2", high)])
        await wait_for(lambda: _is(broker, v.job_id, job_pb2.JOB_STATE_PREEMPTED), 30, "victim PREEMPTED", procs)
        t_preempt = time.monotonic()

        async def terminating() -> bool:
            return any(x["metadata"].get("deletionTimestamp") for x in await _pods(c, "team-b", v.job_id))

        await wait_for(terminating, 30, "the victim's pods terminating", procs)
        assert (await _job(broker, p.job_id)).status.state == job_pb2.JOB_STATE_QUEUED  # not dispatched meanwhile
        # the cluster keeps the preemptor's nodes meanwhile: a hold its extender honours (F-5) …
        hold_name = f"{p.job_id}-1-hold"

        async def hold() -> dict[str, Any] | None:
            return await _get(c, kr.CONFIG_MAPS, hold_name, "tandem-system")

        held = await wait_for(hold, 30, "the hold written", procs)
        assert held["data"]["hold"] == "true" and held["data"]["job"] == p.job_id
        assert sorted(json.loads(held["data"]["pod_sets"])[0]["nodes"]) == victim_nodes
        # … so a GPU pod outside Tandem, scheduled meanwhile, never lands on them
        await c.sim.client().create(kr.PODS, _intruder(), "default")

        async def gone() -> bool:
            jobs = (await c.sim.client().list(kr.JOBS, "team-b", label_selector=f"tandem.dev/job={v.job_id}")).items
            return not jobs and not await _pods(c, "team-b", v.job_id)

        await wait_for(gone, 60, "the victim's Job and pods gone", procs)
        assert time.monotonic() - t_preempt >= GRACE_S * 0.9  # the pods had their grace period
        placed = await wait_for(lambda: _bound(c, "team-a", p.job_id, 2), 90, "the preemptor's pods bound", procs)
        assert sorted(x["spec"]["nodeName"] for x in placed) == victim_nodes
        intruder = await c.sim.client().get(kr.PODS, "intruder", "default")
        assert intruder is not None and not intruder["spec"].get("nodeName")  # kept off the held nodes
        await wait_for(lambda: _gone_hold(c, hold_name), 30, "the hold replaced by the dispatch", procs)
        victim = await _job(broker, v.job_id)
        assert victim.status.state == job_pb2.JOB_STATE_QUEUED and victim.status.infra_retries == 0
        assert victim.status.attempts[0].outcome == job_pb2.ATTEMPT_OUTCOME_PREEMPTED
        why = [h.message for h in victim.status.history if h.to_state == job_pb2.JOB_STATE_PREEMPTED]
        assert why == ["preempted: a job of a higher priority band needed the GPUs"]  # never who took them
    finally:
        await c.stop()
        await broker.close()


def _intruder() -> dict[str, Any]:
    """A GPU pod that is no Tandem job's, scheduled by the same scheduler (and extender) as the gangs."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "intruder", "namespace": "default"},
        "spec": {
            "schedulerName": "tandem-scheduler",
            "restartPolicy": "Never",
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example.com/notebook:1",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }


async def _get(c: Cluster, res: kr.Resource, name: str, namespace: str) -> dict[str, Any] | None:
    try:
        return await c.sim.client().get(res, name, namespace)
    except KubeApiError as e:
        if e.code == 404:
            return None
        raise


async def _gone_hold(c: Cluster, name: str) -> bool:
    return await _get(c, kr.CONFIG_MAPS, name, "tandem-system") is None


async def _is(broker: Broker, job_id: str, state: int) -> bool:
    return (await _job(broker, job_id)).status.state == state
