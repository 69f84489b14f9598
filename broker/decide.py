"""The placement decision for one job over the catalog: prune with numpy, exact-fit candidate domains, rank."""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from placement.errors import CapacityError
from placement.fit import allocate, capacity
from placement.model import JobRequest, Node, PodShape

from broker.catalog import Catalog, ClusterEntry, Usability
from broker.records import ReplicaPlacement

__all__ = ["Wait", "Choice", "Decision", "decide", "could_ever_fit", "demands_of", "overlaid_nodes"]


class Wait(enum.Enum):
    """Why a job is not placed now (names match tandem.v1.WaitReason without the prefix)."""

    INSUFFICIENT_CAPACITY = "INSUFFICIENT_CAPACITY"
    TOPOLOGY_FRAGMENTED = "TOPOLOGY_FRAGMENTED"
    NO_FRESH_INVENTORY = "NO_FRESH_INVENTORY"
    CLUSTERS_CORDONED = "CLUSTERS_CORDONED"
    QUOTA_EXCEEDED = "QUOTA_EXCEEDED"
    RETRY_BACKOFF = "RETRY_BACKOFF"
    QUEUED_BEHIND_OTHERS = "QUEUED_BEHIND_OTHERS"


@dataclass(frozen=True, slots=True)
class Choice:
    cluster: str
    domain: tuple[str, ...]
    assignments: tuple[ReplicaPlacement, ...]
    gpu_model: str
    gpus: float
    leftover_gpus: int
    inventory_sequence: int


@dataclass(frozen=True, slots=True)
class Decision:
    choice: Choice | None
    wait: Wait | None = None
    message: str = ""


def demands_of(req: JobRequest, counts: Sequence[int] | None = None) -> list[tuple[PodShape, int]]:
    return [(ps.shape, counts[i] if counts else ps.count) for i, ps in enumerate(req.pod_sets)]


def _shrunk_counts(req: JobRequest) -> list[int] | None:
    """Counts for an elastic gang at its minimum: shrink the last pod sets first, never below 1 each."""
    if req.min_available is None or req.min_replicas >= req.total_replicas:
        return None
    counts = [ps.count for ps in req.pod_sets]
    excess = req.total_replicas - req.min_replicas
    for i in range(len(counts) - 1, -1, -1):
        take = min(excess, counts[i] - 1)
        counts[i] -= take
        excess -= take
    return counts


def cluster_allowed(entry: ClusterEntry, req: JobRequest, policy_allows: Callable[[str], bool]) -> bool:
    if req.allowed_clusters and entry.name not in req.allowed_clusters:
        return False
    if req.allowed_regions and entry.meta.region not in req.allowed_regions:
        return False
    if req.allowed_roles and entry.meta.role not in req.allowed_roles:
        return False
    return policy_allows(entry.name)


def level_index(entry: ClusterEntry, level: str | None) -> int | None | bool:
    """Index of a level (by name or label key); None when no level is asked; False when unknown here."""
    if not level:
        return None
    for i, lvl in enumerate(entry.meta.levels):
        if level in (lvl.name, lvl.key):
            return i
    return False


def overlaid_nodes(catalog: Catalog, entry: ClusterEntry, rows: Sequence[int]) -> list[Node]:
    """Nodes of `rows` minus reserved-but-unbound replicas (the reservations overlay, via the core's allocate)."""
    arrays = entry.arrays
    assert arrays is not None
    pending: dict[str, list[PodShape]] = {}
    names = {arrays.nodes[r].name for r in rows}
    for res, rep in catalog.pending_replicas(entry.name):
        if rep.node in names:
            pending.setdefault(rep.node, []).append(res.shapes[rep.pod_set])
    out = []
    for r in rows:
        node = arrays.nodes[r]
        for shape in pending.get(node.name, ()):
            try:
                node, _ = allocate(node, shape, 1)
            except CapacityError:
                break  # over-reserved by the report: the arrays already show it as full
        out.append(node)
    return out


def exact_assign(nodes: list[Node], demands: Sequence[tuple[str, PodShape, int]]) -> list[ReplicaPlacement] | None:
    """Assign every replica to a node with the core's fit: a chunk that fits whole goes to the tightest node,
    otherwise the roomiest node is filled first (keeps large nodes whole for large gangs)."""
    placed: list[ReplicaPlacement] = []
    for pod_set, shape, count in demands:
        remaining = count
        index = 0
        while remaining > 0:
            caps = [capacity(n, shape).count for n in nodes]
            best = -1
            fitting = [(c, i) for i, c in enumerate(caps) if c >= remaining]
            if fitting:
                best = min(fitting)[1]
            else:
                c, i = max((c, i) for i, c in enumerate(caps)) if caps else (0, -1)
                if c <= 0:
                    return None
                best = i
            take = min(caps[best], remaining)
            nodes[best], _ = allocate(nodes[best], shape, take)
            for _ in range(take):
                placed.append(ReplicaPlacement(pod_set, index, nodes[best].name))
                index += 1
            remaining -= take
    return placed


def _rows_for(entry: ClusterEntry, demands: Sequence[tuple[PodShape, int]], rows: np.ndarray) -> list[int]:
    """Within a domain, the nodes worth exact-fitting: biggest numpy capacity first, enough to cover twice the demand."""
    arrays = entry.arrays
    assert arrays is not None
    score = np.zeros(len(rows), np.int64)
    need = 0
    for shape, count in demands:
        score += arrays.capacity(shape)[rows]
        need += count
    order = np.argsort(-score, kind="stable")
    keep = order[score[order] > 0]
    cum = np.cumsum(score[keep])
    cut = int(np.searchsorted(cum, 2 * need)) + 1
    return [int(r) for r in rows[keep[:cut]]] if len(keep) > 64 else [int(r) for r in rows[keep]]


def _try_cluster(
    catalog: Catalog, entry: ClusterEntry, req: JobRequest, counts: Sequence[int] | None, limit: int
) -> tuple[Choice | None, bool]:
    """Best-fit choice in one cluster; the flag says whether the cluster had the GPUs but not in one domain."""
    lvl = level_index(entry, req.required_level)
    if lvl is False or entry.arrays is None:
        return None, False
    level = lvl if isinstance(lvl, int) and not isinstance(lvl, bool) else None
    demands = demands_of(req, counts)
    cands = entry.arrays.candidate_domains(demands, level, limit)
    if not cands:
        if level is not None and entry.arrays.candidate_domains(demands, None, 1):
            return None, True
        return None, False
    named = [(ps.name, shape, n) for ps, (shape, n) in zip(req.pod_sets, demands)]
    for cand in cands:
        rows = _rows_for(entry, demands, cand.rows)
        nodes = overlaid_nodes(catalog, entry, rows)
        placed = exact_assign(nodes, named)
        if placed is None:
            continue
        models = {entry.arrays.nodes[entry.arrays.row[p.node]].gpu_model or "" for p in placed}
        gpu_model = sorted(models - {""})[0] if models - {""} else ""
        gpus = sum(shape.gpu_cost * n for shape, n in demands)
        domain = tuple(s or "" for s in cand.path)
        return Choice(entry.name, domain, tuple(placed), gpu_model, gpus, cand.leftover_gpus, entry.sequence), False
    return None, True


def decide(
    catalog: Catalog,
    req: JobRequest,
    now: float,
    *,
    policy_allows: Callable[[str], bool] = lambda _c: True,
    excluded_clusters: Collection[str] = (),
    locality: Mapping[str, int] | None = None,
    limit: int = 8,
) -> Decision:
    """Where the job goes now (feasible choices ranked best-fit, then locality), or why it waits."""
    allowed = [e for e in catalog.clusters.values()
               if cluster_allowed(e, req, policy_allows) and e.name not in excluded_clusters]
    usable = [e for e in allowed if e.usability(now, catalog.stale_after_s) is Usability.USABLE]
    if not usable:
        if allowed and all(e.cordoned for e in allowed):
            return Decision(None, Wait.CLUSTERS_CORDONED, "every allowed cluster is cordoned")
        return Decision(None, Wait.NO_FRESH_INVENTORY, "no allowed cluster is connected with a fresh report")
    fragmented = False
    for counts in (None, _shrunk_counts(req)):
        if counts is None and req.min_available is not None and _shrunk_counts(req) is None:
            pass
        pruned = set(catalog.fleet.prune(demands_of(req, counts)))
        choices: list[Choice] = []
        for entry in usable:
            if entry.name not in pruned:
                continue
            choice, frag = _try_cluster(catalog, entry, req, counts, limit)
            fragmented |= frag
            if choice is not None:
                choices.append(choice)
        if choices:
            loc = locality or {}
            choices.sort(key=lambda c: (loc.get(c.cluster, len(loc)), c.leftover_gpus, c.cluster))
            return Decision(choices[0])
        if _shrunk_counts(req) is None:
            break
    if fragmented:
        return Decision(None, Wait.TOPOLOGY_FRAGMENTED,
                        f"free GPUs exist but no {req.required_level or 'node set'} domain holds the whole gang")
    return Decision(None, Wait.INSUFFICIENT_CAPACITY, "no allowed, fresh cluster has room for the gang now")


def could_ever_fit(
    catalog: Catalog, req: JobRequest, policy_allows: Callable[[str], bool]
) -> tuple[bool | None, str]:
    """Could the job fit in some allowed cluster if it were empty? None = no cluster known yet (cannot tell)."""
    known = [e for e in catalog.clusters.values() if e.nodes and cluster_allowed(e, req, policy_allows)]
    if not [e for e in catalog.clusters.values() if e.nodes]:
        return None, "no cluster inventory known yet"
    if not known:
        return False, "no allowed cluster (check cluster_selector and the tenant's clusters)"
    counts = _shrunk_counts(req)
    demands = demands_of(req, counts)
    reasons = []
    for entry in known:
        lvl = level_index(entry, req.required_level)
        if lvl is False:
            reasons.append(f"{entry.name}: no topology level {req.required_level}")
            continue
        empty = catalog.empty_arrays(entry)
        level = lvl if isinstance(lvl, int) and not isinstance(lvl, bool) else None
        if empty.candidate_domains(demands, level, 1):
            return True, ""
        reasons.append(f"{entry.name}: no {req.required_level or 'cluster'} domain could hold it even empty")
    return False, "; ".join(reasons)
