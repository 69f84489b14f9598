"""Victim search for one waiting gang, over a cycle's fleet view (FLEET-NOTES F-5).

Given jobs the rules (``broker.scheduling.fairness``) let the gang preempt, find in each allowed cluster — within one
domain of the gang's required level when it has one — the cheapest set whose removal lets the core's exact
gang fit place it: simulate the candidates' removal cheapest first until the gang fits (a binary search
over that prefix: freeing more never hurts), then drop every victim the fit does not need (Kueue's
minimal-set pass). Cheapest means: gated before starting before running, then the fewest GPU-hours lost,
then the lowest priority, then the tenant most over its fair share. The plan with the fewest GPU-hours lost
across clusters and domains wins. A gang is one victim: its every replica is freed, never a part.

Removal is simulated on the overlaid nodes with ``placement.allocation.vacate``; the result is a plan, and the
cluster's own check of the preemptor's dispatch is what holds it to the truth.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fleetplan.decide import (
    Choice,
    ClusterPredicate,
    allow_every_cluster,
    choice_of,
    cluster_allowed,
    core_request,
    level_index,
)
from fleetplan.view import ClusterState, FleetView
from placement.allocation import vacate
from placement.model import JobRequest, Node, PodShape, TopologyLevels
from placement.topology import GangPlacement, fit_gang

__all__ = ["VictimCandidate", "PreemptionPlan", "plan_preemption"]


@dataclass(frozen=True, slots=True)
class VictimCandidate:
    """A running gang the rules allow the waiting job to preempt, and where its replicas run."""

    job_id: str
    cluster: str
    replicas: tuple[tuple[str, PodShape], ...]
    """(node, shape) per replica."""
    stage: int
    """0 = gated (accepted, not started), 1 = starting, 2 = running."""
    lost_gpu_hours: float
    """Work lost if preempted now: GPUs x hours since it started (or since its last checkpoint)."""
    priority: int
    over_share: float = 0.0
    """Its tenant's usage minus fair share (cost units): more over is preempted first among equals."""

    @property
    def key(self) -> tuple[int, float, int, float, str]:
        return self.stage, self.lost_gpu_hours, self.priority, -self.over_share, self.job_id


@dataclass(frozen=True, slots=True)
class PreemptionPlan:
    choice: Choice
    """Where the preemptor goes once the victims are gone."""
    victims: tuple[VictimCandidate, ...]
    lost_gpu_hours: float


def _vacated(nodes: dict[str, Node], victims: Sequence[VictimCandidate]) -> dict[str, Node]:
    out = dict(nodes)
    for v in victims:
        for node_name, shape in v.replicas:
            n = out.get(node_name)
            if n is not None:
                out[node_name] = vacate(n, shape)
    return out


def _fits(
    nodes: dict[str, Node],
    order: Sequence[str],
    victims: Sequence[VictimCandidate],
    req: JobRequest,
    levels: TopologyLevels,
) -> GangPlacement | None:
    freed = _vacated(nodes, victims)
    placed = fit_gang([freed[n] for n in order], req, levels)
    return placed if isinstance(placed, GangPlacement) else None


def _minimal(
    nodes: dict[str, Node],
    order: Sequence[str],
    cands: Sequence[VictimCandidate],
    req: JobRequest,
    levels: TopologyLevels,
) -> tuple[list[VictimCandidate], GangPlacement] | None:
    """The shortest cheapest-first prefix that lets the gang fit, then pruned to a minimal set."""
    if not cands or _fits(nodes, order, cands, req, levels) is None:
        return None
    lo, hi = 1, len(cands)
    while lo < hi:
        mid = (lo + hi) // 2
        if _fits(nodes, order, cands[:mid], req, levels) is not None:
            hi = mid
        else:
            lo = mid + 1
    chosen = list(cands[:lo])
    for v in sorted(chosen, key=lambda c: c.key, reverse=True):  # try dropping the dearest first
        if len(chosen) > 1:
            rest = [c for c in chosen if c.job_id != v.job_id]
            if _fits(nodes, order, rest, req, levels) is not None:
                chosen = rest
    placed = _fits(nodes, order, chosen, req, levels)
    assert placed is not None  # the pass only drops a victim when the gang still fits without it
    return chosen, placed


def _scopes(
    view: FleetView, entry: ClusterState, req: JobRequest, rows: list[int], cands: Sequence[VictimCandidate]
) -> list[tuple[list[int], list[VictimCandidate]]]:
    """Where to search: each domain of the required level that a candidate touches, or the whole cluster."""
    lvl = level_index(entry, req.required_level)
    if lvl is None or lvl is False or isinstance(lvl, bool):
        return [(rows, list(cands))]
    arrays = view.arrays(entry.name)
    assert arrays is not None
    dom = arrays.dom[lvl]
    by_domain: dict[int, list[int]] = {}
    for r in rows:
        by_domain.setdefault(int(dom[r]), []).append(r)
    out: list[tuple[list[int], list[VictimCandidate]]] = []
    for members in by_domain.values():
        names = {arrays.nodes[r].name for r in members}
        touching = [c for c in cands if any(n in names for n, _ in c.replicas)]
        if touching:
            out.append((members, touching))
    return out


def plan_preemption(
    view: FleetView,
    req: JobRequest,
    candidates: Sequence[VictimCandidate],
    *,
    policy_allows: ClusterPredicate = allow_every_cluster,
) -> PreemptionPlan | None:
    """The cheapest feasible set of victims for `req` over every allowed, usable cluster, or None."""
    best: PreemptionPlan | None = None
    by_cluster: dict[str, list[VictimCandidate]] = {}
    for c in sorted(candidates, key=lambda c: c.key):
        by_cluster.setdefault(c.cluster, []).append(c)
    for name, cands in by_cluster.items():
        entry = view.clusters.get(name)
        if entry is None or not entry.usable or not cluster_allowed(entry, req, policy_allows):
            continue
        arrays = view.arrays(name)
        if arrays is None or level_index(entry, req.required_level) is False:
            continue
        rows = view.usable_rows(name)
        core_req = core_request(entry, req)
        levels = TopologyLevels(tuple(l.key for l in entry.meta.levels))
        for scope_rows, scope_cands in _scopes(view, entry, req, rows, cands):
            overlaid = view.overlaid_nodes(name, scope_rows)
            nodes = {n.name: n for n in overlaid}
            order = [n.name for n in overlaid]
            found = _minimal(nodes, order, scope_cands, core_req, levels)
            if found is None:
                continue
            victims, placed = found
            lost = sum(v.lost_gpu_hours for v in victims)
            if best is not None and (lost, len(victims)) >= (best.lost_gpu_hours, len(best.victims)):
                continue
            choice = choice_of(
                entry,
                req,
                placed,
                lambda n: arrays.nodes[arrays.row[n]].gpu_model,  # noqa: B023 - called here
                tuple(s or "" for s in placed.domain),
            )
            best = PreemptionPlan(choice, tuple(sorted(victims, key=lambda v: v.key)), lost)
    return best
