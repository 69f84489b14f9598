"""Job states, attempt outcomes and the transition table: the one definition of the job state machine.

Main line: QUEUED → RESERVED → DISPATCHED → ACCEPTED → STARTING → RUNNING →
SUCCEEDED / FAILED / CANCELLED, plus:

* CANCELLING — cancel requested after the workload may exist in a cluster;
  kept until the cluster confirms deletion, even across a disconnect (only an
  explicit ``AbandonLost`` — admin or a long bound — ends it unconfirmed).
* PREEMPTED — the broker ordered preemption (grace period to checkpoint); kept
  until the cluster confirms, then the job goes back to QUEUED with a new
  attempt (no retry spent). Not terminal. Counts against quota meanwhile.
* LOST — a STARTING/RUNNING attempt whose cluster went silent past a bound.
  Still counts against quota. Back to RUNNING if the cluster reports it again;
  re-queued (outcome LOST, retry spent) when abandoned.

Retry budget (decided here, once): outcomes INFRA_FAILED, GANG_TIMEOUT and
LOST spend it — LOST only when the attempt had been started (gates lifted);
an attempt re-planned before its Start (cluster silent, reservation expired)
is LOST without spending. REJECTED and PREEMPTED never spend it. APP_FAILED
fails the job at once (no retry); every job also has a hard cap on attempts
of any kind so rejection loops end.
"""

from __future__ import annotations

import enum

__all__ = [
    "JobState",
    "AttemptOutcome",
    "TERMINAL",
    "ACTIVE",
    "HOLDS_CAPACITY",
    "PRE_START",
    "TRANSITIONS",
    "is_allowed",
    "spends_retry",
]


class JobState(enum.StrEnum):
    """Job lifecycle state (names match tandem.v1.JobState without the prefix)."""

    QUEUED = "QUEUED"
    RESERVED = "RESERVED"
    DISPATCHED = "DISPATCHED"
    ACCEPTED = "ACCEPTED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLING = "CANCELLING"
    CANCELLED = "CANCELLED"
    PREEMPTED = "PREEMPTED"
    LOST = "LOST"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


class AttemptOutcome(enum.StrEnum):
    """How an attempt ended (names match tandem.v1.AttemptOutcome without the prefix)."""

    SUCCEEDED = "SUCCEEDED"
    APP_FAILED = "APP_FAILED"
    INFRA_FAILED = "INFRA_FAILED"
    GANG_TIMEOUT = "GANG_TIMEOUT"
    REJECTED = "REJECTED"
    PREEMPTED = "PREEMPTED"
    CANCELLED = "CANCELLED"
    LOST = "LOST"


S = JobState

TERMINAL: frozenset[JobState] = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED})
"""No transition leaves these."""

ACTIVE: frozenset[JobState] = frozenset(S) - TERMINAL
"""Everything not terminal (the queue and the placer load these after a restart)."""

HOLDS_CAPACITY: frozenset[JobState] = frozenset(
    {S.RESERVED, S.DISPATCHED, S.ACCEPTED, S.STARTING, S.RUNNING, S.LOST, S.CANCELLING, S.PREEMPTED}
)
"""States whose current attempt is charged to quota and fair share (reserved counts as used)."""

PRE_START: frozenset[JobState] = frozenset({S.RESERVED, S.DISPATCHED, S.ACCEPTED})
"""An attempt in these states has not been sent Start: its gates are still on, so it may be re-planned safely."""

TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    S.QUEUED: frozenset({S.RESERVED, S.CANCELLED, S.FAILED}),
    # RESERVED → ACCEPTED too: the agent's accept may overtake the dispatcher's "sent" mark.
    S.RESERVED: frozenset({S.DISPATCHED, S.ACCEPTED, S.QUEUED, S.CANCELLED, S.CANCELLING, S.FAILED}),
    S.DISPATCHED: frozenset({S.ACCEPTED, S.QUEUED, S.CANCELLING, S.FAILED}),
    S.ACCEPTED: frozenset({S.STARTING, S.QUEUED, S.CANCELLING, S.PREEMPTED, S.FAILED}),
    S.STARTING: frozenset({S.RUNNING, S.SUCCEEDED, S.FAILED, S.QUEUED, S.CANCELLING, S.PREEMPTED, S.LOST}),
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.QUEUED, S.CANCELLING, S.PREEMPTED, S.LOST}),
    S.LOST: frozenset({S.RUNNING, S.SUCCEEDED, S.FAILED, S.QUEUED, S.CANCELLING}),
    S.CANCELLING: frozenset({S.CANCELLED, S.SUCCEEDED}),
    S.PREEMPTED: frozenset({S.QUEUED, S.SUCCEEDED, S.FAILED, S.CANCELLING}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
}
"""Allowed edges ``from → {to}``. The store refuses any other (InvalidTransition).

A self-edge is never a transition; a same-state update that opens a new
attempt (QUEUED → QUEUED) does not exist — re-queueing always closes the
current attempt and the next reservation opens a new one.
"""


def is_allowed(src: JobState, dst: JobState) -> bool:
    """True if the state machine has the edge ``src → dst``."""
    return dst in TRANSITIONS[src]


def spends_retry(outcome: AttemptOutcome, *, started: bool) -> bool:
    """Whether an attempt that ended with ``outcome`` spends the job's infrastructure-retry budget.

    ``started`` is True once Start was sent (gates lifted). See the module docstring.
    """
    if outcome in (AttemptOutcome.INFRA_FAILED, AttemptOutcome.GANG_TIMEOUT):
        return True
    if outcome is AttemptOutcome.LOST:
        return started
    return False
