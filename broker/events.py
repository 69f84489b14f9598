"""What the placer and the dispatcher tell each other, as explicit events (the hub carries them).

Neither holds the other: the placer emits `ReservationMade` for the dispatcher to deliver; the
dispatcher emits `JobChanged` (a committed job change it applied) and `CapacityChanged` (a report,
a rejected dispatch) for the placer to look at the queue again."""

from __future__ import annotations

from dataclasses import dataclass

from broker.records import JobRecord

__all__ = ["JobChanged", "CapacityChanged", "ReservationMade", "ToPlacer", "ToDispatcher"]


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


ToPlacer = JobChanged | CapacityChanged
ToDispatcher = ReservationMade
