"""Reservations overlay: reported inventory minus the reserved replicas the report does not yet show bound."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from placement.allocation import allocate
from placement.dra import DraEvaluator
from placement.fit import Fit, capacity
from placement.model import JobRequest, Node, PodShape
from placement.reasons import Reason
from placement.topology import GangPlacement

__all__ = [
    "ReportedNodes",
    "ReservedPart",
    "Reservation",
    "BoundReplicas",
    "Conflict",
    "Overlay",
    "unbound_parts",
    "apply_overlay",
    "effective_nodes",
    "capacity_with_reservations",
    "subtract_held",
]

ReservationKey = tuple[str, int]
"""(job_id, attempt)."""


@dataclass(frozen=True, slots=True)
class BoundReplicas:
    """For one reservation: replicas the report already shows bound, per (pod_set, node)."""

    job_id: str
    attempt: int
    counts: Mapping[tuple[str, str], int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ReportedNodes:
    """The nodes as one cluster's report gave them, the overlay's input: `sequence` increases with every report;
    `bound` says, per reservation, what the nodes' free figures already include. (The broker's decoded agent
    report, snapshot or delta, is `fleetplan.catalog.InventoryReport`; this is what the overlay needs of it.)"""

    cluster: str
    sequence: int
    nodes: tuple[Node, ...]
    bound: tuple[BoundReplicas, ...] = ()


@dataclass(frozen=True, slots=True)
class ReservedPart:
    """`replicas` replicas of `pod_set` (each `shape`) reserved on `node`."""

    pod_set: str
    node: str
    replicas: int
    shape: PodShape


@dataclass(frozen=True, slots=True)
class Reservation:
    """A placement held for one attempt of a job until its pods are bound (or it is released)."""

    job_id: str
    attempt: int
    parts: tuple[ReservedPart, ...]

    @property
    def key(self) -> ReservationKey:
        return (self.job_id, self.attempt)

    @classmethod
    def from_placement(cls, job: JobRequest, placement: GangPlacement, attempt: int) -> Reservation:
        shapes = {ps.name: ps.shape for ps in job.pod_sets}
        merged: dict[tuple[str, str], int] = {}
        for a in placement.assignments:
            merged[(a.pod_set, a.node)] = merged.get((a.pod_set, a.node), 0) + a.replicas
        return cls(
            job.job_id,
            attempt,
            tuple(ReservedPart(ps, node, n, shapes[ps]) for (ps, node), n in merged.items()),
        )


@dataclass(frozen=True, slots=True)
class Conflict:
    """Reserved replicas that no longer fit on the reported node (or the node is gone)."""

    job_id: str
    attempt: int
    pod_set: str
    node: str
    replicas: int
    reason: Reason | None
    detail: str


@dataclass(frozen=True, slots=True)
class Overlay:
    """Effective nodes (same order as the report), conflicts, and which reservations hold each node."""

    nodes: tuple[Node, ...]
    conflicts: tuple[Conflict, ...]
    holders: Mapping[str, tuple[str, ...]]


def unbound_parts(reservation: Reservation, bound: BoundReplicas | None) -> list[ReservedPart]:
    """The parts of a reservation not yet bound: reserved minus bound per (pod_set, node), >= 0."""
    counts = bound.counts if bound is not None else {}
    out = []
    for part in reservation.parts:
        left = part.replicas - counts.get((part.pod_set, part.node), 0)
        if left > 0:
            out.append(ReservedPart(part.pod_set, part.node, left, part.shape))
    return out


def subtract_held(node: Node, shape: PodShape, replicas: int, dra: DraEvaluator | None = None) -> tuple[Node, int, Fit]:
    """Take `replicas` held replicas of `shape` off the node, as many as still fit (a hold that
    no longer fits takes what is left); returns the node, the shortfall and the fit before."""
    fit = capacity(node, shape, dra=dra)
    take = min(fit.count, replicas)
    if take > 0:
        node, _ = allocate(node, shape, take, dra=dra)
    return node, replicas - take, fit


def apply_overlay(
    report: ReportedNodes,
    reservations: Iterable[Reservation],
    bound: Iterable[BoundReplicas] | None = None,
    *,
    exclude: ReservationKey | None = None,
    dra: DraEvaluator | None = None,
) -> Overlay:
    """Reported nodes minus every reservation's unbound part (bound replicas are already in the
    report's free figures, so they are not subtracted again). `exclude` skips one reservation,
    e.g. the gang whose own pod is being filtered. Parts that no longer fit become conflicts."""
    by_key = {(b.job_id, b.attempt): b for b in (report.bound if bound is None else bound)}
    state = {n.name: n for n in report.nodes}
    conflicts: list[Conflict] = []
    holders: dict[str, list[str]] = {}
    for res in sorted(reservations, key=lambda r: r.key):
        if res.key == exclude:
            continue
        for part in unbound_parts(res, by_key.get(res.key)):
            node = state.get(part.node)
            if node is None:
                conflicts.append(
                    Conflict(
                        res.job_id, res.attempt, part.pod_set, part.node, part.replicas, None, "node not in report"
                    )
                )
                continue
            holders.setdefault(part.node, []).append(res.job_id)
            node, short, fit = subtract_held(node, part.shape, part.replicas, dra)
            state[part.node] = node
            if short:
                conflicts.append(
                    Conflict(res.job_id, res.attempt, part.pod_set, part.node, short, fit.reason, fit.detail)
                )
    return Overlay(
        tuple(state[n.name] for n in report.nodes),
        tuple(conflicts),
        {k: tuple(dict.fromkeys(v)) for k, v in holders.items()},
    )


def effective_nodes(
    report: ReportedNodes,
    reservations: Iterable[Reservation],
    bound: Iterable[BoundReplicas] | None = None,
    *,
    exclude: ReservationKey | None = None,
    dra: DraEvaluator | None = None,
) -> tuple[Node, ...]:
    """The nodes as placement should see them: see apply_overlay."""
    return apply_overlay(report, reservations, bound, exclude=exclude, dra=dra).nodes


def capacity_with_reservations(
    reported: Node, effective: Node, shape: PodShape, holders: Sequence[str] = (), *, dra: DraEvaluator | None = None
) -> Fit:
    """Fit on the effective node; when only the reservations stand in the way, say so
    (RESERVED_FOR_GANG) instead of the resource that ran out."""
    fit = capacity(effective, shape, dra=dra)
    if fit.count > 0 or not holders:
        return fit
    if capacity(reported, shape, dra=dra).count > 0:
        r = Reason.RESERVED_FOR_GANG
        return Fit(0, r, r.message(node=reported.name, gang=", ".join(holders)))
    return fit
