"""Typed domain records the store persists and returns: jobs, attempts, reservations, watch events, dispatch orders.

Frozen dataclasses, no protobuf: the services convert to and from tandem.v1
messages in their serde module. Times are float seconds since the epoch (the
injected clock's unit).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from broker.domain.states import AttemptOutcome, JobState
from fleetplan.catalog import ReplicaPlacement

__all__ = [
    "event_log",
    "ReplicaPlacement",
    "ReplicaRecord",
    "NewJob",
    "JobRecord",
    "SubmitResult",
    "AttemptRecord",
    "AttemptStamp",
    "AttemptClose",
    "OrderKind",
    "OrderSpec",
    "DispatchOrder",
    "Transition",
    "EventKind",
    "UpdateReason",
    "WatchEvent",
    "JobFilter",
    "JobPage",
    "WatchPage",
    "GpuHours",
    "CompactionResult",
]

Labels = tuple[tuple[str, str], ...]


def freeze_labels(labels: Mapping[str, str] | Labels) -> Labels:
    """Canonical, hashable label form: sorted (key, value) pairs."""
    items = labels.items() if isinstance(labels, Mapping) else labels
    return tuple(sorted((str(k), str(v)) for k, v in items))


@dataclass(frozen=True, slots=True)
class ReplicaRecord:
    """One replica of an attempt as the cluster observed it (pod, node, phase, exit)."""

    pod_set: str
    index: int
    pod: str = ""
    node: str = ""
    phase: str = "PENDING"
    """ReplicaPhase without its prefix: PENDING, GATED, SCHEDULED, RUNNING, SUCCEEDED, FAILED, UNKNOWN..."""
    exit_code: int | None = None
    reason: str = ""
    message: str = ""


@dataclass(frozen=True, slots=True)
class NewJob:
    """A submission as the services hand it to the store (validated and authorised already).

    ``spec`` is the serialized JobSpec (``SerializeToString(deterministic=True)``
    so retries fingerprint the same); the other fields are the indexed copy.
    """

    tenant: str
    queue: str
    spec: bytes
    job_set: str = ""
    priority_band: str = "default"
    priority: int = 0
    preemptible: bool = False
    labels: Labels = ()
    gpus: float = 0.0
    """Total GPU demand in whole-GPU equivalents (MIG / shares as fractions)."""
    gpu_models: tuple[str, ...] = ()
    """Allowed GPU models (empty = any the tenant may use)."""
    max_infra_retries: int | None = None
    """Per-job retry budget; None = the store's RetryPolicy default."""
    max_runtime_s: float | None = None
    idempotency_key: str | None = None
    """Scoped per tenant; None = no deduplication."""
    fingerprint: bytes | None = None
    """Hash of the canonical request; None = the store computes one over every field above."""
    job_id: str | None = None
    """Normally None (the store's id generator names the job)."""
    actor: str = "broker"
    """Who submitted, for the job's first history entry, e.g. ``tenant/alice`` (not part of the fingerprint)."""


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A job as stored: identity, indexed spec fields, the spec bytes and its current status."""

    job_id: str
    seq: int
    """Arrival order (monotonic per store); also the pagination key."""
    tenant: str
    queue: str
    job_set: str
    priority_band: str
    priority: int
    preemptible: bool
    labels: Labels
    gpus: float
    gpu_models: tuple[str, ...]
    max_infra_retries: int | None
    max_runtime_s: float | None
    spec: bytes
    idempotency_key: str | None
    fingerprint: bytes
    state: JobState
    attempt: int
    """Current attempt number; 0 before the first reservation."""
    infra_retries: int
    """Retry budget spent so far."""
    not_before: float
    """Earliest time the placer may reserve it (retry back-off); 0 = now."""
    create_time: float
    update_time: float
    end_time: float | None
    reason: str
    """Reason (CamelCase, lifecycle.TransitionReason) of the latest transition."""
    message: str
    revision: int
    """Store revision of the latest change to this job."""
    held: bool = False
    """An operator hold (HoldJob) is on: the placer must not reserve it; the store refuses a Reserve for it."""
    held_by: str = ""
    """Who placed the hold (``tenant/<name>`` or ``admin/<principal>``); '' when not held."""

    @property
    def label_map(self) -> dict[str, str]:
        return dict(self.labels)

    @property
    def terminal(self) -> bool:
        return self.state.terminal


@dataclass(frozen=True, slots=True)
class SubmitResult:
    """``created`` is False when an idempotent retry returned the original job."""

    job: JobRecord
    created: bool


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One attempt (run) of a job on one cluster, with its reservation, timestamps and outcome."""

    job_id: str
    number: int
    cluster: str
    domain: tuple[str, ...]
    assignments: tuple[ReplicaPlacement, ...]
    gpu_model: str
    gpus: float
    reserve_time: float
    expires_at: float | None = None
    dispatch_time: float | None = None
    accept_time: float | None = None
    start_time: float | None = None
    running_time: float | None = None
    end_time: float | None = None
    outcome: AttemptOutcome | None = None
    exit_code: int | None = None
    message: str = ""
    spent_retry: bool = False
    namespace: str = ""
    rejection_reason: str = ""
    rejection_nodes: tuple[str, ...] = ()
    rendezvous: str = ""
    """``<host>:<port>`` of replica 0 of the first pod set, as the agent reported it."""
    feedback: str = ""
    """The extender's last filter verdict for a pod of this attempt that did not fit (one line)."""
    feedback_time: float | None = None
    replicas: tuple[ReplicaRecord, ...] = ()
    """Observed replicas (the agent's last WorkloadStatus), by pod set and index."""

    @property
    def active(self) -> bool:
        return self.outcome is None


@dataclass(frozen=True, slots=True)
class AttemptStamp:
    """Progress fields set on the current attempt by a transition (None = leave as is)."""

    dispatch_time: float | None = None
    accept_time: float | None = None
    start_time: float | None = None
    running_time: float | None = None
    namespace: str | None = None
    clear_expiry: bool = False
    """Drop expires_at (the cluster accepted the reservation)."""


@dataclass(frozen=True, slots=True)
class AttemptClose:
    """Ends the current attempt."""

    outcome: AttemptOutcome
    end_time: float
    message: str = ""
    exit_code: int | None = None
    spent_retry: bool = False
    rejection_reason: str = ""
    rejection_nodes: tuple[str, ...] = ()


class OrderKind(enum.StrEnum):
    """What the agent must do for (job, attempt)."""

    DISPATCH = "DISPATCH"
    """Validate the assignment, record the reservation, create the gated workload."""
    START = "START"
    """Pin and lift the gates (only honoured on a live stream)."""
    CANCEL = "CANCEL"
    """Delete the attempt's workload (grace period), then confirm."""
    PREEMPT = "PREEMPT"
    """Like CANCEL, outcome PREEMPTED; the job is re-queued."""


@dataclass(frozen=True, slots=True)
class OrderSpec:
    """An order a transition writes to the outbox (job and attempt come from the transition)."""

    kind: OrderKind
    cluster: str
    grace_s: float = 0.0
    attempt: int | None = None
    """Attempt the order is about; None = the transition's resulting attempt."""


@dataclass(frozen=True, slots=True)
class DispatchOrder:
    """An outbox row: written with the state change, delivered by the dispatcher, then acked."""

    order_id: int
    """Monotonic per store; the per-cluster delivery order."""
    cluster: str
    job_id: str
    attempt: int
    kind: OrderKind
    grace_s: float
    created_at: float
    delivered_at: float | None


@dataclass(frozen=True, slots=True)
class Transition:
    """Compare-and-set on (state, attempt) plus everything that goes in the same transaction.

    Applied atomically by ``Store.transition``: the job row, the attempt rows,
    one watch event and the outbox rows commit together or not at all.
    """

    job_id: str
    expect_state: JobState
    expect_attempt: int
    new_state: JobState
    reason: str
    message: str = ""
    actor: str = "broker"
    close_attempt: AttemptClose | None = None
    """End the current attempt (``expect_attempt``) with this outcome."""
    stamp: AttemptStamp | None = None
    """Progress stamps on the current attempt."""
    new_attempt: AttemptRecord | None = None
    """Open attempt ``expect_attempt + 1`` (its reservation); the job's attempt becomes its number."""
    spend_retry: bool = False
    """Add one to the job's infra_retries."""
    not_before: float | None = None
    """New earliest placement time (None = keep)."""
    orders: tuple[OrderSpec, ...] = ()


class EventKind(enum.StrEnum):
    SUBMITTED = "SUBMITTED"
    TRANSITION = "TRANSITION"
    UPDATED = "UPDATED"
    """Scheduling settings changed (priority, band, hold) without a state change: from_state = to_state."""


class UpdateReason(enum.StrEnum):
    """Reasons of UPDATED events (CamelCase like lifecycle.TransitionReason)."""

    PRIORITY_CHANGED = "PriorityChanged"
    HELD = "Held"
    RELEASED = "Released"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One committed change, at a store revision (monotonic, gap-free per commit order until compaction)."""

    revision: int
    job_id: str
    tenant: str
    job_set: str
    kind: EventKind
    from_state: JobState | None
    to_state: JobState
    attempt: int
    reason: str
    message: str
    actor: str
    time: float


def event_log(ev: WatchEvent) -> tuple[str, dict[str, object]]:
    """A committed event as a log line: its message and fields. ``job`` (the job id) is the correlation key every
    Tandem process logs under, from submission to the pods (their ``tandem.dev/job`` label)."""
    if ev.kind is EventKind.SUBMITTED:
        message = "job submitted"
    elif ev.kind is EventKind.UPDATED:
        message = "job updated"
    else:
        message = "job reserved" if ev.to_state is JobState.RESERVED else "job state changed"
    fields: dict[str, object] = {
        "job": ev.job_id,
        "attempt": ev.attempt,
        "tenant": ev.tenant,
        "state": ev.to_state.value,
        "reason": ev.reason,
        "actor": ev.actor,
        "revision": ev.revision,
    }
    if ev.from_state is not None:
        fields["from_state"] = ev.from_state.value
    if ev.job_set:
        fields["job_set"] = ev.job_set
    return message, fields


@dataclass(frozen=True, slots=True)
class JobFilter:
    """ListJobs filter; every given criterion must hold (AND), values within one criterion are OR."""

    tenant: str | None = None
    states: frozenset[JobState] = frozenset()
    queue: str | None = None
    job_set: str | None = None
    labels: Labels = ()
    """Every (key, value) must match exactly."""
    cluster: str | None = None
    """The job's current attempt (``attempt`` number) is on this cluster; a job with no attempt never matches."""
    gpu_model: str | None = None
    """The current attempt got this GPU model, or the job's ``gpu_models`` lists it."""


@dataclass(frozen=True, slots=True)
class JobPage:
    jobs: tuple[JobRecord, ...]
    next_page_token: str
    """'' when this is the last page."""


@dataclass(frozen=True, slots=True)
class WatchPage:
    """Events after a revision, and how far the read covered (filtered-out events included)."""

    events: tuple[WatchEvent, ...]
    revision: int
    """Resume from here: every revision up to it was scanned (matching events are in ``events``)."""


@dataclass(frozen=True, slots=True)
class GpuHours:
    """GPU-hours of one (tenant, GPU model, cluster) inside a usage window (ExportUsage)."""

    tenant: str
    gpu_model: str
    cluster: str
    gpu_hours: float


@dataclass(frozen=True, slots=True)
class CompactionResult:
    deleted_jobs: int
    deleted_events: int
    compacted_revision: int
    """Watching from below this raises RevisionCompacted."""
