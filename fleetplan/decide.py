"""The placement decision for one job over a cycle's fleet view: prune with numpy, exact-fit candidate domains, rank."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import numpy as np

from fleetplan.arrays import ClusterArrays
from fleetplan.catalog import ReplicaPlacement, Usability
from fleetplan.view import ClusterState, FleetView
from placement.model import JobRequest, PodShape, TopologyLevels
from placement.ranking import ClusterOption, rank_clusters
from placement.reasons import Reason
from placement.topology import GangPlacement, fit_gang

__all__ = [
    "WaitReason",
    "Choice",
    "Decision",
    "decide",
    "decide_in",
    "choice_of",
    "core_request",
    "cluster_allowed",
    "level_index",
    "could_ever_fit",
    "demands_of",
    "Verdict",
    "ClusterVerdict",
    "cluster_verdicts",
    "within_policy",
    "NO_ALLOWED_MODEL",
    "ClusterPredicate",
    "allow_every_cluster",
]

ClusterPredicate = Callable[[ClusterState], bool]
"""Whether the tenancy policy lets the job's tenant use a cluster (its name, region and role)."""


def allow_every_cluster(_cluster: ClusterState) -> bool:
    """The policy predicate when no tenancy policy narrows the clusters."""
    return True


_PRUNE_ABOVE = 4
"""Usable clusters above which the fleet-wide summary prune runs before the per-cluster checks."""


class WaitReason(enum.StrEnum):
    """Why a QUEUED job is not placed: the one enum of wait reasons, for the fleet decision here and for the
    broker's queue (names match tandem.v1.WaitReason without the prefix)."""

    UNSPECIFIED = "UNSPECIFIED"
    # Decided here, over a fleet view:
    INSUFFICIENT_CAPACITY = "INSUFFICIENT_CAPACITY"
    TOPOLOGY_FRAGMENTED = "TOPOLOGY_FRAGMENTED"
    NO_FRESH_INVENTORY = "NO_FRESH_INVENTORY"
    CLUSTERS_CORDONED = "CLUSTERS_CORDONED"
    NOT_ALLOWED = "NOT_ALLOWED"
    # Decided by the queue (order, quotas, back-off, holds) before a job reaches the decision:
    QUEUED_BEHIND_OTHERS = "QUEUED_BEHIND_OTHERS"
    QUOTA_EXCEEDED = "QUOTA_EXCEEDED"
    FAIR_SHARE = "FAIR_SHARE"
    RETRY_BACKOFF = "RETRY_BACKOFF"
    DRAINING_DOMAIN = "DRAINING_DOMAIN"
    RATE_LIMITED = "RATE_LIMITED"
    HELD = "HELD"


NO_ALLOWED_MODEL = "(no GPU model the tenant may use)"
"""A model no node has: what a GPU pod set may get when its named models and the tenant's allowed ones do
not meet (an empty set would mean "any model")."""


def within_policy(req: JobRequest, allowed_models: Collection[str] | None) -> JobRequest:
    """The request as the tenancy policy lets it be placed: every pod set that takes GPUs may get only a
    model the tenant may use, whatever the request named or did not name (named models are narrowed to the
    allowed ones; none named means exactly the allowed ones; a template's `nvidia.com/gpu.product` node
    selector still applies on top). The fit then refuses every other node, so the model a job is given —
    and charged quota for — is always one its tenant may use. None: the tenant may use any model."""
    if allowed_models is None:
        return req
    allowed = frozenset(allowed_models)
    pod_sets = []
    for ps in req.pod_sets:
        shape = ps.shape
        if shape.wants_gpu:
            models = (shape.gpu_models & allowed if shape.gpu_models else allowed) or frozenset({NO_ALLOWED_MODEL})
            if models != shape.gpu_models:
                ps = dataclasses.replace(ps, shape=dataclasses.replace(shape, gpu_models=models))
        pod_sets.append(ps)
    return dataclasses.replace(req, pod_sets=tuple(pod_sets))


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
    wait: WaitReason | None = None
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


def maps_tenant(entry: ClusterState, tenant: str) -> bool:
    """The cluster's own configuration gives the tenant a namespace (its agent would refuse it otherwise)."""
    return entry.meta.tenants is None or not tenant or tenant in entry.meta.tenants


def cluster_allowed(entry: ClusterState, req: JobRequest, policy_allows: ClusterPredicate) -> bool:
    if req.allowed_clusters and entry.name not in req.allowed_clusters:
        return False
    if not maps_tenant(entry, req.tenant):
        return False
    if req.allowed_regions and entry.meta.region not in req.allowed_regions:
        return False
    if req.allowed_roles and entry.meta.role not in req.allowed_roles:
        return False
    return policy_allows(entry)


def level_index(entry: ClusterState, level: str | None) -> int | None | bool:
    """Index of a level (by name or label key); None when no level is asked; False when unknown here."""
    if not level:
        return None
    for i, lvl in enumerate(entry.meta.levels):
        if level in (lvl.name, lvl.key):
            return i
    return False


def _placements(req: JobRequest, placed: GangPlacement) -> tuple[ReplicaPlacement, ...]:
    """The core's per-node counts as one (pod set, index, node) per replica, indexes contiguous per node."""
    out: list[ReplicaPlacement] = []
    next_index: dict[str, int] = {}
    order = {ps.name: i for i, ps in enumerate(req.pod_sets)}
    for a in sorted(placed.assignments, key=lambda a: order.get(a.pod_set, 0)):
        i = next_index.get(a.pod_set, 0)
        out.extend(ReplicaPlacement(a.pod_set, i + k, a.node) for k in range(a.replicas))
        next_index[a.pod_set] = i + a.replicas
    return tuple(out)


def _rows_for(arrays: ClusterArrays, demands: Sequence[tuple[PodShape, int]], rows: np.ndarray) -> list[int]:
    """Within a big domain, the nodes worth exact-fitting: tightest numpy capacity first (best fit packs
    partly used nodes), just enough to cover the demand with some slack for what numpy cannot see."""
    score = np.zeros(len(rows), np.int64)
    need = 0
    for shape, count in demands:
        score += arrays.capacity(shape)[rows]
        need += count
    keep = np.flatnonzero(score > 0)  # excluded, unready and full nodes never reach the exact fit
    if len(keep) <= 64:
        return [int(r) for r in rows[keep]]
    keep = keep[np.argsort(score[keep], kind="stable")]
    cum = np.cumsum(score[keep])
    cut = int(np.searchsorted(cum, need + max(2, need // 8))) + 1
    return [int(r) for r in rows[keep[:cut]]]


def core_request(entry: ClusterState, req: JobRequest) -> JobRequest:
    """The job with its levels named by this cluster's label keys (the core's vocabulary)."""
    keys = {l.name: l.key for l in entry.meta.levels}
    keys.update({l.key: l.key for l in entry.meta.levels})
    return dataclasses.replace(
        req,
        required_level=keys.get(req.required_level) if req.required_level else None,
        preferred_level=keys.get(req.preferred_level) if req.preferred_level else None,
    )


def decide_in(view: FleetView, cluster: str, req: JobRequest, limit: int = 8) -> tuple[Choice | None, bool]:
    """Best choice in one cluster; the flag says whether the cluster had the GPUs but not in one domain.

    numpy narrows the cluster to candidate domains (capacity sums at the required level); the
    core's exact gang fit runs only on those, over the overlaid nodes."""
    entry = view.clusters[cluster]
    arrays = view.arrays(cluster)
    lvl = level_index(entry, req.required_level)
    if lvl is False or arrays is None:
        return None, False
    level = lvl if isinstance(lvl, int) and not isinstance(lvl, bool) else None
    demands = demands_of(req, _shrunk_counts(req))
    cands = arrays.candidate_domains(demands, level, limit)
    if not cands:
        if level is not None and arrays.candidate_domains(demands, None, 1):
            return None, True
        return None, False
    core_req = core_request(entry, req)
    levels = TopologyLevels(tuple(l.key for l in entry.meta.levels))
    for cand in cands:
        rows = _rows_for(arrays, demands, cand.rows)
        nodes = view.overlaid_nodes(cluster, rows)
        placed = fit_gang(nodes, core_req, levels)
        if not isinstance(placed, GangPlacement):
            continue
        return choice_of(
            entry, req, placed, lambda name: arrays.nodes[arrays.row[name]].gpu_model, tuple(s or "" for s in cand.path)
        ), False
    return None, True


def choice_of(
    entry: ClusterState,
    req: JobRequest,
    placed: GangPlacement,
    model_of: Callable[[str], str | None],
    domain: tuple[str, ...],
) -> Choice:
    """The core's gang placement in `entry` as the broker's choice: replicas, the model charged, GPUs."""
    replicas = _placements(req, placed)
    shapes = {ps.name: ps.shape for ps in req.pod_sets}
    models = {model_of(p.node) or "" for p in replicas if shapes[p.pod_set].wants_gpu}
    gpu_model = sorted(models - {""})[0] if models - {""} else ""
    gpus = sum(shapes[p.pod_set].gpu_cost for p in replicas)
    return Choice(entry.name, domain, replicas, gpu_model, gpus, placed.leftover_gpus, entry.sequence)


def decide(
    view: FleetView,
    req: JobRequest,
    *,
    policy_allows: ClusterPredicate = allow_every_cluster,
    excluded_clusters: Collection[str] = (),
    limit: int = 8,
    max_feasible: int = 2,
) -> Decision:
    """Where the job goes now (feasible clusters ranked by the core: fit, locality, queue, freshness), or why it waits."""
    now = view.now
    allowed = [
        e for e in view.clusters.values() if cluster_allowed(e, req, policy_allows) and e.name not in excluded_clusters
    ]
    usable = [e for e in allowed if e.usable]
    if not usable:
        if allowed and all(e.cordoned for e in allowed):
            return Decision(None, WaitReason.CLUSTERS_CORDONED, "every allowed cluster is cordoned")
        return Decision(None, WaitReason.NO_FRESH_INVENTORY, "no allowed cluster is connected with a fresh report")
    fragmented = False
    demands = demands_of(req, _shrunk_counts(req))
    # The fleet summary prunes many clusters at once; for a few, the per-cluster checks below are cheaper.
    pruned = set(view.prune(demands)) if len(usable) > _PRUNE_ABOVE else {e.name for e in usable}
    ordered: list[tuple[tuple[int, int, str], ClusterState]] = []
    for entry in usable:
        arrays = view.arrays(entry.name)
        if entry.name not in pruned or arrays is None:
            continue
        lvl = level_index(entry, req.required_level)
        if lvl is False:
            continue
        level = lvl if isinstance(lvl, int) and not isinstance(lvl, bool) else None
        if not arrays.could_hold(demands, level):
            fragmented |= level is not None and arrays.could_hold(demands, None)
            continue
        loc = next((i for i, h in enumerate(req.locality) if h in (entry.name, entry.meta.region)), len(req.locality))
        ordered.append(((loc, view.total_free(entry.name) if len(usable) > 1 else 0, entry.name), entry))
    # Exact fit in summary order (locality, then the fullest cluster first: packing keeps big ones free),
    # stopping after a few feasible clusters; the core ranks those.
    ordered.sort(key=lambda kv: kv[0])
    options: list[ClusterOption] = []
    found: dict[str, Choice] = {}
    for _, entry in ordered:
        choice, frag = decide_in(view, entry.name, req, limit)
        fragmented |= frag
        if choice is None:
            continue
        found[entry.name] = choice
        options.append(
            ClusterOption(
                entry.name,
                entry.meta.region,
                entry.meta.role,
                feasible=True,
                fragmentation_cost=float(choice.leftover_gpus),
                queue_length=view.reservation_count(entry.name),
                report_age_s=max(0.0, now - entry.last_report),
            )
        )
        # Big gangs cost a lot to exact-fit (one allocation per node): take the first feasible cluster.
        if len(options) >= (max_feasible if req.total_replicas <= 16 else 1):
            break
    if options:
        ranked = rank_clusters(req, options)
        return Decision(found[ranked[0].cluster])
    if fragmented:
        return Decision(
            None,
            WaitReason.TOPOLOGY_FRAGMENTED,
            f"free GPUs exist but no {req.required_level or 'node set'} domain holds the whole gang",
        )
    return Decision(None, WaitReason.INSUFFICIENT_CAPACITY, "no allowed, fresh cluster has room for the gang now")


class Verdict(enum.Enum):
    """One cluster's verdict on a queued job (names match tandem.v1.ClusterVerdictReason without the prefix)."""

    FITS = "FITS"
    INSUFFICIENT_CAPACITY = "INSUFFICIENT_CAPACITY"
    TOPOLOGY_FRAGMENTED = "TOPOLOGY_FRAGMENTED"
    UNKNOWN_TOPOLOGY_LEVEL = "UNKNOWN_TOPOLOGY_LEVEL"
    NO_FRESH_INVENTORY = "NO_FRESH_INVENTORY"
    CORDONED = "CORDONED"
    READ_ONLY = "READ_ONLY"
    NO_FEASIBLE_NODE = "NO_FEASIBLE_NODE"
    TENANT_NOT_MAPPED = "TENANT_NOT_MAPPED"


@dataclass(frozen=True, slots=True)
class ClusterVerdict:
    cluster: str
    verdict: Verdict
    message: str
    fit_reason: Reason | None = None


_NOT_USABLE = {
    Usability.CORDONED: (Verdict.CORDONED, "cordoned by an admin"),
    Usability.READ_ONLY: (Verdict.READ_ONLY, "its agent is read-only: nothing is placed there"),
    Usability.NO_SNAPSHOT: (Verdict.NO_FRESH_INVENTORY, "no inventory snapshot yet"),
    Usability.DISCONNECTED: (Verdict.NO_FRESH_INVENTORY, "its agent is disconnected"),
    Usability.STALE: (Verdict.NO_FRESH_INVENTORY, "its last report is stale"),
}


def cluster_verdicts(
    view: FleetView,
    req: JobRequest,
    *,
    policy_allows: ClusterPredicate = allow_every_cluster,
    only: str | None = None,
) -> tuple[ClusterVerdict, ...]:
    """Why a queued job goes to none of its allowed clusters now: per cluster, the core's own gang fit over
    that cluster's reported inventory minus reservations (what an extender would say, for a gang that has no
    pods yet). Costs one exact fit per cluster: for "why does it wait" views, not for the placement loop.
    `only`: that cluster's verdict alone (none when the job may not use it)."""
    out: list[ClusterVerdict] = []
    for entry in sorted(view.clusters.values(), key=lambda e: e.name):
        if only is not None and entry.name != only:
            continue
        if not cluster_allowed(entry, dataclasses.replace(req, tenant=""), policy_allows):
            continue  # not the job's to know about
        if not maps_tenant(entry, req.tenant):
            out.append(
                ClusterVerdict(
                    entry.name, Verdict.TENANT_NOT_MAPPED, f"the cluster maps no namespace to tenant {req.tenant}"
                )
            )
            continue
        usability = entry.usability
        arrays = view.arrays(entry.name)
        if usability is not Usability.USABLE or arrays is None:
            verdict, message = _NOT_USABLE.get(usability, (Verdict.NO_FRESH_INVENTORY, "no inventory"))
            out.append(ClusterVerdict(entry.name, verdict, message))
            continue
        if level_index(entry, req.required_level) is False:
            out.append(
                ClusterVerdict(
                    entry.name,
                    Verdict.UNKNOWN_TOPOLOGY_LEVEL,
                    f"no topology level {req.required_level}",
                    Reason.UNKNOWN_TOPOLOGY_LEVEL,
                )
            )
            continue
        rows = view.usable_rows(entry.name)
        core_req = core_request(entry, req)
        levels = TopologyLevels(tuple(l.key for l in entry.meta.levels))
        placed = fit_gang(view.overlaid_nodes(entry.name, rows), core_req, levels)
        if isinstance(placed, GangPlacement):
            out.append(ClusterVerdict(entry.name, Verdict.FITS, "a domain has room for the gang now"))
            continue
        demands = demands_of(req, _shrunk_counts(req))
        verdict = Verdict.INSUFFICIENT_CAPACITY
        if placed.reason is Reason.NO_FEASIBLE_NODE and not view.empty_arrays(entry.name).candidate_domains(
            demands, None, 1
        ):
            verdict = Verdict.NO_FEASIBLE_NODE  # not even an empty node of this cluster could hold a replica
        elif (
            req.required_level
            and placed.reason is Reason.DOMAIN_TOO_SMALL
            and arrays.candidate_domains(demands, None, 1)
        ):
            verdict = Verdict.TOPOLOGY_FRAGMENTED  # the cluster as a whole has the room, no single domain does
        out.append(ClusterVerdict(entry.name, verdict, placed.detail, placed.reason))
    return tuple(out)


def could_ever_fit(view: FleetView, req: JobRequest, policy_allows: ClusterPredicate) -> tuple[bool | None, str]:
    """Could the job fit in some allowed cluster if it were empty? None = no cluster known yet (cannot tell)."""
    known = [
        e
        for e in view.clusters.values()
        if e.has_nodes and not e.meta.read_only and cluster_allowed(e, req, policy_allows)
    ]
    if not [e for e in view.clusters.values() if e.has_nodes]:
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
        empty = view.empty_arrays(entry.name)
        level = lvl if isinstance(lvl, int) and not isinstance(lvl, bool) else None
        key = (level, *demands)
        fits = empty.fits_cache.get(key)
        if fits is None:
            fits = bool(empty.candidate_domains(demands, level, 1))
            empty.fits_cache[key] = fits
        if fits:
            return True, ""
        reasons.append(f"{entry.name}: no {req.required_level or 'cluster'} domain could hold it even empty")
    return False, "; ".join(reasons)
