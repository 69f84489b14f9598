"""The placer's holds: nodes held for a job while its preemption victims leave, domains held while they drain."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from broker.domain.events import HoldReleased, NodesHeld, ToDispatcher
from broker.domain.records import JobRecord
from broker.domain.states import HOLDS_CAPACITY, JobState
from broker.scheduling import queue as q
from broker.scheduling.drains import DrainHolds
from broker.scheduling.placer_book import JobBook, WaitHint
from fleetplan import catalog as cat
from fleetplan.decide import Choice, Decision, WaitReason
from fleetplan.drain import DrainDomain
from fleetplan.view import FleetView

__all__ = ["Holds", "PreemptionHold", "DRAIN_RESEND_S", "preempting_wait"]

_log = logging.getLogger("tandem.broker.placer")  # the placer's logger: these are its decisions

DRAIN_RESEND_S = 60.0
"""A held domain's copy in its cluster is sent again this often (and expires after twice that)."""


@dataclass(frozen=True, slots=True)
class PreemptionHold:
    """Nodes held for a waiting job while the jobs preempted for it leave (FLEET-NOTES F-5).

    The hold is a reservation in the catalog overlay, so no other placement takes the freed GPUs; it is
    given back when its job is decided (placed, or, past the deadline, planned again from scratch)."""

    reservation: cat.Reservation
    victims: frozenset[str]
    deadline: float


def preempting_wait(victims: frozenset[str], now: float) -> WaitHint:
    """Why a job whose victims are still leaving waits (the preemptor's blocked-job filter reads the reason)."""
    return WaitHint(
        WaitReason.INSUFFICIENT_CAPACITY,
        f"preempting {len(victims)} job(s) for it; its nodes are held until they leave",
        now,
    )


class Holds:
    """Capacity held for waiting jobs, and the clusters' copies of it: preemption holds (`preempting`) and
    held domains (`drains`). The preemptor starts them, the placer's step consults them per job, and each
    ends when its job leaves the queue."""

    def __init__(
        self,
        book: JobBook,
        drains: DrainHolds,
        *,
        send: Callable[[ToDispatcher], None],
        metrics: object | None = None,
    ) -> None:
        self.book = book
        """Where a hold's reservation is derived from and kept (its catalog), and where its job's wait and
        next look are noted."""
        self.drains = drains
        """Domains held for long-waiting gangs while they drain (see broker.scheduling.drains)."""
        self.preempting: dict[str, PreemptionHold] = {}
        """Waiting jobs whose victims are leaving: the nodes they will get are held for them meanwhile."""
        self.send = send
        """Where the clusters' copies of holds go (the hub hands them to the dispatcher)."""
        self.metrics = metrics

    def observe(self, job: JobRecord) -> None:
        """A committed job change: a job that left the queue gives its holds back; a victim that left wakes
        the job it was preempted for."""
        if job.state is not JobState.QUEUED:
            gone = self.preempting.pop(job.job_id, None)
            if gone is not None and job.state is not JobState.RESERVED:
                self._release(gone)  # cancelled (or failed) while its victims were leaving
            self.drains.end(job.job_id)
        if job.state not in HOLDS_CAPACITY:
            for holder, hold in self.preempting.items():
                if job.job_id in hold.victims:
                    self.book.todo.add(holder)  # one of its victims has left: look at it again

    # ------------------------------------------------------------------ preemption holds

    def hold_for_preemption(self, job: JobRecord, choice: Choice, victims: frozenset[str], deadline: float) -> None:
        """Hold the nodes `job` will get once `victims` have left (the preemptor's plan, FLEET-NOTES F-5)."""
        res = self.book.reservation(job, choice.cluster, job.attempt + 1, choice.assignments, choice.gpu_model)
        self.book.catalog.add_reservation(res)
        self.preempting[job.job_id] = PreemptionHold(res, victims, deadline)
        # the cluster keeps them too: its extender holds them against pods outside Tandem meanwhile
        self.send(NodesHeld(choice.cluster, job.job_id, job.attempt + 1, job.spec, choice.assignments, deadline))
        self.book.waits[job.job_id] = preempting_wait(victims, self.book.clock())

    @staticmethod
    def victims_gone(hold: PreemptionHold, snap: q.QueueSnapshot) -> bool:
        """Whether every job preempted for the hold's job has stopped holding capacity."""
        for v in hold.victims:
            e = snap.entries.get(v)
            if e is not None and e.state in HOLDS_CAPACITY:
                return False
        return True

    def after_decision(self, job: JobRecord, hold: PreemptionHold, d: Decision, view: FleetView, now: float) -> None:
        """The held job was decided: placed (the hold is done), or not yet (hold on until the deadline)."""
        if d.choice is not None:
            self.preempting.pop(job.job_id, None)
            if d.choice.cluster != hold.reservation.cluster:  # its dispatch replaces the hold where it lands
                self._release(hold)
        elif now < hold.deadline:
            view.hold((hold.reservation,))  # its victims left but no report shows their nodes free yet
        else:
            self.preempting.pop(job.job_id, None)
            self._release(hold)
            _log.warning(
                "preempted jobs did not free the held nodes in time; planning again",
                extra={"job": job.job_id, "victims": sorted(hold.victims)},
            )
            if self.metrics is not None:
                self.metrics.preemption_timeouts.inc()  # type: ignore[attr-defined]

    def _release(self, hold: PreemptionHold) -> None:
        r = hold.reservation
        self.send(HoldReleased(r.cluster, r.job_id, r.attempt))

    # ------------------------------------------------------------------ held domains

    def hold_domain(self, job: JobRecord, domain: DrainDomain, now: float, max_hold_s: float) -> None:
        """Hold `domain` for the waiting gang `job` while it drains (see broker.scheduling.drains)."""
        self.drains.start(job.job_id, domain, now, max_hold_s, attempt=job.attempt + 1)
        self.drains.refresh(now, {job.job_id})
        self.book.refresh_entry(job)
        self.tell_clusters(now)
        self.book.capacity_changed()

    def tell_clusters(self, now: float) -> None:
        """The clusters keep held domains too: their idle GPUs as they change, and holds that ended."""
        for hold in self.drains.take_released():
            self.send(HoldReleased(hold.domain.cluster, hold.job_id, hold.attempt, drain=True))
        for hold, idle in self.drains.outgoing(now, DRAIN_RESEND_S):
            if idle:
                self.send(
                    NodesHeld(
                        hold.domain.cluster,
                        hold.job_id,
                        hold.attempt,
                        b"",
                        (),
                        now + 2 * DRAIN_RESEND_S,
                        drain=True,
                        idle=idle,
                    )
                )
            else:  # nothing idle to keep (yet): no copy in the cluster
                self.send(HoldReleased(hold.domain.cluster, hold.job_id, hold.attempt, drain=True))

    def usage_without_own_drain(self, job: JobRecord, snap: q.QueueSnapshot, usage: q.Usage) -> q.Usage:
        """The cycle's usage less the idle GPUs the job's own drain hold is charged (they are its to take)."""
        drain = self.drains.holds.get(job.job_id)
        if drain is None or drain.idle_gpus == 0:
            return usage
        return snap.charge(usage, job.tenant, drain.gpu_model, -float(drain.idle_gpus))
