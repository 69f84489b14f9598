"""What the placer and the dispatcher tell each other, as explicit events (the hub carries them).

Neither holds the other: the placer emits `ReservationMade` for the dispatcher to deliver; the
dispatcher emits `JobChanged` (a committed job change it applied) and `CapacityChanged` (a report,
a rejected dispatch) for the placer to look at the queue again."""

from __future__ import annotations

from dataclasses import dataclass

from broker.domain.records import JobRecord
from fleetplan.catalog import ReplicaPlacement

__all__ = ["JobChanged", "CapacityChanged", "ReservationMade", "NodesHeld", "HoldReleased", "ToPlacer", "ToDispatcher"]


@dataclass(frozen=True, slots=True)
class JobChanged:
    job: JobRecord


@dataclass(frozen=True, slots=True)
class CapacityChanged:
    cluster: str
    why: str


@dataclass(frozen=True, slots=True)
class ReservationMade:
    cluster: str
    job_id: str
    attempt: int


@dataclass(frozen=True, slots=True)
class NodesHeld:
    """The placer holds nodes for a job whose victims are leaving: the cluster keeps them too (F-5)."""

    cluster: str
    job_id: str
    attempt: int
    spec: bytes
    assignments: tuple[ReplicaPlacement, ...]
    expires_at: float
    drain: bool = False
    """A held domain's idle GPUs (`idle`: node, whole GPUs) rather than a preemption's nodes."""
    idle: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class HoldReleased:
    cluster: str
    job_id: str
    attempt: int
    drain: bool = False


ToPlacer = JobChanged | CapacityChanged
ToDispatcher = ReservationMade | NodesHeld | HoldReleased
