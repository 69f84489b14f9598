"""Which domain a long-waiting gang should hold while it drains (FLEET-NOTES F-8), over a cycle's fleet view.

A gang that has waited past a bound takes one domain of its required level (or a whole cluster when it asks
for none) that could hold it empty, and keeps the domain's idle GPUs for itself as they free up; only jobs
whose enforced end (max runtime + start timeout, as the cluster's Job deadline enforces it) comes before the
domain has drained may be backfilled into it. The domain chosen is the one that drains soonest: every job on
it ends by its enforced bound, and a preemptible job without one ends at the hold's own end (it is preempted
then). A domain where a job that is not preemptible runs without a max runtime could never drain: it is
never chosen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from fleetplan.catalog import ReservedReplica, empty_node
from fleetplan.decide import ClusterPredicate, allow_every_cluster, cluster_allowed, core_request, level_index
from fleetplan.view import FleetView
from placement.model import JobRequest, Node, PodShape, TopologyLevels
from placement.topology import GangPlacement, fit_gang

__all__ = ["BusyJob", "DrainDomain", "choose_drain_domain", "enforced_end", "hold_parts"]


def enforced_end(start: float, max_runtime_s: float | None, start_timeout_s: float) -> float | None:
    """When a job started at `start` has ended at the latest: the cluster's Job deadline (activeDeadlineSeconds =
    max runtime + start timeout); None without a max runtime."""
    return None if max_runtime_s is None else start + max_runtime_s + start_timeout_s


@dataclass(frozen=True, slots=True)
class BusyJob:
    """A job holding nodes now, and when it is bound to have ended (None = no bound)."""

    job_id: str
    cluster: str
    nodes: frozenset[str]
    ends_by: float | None
    preemptible: bool


@dataclass(frozen=True, slots=True)
class DrainDomain:
    cluster: str
    path: tuple[str, ...]
    """The domain's label values down to the gang's required level (empty: the whole cluster)."""
    nodes: tuple[str, ...]
    drains_by: float
    """When every job now on it has ended by its enforced bound."""
    busy_gpus: int


def choose_drain_domain(
    view: FleetView,
    req: JobRequest,
    busy: Sequence[BusyJob],
    *,
    now: float,
    hold_until: float,
    policy_allows: ClusterPredicate = allow_every_cluster,
    model_ok: Callable[[str], bool] = lambda _m: True,
) -> DrainDomain | None:
    """The domain that would hold the gang empty and drains soonest, or None (see the module docstring).

    `model_ok(gpu model)`: whether the gang's quota admits it on that model (a domain it could never be
    admitted to is never held)."""
    by_cluster: dict[str, list[BusyJob]] = {}
    for b in busy:
        by_cluster.setdefault(b.cluster, []).append(b)
    best: tuple[tuple[float, int, str, tuple[str, ...]], DrainDomain] | None = None
    for name, entry in view.clusters.items():
        if not entry.usable or not cluster_allowed(entry, req, policy_allows):
            continue
        lvl = level_index(entry, req.required_level)
        arrays = view.arrays(name)
        if lvl is False or isinstance(lvl, bool) or arrays is None:
            continue
        levels = TopologyLevels(tuple(l.key for l in entry.meta.levels))
        core_req = core_request(entry, req)
        groups: dict[int, list[int]] = {}
        for r in view.usable_rows(name):
            groups.setdefault(int(arrays.dom[lvl][r]) if lvl is not None else 0, []).append(r)
        for rows in groups.values():
            nodes = [arrays.nodes[r] for r in rows]
            placed = fit_gang([empty_node(n) for n in nodes], core_req, levels)
            if not isinstance(placed, GangPlacement):
                continue
            used = {n.gpu_model for n in nodes if n.name in {a.node for a in placed.assignments} and n.gpu_model}
            if not all(model_ok(m) for m in used):
                continue
            names = {n.name for n in nodes}
            on = [b for b in by_cluster.get(name, ()) if b.nodes & names]
            if any(b.ends_by is None and not b.preemptible for b in on):
                continue  # would never drain
            drains_by = max([now] + [b.ends_by if b.ends_by is not None else hold_until for b in on])
            busy_gpus = sum(len(n.gpus) - n.free_whole_gpus for n in nodes)
            path = tuple(s or "" for s in placed.domain)
            key = (drains_by, busy_gpus, name, path)
            if best is None or key < best[0]:
                best = (key, DrainDomain(name, path, tuple(sorted(names)), drains_by, busy_gpus))
    return best[1] if best else None


def hold_parts(nodes: Iterable[Node]) -> tuple[tuple[ReservedReplica, ...], dict[str, PodShape]]:
    """A reservation's replicas and shapes holding every idle whole GPU of `nodes` (one part per node)."""
    replicas: list[ReservedReplica] = []
    shapes: dict[str, PodShape] = {}
    for n in nodes:
        free = n.free_whole_gpus
        if free > 0:
            part = f"hold/{n.name}"
            replicas.append(ReservedReplica(part, 0, n.name))
            shapes[part] = PodShape(gpus=free)
    return tuple(replicas), shapes
