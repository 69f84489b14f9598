"""Changes to a job's scheduling settings that are not state transitions (priority, band, hold): pure decisions
both backends run inside their write transaction, then persist with an UPDATED event.

No I/O: ``decide_*`` take the job as read in the transaction and return the record to write (or None when
nothing changes); the backend writes the changed columns and one watch event (from_state = to_state).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from broker.domain import job_events, lifecycle
from broker.domain.errors import ErrorDetails, JobFinished, PermissionDenied
from broker.domain.records import JobRecord, UpdateReason

__all__ = ["Respec", "Update", "Decide", "decide_priority", "decide_hold", "refuse_held_reserve"]

Respec = Callable[[bytes, int, str], bytes]
"""(spec bytes, priority, band) -> spec bytes carrying them (the services' serde; the store knows no protobuf)."""


@dataclass(frozen=True, slots=True)
class Update:
    """The job to write (revision still the old one) and its event's reason and message."""

    job: JobRecord
    reason: UpdateReason
    message: str


Decide = Callable[[JobRecord], Update | None]
"""A settings decision (``decide_*`` with its arguments bound) on the job as read in the transaction."""


def _live(job: JobRecord) -> None:
    if job.terminal:
        raise JobFinished(f"job {job.job_id} already {job.state.value}", job_id=job.job_id, state=job.state.value)


def decide_priority(
    job: JobRecord, priority: int | None, band: str | None, message: str, respec: Respec | None
) -> Update | None:
    """New priority and / or band (None = keep); None when both are what the job has already."""
    _live(job)
    new_priority = job.priority if priority is None else priority
    new_band = job.priority_band if not band else band
    if (new_priority, new_band) == (job.priority, job.priority_band):
        return None
    spec = respec(job.spec, new_priority, new_band) if respec is not None else job.spec
    changes = []
    if new_priority != job.priority:
        changes.append(f"priority {job.priority} -> {new_priority}")
    if new_band != job.priority_band:
        changes.append(f"band {job.priority_band} -> {new_band}")
    text = ", ".join(changes) + (f": {message}" if message else "")
    return Update(
        dataclasses.replace(job, priority=new_priority, priority_band=new_band, spec=spec),
        UpdateReason.PRIORITY_CHANGED,
        text,
    )


def decide_hold(job: JobRecord, held: bool, *, tenant: str | None, actor: str, message: str) -> Update | None:
    """Hold (``held``) or release; None when the job already is that way. A tenant caller (``tenant`` given)
    releases only holds placed as ``tenant/<tenant>``."""
    _live(job)
    if held == job.held:
        return None
    if held:
        text = f"held by {actor}" + (f": {message}" if message else "")
        return Update(dataclasses.replace(job, held=True, held_by=actor), UpdateReason.HELD, text)
    if tenant is not None and job.held_by != f"tenant/{tenant}":
        raise PermissionDenied(
            f"job {job.job_id} is held by {job.held_by}; only an admin may release it",
            details=ErrorDetails(reason="HELD_BY_ADMIN"),
            job_id=job.job_id,
        )
    text = f"released by {actor} (held by {job.held_by})" + (f": {message}" if message else "")
    return Update(dataclasses.replace(job, held=False, held_by=""), UpdateReason.RELEASED, text)


def refuse_held_reserve(job: JobRecord, event: job_events.Event) -> lifecycle.Reaction | None:
    """A held job gets no new attempt, whatever the placer decided before the hold committed."""
    if job.held and isinstance(event, job_events.Reserve):
        return lifecycle.Reaction(ignored=lifecycle.IgnoreReason.NOT_APPLICABLE)
    return None
