"""Every kind of job lifecycle event by name, for the property tests that throw random event sequences at a job."""

from __future__ import annotations

from collections.abc import Callable

from broker.domain import job_events
from broker.domain.states import AttemptOutcome
from fleetplan.catalog import ReplicaPlacement

EVENT_KINDS = (
    "reserve",
    "sent",
    "accepted",
    "rejected",
    "ready",
    "running",
    "ended",
    "cancel",
    "preempt",
    "silent",
    "expired",
    "abandon",
)
"""The names `lifecycle_event` knows, progress events first (in the order a healthy attempt meets them)."""


def lifecycle_event(
    kind: str,
    job_id: str,
    attempt: int,
    outcome: AttemptOutcome,
    *,
    cluster: str = "c1",
    assignments: tuple[ReplicaPlacement, ...] = (),
) -> job_events.Event:
    """The `kind` event for `job_id`'s attempt number `attempt`; `outcome` is what an "ended" attempt ended with,
    `cluster` and `assignments` what a "reserve" holds."""
    make: dict[str, Callable[[], job_events.Event]] = {
        "reserve": lambda: job_events.Reserve(job_id, attempt, cluster, ("z",), assignments, "H100", 8.0),
        "sent": lambda: job_events.DispatchSent(job_id, attempt),
        "accepted": lambda: job_events.DispatchAccepted(job_id, attempt),
        "rejected": lambda: job_events.DispatchRejected(job_id, attempt, "DOES_NOT_FIT"),
        "ready": lambda: job_events.WorkloadReady(job_id, attempt),
        "running": lambda: job_events.AllRunning(job_id, attempt),
        "ended": lambda: job_events.AttemptEnded(job_id, attempt, outcome),
        "cancel": lambda: job_events.CancelRequested(job_id),
        "preempt": lambda: job_events.PreemptRequested(job_id, attempt),
        "silent": lambda: job_events.ClusterSilent(job_id, attempt),
        "expired": lambda: job_events.ReservationExpired(job_id, attempt),
        "abandon": lambda: job_events.AbandonLost(job_id, attempt),
    }
    return make[kind]()
