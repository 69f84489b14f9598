"""What each store write decides and binds, once for both SQL backends: no I/O, no SQL dialect.

A backend reads what a decision needs, calls these, then runs its own
statements with the values they return (same column order as the
statement's column list) inside its own transaction. Booleans are bound
as booleans: SQLite stores them as 0 / 1, PostgreSQL as BOOLEAN.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from broker.domain import job_events, lifecycle
from broker.domain.errors import AlreadyExists, IdempotencyConflict, InvalidTransition, JobFinished, StaleTransition
from broker.domain.lifecycle import TransitionReason
from broker.domain.records import (
    AttemptRecord,
    EventKind,
    JobRecord,
    NewJob,
    ReplicaRecord,
    SubmitResult,
    Transition,
)
from broker.domain.retry import RetryPolicy
from broker.domain.states import TERMINAL, JobState, is_allowed
from broker.store import codec, updates
from broker.store.updates import Update

__all__ = [
    "Values",
    "EVENT_COLUMNS",
    "ATTEMPT_COLUMNS",
    "COMPACTED_TABLES",
    "submit_fingerprint",
    "replay",
    "id_taken",
    "queued_job",
    "queued_job_values",
    "submitted_event",
    "react",
    "cancel_request",
    "TransitionWrites",
    "plan_transition",
    "update_event",
    "update_values",
    "replica_values",
]

Values = tuple[object, ...]
"""The values one statement binds, in its column (or placeholder) order."""

EVENT_COLUMNS = "job_id, tenant, job_set, kind, from_state, to_state, attempt, reason, message, actor, time"
"""The columns an event insert binds, in the order ``submitted_event``, ``update_event`` and a transition's event give."""

ATTEMPT_COLUMNS = "job_id, number, cluster, domain, assignments, gpu_model, gpus, reserve_time, expires_at"
"""The columns a new attempt's insert binds, in the order of ``TransitionWrites.new_attempt``."""

COMPACTED_TABLES = ("orders", "replicas", "attempts", "jobs")
"""Where a compacted job has rows besides its events (which go first: the compaction revision is read from them)."""


def _event_values(
    job: JobRecord,
    kind: EventKind,
    src: JobState | None,
    dst: JobState,
    attempt: int,
    reason: str,
    message: str,
    actor: str,
    now: float,
) -> Values:
    """One watch event of the job (``EVENT_COLUMNS`` order); the database assigns its revision."""
    return (
        job.job_id,
        job.tenant,
        job.job_set,
        kind.value,
        None if src is None else src.value,
        dst.value,
        attempt,
        reason,
        message,
        actor,
        now,
    )


# -- submit ------------------------------------------------------------------------------------------------


def submit_fingerprint(new: NewJob) -> bytes:
    """The request's fingerprint: the caller's when given, else the canonical one."""
    return new.fingerprint or codec.fingerprint(new)


def replay(new: NewJob, fingerprint: bytes, earlier: JobRecord) -> SubmitResult:
    """A submission whose idempotency key ``earlier`` holds: that job when the requests are equal, else a conflict."""
    if earlier.fingerprint == fingerprint:
        return SubmitResult(earlier, created=False)
    raise IdempotencyConflict(
        "idempotency key was already used for a different request",
        job_id=earlier.job_id,
        idempotency_key=new.idempotency_key,
    )


def id_taken(job_id: str) -> AlreadyExists:
    """The error for a caller-chosen job id that another job has."""
    return AlreadyExists(f"job {job_id} already exists", job_id=job_id)


def queued_job(new: NewJob, job_id: str, fingerprint: bytes, now: float) -> JobRecord:
    """The QUEUED job a submission creates; ``seq`` and ``revision`` are 0 until the database assigns them."""
    return JobRecord(
        job_id=job_id,
        seq=0,
        tenant=new.tenant,
        queue=new.queue,
        job_set=new.job_set,
        priority_band=new.priority_band,
        priority=new.priority,
        preemptible=new.preemptible,
        labels=tuple(sorted(new.labels)),
        gpus=new.gpus,
        gpu_models=new.gpu_models,
        max_infra_retries=new.max_infra_retries,
        max_runtime_s=new.max_runtime_s,
        spec=new.spec,
        idempotency_key=new.idempotency_key or None,
        fingerprint=fingerprint,
        state=JobState.QUEUED,
        attempt=0,
        infra_retries=0,
        not_before=0.0,
        create_time=now,
        update_time=now,
        end_time=None,
        reason=TransitionReason.SUBMITTED.value,
        message="",
        revision=0,
    )


def queued_job_values(job: JobRecord) -> Values:
    """A new job row's values: job_id, tenant, queue, job_set, priority_band, priority, preemptible, labels, gpus,
    gpu_models, max_infra_retries, max_runtime_s, spec, idem_key, fingerprint, state (1-16), create_time (17, also
    the update_time), reason (18). The rest of the row is the same for every new job: the statement's literals."""
    return (
        job.job_id,
        job.tenant,
        job.queue,
        job.job_set,
        job.priority_band,
        job.priority,
        job.preemptible,
        codec.dumps(dict(job.labels)),
        job.gpus,
        codec.dumps(list(job.gpu_models)),
        job.max_infra_retries,
        job.max_runtime_s,
        job.spec,
        job.idempotency_key,
        job.fingerprint,
        job.state.value,
        job.create_time,
        job.reason,
    )


def submitted_event(job: JobRecord, actor: str) -> Values:
    """The SUBMITTED event of a new job (``EVENT_COLUMNS`` order)."""
    return _event_values(job, EventKind.SUBMITTED, None, job.state, 0, job.reason, "", actor, job.create_time)


# -- events ------------------------------------------------------------------------------------------------


def react(
    job: JobRecord, attempt: AttemptRecord | None, event: job_events.Event, retry: RetryPolicy, now: float
) -> lifecycle.Reaction:
    """``lifecycle.react`` on the job and its current attempt as read in the transaction, except that a held job
    gets no new attempt."""
    refused = updates.refuse_held_reserve(job, event)
    return refused if refused is not None else lifecycle.react(job, attempt, event, retry, now)


def cancel_request(job: JobRecord, actor: str, message: str, grace_s: float) -> job_events.CancelRequested:
    """A cancel of one job; JobFinished when it succeeded or failed (a cancelled one cancels again as a no-op)."""
    if job.state in (JobState.SUCCEEDED, JobState.FAILED):
        raise JobFinished(f"job {job.job_id} already {job.state.value}", job_id=job.job_id, state=job.state.value)
    return job_events.CancelRequested(job.job_id, actor=actor, message=message, grace_s=grace_s)


# -- transition --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TransitionWrites:
    """What a checked transition writes, in statement order; None skips that statement."""

    close_attempt: Values | None
    """outcome, end_time, message, exit_code, spent_retry, rejection_reason, rejection_nodes; job_id, number
    (of the open attempt)."""
    stamp_attempt: Values | None
    """dispatch_time, accept_time, start_time, running_time, namespace (each None = keep), clear_expiry;
    job_id, number."""
    new_attempt: Values | None
    """``ATTEMPT_COLUMNS``; any other open attempt of the job is closed as superseded first."""
    event: Values
    """``EVENT_COLUMNS``."""
    orders: list[Values]
    """cluster, job_id, attempt, kind, grace_s, created_at: one per order."""
    job: JobRecord
    """The job after the transition, its revision the old one until the event has its own."""

    def job_values(self, revision: int) -> Values:
        """The job row's change: state, attempt, infra_retries, not_before, update_time, end_time, reason, message,
        revision; then job_id (the key)."""
        j = self.job
        return (
            j.state.value,
            j.attempt,
            j.infra_retries,
            j.not_before,
            j.update_time,
            j.end_time,
            j.reason,
            j.message,
            revision,
            j.job_id,
        )

    def written(self, revision: int) -> JobRecord:
        """The job as stored, once its event got ``revision``."""
        return dataclasses.replace(self.job, revision=revision)


def _check(job: JobRecord, t: Transition) -> None:
    """The compare-and-set: ``t`` applies only to the state and attempt it was decided on, along an allowed edge."""
    if job.state is not t.expect_state or job.attempt != t.expect_attempt:
        raise StaleTransition(
            f"job {job.job_id} is {job.state.value}/attempt {job.attempt}, "
            f"expected {t.expect_state.value}/attempt {t.expect_attempt}",
            job_id=job.job_id,
            state=job.state.value,
            attempt=job.attempt,
        )
    if not is_allowed(job.state, t.new_state):
        raise InvalidTransition(
            f"job {job.job_id}: no transition {job.state.value} -> {t.new_state.value}",
            job_id=job.job_id,
            from_state=job.state.value,
            to_state=t.new_state.value,
        )
    a = t.new_attempt
    if a is not None and (a.number != job.attempt + 1 or a.job_id != job.job_id):
        raise InvalidTransition(
            f"job {job.job_id}: new attempt must be {job.attempt + 1}, got {a.number}", job_id=job.job_id
        )


def plan_transition(job: JobRecord, t: Transition, now: float) -> TransitionWrites:
    """Check ``t`` against the job as read in the transaction (StaleTransition, InvalidTransition) and say what it
    writes: attempt changes, event, orders and the job's new state."""
    _check(job, t)
    close: Values | None = None
    stamp: Values | None = None
    if t.close_attempt is not None and job.attempt > 0:
        c = t.close_attempt
        close = (
            c.outcome.value,
            c.end_time,
            c.message,
            c.exit_code,
            c.spent_retry,
            c.rejection_reason,
            codec.dumps(list(c.rejection_nodes)),
            job.job_id,
            job.attempt,
        )
    if t.stamp is not None and job.attempt > 0:
        s = t.stamp
        stamp = (
            s.dispatch_time,
            s.accept_time,
            s.start_time,
            s.running_time,
            s.namespace,
            s.clear_expiry,
            job.job_id,
            job.attempt,
        )
    attempt_no, new_attempt = job.attempt, None
    if t.new_attempt is not None:
        a = t.new_attempt
        attempt_no = a.number
        new_attempt = (
            job.job_id,
            a.number,
            a.cluster,
            codec.dumps(list(a.domain)),
            codec.assignments_json(a.assignments),
            a.gpu_model,
            a.gpus,
            a.reserve_time,
            a.expires_at,
        )
    event = _event_values(
        job, EventKind.TRANSITION, job.state, t.new_state, attempt_no, t.reason, t.message, t.actor, now
    )
    orders: list[Values] = [
        (o.cluster, job.job_id, attempt_no if o.attempt is None else o.attempt, o.kind.value, o.grace_s, now)
        for o in t.orders
    ]
    after = dataclasses.replace(
        job,
        state=t.new_state,
        attempt=attempt_no,
        infra_retries=job.infra_retries + (1 if t.spend_retry else 0),
        not_before=job.not_before if t.not_before is None else t.not_before,
        update_time=now,
        end_time=now if t.new_state in TERMINAL else None,
        reason=t.reason,
        message=t.message,
    )
    return TransitionWrites(close, stamp, new_attempt, event, orders, after)


# -- settings update ---------------------------------------------------------------------------------------


def update_event(job: JobRecord, u: Update, actor: str, now: float) -> Values:
    """The UPDATED event of a settings change (``EVENT_COLUMNS``): state and attempt stay."""
    return _event_values(
        job, EventKind.UPDATED, job.state, job.state, job.attempt, u.reason.value, u.message, actor, now
    )


def update_values(u: Update, revision: int) -> Values:
    """The job row's change: priority, priority_band, spec, held_by (NULL = not held), revision; then job_id."""
    j = u.job
    return (j.priority, j.priority_band, j.spec, j.held_by if j.held else None, revision, j.job_id)


# -- observed status ---------------------------------------------------------------------------------------


def replica_values(job_id: str, attempt: int, replicas: Sequence[ReplicaRecord], now: float) -> list[Values]:
    """One row per observed replica: job_id, attempt, pod_set, idx, pod, node, phase, exit_code, reason, message,
    update_time."""
    return [
        (job_id, attempt, r.pod_set, r.index, r.pod, r.node, r.phase, r.exit_code, r.reason, r.message, now)
        for r in replicas
    ]
