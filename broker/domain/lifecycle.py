"""Pure job state-machine reactions: (job, current attempt, event, policy, now) → a Transition to commit, or why not.

No I/O and no clock: the store runs ``react`` inside its write transaction
(read, decide, compare-and-set) and the simulator can run it unchanged.
Every event names the (job, attempt) it is about; events about an older
attempt are ignored (fencing), as are duplicates that change nothing.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from broker.domain.job_events import (
    AbandonLost,
    AllRunning,
    AttemptEnded,
    CancelRequested,
    ClusterSilent,
    DispatchAccepted,
    DispatchRejected,
    DispatchSent,
    Event,
    PreemptRequested,
    RequeueRequested,
    ReservationExpired,
    Reserve,
    WorkloadReady,
)
from broker.domain.records import (
    AttemptClose,
    AttemptRecord,
    AttemptStamp,
    JobRecord,
    OrderKind,
    OrderSpec,
    Transition,
)
from broker.domain.retry import RetryPolicy, backoff_s
from broker.domain.states import PRE_START, AttemptOutcome, JobState, is_allowed, spends_retry

__all__ = [
    "TransitionReason",
    "IgnoreReason",
    "Reaction",
    "react",
]

S = JobState
O = AttemptOutcome


class TransitionReason(enum.StrEnum):
    """Stable CamelCase transition reasons (StateTransition.reason on the wire)."""

    SUBMITTED = "Submitted"
    PLACED = "Placed"
    DISPATCH_SENT = "DispatchSent"
    DISPATCH_ACCEPTED = "DispatchAccepted"
    DISPATCH_REJECTED = "DispatchRejected"
    START_SENT = "StartSent"
    RUNNING = "Running"
    RECOVERED = "Recovered"
    SUCCEEDED = "Succeeded"
    APP_FAILED = "AppFailed"
    INFRA_FAILED = "InfraFailed"
    GANG_TIMEOUT = "GangTimeout"
    RETRY_BUDGET_SPENT = "RetryBudgetSpent"
    MAX_ATTEMPTS = "MaxAttemptsReached"
    CANCEL_REQUESTED = "CancelRequested"
    CANCELLED = "Cancelled"
    PREEMPTION_REQUESTED = "PreemptionRequested"
    PREEMPTED = "Preempted"
    CLUSTER_SILENT = "ClusterSilent"
    RESERVATION_EXPIRED = "ReservationExpired"
    LOST_ABANDONED = "LostAbandoned"


class IgnoreReason(enum.StrEnum):
    """Why an event produced no transition."""

    STALE_ATTEMPT = "STALE_ATTEMPT"
    """The event is about an attempt that is not the job's current one."""
    NO_EFFECT = "NO_EFFECT"
    """Duplicate or already-applied event (e.g. a second AllRunning)."""
    NOT_APPLICABLE = "NOT_APPLICABLE"
    """The event makes no sense in the job's state (e.g. Start for a QUEUED job)."""
    FINISHED = "FINISHED"
    """The job is terminal."""
    NOT_PREEMPTIBLE = "NOT_PREEMPTIBLE"


@dataclass(frozen=True, slots=True)
class Reaction:
    """Exactly one of ``transition`` / ``ignored`` is set."""

    transition: Transition | None = None
    ignored: IgnoreReason | None = None


def _ignore(why: IgnoreReason) -> Reaction:
    return Reaction(ignored=why)


# ---- the reaction -------------------------------------------------------------------------


def react(job: JobRecord, current: AttemptRecord | None, event: Event, policy: RetryPolicy, now: float) -> Reaction:
    """Decide what ``event`` does to ``job`` (``current`` is its attempt number ``job.attempt``, if any)."""
    if isinstance(event, CancelRequested):
        return _cancel(job, current, event, now)
    if job.state.terminal:
        return _ignore(IgnoreReason.FINISHED)
    if event.attempt != job.attempt:
        return _ignore(IgnoreReason.STALE_ATTEMPT)
    if isinstance(event, Reserve):
        return _reserve(job, event, now)
    if current is None or current.outcome is not None or job.state is S.QUEUED:
        return _ignore(IgnoreReason.NOT_APPLICABLE)  # the attempt already ended
    if isinstance(event, DispatchSent):
        if job.state is not S.RESERVED:
            return _ignore(IgnoreReason.NO_EFFECT)
        return _move(job, S.DISPATCHED, TransitionReason.DISPATCH_SENT, stamp=AttemptStamp(dispatch_time=now))
    if isinstance(event, DispatchAccepted):
        if job.state not in (S.RESERVED, S.DISPATCHED):
            return _ignore(IgnoreReason.NO_EFFECT)
        stamp = AttemptStamp(
            dispatch_time=current.dispatch_time or now,
            accept_time=now,
            namespace=event.namespace or None,
            clear_expiry=True,
        )
        return _move(job, S.ACCEPTED, TransitionReason.DISPATCH_ACCEPTED, stamp=stamp)
    if isinstance(event, DispatchRejected):
        if job.state not in (S.RESERVED, S.DISPATCHED, S.ACCEPTED):
            return _ignore(IgnoreReason.NOT_APPLICABLE)
        close = AttemptClose(
            outcome=O.REJECTED,
            end_time=now,
            message=event.message,
            rejection_reason=event.reason,
            rejection_nodes=event.nodes,
        )
        return _requeue(job, close, TransitionReason.DISPATCH_REJECTED, policy, now, event.message)
    if isinstance(event, WorkloadReady):
        if job.state is not S.ACCEPTED:
            return _ignore(IgnoreReason.NO_EFFECT)
        return _move(
            job,
            S.STARTING,
            TransitionReason.START_SENT,
            stamp=AttemptStamp(start_time=now),
            orders=(OrderSpec(OrderKind.START, current.cluster),),
        )
    if isinstance(event, AllRunning):
        if job.state in (S.STARTING, S.LOST):
            reason = TransitionReason.RUNNING if job.state is S.STARTING else TransitionReason.RECOVERED
            stamp = AttemptStamp(running_time=current.running_time or now)
            return _move(job, S.RUNNING, reason, stamp=stamp)
        return _ignore(IgnoreReason.NO_EFFECT)
    if isinstance(event, AttemptEnded):
        return _ended(job, current, event, policy, now)
    if isinstance(event, PreemptRequested):
        if not job.preemptible:
            return _ignore(IgnoreReason.NOT_PREEMPTIBLE)
        if job.state not in (S.ACCEPTED, S.STARTING, S.RUNNING):
            return _ignore(IgnoreReason.NOT_APPLICABLE)
        return _move(
            job,
            S.PREEMPTED,
            TransitionReason.PREEMPTION_REQUESTED,
            message=event.message,
            orders=(OrderSpec(OrderKind.PREEMPT, current.cluster, grace_s=event.grace_s),),
        )
    if isinstance(event, ClusterSilent):
        if job.state in PRE_START:
            # Gates are still on: re-plan elsewhere; the agent deletes the replaced attempt on reconnect.
            close = AttemptClose(outcome=O.LOST, end_time=now, message="cluster silent before start")
            return _requeue(
                job,
                close,
                TransitionReason.CLUSTER_SILENT,
                policy,
                now,
                close.message,
                orders=(OrderSpec(OrderKind.CANCEL, current.cluster, attempt=job.attempt),),
            )
        if job.state in (S.STARTING, S.RUNNING):
            return _move(job, S.LOST, TransitionReason.CLUSTER_SILENT, message="cluster silent; attempt fate unknown")
        return _ignore(IgnoreReason.NO_EFFECT)  # CANCELLING / PREEMPTED wait for the cluster
    if isinstance(event, ReservationExpired):
        if job.state not in (S.RESERVED, S.DISPATCHED):
            return _ignore(IgnoreReason.NO_EFFECT)
        close = AttemptClose(outcome=O.LOST, end_time=now, message="reservation expired before accept")
        return _requeue(
            job,
            close,
            TransitionReason.RESERVATION_EXPIRED,
            policy,
            now,
            close.message,
            orders=(OrderSpec(OrderKind.CANCEL, current.cluster, attempt=job.attempt),),
        )
    if isinstance(event, AbandonLost):
        cleanup = (OrderSpec(OrderKind.CANCEL, current.cluster, attempt=job.attempt),)
        if job.state in (S.LOST, S.PREEMPTED):
            lost = job.state is S.LOST  # a lost attempt spends a retry; a preemption never confirmed does not
            message = "lost attempt abandoned" if lost else "preemption never confirmed; abandoned"
            close = AttemptClose(outcome=O.LOST, end_time=now, message=message, spent_retry=lost)
            return _requeue(
                job, close, TransitionReason.LOST_ABANDONED, policy, now, message, actor=event.actor, orders=cleanup
            )
        if job.state is S.CANCELLING:
            close = AttemptClose(outcome=O.LOST, end_time=now, message="cancel never confirmed; abandoned")
            return _move(
                job,
                S.CANCELLED,
                TransitionReason.LOST_ABANDONED,
                message=close.message,
                actor=event.actor,
                close=close,
                orders=cleanup,
            )
        return _ignore(IgnoreReason.NOT_APPLICABLE)
    if isinstance(event, RequeueRequested):
        return _requeue_requested(job, current, event, policy, now)
    raise TypeError(f"unknown event {event!r}")


def _move(
    job: JobRecord,
    new: JobState,
    reason: TransitionReason,
    *,
    message: str = "",
    actor: str = "broker",
    stamp: AttemptStamp | None = None,
    close: AttemptClose | None = None,
    orders: tuple[OrderSpec, ...] = (),
) -> Reaction:
    if not is_allowed(job.state, new):
        return _ignore(IgnoreReason.NOT_APPLICABLE)
    return Reaction(
        transition=Transition(
            job_id=job.job_id,
            expect_state=job.state,
            expect_attempt=job.attempt,
            new_state=new,
            reason=reason.value,
            message=message,
            actor=actor,
            stamp=stamp,
            close_attempt=close,
            orders=orders,
        )
    )


def _reserve(job: JobRecord, ev: Reserve, now: float) -> Reaction:
    if job.state is not S.QUEUED:
        return _ignore(IgnoreReason.NOT_APPLICABLE)
    attempt = AttemptRecord(
        job_id=job.job_id,
        number=job.attempt + 1,
        cluster=ev.cluster,
        domain=ev.domain,
        assignments=ev.assignments,
        gpu_model=ev.gpu_model,
        gpus=ev.gpus,
        reserve_time=now,
        expires_at=ev.expires_at,
    )
    t = Transition(
        job_id=job.job_id,
        expect_state=S.QUEUED,
        expect_attempt=job.attempt,
        new_state=S.RESERVED,
        reason=TransitionReason.PLACED.value,
        message=f"reserved on {ev.cluster}",
        new_attempt=attempt,
        orders=(OrderSpec(OrderKind.DISPATCH, ev.cluster, attempt=attempt.number),),
    )
    return Reaction(transition=t)


def _requeue(
    job: JobRecord,
    close: AttemptClose,
    reason: TransitionReason,
    policy: RetryPolicy,
    now: float,
    message: str,
    *,
    orders: tuple[OrderSpec, ...] = (),
    actor: str = "broker",
) -> Reaction:
    """Close the current attempt and re-queue, or FAIL when the budget or the attempt cap is spent."""
    if not is_allowed(job.state, S.QUEUED):
        return _ignore(IgnoreReason.NOT_APPLICABLE)
    spent = close.spent_retry
    budget = job.max_infra_retries if job.max_infra_retries is not None else policy.max_infra_retries
    retries = job.infra_retries + (1 if spent else 0)
    if spent and retries > budget:
        return _fail(
            job,
            close,
            TransitionReason.RETRY_BUDGET_SPENT,
            f"{message}; retry budget spent ({budget})",
            orders,
            actor,
            spent,
        )
    if job.attempt >= policy.max_attempts:
        return _fail(
            job,
            close,
            TransitionReason.MAX_ATTEMPTS,
            f"{message}; attempt cap reached ({policy.max_attempts})",
            orders,
            actor,
            spent,
        )
    not_before = now + backoff_s(policy, retries) if spent else now
    if close.outcome is O.PREEMPTED:
        not_before = max(not_before, now + policy.preempted_backoff_s)
    return Reaction(
        transition=Transition(
            job_id=job.job_id,
            expect_state=job.state,
            expect_attempt=job.attempt,
            new_state=S.QUEUED,
            reason=reason.value,
            message=message,
            actor=actor,
            close_attempt=close,
            spend_retry=spent,
            not_before=not_before,
            orders=orders,
        )
    )


def _fail(
    job: JobRecord,
    close: AttemptClose,
    reason: TransitionReason,
    message: str,
    orders: tuple[OrderSpec, ...],
    actor: str,
    spent: bool,
) -> Reaction:
    return Reaction(
        transition=Transition(
            job_id=job.job_id,
            expect_state=job.state,
            expect_attempt=job.attempt,
            new_state=S.FAILED,
            reason=reason.value,
            message=message,
            actor=actor,
            close_attempt=close,
            spend_retry=spent,
            orders=orders,
        )
    )


_END_REASON = {
    O.SUCCEEDED: TransitionReason.SUCCEEDED,
    O.APP_FAILED: TransitionReason.APP_FAILED,
    O.INFRA_FAILED: TransitionReason.INFRA_FAILED,
    O.GANG_TIMEOUT: TransitionReason.GANG_TIMEOUT,
    O.REJECTED: TransitionReason.DISPATCH_REJECTED,
    O.PREEMPTED: TransitionReason.PREEMPTED,
    O.CANCELLED: TransitionReason.CANCELLED,
    O.LOST: TransitionReason.LOST_ABANDONED,
}


def _ended(job: JobRecord, current: AttemptRecord, ev: AttemptEnded, policy: RetryPolicy, now: float) -> Reaction:
    started = current.start_time is not None
    outcome = ev.outcome
    if job.state is S.CANCELLING and outcome is not O.SUCCEEDED:
        outcome = O.CANCELLED  # whatever the exit, the user asked for it
    elif job.state is S.PREEMPTED and outcome is not O.SUCCEEDED:
        outcome = O.PREEMPTED  # SIGTERM exits are the preemption, not an application failure
    close = AttemptClose(
        outcome=outcome,
        end_time=now,
        message=ev.message,
        exit_code=ev.exit_code if outcome is O.APP_FAILED else None,
        spent_retry=spends_retry(outcome, started=started),
    )
    reason = _END_REASON[outcome]
    if outcome is O.SUCCEEDED:
        return _move(job, S.SUCCEEDED, reason, message=ev.message, close=close)
    if outcome is O.APP_FAILED:
        return _move(job, S.FAILED, reason, message=ev.message or f"exit code {ev.exit_code}", close=close)
    if outcome is O.CANCELLED:
        if job.state is not S.CANCELLING:
            # A workload deleted behind our back is an infrastructure failure, not a cancel.
            close = AttemptClose(
                outcome=O.INFRA_FAILED, end_time=now, message=ev.message or "workload deleted", spent_retry=True
            )
            return _requeue(job, close, TransitionReason.INFRA_FAILED, policy, now, close.message)
        return _move(job, S.CANCELLED, reason, message=ev.message, close=close)
    if outcome is O.REJECTED:
        if job.state not in PRE_START:
            return _ignore(IgnoreReason.NOT_APPLICABLE)
        return _requeue(job, close, reason, policy, now, ev.message)
    return _requeue(job, close, reason, policy, now, ev.message or reason.value)


def _cancel(job: JobRecord, current: AttemptRecord | None, ev: CancelRequested, now: float) -> Reaction:
    if job.state.terminal or job.state is S.CANCELLING:
        return _ignore(IgnoreReason.FINISHED if job.state.terminal else IgnoreReason.NO_EFFECT)
    msg = ev.message or "cancelled"
    if job.state is S.QUEUED or current is None:
        return _move(job, S.CANCELLED, TransitionReason.CANCELLED, message=msg, actor=ev.actor)
    if job.state is S.RESERVED:
        # Not sent Start, maybe not even Dispatch: done now; a CANCEL order cleans up a dispatch in flight.
        close = AttemptClose(outcome=O.CANCELLED, end_time=now, message=msg)
        return _move(
            job,
            S.CANCELLED,
            TransitionReason.CANCELLED,
            message=msg,
            actor=ev.actor,
            close=close,
            orders=(OrderSpec(OrderKind.CANCEL, current.cluster, grace_s=0.0),),
        )
    return _move(
        job,
        S.CANCELLING,
        TransitionReason.CANCEL_REQUESTED,
        message=msg,
        actor=ev.actor,
        orders=(OrderSpec(OrderKind.CANCEL, current.cluster, grace_s=ev.grace_s),),
    )


def _requeue_requested(
    job: JobRecord, current: AttemptRecord, ev: RequeueRequested, policy: RetryPolicy, now: float
) -> Reaction:
    """RequeueRequested: like PreemptRequested without the preemptible check, and like ReservationExpired
    (outcome PREEMPTED, no retry spent) for an attempt the cluster has not accepted yet."""
    msg = ev.message or f"requeued by {ev.actor}"
    if job.state in (S.ACCEPTED, S.STARTING, S.RUNNING):
        return _move(
            job,
            S.PREEMPTED,
            TransitionReason.PREEMPTION_REQUESTED,
            message=msg,
            actor=ev.actor,
            orders=(OrderSpec(OrderKind.PREEMPT, current.cluster, grace_s=ev.grace_s),),
        )
    if job.state in (S.RESERVED, S.DISPATCHED):
        close = AttemptClose(outcome=O.PREEMPTED, end_time=now, message=msg)
        return _requeue(
            job,
            close,
            TransitionReason.PREEMPTED,
            policy,
            now,
            msg,
            actor=ev.actor,
            orders=(OrderSpec(OrderKind.CANCEL, current.cluster, attempt=job.attempt),),
        )
    return _ignore(IgnoreReason.NOT_APPLICABLE)
