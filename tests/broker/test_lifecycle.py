"""Pure lifecycle reactions: tables of (state, event) → (new state, outcome, retry, orders), plus invariants."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.domain import job_events
from broker.domain import lifecycle as lc
from broker.domain.records import AttemptRecord, JobRecord, OrderKind, Transition
from broker.domain.retry import RetryPolicy, backoff_s
from broker.domain.states import TRANSITIONS, AttemptOutcome, JobState, is_allowed
from tests.broker.lifecycle_events import EVENT_KINDS, lifecycle_event
from tests.broker.store_builders import T0, attempt_record, job_record

S = JobState
O = AttemptOutcome
NOW = T0 + 1000
POLICY = RetryPolicy(max_infra_retries=2, max_attempts=5, backoff_base_s=10, backoff_factor=2, backoff_max_s=35)


def at(
    state: JobState, *, attempt: int = 1, started: bool | None = None, **kw: object
) -> tuple[JobRecord, AttemptRecord | None]:
    job = job_record(state=state, attempt=attempt, **kw)  # type: ignore[arg-type]
    if attempt == 0:
        return job, None
    if started is None:
        started = state in (S.STARTING, S.RUNNING, S.LOST, S.CANCELLING, S.PREEMPTED)
    return job, attempt_record(number=attempt, started=started)


def react(state: JobState, event: job_events.Event, **kw: object) -> lc.Reaction:
    job, a = at(state, **kw)
    return lc.react(job, a, event, POLICY, NOW)


def ended(outcome: AttemptOutcome, attempt: int = 1, **kw: object) -> job_events.AttemptEnded:
    return job_events.AttemptEnded("job-1", attempt, outcome, **kw)  # type: ignore[arg-type]


def _t(r: lc.Reaction) -> Transition:
    assert r.transition is not None, r.ignored
    return r.transition


@pytest.mark.parametrize(
    "state,event,new_state,outcome,spent,orders",
    [
        (S.RESERVED, job_events.DispatchSent("job-1", 1), S.DISPATCHED, None, False, ()),
        (S.DISPATCHED, job_events.DispatchAccepted("job-1", 1, "ns"), S.ACCEPTED, None, False, ()),
        (S.RESERVED, job_events.DispatchAccepted("job-1", 1), S.ACCEPTED, None, False, ()),
        (S.ACCEPTED, job_events.WorkloadReady("job-1", 1), S.STARTING, None, False, (OrderKind.START,)),
        (S.STARTING, job_events.AllRunning("job-1", 1), S.RUNNING, None, False, ()),
        (S.LOST, job_events.AllRunning("job-1", 1), S.RUNNING, None, False, ()),
        (S.RUNNING, ended(O.SUCCEEDED), S.SUCCEEDED, O.SUCCEEDED, False, ()),
        (S.RUNNING, ended(O.APP_FAILED, exit_code=137), S.FAILED, O.APP_FAILED, False, ()),
        (S.RUNNING, ended(O.INFRA_FAILED), S.QUEUED, O.INFRA_FAILED, True, ()),
        (S.STARTING, ended(O.GANG_TIMEOUT), S.QUEUED, O.GANG_TIMEOUT, True, ()),
        (
            S.DISPATCHED,
            job_events.DispatchRejected("job-1", 1, "DOES_NOT_FIT", "full", ("n1",)),
            S.QUEUED,
            O.REJECTED,
            False,
            (),
        ),
        (S.RUNNING, ended(O.CANCELLED), S.QUEUED, O.INFRA_FAILED, True, ()),  # deleted behind our back
        (S.CANCELLING, ended(O.CANCELLED), S.CANCELLED, O.CANCELLED, False, ()),
        (S.CANCELLING, ended(O.APP_FAILED, exit_code=143), S.CANCELLED, O.CANCELLED, False, ()),
        (S.CANCELLING, ended(O.SUCCEEDED), S.SUCCEEDED, O.SUCCEEDED, False, ()),
        (S.PREEMPTED, ended(O.APP_FAILED, exit_code=143), S.QUEUED, O.PREEMPTED, False, ()),
        (S.PREEMPTED, ended(O.PREEMPTED), S.QUEUED, O.PREEMPTED, False, ()),
        (S.RUNNING, job_events.ClusterSilent("job-1", 1), S.LOST, None, False, ()),
        (S.STARTING, job_events.ClusterSilent("job-1", 1), S.LOST, None, False, ()),
        (S.ACCEPTED, job_events.ClusterSilent("job-1", 1), S.QUEUED, O.LOST, False, (OrderKind.CANCEL,)),
        (S.RESERVED, job_events.ReservationExpired("job-1", 1), S.QUEUED, O.LOST, False, (OrderKind.CANCEL,)),
        (S.LOST, job_events.AbandonLost("job-1", 1), S.QUEUED, O.LOST, True, (OrderKind.CANCEL,)),
        (S.CANCELLING, job_events.AbandonLost("job-1", 1), S.CANCELLED, O.LOST, False, (OrderKind.CANCEL,)),
        (S.PREEMPTED, job_events.AbandonLost("job-1", 1), S.QUEUED, O.LOST, False, (OrderKind.CANCEL,)),
        (S.LOST, ended(O.INFRA_FAILED), S.QUEUED, O.INFRA_FAILED, True, ()),
        (S.QUEUED, job_events.CancelRequested("job-1"), S.CANCELLED, None, False, ()),
        (S.RESERVED, job_events.CancelRequested("job-1"), S.CANCELLED, O.CANCELLED, False, (OrderKind.CANCEL,)),
        (S.DISPATCHED, job_events.CancelRequested("job-1"), S.CANCELLING, None, False, (OrderKind.CANCEL,)),
        (S.RUNNING, job_events.CancelRequested("job-1"), S.CANCELLING, None, False, (OrderKind.CANCEL,)),
        (S.LOST, job_events.CancelRequested("job-1"), S.CANCELLING, None, False, (OrderKind.CANCEL,)),
        (S.PREEMPTED, job_events.CancelRequested("job-1"), S.CANCELLING, None, False, (OrderKind.CANCEL,)),
    ],
)
def test_reactions(
    state: JobState,
    event: job_events.Event,
    new_state: JobState,
    outcome: AttemptOutcome | None,
    spent: bool,
    orders: tuple[OrderKind, ...],
) -> None:
    kw: dict[str, object] = {"attempt": 0} if state is S.QUEUED else {}
    t = _t(react(state, event, **kw))
    assert (t.expect_state, t.new_state) == (state, new_state)
    assert is_allowed(t.expect_state, t.new_state)
    assert (t.close_attempt.outcome if t.close_attempt else None) == outcome
    assert t.spend_retry is spent
    assert tuple(o.kind for o in t.orders) == orders


def test_reserve_opens_the_next_attempt_and_orders_dispatch() -> None:
    job, _ = at(S.QUEUED, attempt=2)
    t = _t(
        lc.react(
            job,
            attempt_record(number=2, outcome=O.REJECTED),
            job_events.Reserve("job-1", 2, "c3", ("z",), (), "A100", 4.0, expires_at=NOW + 60),
            POLICY,
            NOW,
        )
    )
    assert t.new_attempt is not None
    assert (t.new_attempt.number, t.new_attempt.cluster, t.new_attempt.expires_at) == (3, "c3", NOW + 60)
    assert [(o.kind, o.cluster, o.attempt) for o in t.orders] == [(OrderKind.DISPATCH, "c3", 3)]


@pytest.mark.parametrize(
    "state,event,why",
    [
        (S.RUNNING, ended(O.SUCCEEDED, attempt=1), lc.IgnoreReason.STALE_ATTEMPT),  # job is at attempt 2
        (S.RUNNING, job_events.AllRunning("job-1", 2), lc.IgnoreReason.NO_EFFECT),
        (S.STARTING, job_events.WorkloadReady("job-1", 2), lc.IgnoreReason.NO_EFFECT),
        (S.RUNNING, job_events.DispatchRejected("job-1", 2), lc.IgnoreReason.NOT_APPLICABLE),
        (S.RUNNING, job_events.Reserve("job-1", 2, "c", (), (), "", 0), lc.IgnoreReason.NOT_APPLICABLE),
        (S.SUCCEEDED, ended(O.INFRA_FAILED, attempt=2), lc.IgnoreReason.FINISHED),
        (S.CANCELLED, job_events.CancelRequested("job-1"), lc.IgnoreReason.FINISHED),
        (S.CANCELLING, job_events.CancelRequested("job-1"), lc.IgnoreReason.NO_EFFECT),
        (S.CANCELLING, job_events.ClusterSilent("job-1", 2), lc.IgnoreReason.NO_EFFECT),
        (S.RUNNING, job_events.PreemptRequested("job-1", 2), lc.IgnoreReason.NOT_PREEMPTIBLE),
        (S.RUNNING, job_events.AbandonLost("job-1", 2), lc.IgnoreReason.NOT_APPLICABLE),
    ],
)
def test_ignored_events(state: JobState, event: job_events.Event, why: lc.IgnoreReason) -> None:
    assert react(state, event, attempt=2).ignored is why


def test_preempt_orders_grace_and_requeues_without_spending() -> None:
    t = _t(react(S.RUNNING, job_events.PreemptRequested("job-1", 1, grace_s=120), preemptible=True))
    assert t.new_state is S.PREEMPTED
    assert [(o.kind, o.grace_s) for o in t.orders] == [(OrderKind.PREEMPT, 120)]


@pytest.mark.parametrize(
    "retries_before,budget,new_state,not_before,reason",
    [
        (0, None, S.QUEUED, NOW + 10, "InfraFailed"),
        (1, None, S.QUEUED, NOW + 20, "InfraFailed"),
        (2, None, S.FAILED, 0.0, "RetryBudgetSpent"),  # policy budget 2
        (0, 0, S.FAILED, 0.0, "RetryBudgetSpent"),  # per-job budget overrides
        (4, 9, S.QUEUED, NOW + 35, "InfraFailed"),  # back-off capped
    ],
)
def test_retry_budget_and_backoff(
    retries_before: int, budget: int | None, new_state: JobState, not_before: float, reason: str
) -> None:
    t = _t(react(S.RUNNING, ended(O.INFRA_FAILED), infra_retries=retries_before, max_infra_retries=budget))
    assert (t.new_state, t.reason, t.spend_retry) == (new_state, reason, True)
    if new_state is S.QUEUED:
        assert t.not_before == not_before


def test_attempt_cap_ends_rejection_loops() -> None:
    r = react(S.DISPATCHED, job_events.DispatchRejected("job-1", 5, "DOES_NOT_FIT"), attempt=5)
    t = _t(r)
    assert (t.new_state, t.reason, t.spend_retry) == (S.FAILED, "MaxAttemptsReached", False)
    t4 = _t(react(S.DISPATCHED, job_events.DispatchRejected("job-1", 4, "DOES_NOT_FIT"), attempt=4))
    assert (t4.new_state, t4.not_before) == (S.QUEUED, NOW)  # rejections re-plan at once


@pytest.mark.parametrize(
    "n,expected",
    [(0, 0.0), (1, 10.0), (2, 20.0), (3, 35.0), (10, 35.0)],
)
def test_backoff(n: int, expected: float) -> None:
    assert backoff_s(POLICY, n) == expected


def test_app_failure_keeps_exit_code() -> None:
    t = _t(react(S.RUNNING, ended(O.APP_FAILED, exit_code=2, message="boom")))
    assert t.close_attempt is not None and t.close_attempt.exit_code == 2
    assert t.message == "boom"


# -- invariants --------------------------------------------------------------------------------


_DRAW = st.tuples(st.sampled_from(EVENT_KINDS), st.integers(min_value=-1, max_value=1), st.sampled_from(list(O)))


def _apply(job: JobRecord, attempt: AttemptRecord | None, t: Transition) -> tuple[JobRecord, AttemptRecord | None]:
    """In-memory mirror of the store's _apply (enough for the invariants)."""
    if t.close_attempt and attempt is not None:
        attempt = dataclasses.replace(attempt, outcome=t.close_attempt.outcome, end_time=t.close_attempt.end_time)
    if t.stamp and attempt is not None:
        attempt = dataclasses.replace(attempt, start_time=t.stamp.start_time or attempt.start_time)
    number = job.attempt
    if t.new_attempt is not None:
        attempt, number = t.new_attempt, t.new_attempt.number
    job = dataclasses.replace(
        job,
        state=t.new_state,
        attempt=number,
        infra_retries=job.infra_retries + int(t.spend_retry),
        not_before=job.not_before if t.not_before is None else t.not_before,
    )
    return job, attempt


@settings(max_examples=200, deadline=None)
@given(st.data(), st.booleans())
def test_random_event_sequences_respect_the_table(data: st.DataObject, preemptible: bool) -> None:
    job: JobRecord = job_record(state=S.QUEUED, attempt=0, preemptible=preemptible)
    attempt: AttemptRecord | None = None
    for kind, offset, outcome in data.draw(st.lists(_DRAW, min_size=1, max_size=40)):
        ev = lifecycle_event(kind, "job-1", max(0, job.attempt + offset), outcome)
        r = lc.react(job, attempt, ev, POLICY, NOW)
        assert (r.transition is None) != (r.ignored is None)
        if r.transition is None:
            continue
        t = r.transition
        assert (t.expect_state, t.expect_attempt) == (job.state, job.attempt)
        assert t.new_state in TRANSITIONS[job.state], (job.state, t.new_state, ev)
        if t.new_attempt is not None:
            assert t.new_attempt.number == job.attempt + 1 and job.state is S.QUEUED
        if t.new_state is S.QUEUED:
            assert t.close_attempt is not None  # a requeue always closes the attempt
        job, attempt = _apply(job, attempt, t)
        assert job.infra_retries <= POLICY.max_infra_retries + 1
        assert job.attempt <= POLICY.max_attempts
        if job.infra_retries > POLICY.max_infra_retries:
            assert job.state is S.FAILED
        if job.state.terminal:
            break
