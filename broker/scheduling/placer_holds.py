"""The placer's holds: nodes held for a job while its preemption victims leave, domains held while they drain."""

from __future__ import annotations

import logging

from broker.domain.events import HoldReleased, NodesHeld
from broker.domain.records import JobRecord
from broker.domain.states import HOLDS_CAPACITY
from broker.scheduling import queue as q
from broker.scheduling.placer_book import PlacerBook, PreemptionHold, WaitInfo
from fleetplan.decide import Choice, Decision, WaitReason
from fleetplan.drain import DrainDomain
from fleetplan.view import FleetView

__all__ = ["PlacerHolds", "DRAIN_RESEND_S", "preempting_wait"]

_log = logging.getLogger("tandem.broker.placer")  # the placer's logger: these are its decisions

DRAIN_RESEND_S = 60.0
"""A held domain's copy in its cluster is sent again this often (and expires after twice that)."""


def preempting_wait(victims: frozenset[str], now: float) -> WaitInfo:
    """Why a job whose victims are still leaving waits (the preemptor's blocked-job filter reads the reason)."""
    return WaitInfo(
        WaitReason.INSUFFICIENT_CAPACITY,
        f"preempting {len(victims)} job(s) for it; its nodes are held until they leave",
        now,
    )


class PlacerHolds(PlacerBook):
    """Preemption holds and held domains over the placer's bookkeeping; the step consults them per job."""

    metrics: object | None

    def hold_for_preemption(self, job: JobRecord, choice: Choice, victims: frozenset[str], deadline: float) -> None:
        """Hold the nodes `job` will get once `victims` have left (the preemptor's plan, FLEET-NOTES F-5)."""
        res = self._reservation(job, choice.cluster, job.attempt + 1, choice.assignments, choice.gpu_model)
        self.catalog.add_reservation(res)
        self.preempting[job.job_id] = PreemptionHold(res, victims, deadline)
        # the cluster keeps them too: its extender holds them against pods outside Tandem meanwhile
        self.send(NodesHeld(choice.cluster, job.job_id, job.attempt + 1, job.spec, choice.assignments, deadline))
        self.waits[job.job_id] = preempting_wait(victims, self.clock())

    def _victims_gone(self, hold: PreemptionHold, snap: q.QueueSnapshot) -> bool:
        for v in hold.victims:
            e = snap.entries.get(v)
            if e is not None and e.state in HOLDS_CAPACITY:
                return False
        return True

    def _after_hold(self, job: JobRecord, hold: PreemptionHold, d: Decision, view: FleetView, now: float) -> None:
        """The held job was decided: placed (the hold is done), or not yet (hold on until the deadline)."""
        if d.choice is not None:
            self.preempting.pop(job.job_id, None)
            if d.choice.cluster != hold.reservation.cluster:  # its dispatch replaces the hold where it lands
                self._release_hold(hold)
        elif now < hold.deadline:
            view.hold((hold.reservation,))  # its victims left but no report shows their nodes free yet
        else:
            self.preempting.pop(job.job_id, None)
            self._release_hold(hold)
            _log.warning(
                "preempted jobs did not free the held nodes in time; planning again",
                extra={"job": job.job_id, "victims": sorted(hold.victims)},
            )
            if self.metrics is not None:
                self.metrics.preemption_timeouts.inc()  # type: ignore[attr-defined]

    def _tell_drains(self, now: float) -> None:
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

    def _without_own_drain(self, job: JobRecord, snap: q.QueueSnapshot, usage: q.Usage) -> q.Usage:
        """The cycle's usage less the idle GPUs the job's own drain hold is charged (they are its to take)."""
        drain = self.drains.holds.get(job.job_id)
        if drain is None or drain.idle_gpus == 0:
            return usage
        return snap.charge(usage, job.tenant, drain.gpu_model, -float(drain.idle_gpus))

    def hold_domain(self, job: JobRecord, domain: DrainDomain, now: float, max_hold_s: float) -> None:
        """Hold `domain` for the waiting gang `job` while it drains (see broker.scheduling.drains)."""
        self.drains.start(job.job_id, domain, now, max_hold_s, attempt=job.attempt + 1)
        self.drains.refresh(now, {job.job_id})
        self._entry(job)
        self._tell_drains(now)
        self.capacity_changed()
