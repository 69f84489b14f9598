"""The job state machine's table: exact edges, terminal states, capacity accounting, retry spending."""

from __future__ import annotations

import pytest

from broker.domain.states import (
    ACTIVE,
    HOLDS_CAPACITY,
    TERMINAL,
    TRANSITIONS,
    AttemptOutcome,
    JobState,
    is_allowed,
    spends_retry,
)

S = JobState
O = AttemptOutcome

MAIN_LINE = [S.QUEUED, S.RESERVED, S.DISPATCHED, S.ACCEPTED, S.STARTING, S.RUNNING, S.SUCCEEDED]


def test_every_state_has_a_row() -> None:
    assert set(TRANSITIONS) == set(S)


@pytest.mark.parametrize("src,dst", list(zip(MAIN_LINE, MAIN_LINE[1:])))
def test_main_line_is_allowed(src: JobState, dst: JobState) -> None:
    assert is_allowed(src, dst)


@pytest.mark.parametrize("state", sorted(TERMINAL))
def test_terminal_states_have_no_exit(state: JobState) -> None:
    assert TRANSITIONS[state] == frozenset()
    assert state.terminal and state not in ACTIVE


@pytest.mark.parametrize("state", list(S))
def test_no_self_edges(state: JobState) -> None:
    assert not is_allowed(state, state)


@pytest.mark.parametrize(
    "src,dst,allowed",
    [
        (S.QUEUED, S.RUNNING, False),  # never skip placement
        (S.QUEUED, S.CANCELLED, True),
        (S.RESERVED, S.CANCELLED, True),  # not started: cancelled at once
        (S.DISPATCHED, S.CANCELLED, False),  # a workload may exist: CANCELLING first
        (S.RUNNING, S.CANCELLED, False),
        (S.RUNNING, S.CANCELLING, True),
        (S.CANCELLING, S.CANCELLED, True),
        (S.CANCELLING, S.QUEUED, False),  # kept until the cluster confirms
        (S.CANCELLING, S.RUNNING, False),
        (S.RUNNING, S.LOST, True),
        (S.LOST, S.RUNNING, True),  # the cluster came back
        (S.ACCEPTED, S.LOST, False),  # not started: re-planned instead
        (S.RUNNING, S.PREEMPTED, True),
        (S.PREEMPTED, S.QUEUED, True),
        (S.PREEMPTED, S.RUNNING, False),
        (S.RESERVED, S.ACCEPTED, True),  # accept may overtake the "sent" mark
        (S.RUNNING, S.QUEUED, True),  # retry after an infrastructure failure
        (S.SUCCEEDED, S.QUEUED, False),
    ],
)
def test_selected_edges(src: JobState, dst: JobState, allowed: bool) -> None:
    assert is_allowed(src, dst) is allowed


def test_capacity_is_held_from_reservation_until_confirmation() -> None:
    assert HOLDS_CAPACITY == {
        S.RESERVED,
        S.DISPATCHED,
        S.ACCEPTED,
        S.STARTING,
        S.RUNNING,
        S.LOST,
        S.CANCELLING,
        S.PREEMPTED,
    }


@pytest.mark.parametrize(
    "outcome,started,spends",
    [
        (O.SUCCEEDED, True, False),
        (O.APP_FAILED, True, False),
        (O.INFRA_FAILED, True, True),
        (O.INFRA_FAILED, False, True),
        (O.GANG_TIMEOUT, True, True),
        (O.REJECTED, False, False),
        (O.PREEMPTED, True, False),
        (O.CANCELLED, True, False),
        (O.LOST, True, True),
        (O.LOST, False, False),  # re-planned before Start: its gates never lifted
    ],
)
def test_retry_budget_spending(outcome: AttemptOutcome, started: bool, spends: bool) -> None:
    assert spends_retry(outcome, started=started) is spends


def test_enum_names_match_the_wire() -> None:
    from tandem.v1 import job_pb2

    assert {f"JOB_STATE_{s.value}" for s in S} == set(job_pb2.JobState.keys()) - {"JOB_STATE_UNSPECIFIED"}
    assert {f"ATTEMPT_OUTCOME_{o.value}" for o in O} == (
        set(job_pb2.AttemptOutcome.keys()) - {"ATTEMPT_OUTCOME_UNSPECIFIED"}
    )
