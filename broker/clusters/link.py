"""The agent link's messages as plain domain types (both directions), so protobuf stays in the servicer and serde."""

from __future__ import annotations

from dataclasses import dataclass

from broker.domain.records import ReplicaRecord
from broker.domain.states import AttemptOutcome
from fleetplan.catalog import ClusterMeta, InventoryReport, ReplicaPlacement

__all__ = [
    "Hello",
    "Report",
    "DispatchReply",
    "WorkloadReport",
    "PodFeedback",
    "Feedback",
    "CancelReply",
    "Heartbeat",
    "Inbound",
    "Welcome",
    "DispatchOut",
    "StartOut",
    "CancelOut",
    "AckOut",
    "ResyncOut",
    "Outbound",
]

# ----------------------------------------------------------------------------- agent -> broker


@dataclass(frozen=True, slots=True)
class Hello:
    meta: ClusterMeta
    protocol_version: int
    known: tuple[tuple[str, int], ...] = ()
    """(job, attempt) of every workload the cluster holds."""
    leader_epoch: int = 0
    """The agent Lease's transitions when this agent became leader: the highest epoch's stream wins."""
    leader_identity: str = ""


@dataclass(frozen=True, slots=True)
class Report:
    report: InventoryReport


@dataclass(frozen=True, slots=True)
class DispatchReply:
    job_id: str
    attempt: int
    accepted: bool
    namespace: str = ""
    reason: str = ""
    """DispatchRejectReason name without its prefix, e.g. DOES_NOT_FIT."""
    message: str = ""
    nodes: tuple[str, ...] = ()
    """Nodes the rejection names (excluded until the cluster's next report)."""


@dataclass(frozen=True, slots=True)
class WorkloadReport:
    """A WorkloadStatus reduced to what the broker's lifecycle reacts to."""

    job_id: str
    attempt: int
    phase: str
    """CREATING, GATED, STARTING, RUNNING, SUCCEEDED, FAILED, DELETED, UNSPECIFIED."""
    outcome: AttemptOutcome | None
    exit_code: int | None
    message: str
    namespace: str
    running_replicas: int
    total_replicas: int
    replicas: tuple[ReplicaRecord, ...] = ()
    """Every replica as observed (pod, node, phase, exit)."""
    rendezvous: str = ""
    """``<host>:<port>`` as the agent wired it; empty when it did not say."""


@dataclass(frozen=True, slots=True)
class PodFeedback:
    """The extender's filter verdict for one Tandem pod, as one line (``text``) for GetJob."""

    job_id: str
    attempt: int
    pod_set: str
    index: int
    pod: str
    time: float
    text: str


@dataclass(frozen=True, slots=True)
class Feedback:
    pods: tuple[PodFeedback, ...]


@dataclass(frozen=True, slots=True)
class CancelReply:
    job_id: str
    attempt: int
    gone: bool
    """The workload is deleted (or never existed): the cancel is confirmed."""
    message: str = ""


@dataclass(frozen=True, slots=True)
class Heartbeat:
    inventory_sequence: int = 0


Inbound = Hello | Report | DispatchReply | WorkloadReport | Feedback | CancelReply | Heartbeat

# ----------------------------------------------------------------------------- broker -> agent


@dataclass(frozen=True, slots=True)
class Welcome:
    broker_id: str
    session_id: str
    heartbeat_s: float
    timeout_s: float
    max_message_bytes: int
    obsolete: tuple[tuple[str, int], ...]
    current: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class DispatchOut:
    job_id: str
    attempt: int
    spec: bytes
    """The stored JobSpec (serialized); serde turns it into the Dispatch's pod sets."""
    tenant: str
    domain: tuple[str, ...]
    assignments: tuple[ReplicaPlacement, ...]
    start_deadline: float
    inventory_sequence: int
    dispatch_id: str = ""
    """``<store id>/<job>/<attempt>``: the agent adopts only objects carrying it."""
    start_timeout_s: float = 0.0
    restart_reason: str = ""
    """Outcome of the previous attempt (TANDEM_RESTART_REASON), empty for the first."""
    previous_cluster: str = ""


@dataclass(frozen=True, slots=True)
class StartOut:
    job_id: str
    attempt: int


@dataclass(frozen=True, slots=True)
class CancelOut:
    job_id: str
    attempt: int
    reason: str
    """USER_REQUEST, PREEMPTED, GANG_TIMEOUT, SUPERSEDED or GANG_FAILED."""
    grace_s: float
    message: str = ""


@dataclass(frozen=True, slots=True)
class AckOut:
    acked_agent_sequence: int


@dataclass(frozen=True, slots=True)
class ResyncOut:
    inventory: bool
    workloads: bool
    reason: str


@dataclass(frozen=True, slots=True)
class HoldOut:
    """Keep these nodes for an attempt to be dispatched once the jobs preempted for it have left."""

    job_id: str
    attempt: int
    spec: bytes
    """The stored JobSpec (its pod sets' shapes)."""
    assignments: tuple[ReplicaPlacement, ...]
    expires_at: float
    dispatch_id: str = ""
    drain: bool = False
    """A held domain's idle GPUs: `idle` (node, whole GPUs) instead of the spec's pod sets."""
    idle: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class ReleaseHoldOut:
    job_id: str
    attempt: int
    drain: bool = False


Outbound = Welcome | DispatchOut | StartOut | CancelOut | AckOut | ResyncOut | HoldOut | ReleaseHoldOut
