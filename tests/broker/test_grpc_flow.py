"""End to end over real gRPC on loopback: launcher client -> broker -> scripted agent and back."""

from __future__ import annotations

import pytest

from broker.launcher.client import SubmitItem
from tandem.v1 import cluster_service_pb2 as cs
from tandem.v1 import job_pb2
from tests.broker.hub_builders import Broker, broker, eventually, node, spec  # noqa: F401

pytestmark = pytest.mark.timeout(60)


async def _state(b: Broker, job_id: str) -> int:
    job = await b.client("admin").get(job_id)
    return job.status.state


async def test_submit_reserve_dispatch_accept_start_run_succeed(broker: Broker) -> None:
    agent = broker.agent("c1")
    await agent.connect([node("n1"), node("n2")])
    c = broker.client("alpha")
    [res] = await c.submit("run-1", [SubmitItem("k1", spec(gpus=8, replicas=2, level="rack"))])
    assert res.job_id and not res.error_code
    d = await agent.expect("dispatch")
    assert (d.attempt.job_id, d.attempt.attempt) == (res.job_id, 1)
    assert d.tenant == "alpha"
    assert sorted(n.node for n in d.pod_sets[0].nodes) == ["n1", "n2"]
    assert [s.value for s in d.domain.segments] == ["z1", "r1"]
    job = await c.get(res.job_id)
    assert job.status.state in (job_pb2.JOB_STATE_RESERVED, job_pb2.JOB_STATE_DISPATCHED)
    assert job.status.attempts[0].cluster == "c1"
    agent.accept(d)
    agent.status(res.job_id, 1, cs.WORKLOAD_PHASE_GATED, replicas=2)
    start = await agent.expect("start")
    assert (start.attempt.job_id, start.attempt.attempt) == (res.job_id, 1)
    agent.status(res.job_id, 1, cs.WORKLOAD_PHASE_RUNNING, replicas=2, running=2)
    await eventually(lambda: _is(broker, res.job_id, job_pb2.JOB_STATE_RUNNING))
    agent.status(
        res.job_id, 1, cs.WORKLOAD_PHASE_SUCCEEDED, replicas=2, running=2, outcome=job_pb2.ATTEMPT_OUTCOME_SUCCEEDED
    )
    await eventually(lambda: _is(broker, res.job_id, job_pb2.JOB_STATE_SUCCEEDED))
    job = await c.get(res.job_id)
    states = [h.to_state for h in job.status.history]
    assert states == [
        job_pb2.JOB_STATE_QUEUED,
        job_pb2.JOB_STATE_RESERVED,
        job_pb2.JOB_STATE_DISPATCHED,
        job_pb2.JOB_STATE_ACCEPTED,
        job_pb2.JOB_STATE_STARTING,
        job_pb2.JOB_STATE_RUNNING,
        job_pb2.JOB_STATE_SUCCEEDED,
    ]
    assert job.status.attempts[0].outcome == job_pb2.ATTEMPT_OUTCOME_SUCCEEDED
    await agent.close()


async def _is(b: Broker, job_id: str, state: int) -> bool:
    return await _state(b, job_id) == state


async def test_node_level_facts_decide_not_cluster_sums(broker: Broker) -> None:
    # c-frag has 16 free GPUs as 2 per node: no node can hold a pod of 8. c-whole has one 8-GPU node free.
    frag = broker.agent("c-frag")
    await frag.connect([node(f"f{i}", gpus=8, free=2) for i in range(8)])
    whole = broker.agent("c-whole")
    await whole.connect([node("w1", gpus=8, free=8)])
    c = broker.client("alpha")
    [res] = await c.submit("run-2", [SubmitItem("k", spec(gpus=8, replicas=1))])
    d = await whole.expect("dispatch")
    assert d.attempt.job_id == res.job_id
    assert frag.inbox.empty() or all(m.WhichOneof("body") != "dispatch" for m in list(frag.inbox._queue))  # type: ignore[attr-defined]
    await frag.close()
    await whole.close()


async def test_gang_needing_one_rack_goes_where_one_rack_holds_it(broker: Broker) -> None:
    # c-spread: 4 free nodes but in 4 racks; c-rack: 4 free nodes in one rack.
    spread = broker.agent("c-spread")
    await spread.connect([node(f"s{i}", rack=f"r{i}") for i in range(4)])
    rack = broker.agent("c-rack")
    await rack.connect([node(f"r{i}", rack="rA") for i in range(4)])
    c = broker.client("alpha")
    [res] = await c.submit("run-3", [SubmitItem("k", spec(gpus=8, replicas=4, level="rack"))])
    d = await rack.expect("dispatch")
    assert d.attempt.job_id == res.job_id
    assert sum(n.replicas for n in d.pod_sets[0].nodes) == 4
    await spread.close()
    await rack.close()


async def test_rejected_dispatch_is_replanned_elsewhere(broker: Broker) -> None:
    a = broker.agent("ca")
    await a.connect([node("a1")])
    c = broker.client("alpha")
    [res] = await c.submit("run-4", [SubmitItem("k", spec(gpus=8))])
    d1 = await a.expect("dispatch")
    b = broker.agent("cb")
    await b.connect([node("b1")])
    await eventually(lambda: "cb" in broker.hub.catalog.clusters and broker.hub.catalog.clusters["cb"].has_snapshot)
    a.reject(d1, ["a1"])
    d2 = await b.expect("dispatch")
    assert (d2.attempt.job_id, d2.attempt.attempt) == (res.job_id, 2)
    job = await c.get(res.job_id)
    assert job.status.attempts[0].outcome == job_pb2.ATTEMPT_OUTCOME_REJECTED
    assert list(job.status.attempts[0].rejection.nodes) == ["a1"]
    await a.close()
    await b.close()


async def test_rejection_excludes_named_nodes_until_newer_report(broker: Broker) -> None:
    a = broker.agent("ca")
    await a.connect([node("a1"), node("a2", rack="r2")])
    c = broker.client("alpha")
    [res] = await c.submit("run-5", [SubmitItem("k", spec(gpus=8))])
    d1 = await a.expect("dispatch")
    first = d1.pod_sets[0].nodes[0].node
    a.reject(d1, [first])
    d2 = await a.expect("dispatch")
    assert d2.attempt.attempt == 2
    assert d2.pod_sets[0].nodes[0].node != first
    await a.close()


async def test_report_showing_reservation_bound_is_not_double_counted(broker: Broker) -> None:
    a = broker.agent("ca")
    await a.connect([node("a1"), node("a2", rack="r2")])
    c = broker.client("alpha")
    [r1] = await c.submit("run-6", [SubmitItem("k1", spec(gpus=8))])
    d = await a.expect("dispatch")
    used = d.pod_sets[0].nodes[0].node
    other = "a2" if used == "a1" else "a1"
    # The report shows the replica bound: the node is now full in the inventory itself.
    a.snapshot(
        [node(used, free=0, rack="r1" if used == "a1" else "r2"), node(other, rack="r1" if other == "a1" else "r2")],
        bound=[(r1.job_id, 1, "workers", 0, used)],
    )
    await eventually(lambda: broker.hub.catalog.clusters["ca"].sequence == 2)
    # If the reservation were subtracted again, the free node would look taken and a second job would wait.
    [r2] = await c.submit("run-6", [SubmitItem("k2", spec(gpus=8))])
    d2 = await a.expect("dispatch")
    assert d2.attempt.job_id == r2.job_id and d2.pod_sets[0].nodes[0].node == other
    # And the reservation still holds what is not yet bound: a third 8-GPU job waits.
    [r3] = await c.submit("run-6", [SubmitItem("k3", spec(gpus=8))])
    await eventually(lambda: r3.job_id in broker.hub.placer.book.waits)
    assert broker.hub.placer.book.waits[r3.job_id].reason.value == "INSUFFICIENT_CAPACITY"
    await a.close()


async def test_stale_attempt_status_is_ignored(broker: Broker) -> None:
    a = broker.agent("ca")
    await a.connect([node("a1"), node("a2", rack="r2")])
    c = broker.client("alpha")
    [res] = await c.submit("run-7", [SubmitItem("k", spec(gpus=8))])
    d1 = await a.expect("dispatch")
    a.reject(d1, [d1.pod_sets[0].nodes[0].node])
    d2 = await a.expect("dispatch")
    assert d2.attempt.attempt == 2
    # A late status for attempt 1 must not move the job.
    a.status(res.job_id, 1, cs.WORKLOAD_PHASE_SUCCEEDED, outcome=job_pb2.ATTEMPT_OUTCOME_SUCCEEDED)
    a.accept(d2)
    await eventually(lambda: _is(broker, res.job_id, job_pb2.JOB_STATE_ACCEPTED))
    job = await c.get(res.job_id)
    assert job.status.current_attempt == 2
    await a.close()


async def test_cancel_reaches_cluster_and_stays_cancelling_until_confirmed(broker: Broker) -> None:
    a = broker.agent("ca")
    await a.connect([node("a1")])
    c = broker.client("alpha")
    [res] = await c.submit("run-8", [SubmitItem("k", spec(gpus=8))])
    d = await a.expect("dispatch")
    a.accept(d)
    await eventually(lambda: _is(broker, res.job_id, job_pb2.JOB_STATE_ACCEPTED))
    resp = await c.cancel(res.job_id, "no longer needed")
    assert resp.state == job_pb2.JOB_STATE_CANCELLING
    cancel = await a.expect("cancel")
    assert (cancel.attempt.job_id, cancel.attempt.attempt) == (res.job_id, 1)
    assert await _state(broker, res.job_id) == job_pb2.JOB_STATE_CANCELLING
    a.cancel_ack(res.job_id, 1)
    await eventually(lambda: _is(broker, res.job_id, job_pb2.JOB_STATE_CANCELLED))
    await a.close()


async def test_cordoned_cluster_gets_nothing_new(broker: Broker) -> None:
    a = broker.agent("ca")
    await a.connect([node("a1")])
    admin = broker.client("admin")
    summary = await admin.cordon("ca", "maintenance")
    assert summary.cordoned
    c = broker.client("alpha")
    [res] = await c.submit("run-9", [SubmitItem("k", spec(gpus=8))])
    await eventually(lambda: res.job_id in broker.hub.placer.book.waits)
    job = await c.get(res.job_id)
    assert job.status.state == job_pb2.JOB_STATE_QUEUED
    assert job.status.queue_info.reason == job_pb2.WAIT_REASON_CLUSTERS_CORDONED
    await admin.cordon("ca", "done", on=False)
    d = await a.expect("dispatch")
    assert d.attempt.job_id == res.job_id
    await a.close()


async def test_cancel_job_set_reaches_every_cluster(broker: Broker) -> None:
    a = broker.agent("ca")
    await a.connect([node("a1"), node("a2", rack="r2")])
    c = broker.client("alpha")
    r1, r2, r3 = await c.submit("set-x", [SubmitItem(f"k{i}", spec(gpus=8)) for i in range(3)])
    for _ in range(2):
        a.accept(await a.expect("dispatch"))
    await eventually(lambda: _is(broker, r1.job_id, job_pb2.JOB_STATE_ACCEPTED))
    await eventually(lambda: _is(broker, r2.job_id, job_pb2.JOB_STATE_ACCEPTED))
    resp = await c.cancel_set("set-x", "sweep")
    assert sorted(resp.cancelled_job_ids) == sorted([r1.job_id, r2.job_id, r3.job_id])
    assert await _state(broker, r3.job_id) == job_pb2.JOB_STATE_CANCELLED  # never placed: done at once
    cancels = {(await a.expect("cancel")).attempt.job_id for _ in range(2)}
    assert cancels == {r1.job_id, r2.job_id}
    assert await _state(broker, r1.job_id) == job_pb2.JOB_STATE_CANCELLING
    for job_id in cancels:
        a.cancel_ack(job_id, 1)
    await eventually(lambda: _is(broker, r1.job_id, job_pb2.JOB_STATE_CANCELLED))
    await eventually(lambda: _is(broker, r2.job_id, job_pb2.JOB_STATE_CANCELLED))
    await a.close()


async def test_reconnect_fences_replaced_attempts(broker: Broker) -> None:
    a = broker.agent("ca")
    await a.connect([node("a1"), node("a2", rack="r2")])
    c = broker.client("alpha")
    [res] = await c.submit("run-f", [SubmitItem("k", spec(gpus=8))])
    d1 = await a.expect("dispatch")
    a.reject(d1, [d1.pod_sets[0].nodes[0].node])
    d2 = await a.expect("dispatch")
    a.accept(d2)
    await eventually(lambda: _is(broker, res.job_id, job_pb2.JOB_STATE_ACCEPTED))
    await a.close()
    again = broker.agent("ca")
    welcome = await again.connect([node("a1"), node("a2", rack="r2")], known=[(res.job_id, 1), (res.job_id, 2)])
    assert [(x.job_id, x.attempt) for x in welcome.obsolete_attempts] == [(res.job_id, 1)]
    assert [(x.job_id, x.attempt) for x in welcome.current_attempts] == [(res.job_id, 2)]
    await again.close()


async def test_health_and_reflection(broker: Broker) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    async with grpc.aio.insecure_channel(broker.tenant_addr) as ch:
        resp = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service="tandem.v1.JobService"))
        assert resp.status == health_pb2.HealthCheckResponse.SERVING

        async def ask():  # type: ignore[no-untyped-def]
            yield reflection_pb2.ServerReflectionRequest(list_services="")

        async for answer in reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(ask()):
            names = {s.name for s in answer.list_services_response.service}
            assert {"tandem.v1.JobService", "tandem.v1.ClusterService", "grpc.health.v1.Health"} <= names
            break


async def test_agent_messages_are_acknowledged_cumulatively_once_processed(broker: Broker) -> None:
    a = broker.agent("ca")
    await a.connect([node("a1"), node("a2", rack="r2")])
    c = broker.client("alpha")
    jobs = await c.submit("acks", [SubmitItem(f"k{i}", spec(gpus=8)) for i in range(2)])
    for _ in range(2):
        a.accept(await a.expect("dispatch"))
    last = a.seq

    async def acked() -> bool:
        while True:
            ack = await a.expect("ack")
            if ack.acked_agent_sequence == last:
                return True
            assert ack.acked_agent_sequence < last

    assert await acked()
    # Acknowledged means committed: both accepts are in the store.
    for r in jobs:
        assert await _state(broker, r.job_id) == job_pb2.JOB_STATE_ACCEPTED
    await a.close()
