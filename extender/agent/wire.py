"""ClusterService protobuf <-> the agent's domain, in one place (the agent's side of the broker link).

Broker messages become plain values (`Order`, `StartMsg`, ...); what the agent says goes out through the
builders here. Nothing else in the agent touches protobuf, except the inventory encoder (`encode`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from google.protobuf import duration_pb2, timestamp_pb2

from extender.agent.config import AgentConfig
from extender.agent.model import AttemptKey, DeviceRequestSpec, NodeCount, Order, PodSetOrder
from extender.agent.status import PodFeedback, ReplicaView
from placement.errors import PodSpecError
from placement.model import WHOLE_GPU_MILLI, DraRequest, PodShape
from placement.podspec import shape_from_pod
from tandem.v1 import cluster_service_pb2 as cs
from tandem.v1 import common_pb2, job_pb2

__all__ = [
    "WireError",
    "WelcomeMsg",
    "StartMsg",
    "CancelMsg",
    "AckMsg",
    "ResyncMsg",
    "Inbound",
    "Rejection",
    "NodeResult",
    "KnownAttempt",
    "WorkloadReport",
    "PROTOCOL_VERSION",
    "Outbox",
    "inbound",
    "order_from_dispatch",
    "hello",
    "dispatch_ack",
    "workload_status",
    "scheduling_feedback",
    "cancel_ack",
    "heartbeat",
]

PROTOCOL_VERSION = 1


class WireError(ValueError):
    """A broker message the agent cannot act on; `field` names what is wrong, `key` the attempt of a
    Dispatch that could not be read (so it can still be rejected)."""

    def __init__(self, field_path: str, message: str, key: AttemptKey | None = None) -> None:
        super().__init__(f"{field_path}: {message}")
        self.field = field_path
        self.key = key


# ----------------------------------------------------------------------------- broker -> agent


@dataclass(frozen=True, slots=True)
class WelcomeMsg:
    obsolete: tuple[AttemptKey, ...]
    current: tuple[AttemptKey, ...]
    heartbeat_s: float
    session_id: str


@dataclass(frozen=True, slots=True)
class StartMsg:
    key: AttemptKey


@dataclass(frozen=True, slots=True)
class CancelMsg:
    key: AttemptKey
    reason: str
    """CancelReason name without its prefix (USER_REQUEST, PREEMPTED, SUPERSEDED, ...)."""
    grace_s: float | None
    message: str = ""


@dataclass(frozen=True, slots=True)
class AckMsg:
    sequence: int


@dataclass(frozen=True, slots=True)
class ResyncMsg:
    inventory: bool
    workloads: bool
    reason: str


@dataclass(frozen=True, slots=True)
class HoldMsg:
    """Keep nodes for an attempt the broker will dispatch once the jobs preempted for it have left."""

    key: AttemptKey
    pod_sets: tuple[PodSetOrder, ...]
    expires_at: float
    dispatch_id: str = ""
    drain: bool = False
    """A held domain's idle GPUs (written as `<job>-<attempt>-drain`) rather than a preemption's nodes."""


@dataclass(frozen=True, slots=True)
class ReleaseHoldMsg:
    key: AttemptKey
    drain: bool = False


Inbound = WelcomeMsg | Order | StartMsg | CancelMsg | AckMsg | ResyncMsg | HoldMsg | ReleaseHoldMsg


def _key(ref: common_pb2.AttemptRef) -> AttemptKey:
    return (ref.job_id, ref.attempt)


def _seconds(d: duration_pb2.Duration) -> float:
    return d.seconds + d.nanos / 1e9


def _enum_name(enum: Any, value: int, prefix: str) -> str:
    return str(enum.Name(value)).removeprefix(prefix) if value in enum.values() else "UNSPECIFIED"


def _pod_set(ps: cs.PodSetDispatch, path: str) -> PodSetOrder:
    try:
        template = orjson.loads(ps.pod_template_json or "{}")
    except orjson.JSONDecodeError as e:
        raise WireError(f"{path}.pod_template_json", f"not JSON: {e}") from e
    if not isinstance(template, dict):
        raise WireError(f"{path}.pod_template_json", "must be a PodTemplateSpec object")
    try:
        from_template = shape_from_pod({"spec": template.get("spec") or {}})
    except PodSpecError as e:
        raise WireError(f"{path}.pod_template_json.{e.field}", str(e)) from e
    s = ps.shape
    requests = tuple(
        DeviceRequestSpec(
            r.name or f"r{i}",
            r.device_class_name,
            tuple(r.selectors),
            max(r.count, 1),
            r.allocation_mode == job_pb2.DEVICE_ALLOCATION_MODE_ALL,
        )
        for i, r in enumerate(s.device_requests)
    )
    declared, templated = frozenset(s.allowed_gpu_models), from_template.gpu_models
    models = declared & templated if declared and templated else declared or templated
    shape = PodShape(
        gpus=s.gpu_count,
        gpu_milli=s.gpu_milli or WHOLE_GPU_MILLI,
        gpu_models=models,
        min_gpu_memory_mib=s.min_gpu_memory_mib,
        mig_profile=s.mig_profile or None,
        mig_count=s.mig_count,
        dra=tuple(DraRequest(r.device_class, r.selectors, r.count) for r in requests),
        cpu_milli=s.cpu_milli,
        memory=s.memory_bytes,
        extended=tuple(sorted(s.extended_resources.items())),
        # Where it may run comes from the template (the broker judged these; the agent only narrows them).
        tolerations=from_template.tolerations,
        node_selector=from_template.node_selector,
        affinity=from_template.affinity,
    )
    nodes = tuple(NodeCount(n.node, n.replicas) for n in ps.nodes)
    if not ps.name:
        raise WireError(f"{path}.name", "required")
    if sum(n.replicas for n in nodes) != ps.count or any(n.replicas < 1 or not n.node for n in nodes):
        raise WireError(f"{path}.nodes", f"must assign exactly count={ps.count} replicas, each node >= 1")
    return PodSetOrder(ps.name, ps.count, shape, template, nodes, requests, ps.fixed_count)


def order_from_dispatch(d: cs.Dispatch) -> Order:
    """The order a Dispatch carries; raises WireError naming the field the agent cannot use."""
    if not d.attempt.job_id or d.attempt.attempt < 1:
        raise WireError("attempt", "job_id and attempt >= 1 are required")
    if not d.pod_sets:
        raise WireError("pod_sets", "at least one pod set is required")
    pod_sets = tuple(_pod_set(ps, f"pod_sets[{i}]") for i, ps in enumerate(d.pod_sets))
    start_deadline = d.start_deadline.ToNanoseconds() / 1e9 if d.HasField("start_deadline") else 0.0
    return Order(
        job_id=d.attempt.job_id,
        attempt=d.attempt.attempt,
        tenant=d.tenant,
        pod_sets=pod_sets,
        domain=tuple(s.value if s.HasField("value") else "" for s in d.domain.segments),
        namespace_hint=d.namespace_hint,
        framework=_enum_name(job_pb2.Framework, d.rendezvous.framework, "FRAMEWORK_").replace("UNSPECIFIED", "PLAIN"),
        rendezvous_port=d.rendezvous.port or 29400,
        start_deadline=start_deadline,
        start_timeout_s=_seconds(d.start_timeout) if d.HasField("start_timeout") else 600.0,
        max_runtime_s=_seconds(d.max_runtime) if d.HasField("max_runtime") else None,
        job_set=d.job_set_id,
        queue=d.queue,
        labels=dict(d.labels),
        annotations=dict(d.annotations),
        priority_band=d.priority_band or "default",
        grace_s=_seconds(d.termination_grace_period) if d.HasField("termination_grace_period") else None,
        preemptible=d.preemptible,
        dispatch_id=d.dispatch_id,
        inventory_sequence=d.inventory_sequence,
        restart_reason=d.restart_reason,
        previous_cluster=d.previous_cluster,
    )


def inbound(msg: cs.BrokerMessage) -> Inbound | None:
    """One broker message as a domain value (None for kinds the agent ignores); WireError when unusable."""
    kind = msg.WhichOneof("body")
    if kind == "welcome":
        w = msg.welcome
        return WelcomeMsg(
            tuple(_key(a) for a in w.obsolete_attempts),
            tuple(_key(a) for a in w.current_attempts),
            _seconds(w.heartbeat_interval) or 5.0,
            w.session_id,
        )
    if kind == "dispatch":
        try:
            return order_from_dispatch(msg.dispatch)
        except WireError as e:
            raise WireError(e.field, str(e).partition(": ")[2], _key(msg.dispatch.attempt)) from e
    if kind == "start":
        return StartMsg(_key(msg.start.attempt))
    if kind == "cancel":
        c = msg.cancel
        grace = _seconds(c.grace_period) if c.HasField("grace_period") else None
        return CancelMsg(_key(c.attempt), _enum_name(cs.CancelReason, c.reason, "CANCEL_REASON_"), grace, c.message)
    if kind == "ack":
        return AckMsg(msg.ack.acked_agent_sequence)
    if kind == "resync":
        r = msg.resync
        return ResyncMsg(r.inventory, r.workloads, r.reason)
    if kind == "hold":
        h = msg.hold
        if not h.attempt.job_id or h.attempt.attempt < 1 or not h.pod_sets:
            raise WireError("hold", "attempt (job_id, attempt >= 1) and pod sets are required")
        return HoldMsg(
            _key(h.attempt),
            tuple(_pod_set(ps, f"hold.pod_sets[{i}]") for i, ps in enumerate(h.pod_sets)),
            h.expires_at.ToNanoseconds() / 1e9,
            h.dispatch_id,
            h.drain,
        )
    if kind == "release_hold":
        return ReleaseHoldMsg(_key(msg.release_hold.attempt), msg.release_hold.drain)
    return None


# ----------------------------------------------------------------------------- agent -> broker


@dataclass(frozen=True, slots=True)
class NodeResult:
    node: str
    reasons: tuple[str, ...] = ()
    """tandem.v1.FitReason names without their prefix (the core's Reason names, plus wire-only ones)."""
    message: str = ""


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a dispatch is refused: a DispatchRejectReason name without its prefix, the detail, the nodes."""

    reason: str
    message: str
    nodes: tuple[str, ...] = ()
    node_results: tuple[NodeResult, ...] = ()


@dataclass(frozen=True, slots=True)
class KnownAttempt:
    key: AttemptKey
    phase: str
    """WorkloadPhase name without its prefix."""
    dispatch_id: str = ""


@dataclass(frozen=True, slots=True)
class WorkloadReport:
    key: AttemptKey
    phase: str
    """WorkloadPhase name without its prefix."""
    replicas: tuple[ReplicaView, ...] = ()
    namespace: str = ""
    rendezvous: str = ""
    outcome: str = ""
    """AttemptOutcome name without its prefix, for terminal phases."""
    exit_code: int | None = None
    message: str = ""


def _ts(t: float) -> timestamp_pb2.Timestamp:
    out = timestamp_pb2.Timestamp()
    out.FromNanoseconds(int(t * 1e9))
    return out


def _ref(out: common_pb2.AttemptRef, key: AttemptKey) -> None:
    out.job_id, out.attempt = key


def hello(
    config: AgentConfig,
    known: Iterable[KnownAttempt],
    *,
    epoch: int,
    identity: str,
    instance_id: str,
    kubernetes_version: str,
    agent_version: str,
    dispatch: bool,
    dra_enabled: bool = True,
) -> cs.Hello:
    out = cs.Hello(
        cluster_name=config.cluster_name,
        region=config.region,
        role=config.role,
        protocol_version=PROTOCOL_VERSION,
        agent_version=agent_version,
        agent_instance_id=instance_id,
        leader_epoch=epoch,
        leader_identity=identity,
    )
    out.capabilities.dispatch = dispatch
    for name, key in config.topology_levels():
        out.topology_levels.add(name=name, label_key=key)
    for name, template in sorted(config.log_url_templates.items()):
        out.log_url_templates.add(name=name, url_template=template)
    for k in known:
        ka = out.known_attempts.add(
            phase=cs.WorkloadPhase.Value(f"WORKLOAD_PHASE_{k.phase}"), dispatch_id=k.dispatch_id
        )
        _ref(ka.attempt, k.key)
    for tenant, namespaces in sorted(config.tenants.items()):
        out.tenant_namespaces.add(tenant=tenant, namespaces=namespaces)
    c = out.cluster
    c.name, c.region, c.role, c.kubernetes_version = config.cluster_name, config.region, config.role, kubernetes_version
    c.labels.update(config.cluster_labels)
    c.dra_enabled = dra_enabled
    return out


def dispatch_ack(
    key: AttemptKey, *, namespace: str = "", rejection: Rejection | None = None, inventory_sequence: int = 0
) -> cs.DispatchAck:
    out = cs.DispatchAck(accepted=rejection is None, namespace=namespace, inventory_sequence=inventory_sequence)
    _ref(out.attempt, key)
    if rejection is not None:
        r = out.rejection
        r.reason = job_pb2.DispatchRejectReason.Value(f"DISPATCH_REJECT_REASON_{rejection.reason}")
        r.message = rejection.message[:4096]
        r.nodes.extend(rejection.nodes)
        for n in rejection.node_results:
            r.node_results.add(
                node=n.node,
                fits=False,
                message=n.message,
                reasons=[common_pb2.FitReason.Value(f"FIT_REASON_{x}") for x in n.reasons],
            )
    return out


def workload_status(w: WorkloadReport, now: float) -> cs.WorkloadStatus:
    out = cs.WorkloadStatus(
        phase=cs.WorkloadPhase.Value(f"WORKLOAD_PHASE_{w.phase}"),
        namespace=w.namespace,
        rendezvous_address=w.rendezvous,
        message=w.message[:4096],
    )
    _ref(out.attempt, w.key)
    if w.outcome:
        out.outcome = job_pb2.AttemptOutcome.Value(f"ATTEMPT_OUTCOME_{w.outcome}")
    if w.exit_code is not None:
        out.exit_code = w.exit_code
    out.observe_time.CopyFrom(_ts(now))
    for r in w.replicas:
        rs = out.replicas.add(
            pod_set=r.pod_set,
            index=r.index,
            pod_name=r.pod,
            node=r.node,
            phase=common_pb2.ReplicaPhase.Value(f"REPLICA_PHASE_{r.phase}"),
            reason=r.reason,
            message=r.message[:1024],
            restart_count=r.restarts,
        )
        if r.exit_code is not None:
            rs.exit_code = r.exit_code
        if r.start_time is not None:
            rs.start_time.CopyFrom(_ts(r.start_time))
        if r.finish_time is not None:
            rs.finish_time.CopyFrom(_ts(r.finish_time))
    return out


def scheduling_feedback(key: AttemptKey, items: Sequence[PodFeedback], seen_at: float) -> cs.SchedulingFeedback:
    """The attempt's pods' verdicts, each stamped `seen_at` (when the agent saw them)."""
    out = cs.SchedulingFeedback()
    for f in items:
        p = out.pods.add(pod_set=f.pod_set, index=f.index, pod_name=f.pod, reason=f.reason, message=f.message[:2048])
        _ref(p.attempt, key)
        p.time.CopyFrom(_ts(seen_at))
    return out


_CANCEL_RESULT = {
    "DELETED": cs.CANCEL_RESULT_DELETED,
    "NOT_FOUND": cs.CANCEL_RESULT_NOT_FOUND,
    "IN_PROGRESS": cs.CANCEL_RESULT_IN_PROGRESS,
    "FAILED": cs.CANCEL_RESULT_FAILED,
}


def cancel_ack(key: AttemptKey, result: str, message: str = "") -> cs.CancelAck:
    out = cs.CancelAck(result=_CANCEL_RESULT[result], message=message[:4096])
    _ref(out.attempt, key)
    return out


def heartbeat(applied_broker_sequence: int, inventory_sequence: int, leader: bool) -> cs.Heartbeat:
    return cs.Heartbeat(
        applied_broker_sequence=applied_broker_sequence, inventory_sequence=inventory_sequence, leader=leader
    )


@dataclass
class Outbox:
    """Numbers agent messages of one stream (1 = the Hello) and remembers which are still unacknowledged."""

    sequence: int = 0
    acked: int = 0
    clock: Any = field(default=time.time)

    def message(self, **body: Any) -> cs.AgentMessage:
        self.sequence += 1
        msg = cs.AgentMessage(sequence=self.sequence, **body)
        msg.send_time.CopyFrom(_ts(self.clock()))
        return msg
