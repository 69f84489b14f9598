"""Failure paths over real gRPC with an injected clock: stale clusters, LOST, gang deadlines, restarts, watch resume."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from broker.launcher.client import BrokerClient, SubmitItem
from tandem.v1 import cluster_service_pb2 as cs
from tandem.v1 import common_pb2, job_pb2
from tandem.v1 import job_service_pb2 as svc
from tests.broker.hub_builders import Broker, eventually, node, spec, start_broker

pytestmark = pytest.mark.timeout(60)


class FakeClock:
    def __init__(self) -> None:
        self.t = time.time()

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


async def _state(b: Broker, job_id: str) -> int:
    return (await b.client("admin").get(job_id)).status.state


def _is(b: Broker, job_id: str, state: int):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return await _state(b, job_id) == state

    return check


async def _running(b: Broker, agent, job_id: str, replicas: int = 1):  # type: ignore[no-untyped-def]
    d = await agent.expect("dispatch")
    agent.accept(d)
    agent.status(job_id, d.attempt.attempt, cs.WORKLOAD_PHASE_GATED, replicas=replicas)
    await agent.expect("start")
    agent.status(job_id, d.attempt.attempt, cs.WORKLOAD_PHASE_RUNNING, replicas=replicas, running=replicas)
    await eventually(_is(b, job_id, job_pb2.JOB_STATE_RUNNING))
    return d


async def test_stale_cluster_is_excluded_and_unstarted_work_replanned(tmp_path: Path) -> None:
    clock = FakeClock()
    b = await start_broker(tmp_path, clock=clock, cluster_stale_after_s=30, lost_after_s=60)
    try:
        c1 = b.agent("c1")
        await c1.connect([node("n1")])
        c = b.client("alpha")
        [j] = await c.submit("s", [SubmitItem("k", spec(gpus=8))])
        d1 = await c1.expect("dispatch")
        c2 = b.agent("c2")
        await c2.connect([node("m1")])
        clock.advance(31)
        c2.heartbeat()
        await eventually(lambda: b.hub.catalog.clusters["c2"].last_seen == clock.t)
        await b.hub.dispatcher.watchdog.sweep()
        d2 = await c2.expect("dispatch")
        assert (d2.attempt.job_id, d2.attempt.attempt) == (j.job_id, 2)
        cancel = await c1.expect("cancel")  # the replaced attempt is ordered away where it was
        assert cancel.attempt.attempt == d1.attempt.attempt
        job = await c.get(j.job_id)
        assert job.status.attempts[0].outcome == job_pb2.ATTEMPT_OUTCOME_LOST
        # The stale cluster is excluded, never counted as empty: a job only it could hold waits.
        [only_c1] = await c.submit("s", [SubmitItem("k2", spec(gpus=8, clusters=["c1"]))])
        await eventually(lambda: only_c1.job_id in b.hub.placer.book.waits)
        assert b.hub.placer.book.waits[only_c1.job_id].reason.value == "NO_FRESH_INVENTORY"
        await c1.close()
        await c2.close()
    finally:
        await b.close()


async def test_running_job_on_silent_cluster_becomes_lost_then_recovers(tmp_path: Path) -> None:
    clock = FakeClock()
    b = await start_broker(tmp_path, clock=clock, cluster_stale_after_s=30, lost_after_s=60)
    try:
        a = b.agent("c1")
        await a.connect([node("n1")])
        c = b.client("alpha")
        [j] = await c.submit("s", [SubmitItem("k", spec(gpus=8))])
        await _running(b, a, j.job_id)
        clock.advance(31)
        await b.hub.dispatcher.watchdog.sweep()
        assert await _state(b, j.job_id) == job_pb2.JOB_STATE_RUNNING  # running work keeps running
        clock.advance(60)
        await b.hub.dispatcher.watchdog.sweep()
        assert await _state(b, j.job_id) == job_pb2.JOB_STATE_LOST
        a.status(j.job_id, 1, cs.WORKLOAD_PHASE_RUNNING, replicas=1, running=1)
        await eventually(_is(b, j.job_id, job_pb2.JOB_STATE_RUNNING))
        await a.close()
    finally:
        await b.close()


async def test_gang_not_started_by_deadline_is_torn_down_and_restarted(tmp_path: Path) -> None:
    clock = FakeClock()
    b = await start_broker(
        tmp_path, clock=clock, gang_start_deadline_s=100, cluster_stale_after_s=1000, lost_after_s=1000
    )
    try:
        a = b.agent("c1")
        await a.connect([node("n1"), node("n2", rack="r2")])
        c = b.client("alpha")
        [j] = await c.submit("s", [SubmitItem("k", spec(gpus=8, replicas=2))])
        d = await a.expect("dispatch")
        a.accept(d)
        a.status(j.job_id, 1, cs.WORKLOAD_PHASE_GATED, replicas=2)
        await a.expect("start")
        a.status(j.job_id, 1, cs.WORKLOAD_PHASE_STARTING, replicas=2, running=1)
        clock.advance(101)
        a.heartbeat()
        await b.hub.dispatcher.watchdog.sweep()
        cancel = await a.expect("cancel")
        assert (cancel.attempt.attempt, cancel.reason) == (1, cs.CANCEL_REASON_GANG_TIMEOUT)
        job = await c.get(j.job_id)
        assert job.status.attempts[0].outcome == job_pb2.ATTEMPT_OUTCOME_GANG_TIMEOUT
        assert job.status.state == job_pb2.JOB_STATE_QUEUED and job.status.infra_retries == 1
        clock.advance(60)  # past the retry back-off
        b.hub.placer.capacity_changed()
        d2 = await a.expect("dispatch")
        assert (d2.attempt.job_id, d2.attempt.attempt) == (j.job_id, 2)
        await a.close()
    finally:
        await b.close()


async def test_a_gang_whose_pods_are_not_bound_soon_after_start_is_torn_down_sooner(tmp_path: Path) -> None:
    """Two bounds from the Start (A-14): pods kube-scheduler has not bound within the schedule timeout end the
    attempt then; bound pods that are still starting (image pulls) have until the start timeout."""
    clock = FakeClock()
    b = await start_broker(
        tmp_path,
        clock=clock,
        gang_start_deadline_s=100,
        gang_schedule_timeout_s=30,
        cluster_stale_after_s=1000,
        lost_after_s=1000,
    )
    try:
        a = b.agent("c1")
        await a.connect([node("n1"), node("n2", rack="r2"), node("n3", rack="r3")])
        c = b.client("alpha")
        [stuck, pulling] = await c.submit("s", [SubmitItem("k1", spec(gpus=8)), SubmitItem("k2", spec(gpus=8))])
        dispatches = [await a.expect("dispatch"), await a.expect("dispatch")]  # expect() skips other kinds
        for d in dispatches:
            a.accept(d)
            a.status(d.attempt.job_id, 1, cs.WORKLOAD_PHASE_GATED, replicas=1)
        await a.expect("start")
        await a.expect("start")
        w = cs.WorkloadStatus(phase=cs.WORKLOAD_PHASE_STARTING)
        w.attempt.job_id, w.attempt.attempt = pulling.job_id, 1
        w.replicas.add(pod_set="workers", index=0, node="n2", phase=common_pb2.REPLICA_PHASE_BOUND)
        a.send(workload_status=w)
        a.status(stuck.job_id, 1, cs.WORKLOAD_PHASE_STARTING, replicas=1)  # still pending (not bound)
        bound = b.hub.dispatcher.inbox.all_bound
        await eventually(lambda: bound.get((pulling.job_id, 1)) is True and bound.get((stuck.job_id, 1)) is False)
        clock.advance(31)
        a.heartbeat()
        await b.hub.dispatcher.watchdog.sweep()
        cancel = await a.expect("cancel")
        assert cancel.attempt.job_id == stuck.job_id and cancel.reason == cs.CANCEL_REASON_GANG_TIMEOUT
        job = await c.get(stuck.job_id)
        assert "not every pod was bound" in job.status.attempts[0].outcome_message
        assert (await c.get(pulling.job_id)).status.state == job_pb2.JOB_STATE_STARTING
        clock.advance(70)
        a.heartbeat()
        await b.hub.dispatcher.watchdog.sweep()
        cancel = await a.expect("cancel")
        assert cancel.attempt.job_id == pulling.job_id
        assert "not every replica was running" in (await c.get(pulling.job_id)).status.attempts[0].outcome_message
        await a.close()
    finally:
        await b.close()


async def test_job_start_timeout_overrides_the_default(tmp_path: Path) -> None:
    clock = FakeClock()
    b = await start_broker(
        tmp_path, clock=clock, gang_start_deadline_s=1000, cluster_stale_after_s=5000, lost_after_s=5000
    )
    try:
        a = b.agent("c1")
        await a.connect([node("n1")])
        s = spec(gpus=8)
        s.start_timeout.seconds = 30
        [j] = await b.client("alpha").submit("s", [SubmitItem("k", s)])
        d = await a.expect("dispatch")
        assert d.start_deadline.seconds == int(clock.t) + 30
        a.accept(d)
        await eventually(_is(b, j.job_id, job_pb2.JOB_STATE_ACCEPTED))
        clock.advance(31)
        await b.hub.dispatcher.watchdog.sweep()
        cancel = await a.expect("cancel")
        assert cancel.reason == cs.CANCEL_REASON_GANG_TIMEOUT
        await a.close()
    finally:
        await b.close()


async def test_unanswered_dispatch_expires_and_is_replanned(tmp_path: Path) -> None:
    clock = FakeClock()
    b = await start_broker(
        tmp_path, clock=clock, dispatch_ack_timeout_s=30, cluster_stale_after_s=5000, lost_after_s=5000
    )
    try:
        a = b.agent("c1")
        await a.connect([node("n1")])
        [j] = await b.client("alpha").submit("s", [SubmitItem("k", spec(gpus=8))])
        d1 = await a.expect("dispatch")
        await eventually(_is(b, j.job_id, job_pb2.JOB_STATE_DISPATCHED))
        clock.advance(31)
        a.heartbeat()
        await b.hub.dispatcher.watchdog.sweep()
        cancel = await a.expect("cancel")
        assert (cancel.attempt.attempt, cancel.reason) == (d1.attempt.attempt, cs.CANCEL_REASON_SUPERSEDED)
        d2 = await a.expect("dispatch")
        assert d2.attempt.attempt == 2
        await a.close()
    finally:
        await b.close()


async def test_min_available_is_a_dispatch_time_property_not_a_running_one(tmp_path: Path) -> None:
    """After start, one lost replica fails the whole attempt (the agent reports it FAILED: one Indexed Job per
    pod set with backoffLimit 0); a RUNNING report with fewer replicas running is not a broker teardown."""
    b = await start_broker(tmp_path)
    try:
        a = b.agent("c1")
        await a.connect([node("n1"), node("n2", rack="r2")])
        c = b.client("alpha")
        [j] = await c.submit("s", [SubmitItem("k", spec(gpus=8, replicas=2, min_available=1))])
        await _running(b, a, j.job_id, replicas=2)
        a.status(j.job_id, 1, cs.WORKLOAD_PHASE_RUNNING, replicas=2, running=1)
        a.status(
            j.job_id, 1, cs.WORKLOAD_PHASE_FAILED, replicas=2, running=1, outcome=job_pb2.ATTEMPT_OUTCOME_INFRA_FAILED
        )
        job = await eventually(_job_when(c, j.job_id, lambda job: job.status.current_attempt == 2))
        assert job.status.attempts[0].outcome == job_pb2.ATTEMPT_OUTCOME_INFRA_FAILED
        assert job.status.infra_retries == 1
        await a.close()
    finally:
        await b.close()


def _job_when(
    c: BrokerClient, job_id: str, pred: Callable[[job_pb2.Job], bool]
) -> Callable[[], Awaitable[job_pb2.Job | None]]:
    async def check() -> job_pb2.Job | None:
        job = await c.get(job_id)
        return job if pred(job) else None

    return check


async def test_watch_resumes_from_a_revision(tmp_path: Path) -> None:
    b = await start_broker(tmp_path)
    try:
        c = b.client("beta")
        [first] = await c.submit("s", [SubmitItem("a", spec(gpus=1))])
        rev = (await c.list()).revision
        [second] = await c.submit("s", [SubmitItem("b", spec(gpus=1))])
        await c.cancel(first.job_id)
        seen = []
        async for ev in c.watch(from_revision=rev):
            seen.append((ev.job_id, ev.type, ev.transition.to_state))
            if len(seen) == 2:
                break
        assert seen == [
            (second.job_id, svc.JOB_EVENT_TYPE_SUBMITTED, job_pb2.JOB_STATE_QUEUED),
            (first.job_id, svc.JOB_EVENT_TYPE_STATE_CHANGED, job_pb2.JOB_STATE_CANCELLED),
        ]
        # From 0: a bookmark with the current revision comes first.
        async for ev in c.watch(from_revision=0):
            assert ev.type == svc.JOB_EVENT_TYPE_BOOKMARK and ev.revision >= rev + 2
            break
        # Another tenant's watch sees none of beta's events.
        other = b.client("alpha")
        async for ev in other.watch(from_revision=0, bookmark_interval_seconds=1):
            assert ev.type == svc.JOB_EVENT_TYPE_BOOKMARK
            break
    finally:
        await b.close()


async def test_restart_places_nothing_until_fresh_snapshots_and_keeps_reservations(tmp_path: Path) -> None:
    b = await start_broker(tmp_path)
    a = b.agent("c1")
    await a.connect([node("n1"), node("n2", rack="r2")])
    c = b.client("alpha")
    [j1] = await c.submit("s", [SubmitItem("k1", spec(gpus=8))])
    d1 = await a.expect("dispatch")
    a.accept(d1)
    await eventually(_is(b, j1.job_id, job_pb2.JOB_STATE_ACCEPTED))
    held = d1.pod_sets[0].nodes[0].node
    await a.close()
    await b.close()

    b = await start_broker(tmp_path)
    try:
        a = b.agent("c1")
        welcome = await a.connect(known=[(j1.job_id, 1)], snapshot=False)
        assert [(x.job_id, x.attempt) for x in welcome.current_attempts] == [(j1.job_id, 1)]
        c = b.client("alpha")
        [j2] = await c.submit("s", [SubmitItem("k2", spec(gpus=8))])
        await eventually(lambda: j2.job_id in b.hub.placer.book.waits)
        assert b.hub.placer.book.waits[j2.job_id].reason.value == "NO_FRESH_INVENTORY"
        # The snapshot does not show j1 bound yet: its reloaded reservation keeps its node taken.
        a.snapshot([node("n1"), node("n2", rack="r2")])
        d2 = await a.expect("dispatch")
        assert d2.attempt.job_id == j2.job_id
        assert d2.pod_sets[0].nodes[0].node != held
        await a.close()
    finally:
        await b.close()


async def test_metrics_follow_the_flow(tmp_path: Path) -> None:
    b = await start_broker(tmp_path)
    try:
        a = b.agent("c1")
        await a.connect([node("n1"), node("n2", rack="r2")])
        c = b.client("alpha")
        [j] = await c.submit("s", [SubmitItem("k", spec(gpus=8))])
        d = await a.expect("dispatch")
        a.reject(d, [d.pod_sets[0].nodes[0].node])
        await a.expect("dispatch")
        [waiting] = await c.submit("s", [SubmitItem("k2", spec(gpus=8, replicas=2))])
        await eventually(lambda: waiting.job_id in b.hub.placer.book.waits)
        m = b.hub.metrics
        b.hub.metrics.refresh_queue(b.hub.placer.book)
        sample = m.registry.get_sample_value
        assert sample("tandem_broker_dispatch_rejections_total", {"cluster": "c1"}) == 1
        assert sample("tandem_broker_queue_length", {"tenant": "alpha"}) == 1
        assert sample("tandem_broker_pending_gpu_demand", {"tenant": "alpha", "gpu_model": "any"}) == 16
        assert sample("tandem_broker_reserved_gpus", {"cluster": "c1"}) == 8
        assert sample("tandem_broker_time_to_placement_seconds_count") == 2
        assert sample("tandem_broker_decision_seconds_count") >= 3
        assert j.job_id
        await a.close()
    finally:
        await b.close()


async def test_the_newest_leader_wins_at_once_and_a_deposed_one_is_refused(tmp_path: Path) -> None:
    """Leader A (epoch 1) is connected and heartbeating when it loses the Lease; B (epoch 2) connects: A's
    stream ends ABORTED at once (not after the heartbeat timeout), B receives the pending Start of the gated
    gang it holds, and A cannot come back with its old epoch while B is live."""
    import grpc

    b = await start_broker(tmp_path, cluster_stale_after_s=30, lost_after_s=60)
    try:
        leader_a = b.agent("c1")
        await leader_a.connect([node("n1")], epoch=1)
        c = b.client("alpha")
        [j] = await c.submit("s", [SubmitItem("k", spec(gpus=8))])
        d = await leader_a.expect("dispatch")
        leader_a.accept(d)
        leader_a.status(j.job_id, 1, cs.WORKLOAD_PHASE_GATED, replicas=1)
        await leader_a.expect("start")  # A got Start but lost the Lease before ungating
        leader_a.heartbeat()
        leader_b = b.agent("c1")
        await leader_b.connect([node("n1")], epoch=2, known=[(j.job_id, 1)])
        start = await leader_b.expect("start")
        assert (start.attempt.job_id, start.attempt.attempt) == (j.job_id, 1)
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await leader_a.expect("welcome", timeout=5)  # nothing more comes: the stream ends
        assert ended.value.code() == grpc.StatusCode.ABORTED
        deposed = b.agent("c1")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await deposed.connect([node("n1")], epoch=1)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "deposed leader" in (refused.value.details() or "")
        same = b.agent("c1")  # B's own reconnect (half-open old connection): same epoch, the newer stream wins
        await same.connect([node("n1")], epoch=2, known=[(j.job_id, 1)])
        await same.expect("start")
        assert b.hub.dispatcher.sessions["c1"].leader_epoch == 2
        for agent in (leader_a, leader_b, deposed, same):
            await agent.close()
    finally:
        await b.close()


async def test_an_agent_cannot_accept_or_fail_another_clusters_attempt(tmp_path: Path) -> None:
    """c2's agent answers c1's dispatch (accept, then a terminal status, then a cancel ack): all ignored."""
    b = await start_broker(tmp_path)
    try:
        c1 = b.agent("c1")
        await c1.connect([node("n1")])
        c2 = b.agent("c2")
        await c2.connect([node("m1", gpus=0)])
        c = b.client("alpha")
        [j] = await c.submit("s", [SubmitItem("k", spec(gpus=8))])
        d = await c1.expect("dispatch")
        await eventually(_is(b, j.job_id, job_pb2.JOB_STATE_DISPATCHED))
        c2.accept(d)
        c2.status(
            j.job_id, 1, cs.WORKLOAD_PHASE_FAILED, replicas=1, outcome=job_pb2.ATTEMPT_OUTCOME_APP_FAILED, exit_code=1
        )
        c2.cancel_ack(j.job_id, 1)
        c2.feedback(j.job_id, 1, "workers", 0, "p", time.time(), [("m1", [9], "no GPUs")])
        await eventually(
            lambda: (
                b.hub.metrics.registry.get_sample_value("tandem_broker_agent_foreign_messages_total", {"cluster": "c2"})
                == 4
            )
        )
        assert (await b.hub.store.get_job(j.job_id)).state.name == "DISPATCHED"
        c1.accept(d)  # the owner still can
        await eventually(_is(b, j.job_id, job_pb2.JOB_STATE_ACCEPTED))
        await c1.close()
        await c2.close()
    finally:
        await b.close()


async def test_reconnect_reconciles_what_the_cluster_holds_with_what_the_broker_wants(tmp_path: Path) -> None:
    """The A-13 table: an accepted attempt the cluster no longer holds ends INFRA_FAILED (and is re-planned);
    a dispatched one it never received is sent again; what it holds that the broker replaced is obsolete."""
    b = await start_broker(tmp_path)
    try:
        a = b.agent("c1")
        await a.connect([node("n1"), node("n2")])
        c = b.client("alpha")
        [lost, pending] = await c.submit("s", [SubmitItem("a", spec(gpus=8)), SubmitItem("b", spec(gpus=8))])
        first = await a.expect("dispatch")
        second = await a.expect("dispatch")
        accepted = first if first.attempt.job_id == lost.job_id else second
        a.accept(accepted)
        await eventually(_is(b, lost.job_id, job_pb2.JOB_STATE_ACCEPTED))
        await eventually(_is(b, pending.job_id, job_pb2.JOB_STATE_DISPATCHED))
        await a.close()
        again = b.agent("c1")  # restarted agent: it holds neither, and a leftover of a replaced attempt
        welcome = await again.connect([node("n1"), node("n2")], known=[("gone-job", 3)])
        assert [(x.job_id, x.attempt) for x in welcome.obsolete_attempts] == [("gone-job", 3)]
        resent = await again.expect("dispatch")
        assert (resent.attempt.job_id, resent.attempt.attempt) == (pending.job_id, 1)
        job = await eventually(
            _job_when(
                c,
                lost.job_id,
                lambda job: (
                    job.status.current_attempt == 1
                    and job.status.attempts[0].outcome != job_pb2.ATTEMPT_OUTCOME_UNSPECIFIED
                ),
            )
        )
        assert job.status.attempts[0].outcome == job_pb2.ATTEMPT_OUTCOME_INFRA_FAILED
        assert "vanished" in job.status.attempts[0].outcome_message
        await again.close()
    finally:
        await b.close()


async def test_read_only_cluster_is_listed_never_placed_on_and_each_cluster_says_why(tmp_path: Path) -> None:
    """A read-only agent (inventory file mode) is in ListClusters but gets no dispatch; GetJob of the queued
    job gives one verdict per allowed cluster from the placement core (A-16)."""
    b = await start_broker(tmp_path)
    try:
        ro = b.agent("c1")
        await ro.connect([node("n1")], read_only=True)
        small = b.agent("c2")
        await small.connect([node("m1", free=4, rack="r2"), node("m2", free=4, rack="r3")])
        await eventually(
            lambda: all(e.has_snapshot for e in b.hub.catalog.clusters.values()) and len(b.hub.catalog.clusters) == 2
        )
        c = b.client("alpha")
        [j] = await c.submit("s", [SubmitItem("k", spec(gpus=4, replicas=2, level="rack"))])
        await eventually(lambda: j.job_id in b.hub.placer.book.waits)
        job = await c.get(j.job_id)
        assert job.status.state == job_pb2.JOB_STATE_QUEUED
        verdicts = {v.cluster: v for v in job.status.queue_info.clusters}
        assert verdicts["c1"].reason == job_pb2.CLUSTER_VERDICT_REASON_READ_ONLY
        assert verdicts["c2"].reason == job_pb2.CLUSTER_VERDICT_REASON_TOPOLOGY_FRAGMENTED
        assert "rack z1/r" in verdicts["c2"].message and "needs 2" in verdicts["c2"].message
        listed = await c.list_clusters()
        assert {x.name for x in listed.clusters} == {"c1", "c2"}
        with pytest.raises(asyncio.TimeoutError):
            await ro.expect("dispatch", timeout=0.5)
        await ro.close()
        await small.close()
    finally:
        await b.close()


async def test_a_cluster_that_maps_no_namespace_to_the_tenant_is_never_chosen_for_it(tmp_path: Path) -> None:
    """The cluster's own tenant -> namespace map (Hello) is part of where a job may go: c1 has room but maps
    only beta, so alpha's job goes to c2; GetJob says why c1 was not used."""
    b = await start_broker(tmp_path)
    try:
        c1, c2 = b.agent("c1"), b.agent("c2")
        await c1.connect([node("n1"), node("n2")], tenants={"beta": ["team-b"]})
        await c2.connect([node("m1"), node("m2", free=0)], tenants={"alpha": ["team-a"], "beta": ["team-b"]})
        await eventually(
            lambda: all(e.has_snapshot for e in b.hub.catalog.clusters.values()) and len(b.hub.catalog.clusters) == 2
        )
        c = b.client("alpha")
        [j] = await c.submit("s", [SubmitItem("k", spec(gpus=8, replicas=2))])  # only c1 has two free nodes
        assert j.job_id, j.error_message
        await eventually(lambda: j.job_id in b.hub.placer.book.waits)
        job = await c.get(j.job_id)
        verdicts = {v.cluster: v.reason for v in job.status.queue_info.clusters}
        assert verdicts == {
            "c1": job_pb2.CLUSTER_VERDICT_REASON_TENANT_NOT_MAPPED,
            "c2": job_pb2.CLUSTER_VERDICT_REASON_INSUFFICIENT_CAPACITY,
        }
        [k] = await c.submit("s", [SubmitItem("k2", spec(gpus=8))])
        d = await c2.expect("dispatch")
        assert d.attempt.job_id == k.job_id
        await c1.close()
        await c2.close()
    finally:
        await b.close()
