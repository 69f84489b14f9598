"""ClusterService protobuf <-> broker/core domain, in one place: the agent stream's messages and admin views."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from google.protobuf import duration_pb2

from broker.api.serde import spec_from_bytes, ts
from broker.api.serde_inventory import node_from_proto
from broker.clusters import link
from broker.domain.records import ReplicaRecord
from broker.domain.states import AttemptOutcome
from fleetplan.catalog import ClusterMeta, InventoryReport, Level, ReplicaPlacement
from fleetplan.pictures import ClusterGpus
from fleetplan.view import ClusterState
from tandem.v1 import cluster_service_pb2 as cs
from tandem.v1 import common_pb2, job_pb2
from tandem.v1 import inventory_pb2 as inv

__all__ = [
    "hello_meta",
    "report_from_snapshot",
    "report_from_delta",
    "workload_from_proto",
    "dispatch_message",
    "start_message",
    "cancel_message",
    "welcome_message",
    "cluster_summary",
]


def hello_meta(h: cs.Hello) -> ClusterMeta:
    c = h.cluster
    return ClusterMeta(
        name=h.cluster_name,
        region=h.region or c.region,
        role=h.role or c.role,
        labels=dict(c.labels),
        levels=tuple(Level(l.name, l.label_key) for l in h.topology_levels),
        log_templates=tuple((t.name, t.url_template) for t in h.log_url_templates if t.url_template),
        read_only=h.HasField("capabilities") and not h.capabilities.dispatch,
        tenants=frozenset(t.tenant for t in h.tenant_namespaces if t.namespaces) if h.tenant_namespaces else None,
    )


def _bound(progress: Sequence[inv.ReservationProgress]) -> dict[tuple[str, int], frozenset[tuple[str, int]]]:
    return {(p.attempt.job_id, p.attempt.attempt): frozenset((b.pod_set, b.index) for b in p.bound) for p in progress}


def report_from_snapshot(cluster: str, s: inv.InventorySnapshot, now: float) -> InventoryReport:
    return InventoryReport(
        cluster=cluster,
        sequence=s.sequence,
        full=True,
        observed_at=s.observe_time.ToNanoseconds() / 1e9 if s.HasField("observe_time") else now,
        nodes=tuple(node_from_proto(n) for n in s.nodes),
        bound=_bound(s.reservations),
    )


def report_from_delta(cluster: str, d: inv.InventoryDelta, now: float) -> InventoryReport:
    return InventoryReport(
        cluster=cluster,
        sequence=d.sequence,
        full=False,
        base_sequence=d.base_sequence,
        observed_at=d.observe_time.ToNanoseconds() / 1e9 if d.HasField("observe_time") else now,
        nodes=tuple(node_from_proto(n) for n in d.upserted_nodes),
        removed=tuple(d.removed_node_names),
        bound=_bound(d.reservations),
    )


_RUNNING = {common_pb2.REPLICA_PHASE_RUNNING, common_pb2.REPLICA_PHASE_SUCCEEDED}


def workload_from_proto(w: cs.WorkloadStatus) -> link.WorkloadReport:
    name = cs.WorkloadPhase.Name(w.phase) if w.phase in cs.WorkloadPhase.values() else "WORKLOAD_PHASE_UNSPECIFIED"
    oname = (
        job_pb2.AttemptOutcome.Name(w.outcome)
        if w.outcome in job_pb2.AttemptOutcome.values()
        else "ATTEMPT_OUTCOME_UNSPECIFIED"
    ).removeprefix("ATTEMPT_OUTCOME_")
    return link.WorkloadReport(
        job_id=w.attempt.job_id,
        attempt=w.attempt.attempt,
        phase=name.removeprefix("WORKLOAD_PHASE_"),
        outcome=None if oname == "UNSPECIFIED" else AttemptOutcome(oname),
        exit_code=w.exit_code if w.HasField("exit_code") else None,
        message=w.message,
        namespace=w.namespace,
        running_replicas=sum(1 for r in w.replicas if r.phase in _RUNNING),
        total_replicas=len(w.replicas),
        replicas=tuple(_replica(r) for r in w.replicas),
        rendezvous=w.rendezvous_address,
    )


def _replica(r: common_pb2.ReplicaStatus) -> ReplicaRecord:
    known = r.phase in common_pb2.ReplicaPhase.values()
    phase = common_pb2.ReplicaPhase.Name(r.phase) if known else "REPLICA_PHASE_UNSPECIFIED"
    return ReplicaRecord(
        pod_set=r.pod_set,
        index=r.index,
        pod=r.pod_name,
        node=r.node,
        phase=phase.removeprefix("REPLICA_PHASE_"),
        exit_code=r.exit_code if r.HasField("exit_code") else None,
        reason=r.reason,
        message=r.message[:1024],
    )


_FEEDBACK_NODES = 5
"""Failed nodes named per pod in the feedback line; the rest are counted."""


def _reasons(n: common_pb2.NodeFitResult) -> str:
    names = [
        common_pb2.FitReason.Name(r).removeprefix("FIT_REASON_")
        if r in common_pb2.FitReason.values()
        else "UNSPECIFIED"
        for r in n.reasons
    ]
    detail = f" ({n.message})" if n.message else ""
    return f"{n.node}: {'+'.join(names) or 'UNSPECIFIED'}{detail}"


def feedback_from_proto(f: cs.SchedulingFeedback, now: float) -> link.Feedback:
    """Per pod, one line naming the nodes the extender refused and why (passes are left out)."""
    out = []
    for p in f.pods:
        failed = [n for n in p.nodes if not n.fits]
        parts = [_reasons(n) for n in failed[:_FEEDBACK_NODES]]
        if len(failed) > _FEEDBACK_NODES:
            parts.append(f"{len(failed) - _FEEDBACK_NODES} more nodes refused")
        fits = len(p.nodes) - len(failed)
        head = f"{p.pod_set}-{p.index}" + (f" ({p.pod_name})" if p.pod_name else "")
        if p.message:  # kube-scheduler's own aggregate (extender reasons and in-tree filters) says it best
            when = p.time.ToNanoseconds() / 1e9 if p.HasField("time") else now
            text = f"{head}: {p.reason + ': ' if p.reason else ''}{p.message}"
            out.append(
                link.PodFeedback(p.attempt.job_id, p.attempt.attempt, p.pod_set, p.index, p.pod_name, when, text[:2048])
            )
            continue
        verdict = "; ".join(parts) if parts else "no node refused"
        text = f"{head}: {verdict}" + (f"; {fits} nodes fit" if fits else "")
        when = p.time.ToNanoseconds() / 1e9 if p.HasField("time") else now
        out.append(link.PodFeedback(p.attempt.job_id, p.attempt.attempt, p.pod_set, p.index, p.pod_name, when, text))
    return link.Feedback(tuple(out))


def _dur(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


_DEFAULT_PORTS = {job_pb2.FRAMEWORK_TORCHRUN: 29500, job_pb2.FRAMEWORK_RAY: 6379, job_pb2.FRAMEWORK_MPI: 2222}


def _pod_sets(spec: job_pb2.JobSpec, assignments: Sequence[ReplicaPlacement], out: Any, *, templates: bool) -> None:
    """Per pod set of `spec`: its shape and nodes in index order, contiguous per node (and its template)."""
    by_set: dict[str, list[ReplicaPlacement]] = {}
    for r in assignments:
        by_set.setdefault(r.pod_set, []).append(r)
    for ps in spec.pod_sets:
        reps = sorted(by_set.get(ps.name, []), key=lambda r: r.index)
        one = out.add(
            name=ps.name,
            count=len(reps),
            pod_template_json=ps.pod_template_json if templates else "",
            fixed_count=ps.fixed_count,
        )
        one.shape.CopyFrom(ps.shape)
        for r in reps:
            if one.nodes and one.nodes[-1].node == r.node:
                one.nodes[-1].replicas += 1
            else:
                one.nodes.add(node=r.node, replicas=1)


def hold_message(h: link.HoldOut) -> cs.HoldNodes:
    msg = cs.HoldNodes(dispatch_id=h.dispatch_id, drain=h.drain)
    msg.attempt.job_id = h.job_id
    msg.attempt.attempt = h.attempt
    if h.drain:
        for node, gpus in h.idle:
            one = msg.pod_sets.add(name=f"hold/{node}", count=1)
            one.shape.gpu_count = gpus
            one.nodes.add(node=node, replicas=1)
    else:
        _pod_sets(spec_from_bytes(h.spec), h.assignments, msg.pod_sets, templates=False)
    msg.expires_at.CopyFrom(ts(h.expires_at))
    return msg


def dispatch_message(d: link.DispatchOut) -> cs.Dispatch:
    """The Dispatch for an attempt: per pod set the nodes in index order, contiguous per node."""
    spec = spec_from_bytes(d.spec)
    msg = cs.Dispatch(
        tenant=d.tenant,
        job_set_id=spec.job_set_id,
        queue=spec.queue,
        priority_band=spec.priority_band or "default",
        inventory_sequence=d.inventory_sequence,
    )
    msg.attempt.job_id = d.job_id
    msg.attempt.attempt = d.attempt
    for seg in d.domain:
        msg.domain.segments.add(value=seg)
    _pod_sets(spec, d.assignments, msg.pod_sets, templates=True)
    framework = spec.framework or job_pb2.FRAMEWORK_PLAIN
    msg.rendezvous.framework = framework
    msg.rendezvous.port = spec.rendezvous_port or _DEFAULT_PORTS.get(framework, 29400)
    msg.rendezvous.service_name = f"{d.job_id}-{d.attempt}"
    msg.start_deadline.CopyFrom(ts(d.start_deadline))
    msg.dispatch_id = d.dispatch_id
    if d.start_timeout_s:
        msg.start_timeout.CopyFrom(_dur(d.start_timeout_s))
    msg.restart_reason = d.restart_reason
    msg.previous_cluster = d.previous_cluster
    msg.preemptible = spec.preemptible
    if spec.HasField("max_runtime"):
        msg.max_runtime.CopyFrom(spec.max_runtime)
    if spec.HasField("termination_grace_period"):
        msg.termination_grace_period.CopyFrom(spec.termination_grace_period)
    msg.namespace_hint = spec.namespace_hint
    msg.labels.update(spec.labels)
    msg.annotations.update(spec.annotations)
    return msg


def start_message(job_id: str, attempt: int) -> cs.Start:
    out = cs.Start()
    out.attempt.job_id = job_id
    out.attempt.attempt = attempt
    return out


_CANCEL_REASON = {
    "USER_REQUEST": cs.CANCEL_REASON_USER_REQUEST,
    "PREEMPTED": cs.CANCEL_REASON_PREEMPTED,
    "GANG_TIMEOUT": cs.CANCEL_REASON_GANG_TIMEOUT,
    "SUPERSEDED": cs.CANCEL_REASON_SUPERSEDED,
    "GANG_FAILED": cs.CANCEL_REASON_GANG_FAILED,
}


def cancel_message(job_id: str, attempt: int, reason: str, grace_s: float, message: str = "") -> cs.Cancel:
    out = cs.Cancel(reason=_CANCEL_REASON.get(reason, cs.CANCEL_REASON_UNSPECIFIED), message=message)
    out.attempt.job_id = job_id
    out.attempt.attempt = attempt
    out.grace_period.CopyFrom(_dur(grace_s))
    return out


def welcome_message(w: link.Welcome) -> cs.Welcome:
    out = cs.Welcome(
        protocol_version=1, broker_id=w.broker_id, session_id=w.session_id, max_message_bytes=w.max_message_bytes
    )
    out.heartbeat_interval.CopyFrom(_dur(w.heartbeat_s))
    out.heartbeat_timeout.CopyFrom(_dur(w.timeout_s))
    for job, attempt in w.obsolete:
        out.obsolete_attempts.add(job_id=job, attempt=attempt)
    for job, attempt in w.current:
        out.current_attempts.add(job_id=job, attempt=attempt)
    return out


def hello_from_proto(h: cs.Hello) -> link.Hello:
    known = tuple((k.attempt.job_id, k.attempt.attempt) for k in h.known_attempts)
    return link.Hello(hello_meta(h), h.protocol_version, known, h.leader_epoch, h.leader_identity)


def agent_message(msg: cs.AgentMessage, cluster: str, now: float) -> link.Inbound | None:
    """One agent message as a domain value (None for an empty or unknown body)."""
    kind = msg.WhichOneof("body")
    if kind == "inventory_snapshot":
        return link.Report(report_from_snapshot(cluster, msg.inventory_snapshot, now))
    if kind == "inventory_delta":
        return link.Report(report_from_delta(cluster, msg.inventory_delta, now))
    if kind == "dispatch_ack":
        ack = msg.dispatch_ack
        rej = ack.rejection
        nodes = tuple(rej.nodes) + tuple(r.node for r in rej.node_results if r.node not in rej.nodes)
        known = rej.reason in job_pb2.DispatchRejectReason.values()
        reason = job_pb2.DispatchRejectReason.Name(rej.reason) if known else "UNSPECIFIED"
        return link.DispatchReply(
            ack.attempt.job_id,
            ack.attempt.attempt,
            ack.accepted,
            ack.namespace,
            reason.removeprefix("DISPATCH_REJECT_REASON_"),
            rej.message,
            nodes,
        )
    if kind == "workload_status":
        return workload_from_proto(msg.workload_status)
    if kind == "scheduling_feedback":
        return feedback_from_proto(msg.scheduling_feedback, now)
    if kind == "cancel_ack":
        c = msg.cancel_ack
        gone = c.result in (cs.CANCEL_RESULT_DELETED, cs.CANCEL_RESULT_NOT_FOUND)
        return link.CancelReply(c.attempt.job_id, c.attempt.attempt, gone, c.message)
    if kind == "heartbeat":
        return link.Heartbeat(msg.heartbeat.inventory_sequence)
    if kind == "hello":
        return hello_from_proto(msg.hello)
    return None


def broker_message(sequence: int, now: float, out: link.Outbound) -> cs.BrokerMessage:
    """The BrokerMessage for one outbound domain message."""
    msg = cs.BrokerMessage(sequence=sequence)
    msg.send_time.CopyFrom(ts(now))
    if isinstance(out, link.Welcome):
        msg.welcome.CopyFrom(welcome_message(out))
    elif isinstance(out, link.DispatchOut):
        msg.dispatch.CopyFrom(dispatch_message(out))
    elif isinstance(out, link.StartOut):
        msg.start.CopyFrom(start_message(out.job_id, out.attempt))
    elif isinstance(out, link.CancelOut):
        msg.cancel.CopyFrom(cancel_message(out.job_id, out.attempt, out.reason, out.grace_s, out.message))
    elif isinstance(out, link.AckOut):
        msg.ack.acked_agent_sequence = out.acked_agent_sequence
    elif isinstance(out, link.HoldOut):
        msg.hold.CopyFrom(hold_message(out))
    elif isinstance(out, link.ReleaseHoldOut):
        msg.release_hold.attempt.job_id = out.job_id
        msg.release_hold.attempt.attempt = out.attempt
        msg.release_hold.drain = out.drain
    else:
        msg.resync.CopyFrom(cs.ResyncRequest(inventory=out.inventory, workloads=out.workloads, reason=out.reason))
    return msg


def cluster_summary(
    state: ClusterState,
    gpus: ClusterGpus | None,
    now: float,
    stale: bool,
    active_attempts: int,
    cordon_reason: str = "",
) -> cs.ClusterSummary:
    """One cluster's facts from a fleet snapshot, and its GPUs as read through that snapshot (None: no report)."""
    out = cs.ClusterSummary(
        name=state.name,
        region=state.meta.region,
        role=state.meta.role,
        connected=state.connected,
        cordoned=state.cordoned,
        cordon_reason=cordon_reason,
        stale=stale,
        nodes=state.nodes,
        active_attempts=active_attempts,
    )
    for lvl in state.meta.levels:
        out.topology_levels.add(name=lvl.name, label_key=lvl.key)
    if state.last_report:
        out.last_report_time.CopyFrom(ts(state.last_report))
        out.last_report_age.CopyFrom(_dur(max(0.0, now - state.last_report)))
    if gpus is None:
        return out
    for g in gpus.gpus:
        out.gpus.add(model=g.model, total=g.total, free=g.free)
    for d in gpus.domains:
        ds = out.domains.add(level=state.meta.levels[d.depth].name, nodes=d.nodes)
        for seg in d.path:
            ds.path.segments.add(value=seg) if seg is not None else ds.path.segments.add()
        for g in d.gpus:
            ds.gpus.add(model=g.model, total=g.total, free=g.free)
    return out
