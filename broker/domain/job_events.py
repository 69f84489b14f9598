"""What can happen to a job: the events the state machine (broker.domain.lifecycle.react) reacts to.

Each names the job and the attempt it is about, so a late event about an older attempt is recognised.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.domain.states import AttemptOutcome
from fleetplan.catalog import ReplicaPlacement

__all__ = [
    "Reserve",
    "DispatchSent",
    "DispatchAccepted",
    "DispatchRejected",
    "WorkloadReady",
    "AllRunning",
    "AttemptEnded",
    "CancelRequested",
    "PreemptRequested",
    "ClusterSilent",
    "ReservationExpired",
    "AbandonLost",
    "RequeueRequested",
    "Event",
]


@dataclass(frozen=True, slots=True)
class Reserve:
    """The placer chose a placement for a QUEUED job at ``attempt`` (its current number): persist it, order dispatch."""

    job_id: str
    attempt: int
    cluster: str
    domain: tuple[str, ...]
    assignments: tuple[ReplicaPlacement, ...]
    gpu_model: str
    gpus: float
    expires_at: float | None = None


@dataclass(frozen=True, slots=True)
class DispatchSent:
    job_id: str
    attempt: int


@dataclass(frozen=True, slots=True)
class DispatchAccepted:
    job_id: str
    attempt: int
    namespace: str = ""


@dataclass(frozen=True, slots=True)
class DispatchRejected:
    job_id: str
    attempt: int
    reason: str = ""
    """DispatchRejectReason name."""
    message: str = ""
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class WorkloadReady:
    """Every replica's gated pod exists: order Start."""

    job_id: str
    attempt: int


@dataclass(frozen=True, slots=True)
class AllRunning:
    job_id: str
    attempt: int


@dataclass(frozen=True, slots=True)
class AttemptEnded:
    """The cluster reports the attempt's workload finished or gone (also confirms cancel / preempt)."""

    job_id: str
    attempt: int
    outcome: AttemptOutcome
    exit_code: int | None = None
    message: str = ""


@dataclass(frozen=True, slots=True)
class CancelRequested:
    job_id: str
    actor: str = "broker"
    message: str = ""
    grace_s: float = 30.0


@dataclass(frozen=True, slots=True)
class PreemptRequested:
    job_id: str
    attempt: int
    grace_s: float = 30.0
    message: str = ""


@dataclass(frozen=True, slots=True)
class ClusterSilent:
    """The attempt's cluster missed heartbeats past the bound."""

    job_id: str
    attempt: int


@dataclass(frozen=True, slots=True)
class ReservationExpired:
    job_id: str
    attempt: int


@dataclass(frozen=True, slots=True)
class AbandonLost:
    """Stop waiting for a silent cluster to confirm this attempt (bound or admin); the agent deletes it on reconnect.

    LOST → re-queued (outcome LOST, retry spent); CANCELLING → CANCELLED and PREEMPTED → re-queued
    (outcome LOST, no retry spent: the broker had already asked for the attempt to end).
    """

    job_id: str
    attempt: int
    actor: str = "broker"


@dataclass(frozen=True, slots=True)
class RequeueRequested:
    """An operator (admin or the job's tenant) sends a job holding capacity back to the queue, no retry spent,
    preemptible or not: ACCEPTED/STARTING/RUNNING → PREEMPTED with a PREEMPT order (QUEUED once the cluster
    confirms); RESERVED/DISPATCHED → QUEUED now (outcome PREEMPTED) with a CANCEL order. Else not applicable."""

    job_id: str
    attempt: int
    actor: str = "broker"
    grace_s: float = 30.0
    message: str = ""


Event = (
    Reserve
    | DispatchSent
    | DispatchAccepted
    | DispatchRejected
    | WorkloadReady
    | AllRunning
    | AttemptEnded
    | CancelRequested
    | PreemptRequested
    | ClusterSilent
    | ReservationExpired
    | AbandonLost
    | RequeueRequested
)
