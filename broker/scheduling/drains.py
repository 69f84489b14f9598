"""Domains held for long-waiting gangs while they drain (FLEET-NOTES F-8): the placer's bookkeeping.

A hold is a reservation in the catalog overlay covering the domain's idle whole GPUs, refreshed before every
placement step, so no other placement takes them as they free up — except a backfill job, whose enforced end
(max runtime + start timeout) comes before the domain has drained: for its decision the hold is lifted. The
idle GPUs a hold keeps are charged to the holder (its queue entry's ``drain_hold``). A hold ends when its
gang is placed or cancelled, and after ``max_hold_s`` at the latest, so a held gang cannot starve the fleet.
Holds live in memory: after a restart a gang that still waits holds again once it is past the bound.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass

from fleetplan import catalog as cat
from fleetplan.drain import DrainDomain, enforced_end, hold_parts
from fleetplan.view import FleetView

__all__ = ["DrainHold", "DrainHolds"]

_log = logging.getLogger("tandem.broker.drains")


@dataclass(slots=True)
class DrainHold:
    job_id: str
    domain: DrainDomain
    since: float
    until: float
    """The hold is given up then, drained or not."""
    gpu_model: str = ""
    idle_gpus: int = 0
    """Idle GPUs it keeps now (charged to the holder)."""
    attempt: int = 1
    """The attempt the gang will be dispatched as: the cluster's copy of the hold is that attempt's."""
    sent: tuple[tuple[str, int], ...] = ()
    sent_at: float = -1e18

    @property
    def key(self) -> cat.AttemptKey:
        return (self.job_id, 0)  # attempt 0 is never a real attempt: the hold never collides with one


class DrainHolds:
    def __init__(self, catalog: cat.Catalog) -> None:
        self.catalog = catalog
        self.holds: dict[str, DrainHold] = {}
        self._released: list[DrainHold] = []

    def __len__(self) -> int:
        return len(self.holds)

    def start(self, job_id: str, domain: DrainDomain, now: float, max_hold_s: float, attempt: int = 1) -> DrainHold:
        hold = DrainHold(job_id, domain, now, now + max_hold_s, attempt=attempt)
        self.holds[job_id] = hold
        _log.info(
            "domain held for a waiting gang",
            extra={
                "job": job_id,
                "cluster": domain.cluster,
                "domain": "/".join(domain.path),
                "drains_by": round(domain.drains_by),
            },
        )
        return hold

    def end(self, job_id: str) -> None:
        hold = self.holds.pop(job_id, None)
        if hold is not None:
            self.catalog.drop_reservation(hold.key)
            self._released.append(hold)

    def take_released(self) -> list[DrainHold]:
        """Holds ended since the last call (the cluster's copies are to be deleted)."""
        out, self._released = self._released, []
        return out

    def outgoing(self, now: float, resend_s: float) -> list[tuple[DrainHold, tuple[tuple[str, int], ...]]]:
        """Holds whose idle GPUs the cluster should be told of now: they changed since last sent, or the last
        copy is older than `resend_s` (the cluster's copy expires unless it is sent again)."""
        out = []
        for hold in self.holds.values():
            res = self.catalog.reservations.get(hold.key)
            idle = tuple(sorted((r.node, res.shapes[r.pod_set].gpus) for r in res.replicas)) if res else ()
            if idle != hold.sent or now - hold.sent_at >= resend_s:
                hold.sent, hold.sent_at = idle, now
                out.append((hold, idle))
        return out

    def refresh(self, now: float, only: Collection[str] | None = None) -> list[str]:
        """Re-take each held domain's idle GPUs as they are now; give up holds past their end. Returns the jobs
        whose charge changed (their queue entries need updating)."""
        changed: list[str] = []
        for job_id, hold in list(self.holds.items()):
            if only is not None and job_id not in only:
                continue
            self.catalog.drop_reservation(hold.key)
            if now >= hold.until:
                _log.warning("domain hold ended before its gang was placed", extra={"job": job_id})
                del self.holds[job_id]
                self._released.append(hold)
                changed.append(job_id)
                continue
            entry = self.catalog.clusters.get(hold.domain.cluster)
            arrays = entry.arrays if entry is not None else None
            if arrays is None:
                continue
            view = FleetView(self.catalog, now)
            rows = [arrays.row[n] for n in hold.domain.nodes if n in arrays.row]
            nodes = view.overlaid_nodes(hold.domain.cluster, rows)
            replicas, shapes = hold_parts(nodes)
            model = min((n.gpu_model for n in nodes if n.gpu_model), default="")
            idle = sum(s.gpus for s in shapes.values())
            if replicas:
                self.catalog.add_reservation(cat.Reservation(job_id, 0, hold.domain.cluster, replicas, shapes, model))
            if (idle, model) != (hold.idle_gpus, hold.gpu_model):
                hold.idle_gpus, hold.gpu_model = idle, model
                changed.append(job_id)
        return changed

    def lifted_for(
        self, job_id: str, max_runtime_s: float | None, start_timeout_s: float, now: float
    ) -> list[DrainHold]:
        """Holds a decision for `job_id` may see through: its own, and every one it can backfill (it is bound
        to end before the domain has drained). Their reservations are dropped; `restore` puts them back."""
        out: list[DrainHold] = []
        for hold in self.holds.values():
            mine = hold.job_id == job_id
            ends = enforced_end(now, max_runtime_s, start_timeout_s)
            fits_before = ends is not None and ends <= hold.domain.drains_by
            if (mine or fits_before) and hold.key in self.catalog.reservations:
                out.append(hold)
        for hold in out:
            self.catalog.drop_reservation(hold.key)
        return out

    def restore(self, lifted: list[DrainHold], now: float) -> list[str]:
        """Hold again what a decision lifted (its own placement, if any, is already in the overlay)."""
        return self.refresh(now, {h.job_id for h in lifted}) if lifted else []
