"""The fleet under faults: stale inventory, a stream cut before Start, the broker SIGKILLed, the agent
restarted, a leader handover, an agent whose certificate names another cluster, bad templates.

The invariant behind several of them: one job never runs twice — no two attempts of a job ever have pods
bound at the same time (a gang's gates are lifted only on a Start received on a live stream).
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from broker.launcher.client import SubmitItem
from sim import kuberesources as kr
from tandem.v1 import job_pb2
from tests.broker.hub_builders import Broker, policy_doc, start_broker
from tests.e2e.fleet import (
    TENANT_NAMESPACE,
    BrokerProcess,
    Cluster,
    PodHistory,
    busy_pod,
    gang,
    gpu_node,
    job_template,
    start_cluster,
    wait_for,
    watch_pods,
)

pytestmark = pytest.mark.timeout(300)


async def _job(client: Any, job_id: str) -> job_pb2.Job:
    return await client.get(job_id)


async def _pods(c: Cluster, job_id: str, attempt: int | None = None) -> list[dict[str, Any]]:
    sel = f"tandem.dev/job={job_id}" + (f",tandem.dev/attempt={attempt}" if attempt else "")
    return (await c.sim.client().list(kr.PODS, TENANT_NAMESPACE, label_selector=sel)).items


def _bound(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if (p.get("spec") or {}).get("nodeName") and not p["metadata"].get("deletionTimestamp")]


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    b = await start_broker(
        tmp_path, policy=policy_doc(), heartbeat_interval_s=1.0, cluster_stale_after_s=3.0, lost_after_s=30.0
    )
    try:
        yield b
    finally:
        await b.close()


async def test_a_dispatch_the_agent_rejects_is_replanned_elsewhere(broker: Broker, tmp_path: Path) -> None:
    """b's agent knows its nodes were taken before it reported so (a slow coalescing window): it refuses the
    dispatch with the nodes at fault, and the broker re-plans on a."""
    a = await start_cluster("a", [gpu_node("node-a-1", rack="r1")], broker, tmp_path)
    b = await start_cluster("b", [gpu_node("node-b-1", rack="r1")], broker, tmp_path, agent_extra={"coalesce_s": 5.0})
    try:
        await asyncio.sleep(5.5)  # let b's first (empty) delta window pass: the next one is 5 s away
        await b.sim.apply(busy_pod("inference-0", "node-b-1", 8))
        await b.sim.kubelet.start("default", "inference-0")  # type: ignore[union-attr]
        await asyncio.sleep(0.5)  # b's agent has seen it; its report to the broker has not gone yet
        spec = gang(1, 8, level="")
        spec.data_locality.preferred_clusters.append("b")  # the broker tries b first
        client = broker.client("alpha")
        [j] = await client.submit("s", [SubmitItem("k", spec)])

        async def replanned() -> job_pb2.Job | None:
            job = await _job(client, j.job_id)
            return job if len(job.status.attempts) >= 2 and job.status.attempts[1].cluster else None

        job = await wait_for(replanned, 30, "a second attempt", a.procs + b.procs)
        first, second = job.status.attempts[0], job.status.attempts[1]
        assert (first.cluster, first.outcome) == ("b", job_pb2.ATTEMPT_OUTCOME_REJECTED)
        assert first.rejection.reason == job_pb2.DISPATCH_REJECT_REASON_DOES_NOT_FIT
        assert "node-b-1" in first.rejection.nodes
        assert second.cluster == "a"
        assert not await _pods(b, j.job_id)  # the rejected attempt created nothing
    finally:
        await a.stop()
        await b.stop()


async def test_a_stream_cut_before_start_never_runs_two_attempts(broker: Broker, tmp_path: Path) -> None:
    """b's agent dies after creating the gang but before it could report it ready (its Job controller is
    slow): the broker re-plans on a; the restarted agent is told the attempt is obsolete and deletes it. The
    first attempt's pods are never ungated, let alone bound, while the second runs."""
    nodes = [gpu_node(f"node-{c}-{i}", rack="r1") for c in "ab" for i in range(2)]
    a = await start_cluster("a", nodes[:2], broker, tmp_path)
    b = await start_cluster(
        "b", nodes[2:], broker, tmp_path, sim_options={"job_controller_qps": (0.5, 1)}
    )  # one pod every 2 s
    history = PodHistory()
    watcher = asyncio.get_running_loop().create_task(watch_pods(b, history))
    try:
        spec = gang(2, 8)
        spec.data_locality.preferred_clusters.append("b")
        client = broker.client("alpha")
        [j] = await client.submit("s", [SubmitItem("k", spec)])
        await wait_for(lambda: _pods(b, j.job_id), 30, "b's first gang pod", b.procs)
        await b.agents[0].stop(signal.SIGKILL)

        async def on_a() -> job_pb2.Job | None:
            job = await _job(client, j.job_id)
            return job if job.status.attempts and job.status.attempts[-1].cluster == "a" else None

        await wait_for(on_a, 40, "the gang re-planned on a", a.procs)
        assert (await _job(client, j.job_id)).status.attempts[0].outcome == job_pb2.ATTEMPT_OUTCOME_LOST
        await wait_for(lambda: _all_bound(a, j.job_id, 2), 40, "the second attempt bound on a", a.procs)
        b.start_agent()  # restarted: its Hello lists attempt 1, which the broker has replaced
        await wait_for(lambda: _gone(b, j.job_id), 40, "the obsolete attempt deleted in b", b.procs)
        assert all("bound" not in seq and "ungated+pinned" not in seq for seq in history.states.values()), (
            history.states
        )
        assert not _bound(await _pods(b, j.job_id))
    finally:
        watcher.cancel()
        await a.stop()
        await b.stop()


async def _all_bound(c: Cluster, job_id: str, n: int) -> bool:
    return len(_bound(await _pods(c, job_id))) == n


async def _gone(c: Cluster, job_id: str) -> bool:
    jobs = (await c.sim.client().list(kr.JOBS, TENANT_NAMESPACE, label_selector=f"tandem.dev/job={job_id}")).items
    return not jobs and not await _pods(c, job_id)


async def test_the_broker_sigkilled_mid_flight_loses_nothing(tmp_path: Path) -> None:
    """A gang runs on b when the broker is SIGKILLed; a second job is queued. After the restart the agent
    reconnects with a fresh snapshot, the running gang is still RUNNING and finishes, the queued one places."""
    bp = BrokerProcess(tmp_path, cluster_stale_after_s=5.0, lost_after_s=60.0)
    await bp.start()
    b = await start_cluster("b", [gpu_node(f"node-b-{i}", rack="r1") for i in range(2)], bp, tmp_path)
    try:
        client = bp.client("alpha")
        [run] = await client.submit("s", [SubmitItem("k1", gang(1, 8))])
        pods = await wait_for(lambda: _bound_pods(b, run.job_id, 1), 60, "the first gang bound", b.procs)
        for p in pods:
            await b.sim.kubelet.start(TENANT_NAMESPACE, p["metadata"]["name"])  # type: ignore[union-attr]
        await wait_for(lambda: _state(client, run.job_id, job_pb2.JOB_STATE_RUNNING), 30, "RUNNING", b.procs)
        [queued] = await client.submit("s", [SubmitItem("k2", gang(1, 8))])  # the second node takes it
        assert queued.job_id
        bp.kill()
        await bp.start()
        client = bp.client("alpha")
        await wait_for(lambda: bp.cluster_ready("b"), 60, "b reconnected after the restart", b.procs)
        assert (await _job(client, run.job_id)).status.state == job_pb2.JOB_STATE_RUNNING
        await wait_for(lambda: _bound_pods(b, queued.job_id, 1), 60, "the queued job placed", b.procs)
        for p in pods:
            await b.sim.kubelet.complete(TENANT_NAMESPACE, p["metadata"]["name"], 0)  # type: ignore[union-attr]
        await wait_for(lambda: _state(client, run.job_id, job_pb2.JOB_STATE_SUCCEEDED), 60, "SUCCEEDED", b.procs)
    finally:
        await b.stop()
        await bp.stop()


async def _bound_pods(c: Cluster, job_id: str, n: int) -> list[dict[str, Any]] | None:
    pods = _bound(await _pods(c, job_id))
    return pods if len(pods) == n else None


async def _state(client: Any, job_id: str, state: int) -> bool:
    return (await _job(client, job_id)).status.state == state


async def test_the_agent_restarted_mid_flight_adopts_its_gangs(broker: Broker, tmp_path: Path) -> None:
    """The agent is SIGKILLed while one gang is gated (its Job controller is slow) and another runs; the new
    process is not ready until it has loaded the reservations, adopts both from their labels and
    annotations, pins and starts the gated one, and reports the running one through to its end."""
    b = await start_cluster(
        "b",
        [gpu_node(f"node-b-{i}", rack="r1") for i in range(3)],
        broker,
        tmp_path,
        sim_options={"job_controller_qps": (1.0, 1)},
    )
    try:
        client = broker.client("alpha")
        [run] = await client.submit("s", [SubmitItem("k1", gang(1, 8))])
        [pod] = await wait_for(lambda: _bound_pods(b, run.job_id, 1), 60, "the first gang bound", b.procs)
        await b.sim.kubelet.start(TENANT_NAMESPACE, pod["metadata"]["name"])  # type: ignore[union-attr]
        await wait_for(lambda: _state(client, run.job_id, job_pb2.JOB_STATE_RUNNING), 30, "RUNNING", b.procs)
        [slow] = await client.submit("s", [SubmitItem("k2", gang(2, 8))])
        await wait_for(lambda: _pods(b, slow.job_id), 30, "the second gang's first pod", b.procs)
        await b.agents[0].stop(signal.SIGKILL)
        b.start_agent()
        assert not await b.agent_ready(1)  # a fresh process knows nothing yet
        await wait_for(lambda: b.agent_ready(1), 60, "the new agent ready (inventory and reservations)", b.procs)
        await wait_for(lambda: _bound_pods(b, slow.job_id, 2), 60, "the adopted gang started and bound", b.procs)
        assert (await _job(client, slow.job_id)).status.attempts[0].number == 1  # the same attempt, adopted
        await b.sim.kubelet.complete(TENANT_NAMESPACE, pod["metadata"]["name"], 3)  # type: ignore[union-attr]
        job = await wait_for(lambda: _ended(client, run.job_id), 60, "the running gang's end reported", b.procs)
        assert job.status.state == job_pb2.JOB_STATE_FAILED
        assert job.status.attempts[0].outcome == job_pb2.ATTEMPT_OUTCOME_APP_FAILED
        assert job.status.attempts[0].exit_code == 3
    finally:
        await b.stop()


async def _ended(client: Any, job_id: str) -> job_pb2.Job | None:
    job = await _job(client, job_id)
    return job if job.status.state in (job_pb2.JOB_STATE_FAILED, job_pb2.JOB_STATE_SUCCEEDED) else None


async def test_leader_handover_between_two_replicas(broker: Broker, tmp_path: Path) -> None:
    """Two agent replicas: the leader streams; on SIGTERM it releases the Lease and the other takes over
    with a higher epoch at once; SIGKILL of that one hands over after a lease duration. Work goes on."""
    b = await start_cluster("b", [gpu_node(f"node-b-{i}", rack="r1") for i in range(2)], broker, tmp_path, agents=2)
    try:

        async def both_ready() -> bool:
            return await b.agent_ready(0) and await b.agent_ready(1)

        await wait_for(both_ready, 60, "both replicas ready (the follower too)", b.procs)
        first = broker.hub.dispatcher.sessions["b"].leader_epoch
        leader = next(i for i, p in enumerate(b.agents) if _leads(b, i))
        await b.agents[leader].stop(signal.SIGTERM)
        await wait_for(
            lambda: (
                (s := broker.hub.dispatcher.sessions.get("b")) is not None and not s.closed and s.leader_epoch > first
            ),
            20,
            "the other replica connected as the new leader",
            b.procs[-1:],
        )
        client = broker.client("alpha")
        [j] = await client.submit("s", [SubmitItem("k", gang(1, 8))])
        await wait_for(lambda: _bound_pods(b, j.job_id, 1), 60, "the job placed by the new leader", b.procs)
        second = broker.hub.dispatcher.sessions["b"].leader_epoch
        survivor = 1 - leader
        await b.agents[survivor].stop(signal.SIGKILL)
        b.start_agent()
        await wait_for(
            lambda: (
                (s := broker.hub.dispatcher.sessions.get("b")) is not None and not s.closed and s.leader_epoch > second
            ),
            30,
            "a third leader after the lease expired",
            b.procs[-1:],
        )
    finally:
        await b.stop()


def _leads(c: Cluster, i: int) -> bool:
    text = c.agents[i].log.read_text(errors="replace")
    return '"message": "leading"' in text


async def test_an_agent_whose_certificate_names_another_cluster_is_refused(broker: Broker, tmp_path: Path) -> None:
    b = await start_cluster(
        "b", [gpu_node("node-b-1", rack="r1")], broker, tmp_path, cert_name="c", wait_connected=False
    )
    try:
        await wait_for(
            lambda: "PERMISSION_DENIED" in b.agents[0].log.read_text(errors="replace"),
            30,
            "the broker refusing the stream",
            b.procs,
        )
        assert "b" not in broker.hub.catalog.clusters or not broker.hub.catalog.clusters["b"].connected
        assert "agent certificate names cluster c" in b.agents[0].log.read_text(errors="replace")
    finally:
        await b.stop()


async def test_templates_that_would_escape_the_agent_are_refused_or_overwritten(broker: Broker, tmp_path: Path) -> None:
    """The broker refuses a template that sets its own scheduler, node or privileged mode, naming the field;
    a tenant the cluster does not map gets nothing created."""
    b = await start_cluster("b", [gpu_node("node-b-1", rack="r1")], broker, tmp_path)
    try:
        client = broker.client("alpha")
        for field, tweak in (
            ("schedulerName", {"schedulerName": "default-scheduler"}),
            ("nodeName", {"nodeName": "node-b-1"}),
        ):
            spec = gang(1, 8, level="")
            spec.pod_sets[0].pod_template_json = job_template(8, **tweak)
            [res] = await client.submit("s", [SubmitItem(f"k-{field}", spec)])
            assert not res.job_id and field in res.error_message, res
        spec = gang(1, 8, level="")
        tpl = json.loads(job_template(8))
        tpl["spec"]["containers"][0]["securityContext"] = {"privileged": True}
        spec.pod_sets[0].pod_template_json = json.dumps(tpl)
        [res] = await client.submit("s", [SubmitItem("k-priv", spec)])
        assert not res.job_id and "privileged" in res.error_message, res
        # beta is a tenant of the broker, but cluster b maps no namespace to it: never placed there.
        [res] = await broker.client("beta").submit("s", [SubmitItem("k-beta", gang(1, 8, level=""))])
        assert not res.job_id and "no allowed cluster" in res.error_message, res
        assert not (await b.sim.client().list(kr.JOBS, TENANT_NAMESPACE)).items
    finally:
        await b.stop()


async def test_with_a_broker_gone_the_extender_keeps_serving(tmp_path: Path) -> None:
    """Broker down: kube-scheduler's extender is not on the broker's path; a reservation of a created
    workload persists; the agent reconnects with back-off when the broker returns."""
    bp = BrokerProcess(tmp_path, cluster_stale_after_s=5.0, lost_after_s=60.0)
    await bp.start()
    b = await start_cluster("b", [gpu_node(f"node-b-{i}", rack="r1") for i in range(2)], bp, tmp_path)
    try:
        client = bp.client("alpha")
        [j] = await client.submit("s", [SubmitItem("k", gang(1, 8))])
        await wait_for(lambda: _bound_pods(b, j.job_id, 1), 60, "placed", b.procs)
        bp.kill()
        other = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "plain-gpu", "namespace": "default"},
            "spec": {
                "schedulerName": "tandem-scheduler",
                "restartPolicy": "Never",
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [{"name": "m", "image": "x:1", "resources": {"limits": {"nvidia.com/gpu": "4"}}}],
            },
        }
        await b.sim.apply(other)

        async def scheduled() -> bool:
            pod = await b.sim.client().get(kr.PODS, "plain-gpu", "default")
            return bool((pod.get("spec") or {}).get("nodeName"))

        await wait_for(scheduled, 30, "a plain GPU pod scheduled through the extender with no broker", b.procs)
        await bp.start()
        await wait_for(lambda: bp.cluster_ready("b"), 60, "the agent back on the restarted broker", b.procs)
    finally:
        await b.stop()
        await bp.stop()


async def test_a_read_only_agent_reports_a_file_and_is_never_placed_on(broker: Broker, tmp_path: Path) -> None:
    """`tandem-extender agent --inventory-file` says capabilities.dispatch = false: the broker lists the
    cluster with its nodes but never places there; GetJob says so."""
    import yaml

    from tests.e2e.fleet import REPO, spawn

    cert, key = broker.pki.issue("files")
    cfg = {
        "cluster_name": "files",
        "broker": broker.agent_addr,
        "tls_cert_file": str(cert),
        "tls_key_file": str(key),
        "tls_ca_file": str(broker.pki.dir / "test-root-ca.pem"),
        "tls_server_name": "localhost",
        "tenants": {"alpha": ["team-a"]},
        "listen": "127.0.0.1:0",
        "heartbeat_s": 1.0,
    }
    (tmp_path / "agent.yaml").write_text(yaml.safe_dump(cfg))
    proc = spawn(
        "files-agent",
        [
            "agent",
            "--inventory-file",
            str(REPO / "tests" / "fixtures" / "cluster.json"),
            "--config",
            str(tmp_path / "agent.yaml"),
        ],
        tmp_path / "agent.log",
    )
    try:
        await wait_for(
            lambda: (e := broker.hub.catalog.clusters.get("files")) is not None and e.has_snapshot,
            60,
            "the read-only cluster's snapshot",
            [proc],
        )
        entry = broker.hub.catalog.clusters["files"]
        assert entry.meta.read_only and len(entry.nodes) == 12
        client = broker.client("alpha")
        [j] = await client.submit("s", [SubmitItem("k", gang(1, 8, level=""))])
        assert not j.job_id and "no allowed cluster" in j.error_message  # the only cluster creates nothing
    finally:
        await proc.stop()


async def test_a_duplicate_dispatch_is_accepted_again_and_creates_nothing_twice(broker: Broker, tmp_path: Path) -> None:
    """Dispatches are resent (a reconnect, an unacknowledged outbox order): the same dispatch id is adopted,
    acknowledged again, and the cluster still holds one Job, one Service and one reservation."""
    b = await start_cluster("b", [gpu_node("node-b-1", rack="r1")], broker, tmp_path)
    try:
        client = broker.client("alpha")
        [j] = await client.submit("s", [SubmitItem("k", gang(1, 8, level=""))])
        await wait_for(lambda: _bound_pods(b, j.job_id, 1), 60, "placed and bound", b.procs)
        hub = broker.hub
        job = await hub.store.get_job(j.job_id)
        [attempt] = await hub.store.list_attempts(j.job_id)
        session = hub.dispatcher.sessions["b"]
        session.send(hub.dispatcher.outbox.dispatch_out(session, job, attempt))  # the very same order again

        async def accepted_twice() -> bool:
            return await _agent_metric(b, 'tandem_agent_dispatches_total{outcome="accepted"}') == 2.0

        await wait_for(accepted_twice, 20, "the duplicate accepted", b.procs)
        admin = b.sim.client()
        sel = f"tandem.dev/job={j.job_id}"
        assert len((await admin.list(kr.JOBS, TENANT_NAMESPACE, label_selector=sel)).items) == 1
        services = (await admin.list(kr.Resource("v1", "services", "Service", True), TENANT_NAMESPACE)).items
        assert [s["metadata"]["name"] for s in services] == [f"{j.job_id}-1"]
        assert len(await _pods(b, j.job_id)) == 1
        assert (await hub.store.get_job(j.job_id)).attempt == 1  # still the first attempt, not rejected
    finally:
        await b.stop()


async def _agent_metric(c: Cluster, sample: str) -> float | None:
    import aiohttp

    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{c.agent_ports[0]}/metrics") as r:
        for line in (await r.text()).splitlines():
            if line.startswith(sample + " "):
                return float(line.split()[-1])
    return None
