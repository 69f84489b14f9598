"""Fully populated ClusterService messages (agent stream and admin RPCs), for round-trip tests."""

from __future__ import annotations

from tandem.v1 import cluster_service_pb2 as cs
from tandem.v1 import common_pb2 as c
from tandem.v1 import job_pb2 as j
from tests.protos import builders as b

# --------------------------------------------------------------------------- agent -> broker


def topology_level(name: str = "rack", key: str = "example.com/rack") -> cs.TopologyLevel:
    return cs.TopologyLevel(name=name, label_key=key)


def known_attempt() -> cs.KnownAttempt:
    return cs.KnownAttempt(attempt=b.attempt_ref(), phase=cs.WORKLOAD_PHASE_GATED, dispatch_id="4f1c2d/train-7f3k/2")


def agent_capabilities() -> cs.AgentCapabilities:
    return cs.AgentCapabilities(dispatch=True)


def tenant_namespaces() -> cs.TenantNamespaces:
    return cs.TenantNamespaces(tenant="acme", namespaces=["team-acme", "team-acme-batch"])


def hello() -> cs.Hello:
    return cs.Hello(
        cluster_name="eu-a",
        region="eu-west",
        role="training",
        topology_levels=[
            topology_level("zone", "topology.kubernetes.io/zone"),
            topology_level(),
            topology_level("host", "kubernetes.io/hostname"),
        ],
        protocol_version=1,
        agent_version="0.1.0",
        log_url_templates=[b.log_url_template()],
        known_attempts=[known_attempt()],
        tenant_namespaces=[tenant_namespaces()],
        cluster=b.cluster_metadata(),
        agent_instance_id="c0ffee",
        leader_epoch=3,
        leader_identity="tandem-agent-7d9f-x2_5c1e",
        capabilities=agent_capabilities(),
    )


def dispatch_ack() -> cs.DispatchAck:
    return cs.DispatchAck(
        attempt=b.attempt_ref(),
        accepted=True,
        rejection=b.dispatch_rejection(),
        namespace="team-acme",
        inventory_sequence=41,
    )


def pod_scheduling_feedback() -> cs.PodSchedulingFeedback:
    return cs.PodSchedulingFeedback(
        attempt=b.attempt_ref(),
        pod_set="worker",
        index=5,
        pod_name="train-7f3k-2-worker-5-abcde",
        time=b.ts(40),
        nodes=[b.node_fit_result(), c.NodeFitResult(node="gpu-node-2", fits=True)],
        message="0/12 nodes are available: 4 Insufficient nvidia.com/gpu, 8 node(s) didn't match Pod's node affinity/selector.",
        reason="Unschedulable",
    )


def scheduling_feedback() -> cs.SchedulingFeedback:
    return cs.SchedulingFeedback(pods=[pod_scheduling_feedback()])


def workload_status() -> cs.WorkloadStatus:
    return cs.WorkloadStatus(
        attempt=b.attempt_ref(),
        phase=cs.WORKLOAD_PHASE_FAILED,
        replicas=[b.replica_status()],
        namespace="team-acme",
        rendezvous_address="train-7f3k-2-head-0.train-7f3k-2:29500",
        outcome=j.ATTEMPT_OUTCOME_APP_FAILED,
        exit_code=0,  # explicit presence: a zero exit code is still reported
        message="replica worker-1 failed",
        observe_time=b.ts(50),
    )


def cancel_ack() -> cs.CancelAck:
    return cs.CancelAck(attempt=b.attempt_ref(), result=cs.CANCEL_RESULT_IN_PROGRESS, message="3 pods terminating")


def heartbeat() -> cs.Heartbeat:
    return cs.Heartbeat(applied_broker_sequence=17, inventory_sequence=42, leader=True)


def agent_messages() -> list[cs.AgentMessage]:
    """One AgentMessage per member of its `body` oneof."""
    bodies = {
        "hello": hello(),
        "inventory_snapshot": b.inventory_snapshot(),
        "inventory_delta": b.inventory_delta(),
        "dispatch_ack": dispatch_ack(),
        "scheduling_feedback": scheduling_feedback(),
        "workload_status": workload_status(),
        "cancel_ack": cancel_ack(),
        "heartbeat": heartbeat(),
    }
    out = []
    for seq, (field, body) in enumerate(bodies.items(), start=1):
        msg = cs.AgentMessage(sequence=seq, send_time=b.ts(seq))
        getattr(msg, field).CopyFrom(body)
        out.append(msg)
    return out


# --------------------------------------------------------------------------- broker -> agent


def welcome() -> cs.Welcome:
    return cs.Welcome(
        protocol_version=1,
        broker_id="broker-0",
        session_id="s-4f2a",
        heartbeat_interval=b.dur(5),
        heartbeat_timeout=b.dur(30),
        obsolete_attempts=[b.attempt_ref(attempt=1)],
        current_attempts=[b.attempt_ref()],
        max_message_bytes=64 * 2**20,
    )


def node_replica_count(node: str = "gpu-node-17", replicas: int = 8) -> cs.NodeReplicaCount:
    return cs.NodeReplicaCount(node=node, replicas=replicas)


def pod_set_dispatch() -> cs.PodSetDispatch:
    return cs.PodSetDispatch(
        name="worker",
        count=16,
        shape=b.pod_shape(),
        pod_template_json='{"spec":{"containers":[{"name":"main","image":"x"}]}}',
        nodes=[node_replica_count(), node_replica_count("gpu-node-18")],
        fixed_count=True,
    )


def rendezvous_info() -> cs.RendezvousInfo:
    return cs.RendezvousInfo(framework=j.FRAMEWORK_MPI, port=2222, service_name="train-7f3k-2")


def dispatch() -> cs.Dispatch:
    return cs.Dispatch(
        attempt=b.attempt_ref(),
        tenant="acme",
        namespace_hint="team-acme",
        domain=b.topology_path(),
        pod_sets=[pod_set_dispatch()],
        rendezvous=rendezvous_info(),
        start_deadline=b.ts(900),
        max_runtime=b.dur(86_400),
        job_set_id="sweep-2026-11-30",
        queue="research",
        labels={"team": "nlp"},
        annotations={"example.com/note": "x"},
        inventory_sequence=41,
        priority_band="batch",
        termination_grace_period=b.dur(120),
        preemptible=True,
        dispatch_id="4f1c2d/train-7f3k/2",
        start_timeout=b.dur(900),
        restart_reason="INFRA_FAILED",
        previous_cluster="eu-b",
    )


def start() -> cs.Start:
    return cs.Start(attempt=b.attempt_ref())


def cancel() -> cs.Cancel:
    return cs.Cancel(
        attempt=b.attempt_ref(), reason=cs.CANCEL_REASON_PREEMPTED, message="quota reclaimed", grace_period=b.dur(60)
    )


def ack() -> cs.Ack:
    return cs.Ack(acked_agent_sequence=8)


def resync_request() -> cs.ResyncRequest:
    return cs.ResyncRequest(inventory=True, workloads=True, reason="delta base mismatch")


def hold_nodes() -> cs.HoldNodes:
    return cs.HoldNodes(
        attempt=b.attempt_ref(),
        pod_sets=[pod_set_dispatch()],
        expires_at=b.ts(960),
        dispatch_id="4f1c2d/train-7f3k/2",
        drain=True,
    )


def release_hold() -> cs.ReleaseHold:
    return cs.ReleaseHold(attempt=b.attempt_ref(), drain=True)


def broker_messages() -> list[cs.BrokerMessage]:
    """One BrokerMessage per member of its `body` oneof."""
    bodies = {
        "welcome": welcome(),
        "dispatch": dispatch(),
        "start": start(),
        "cancel": cancel(),
        "ack": ack(),
        "resync": resync_request(),
        "hold": hold_nodes(),
        "release_hold": release_hold(),
    }
    out = []
    for seq, (field, body) in enumerate(bodies.items(), start=1):
        msg = cs.BrokerMessage(sequence=seq, send_time=b.ts(seq))
        getattr(msg, field).CopyFrom(body)
        out.append(msg)
    return out


# --------------------------------------------------------------------------- admin


def gpu_model_count() -> cs.GpuModelCount:
    return cs.GpuModelCount(model="NVIDIA-H100-80GB-HBM3", total=512, free=37)


def domain_summary() -> cs.DomainSummary:
    return cs.DomainSummary(level="rack", path=b.topology_path(), nodes=18, gpus=[gpu_model_count()])


def cluster_summary() -> cs.ClusterSummary:
    return cs.ClusterSummary(
        name="eu-a",
        region="eu-west",
        role="training",
        connected=True,
        cordoned=True,
        cordon_reason="driver upgrade",
        last_report_time=b.ts(70),
        last_report_age=b.dur(2, 250_000_000),
        stale=True,
        gpus=[gpu_model_count()],
        domains=[domain_summary()],
        nodes=64,
        active_attempts=5,
        agent_version="0.1.0",
        topology_levels=[topology_level()],
    )


def list_clusters_request() -> cs.ListClustersRequest:
    return cs.ListClustersRequest(region="eu-west", role="training")


def list_clusters_response() -> cs.ListClustersResponse:
    return cs.ListClustersResponse(clusters=[cluster_summary()])


def get_cluster_request() -> cs.GetClusterRequest:
    return cs.GetClusterRequest(name="eu-a")


def get_cluster_response() -> cs.GetClusterResponse:
    return cs.GetClusterResponse(cluster=cluster_summary())


def cordon_request() -> cs.CordonRequest:
    return cs.CordonRequest(name="eu-a", reason="driver upgrade")


def cordon_response() -> cs.CordonResponse:
    return cs.CordonResponse(cluster=cluster_summary())


def uncordon_request() -> cs.UncordonRequest:
    return cs.UncordonRequest(name="eu-a", reason="upgrade done")


def uncordon_response() -> cs.UncordonResponse:
    return cs.UncordonResponse(cluster=cluster_summary())
