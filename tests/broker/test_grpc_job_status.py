"""GetJob over real gRPC: replicas from the agents' WorkloadStatus, rendezvous address, log links, scheduling feedback."""

from __future__ import annotations

import time

import pytest

from broker.launcher.client import SubmitItem
from tandem.v1 import cluster_service_pb2 as cs
from tandem.v1 import common_pb2, job_pb2
from tests.broker.hub_builders import Broker, broker, eventually, node, spec, start_broker  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(60)

LOGS = ("logs", "https://logs.example.com/{cluster}/{namespace}/{pod}?job={job}&attempt={attempt}&node={node}")
DASHBOARD = ("dashboard", "https://grafana.example.com/d/{cluster}?var-workload={workload}")


def _replica(
    index: int,
    phase: int,
    *,
    pod: str = "",
    node_name: str = "",
    exit_code: int | None = None,
    reason: str = "",
    message: str = "",
) -> common_pb2.ReplicaStatus:
    r = common_pb2.ReplicaStatus(
        pod_set="workers", index=index, pod_name=pod, node=node_name, phase=phase, reason=reason, message=message
    )
    if exit_code is not None:
        r.exit_code = exit_code
    return r


async def test_get_job_shows_replicas_rendezvous_links_and_feedback(broker: Broker) -> None:
    agent = broker.agent("c1")
    await agent.connect([node("n1"), node("n2"), node("n3")], log_templates=[LOGS, DASHBOARD])
    c = broker.client("alpha")
    s = spec(gpus=8, replicas=2, level="rack")
    s.framework = job_pb2.FRAMEWORK_TORCHRUN
    [res] = await c.submit("status", [SubmitItem("k1", s)])
    job_id = res.job_id
    d = await agent.expect("dispatch")
    agent.accept(d, namespace="team-a")
    pods = [f"{job_id}-1-workers-{i}" for i in range(2)]
    agent.workload(
        job_id,
        1,
        cs.WORKLOAD_PHASE_GATED,
        [_replica(i, common_pb2.REPLICA_PHASE_GATED, pod=pods[i]) for i in range(2)],
        namespace="team-a",
    )
    await agent.expect("start")
    # Gates lifted; replica 1 waits: the extender refused nodes for it.
    agent.feedback(
        job_id,
        1,
        "workers",
        1,
        pods[1],
        time.time(),
        refused=[
            ("n3", [common_pb2.FIT_REASON_INSUFFICIENT_GPUS], "needs 8 GPUs, 0 free"),
            ("n4", [common_pb2.FIT_REASON_NOT_READY, common_pb2.FIT_REASON_CORDONED], ""),
        ],
        fits=["n2"],
    )

    async def waiting() -> job_pb2.Job | None:
        job = await c.get(job_id)
        return job if "waiting for kube-scheduler" in job.status.message else None

    job = await eventually(waiting)
    assert job.status.state == job_pb2.JOB_STATE_STARTING
    assert job.status.message == (
        f"waiting for kube-scheduler: workers-1 ({pods[1]}): "
        "n3: INSUFFICIENT_GPUS (needs 8 GPUs, 0 free); n4: NOT_READY+CORDONED; 1 nodes fit"
    )
    [a] = job.status.attempts
    assert a.rendezvous_address == f"{job_id}-1-workers-0.{job_id}-1.team-a.svc:29500"
    assert [(r.pod_name, r.phase) for r in a.replicas] == [(p, common_pb2.REPLICA_PHASE_GATED) for p in pods]

    agent.workload(
        job_id,
        1,
        cs.WORKLOAD_PHASE_RUNNING,
        [
            _replica(0, common_pb2.REPLICA_PHASE_RUNNING, pod=pods[0], node_name="n1"),
            _replica(1, common_pb2.REPLICA_PHASE_RUNNING, pod=pods[1], node_name="n2"),
        ],
        namespace="team-a",
    )
    await eventually(lambda: _state_is(c, job_id, job_pb2.JOB_STATE_RUNNING))
    job = await c.get(job_id)
    assert "waiting for kube-scheduler" not in job.status.message  # no longer what it waits on
    agent.workload(
        job_id,
        1,
        cs.WORKLOAD_PHASE_FAILED,
        [
            _replica(
                0,
                common_pb2.REPLICA_PHASE_FAILED,
                pod=pods[0],
                node_name="n1",
                exit_code=137,
                reason="OOMKilled",
                message="container main used 81 GiB",
            ),
            _replica(1, common_pb2.REPLICA_PHASE_SUCCEEDED, pod=pods[1], node_name="n2", exit_code=0),
        ],
        namespace="team-a",
        outcome=job_pb2.ATTEMPT_OUTCOME_APP_FAILED,
        exit_code=137,
    )
    await eventually(lambda: _state_is(c, job_id, job_pb2.JOB_STATE_FAILED))
    [a] = (await c.get(job_id)).status.attempts
    assert [(r.index, r.pod_name, r.node, r.phase, r.exit_code, r.reason) for r in a.replicas] == [
        (0, pods[0], "n1", common_pb2.REPLICA_PHASE_FAILED, 137, "OOMKilled"),
        (1, pods[1], "n2", common_pb2.REPLICA_PHASE_SUCCEEDED, 0, ""),
    ]
    assert a.replicas[0].message == "container main used 81 GiB"
    assert (a.outcome, a.exit_code) == (job_pb2.ATTEMPT_OUTCOME_APP_FAILED, 137)
    links = [(ll.name, ll.url, ll.pod_set, ll.index if ll.HasField("index") else None) for ll in a.log_links]
    assert links == [
        ("logs", f"https://logs.example.com/c1/team-a/{pods[0]}?job={job_id}&attempt=1&node=n1", "workers", 0),
        ("logs", f"https://logs.example.com/c1/team-a/{pods[1]}?job={job_id}&attempt=1&node=n2", "workers", 1),
        ("dashboard", f"https://grafana.example.com/d/c1?var-workload={job_id}-1", "", None),
    ]
    await agent.close()


async def test_agent_rendezvous_wins_and_stale_attempt_status_is_ignored(broker: Broker) -> None:
    agent = broker.agent("c1")
    await agent.connect([node("n1")])
    c = broker.client("alpha")
    [res] = await c.submit("rdzv", [SubmitItem("k1", spec(gpus=8))])
    d = await agent.expect("dispatch")
    agent.accept(d, namespace="ns")
    pod = f"{res.job_id}-1-workers-0"
    agent.workload(
        res.job_id,
        2,
        cs.WORKLOAD_PHASE_GATED,  # an attempt that does not exist: fenced off
        [_replica(0, common_pb2.REPLICA_PHASE_GATED, pod="intruder")],
        rendezvous="evil:1",
    )
    agent.workload(
        res.job_id,
        1,
        cs.WORKLOAD_PHASE_GATED,
        [_replica(0, common_pb2.REPLICA_PHASE_GATED, pod=pod)],
        namespace="ns",
        rendezvous="head.ns.svc.cluster.local:6000",
    )
    await agent.expect("start")
    [a] = (await c.get(res.job_id)).status.attempts
    assert a.rendezvous_address == "head.ns.svc.cluster.local:6000"
    assert [r.pod_name for r in a.replicas] == [pod]
    assert not a.log_links  # this cluster published no templates
    await agent.close()


async def _state_is(c, job_id: str, state: int) -> bool:  # type: ignore[no-untyped-def]
    return (await c.get(job_id)).status.state == state
