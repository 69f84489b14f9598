"""Gang fit over topology domains: pick one domain at the required level and a replica-to-node assignment."""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from placement.allocation import allocate
from placement.dra import DraEvaluator
from placement.fit import capacity
from placement.model import WHOLE_GPU_MILLI, JobRequest, Node, PodSet, TopologyLevels
from placement.reasons import Reason
from placement.usage import allocation_usage, merge_usage

__all__ = [
    "DomainId",
    "Assignment",
    "GangPlacement",
    "GangRefusal",
    "node_path",
    "domain_of",
    "group_by_level",
    "level_name",
    "fit_gang",
    "shrink_counts",
]

DomainId = tuple[str, ...]
"""A domain's whole path from the broadest level down to its own (rack r1 of block b1 != of b2)."""

_MISSING = "\x00"  # prefix of a synthetic value: a node without the label is its own domain


def level_name(key: str) -> str:
    """Short display name of a level key: "network.example.com/rack" -> "rack"."""
    return key.rsplit("/", 1)[-1].rsplit(".", 1)[-1]


def node_path(node: Node, levels: TopologyLevels) -> tuple[str | None, ...]:
    """The node's value per level (its reported topology, or read from its labels)."""
    if len(node.topology) == len(levels.keys):
        return node.topology
    return levels.path(node.labels)


def domain_of(node: Node, levels: TopologyLevels, depth: int) -> DomainId:
    """Domain of `node` at level index `depth`: its path prefix; a missing label makes it unique."""
    path = node_path(node, levels)
    out: list[str] = []
    for v in path[: depth + 1]:
        if v is None:
            out.append(f"{_MISSING}{node.name}")
            break
        out.append(v)
    while len(out) < depth + 1:
        out.append(f"{_MISSING}{node.name}")
    return tuple(out)


def _display(domain: DomainId) -> str:
    return "/".join(f"(node {v[1:]})" if v.startswith(_MISSING) else v for v in domain)


def group_by_level(nodes: Iterable[Node], levels: TopologyLevels, depth: int) -> dict[DomainId, list[Node]]:
    """Nodes grouped by their domain at level index `depth`, in first-seen order."""
    groups: dict[DomainId, list[Node]] = {}
    for n in nodes:
        groups.setdefault(domain_of(n, levels, depth), []).append(n)
    return groups


@dataclass(frozen=True, slots=True)
class Assignment:
    """`replicas` replicas of pod set `pod_set` go on node `node`."""

    pod_set: str
    node: str
    replicas: int


@dataclass(frozen=True, slots=True)
class GangPlacement:
    """A feasible placement of a whole (or elastically shrunk) gang.

    domain: the required-level domain (empty tuple when no level is required);
    domain_labels: (label key, value) for every level of the domain's path, for node affinity;
    counts: replicas placed per pod set (less than asked only with min_available);
    spans: preferred-level domains used; leftover_gpus: whole GPUs still free in the domain;
    usage: GPUs taken per GPU model (MIG as fractions), for quota and fair-share charging.
    """

    job_id: str
    level: str | None
    domain: DomainId
    domain_labels: tuple[tuple[str, str], ...]
    assignments: tuple[Assignment, ...]
    counts: Mapping[str, int]
    spans: int
    leftover_gpus: int
    usage: Mapping[str, float] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(a.replicas for a in self.assignments)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(a.node for a in self.assignments))


@dataclass(frozen=True, slots=True)
class GangRefusal:
    """Why a gang fits nowhere: the reason, a human detail, the best domain's room vs the need,
    and how many nodes refused for each reason (for "why does it wait")."""

    job_id: str
    reason: Reason
    detail: str
    best_domain: DomainId = ()
    have: int = 0
    want: int = 0
    node_reasons: Mapping[Reason, int] = field(default_factory=dict)


def shrink_counts(pod_sets: Sequence[PodSet], total: int) -> dict[str, int]:
    """Replica counts per pod set for an elastic total: remove from the last set first, keep >= 1."""
    counts = {ps.name: ps.count for ps in pod_sets}
    excess = sum(counts.values()) - total
    for ps in reversed(pod_sets):
        if excess <= 0:
            break
        cut = min(excess, counts[ps.name] - 1)
        counts[ps.name] -= cut
        excess -= cut
    return counts


def _order_sets(pod_sets: Sequence[PodSet]) -> list[PodSet]:
    # Biggest replicas first: they are the hardest to pack, small ones fill the gaps.
    return sorted(
        pod_sets, key=lambda ps: (-ps.shape.gpus * ps.shape.gpu_milli, -ps.shape.mig_count, -ps.shape.cpu_milli)
    )


def _pick_nodes(caps: list[tuple[Node, int]], need: int) -> list[tuple[Node, int]]:
    """Best fit: the node that alone covers the rest with least leftover, else fill the largest
    node whole and repeat (ties by name). Empty when the nodes cannot cover `need`."""
    pool = sorted(((c, n.name, n) for n, c in caps if c > 0), key=lambda t: (t[0], t[1]))
    keys = [c for c, _, _ in pool]
    chosen: list[tuple[Node, int]] = []
    while need > 0 and pool:
        i = bisect.bisect_left(keys, need)
        if i < len(pool):  # smallest covering capacity, first name among equals
            chosen.append((pool[i][2], need))
            return chosen
        j = bisect.bisect_left(keys, keys[-1])  # largest capacity, first name among equals
        c, _, n = pool.pop(j)
        del keys[j]
        chosen.append((n, c))
        need -= c
    return chosen if need <= 0 else []


def _assign(
    nodes: list[Node],
    pod_sets: Sequence[PodSet],
    counts: Mapping[str, int],
    levels: TopologyLevels,
    pref_depth: int | None,
    dra: DraEvaluator | None,
) -> tuple[list[Assignment], int, list[Node], dict[str, float]] | None:
    """Assignment of every replica inside one domain, or None; also the preferred-level spans."""
    state = {n.name: n for n in nodes}
    usage: list[dict[str, float]] = []
    out: list[Assignment] = []
    used_groups: set[DomainId] = set()
    for ps in _order_sets(pod_sets):
        need = counts[ps.name]
        if need == 0:
            continue
        caps = [(n, capacity(n, ps.shape, dra=dra).count) for n in state.values()]
        if pref_depth is None:
            picked = _pick_nodes(caps, need)
        else:
            groups: dict[DomainId, list[tuple[Node, int]]] = {}
            for n, c in caps:
                groups.setdefault(domain_of(n, levels, pref_depth), []).append((n, c))
            picked = []
            rest = need
            # Prefer groups already used by earlier pod sets, then best fit on group capacity.
            totals = {g: sum(c for _, c in members) for g, members in groups.items()}
            while rest > 0 and totals:
                covering = [g for g, t in totals.items() if t >= rest]
                if covering:
                    g = min(covering, key=lambda g: (g not in used_groups, totals[g], g))
                else:
                    g = max(totals, key=lambda g: (totals[g], g in used_groups))
                    if totals[g] == 0:
                        break
                take = _pick_nodes(groups[g], min(rest, totals[g]))
                picked.extend(take)
                rest -= sum(r for _, r in take)
                used_groups.add(g)
                del totals[g]
            if rest > 0:
                picked = []
        if sum(r for _, r in picked) < need:
            return None
        for n, r in picked:
            before = state[n.name]
            state[n.name], alloc = allocate(before, ps.shape, r, dra=dra)
            usage.append(allocation_usage(before, alloc))
            out.append(Assignment(ps.name, n.name, r))
    spans = len({domain_of(state[a.node], levels, pref_depth) for a in out}) if pref_depth is not None else 0
    return out, spans, list(state.values()), merge_usage(usage)


def fit_gang(
    nodes: Sequence[Node], job: JobRequest, levels: TopologyLevels, *, dra: DraEvaluator | None = None
) -> GangPlacement | GangRefusal:
    """Place every replica of `job` inside one domain of its required level (if any).

    Among feasible domains the best is the one with fewest preferred-level spans, then the
    least whole GPUs left free (best fit keeps big domains whole), then the domain path.
    With min_available the gang shrinks (last pod set first) to the largest total that fits.
    """
    if not job.pod_sets or any(ps.count < 1 for ps in job.pod_sets):
        return GangRefusal(
            job.job_id, Reason.INVALID_REQUEST, Reason.INVALID_REQUEST.message(detail="every pod set needs count >= 1")
        )
    depths: list[int | None] = []
    for lvl in (job.required_level, job.preferred_level):
        if lvl is None:
            depths.append(None)
        elif lvl not in levels.keys:
            r = Reason.UNKNOWN_TOPOLOGY_LEVEL
            return GangRefusal(job.job_id, r, r.message(level=lvl, detail=", ".join(levels.keys)))
        else:
            depths.append(levels.index(lvl))
    req_depth, pref_depth = depths
    if pref_depth is not None and req_depth is not None and pref_depth <= req_depth:
        pref_depth = None  # inside one required domain a broader preference is already met

    # Nodes that cannot hold one replica of any pod set are dropped up front (with their reason).
    node_reasons: Counter[Reason] = Counter()
    useful: list[Node] = []
    alone: dict[str, tuple[int, ...]] = {}  # replicas of each pod set the node holds on its own
    for n in nodes:
        fits = [capacity(n, ps.shape, dra=dra) for ps in job.pod_sets]
        if any(f.count > 0 for f in fits):
            useful.append(n)
            alone[n.name] = tuple(f.count for f in fits)
        else:
            node_reasons[fits[0].reason or Reason.NO_FEASIBLE_NODE] += 1
    groups: dict[DomainId, list[Node]] = (
        group_by_level(useful, levels, req_depth) if req_depth is not None else {(): useful}
    )

    room = {
        dom: [sum(alone[n.name][i] for n in members) for i in range(len(job.pod_sets))]
        for dom, members in groups.items()
    }

    free_gpus = {dom: sum(n.free_whole_gpus for n in members) for dom, members in groups.items()}
    # With whole-GPU shapes only and no preference, leftover = free GPUs - what the gang takes,
    # the same in every domain: the first domain (fewest free GPUs) that fits is the best one.
    exact_order = pref_depth is None and all(
        ps.shape.gpu_milli >= WHOLE_GPU_MILLI and ps.shape.mig_count == 0 and not ps.shape.dra for ps in job.pod_sets
    )
    order = sorted(groups, key=lambda d: (free_gpus[d], d))

    def attempt(counts: Mapping[str, int]) -> GangPlacement | None:
        best: tuple[tuple[int, int, DomainId], GangPlacement] | None = None
        for dom in order:
            members = groups[dom]
            if any(room[dom][i] < counts[ps.name] for i, ps in enumerate(job.pod_sets)):
                continue  # cannot hold even each pod set alone
            got = _assign(members, job.pod_sets, counts, levels, pref_depth, dra)
            if got is None:
                continue
            assignments, spans, after, usage = got
            leftover = sum(n.free_whole_gpus for n in after)
            key = (spans, leftover, dom)
            if best is None or key < best[0]:
                labels = tuple((levels.keys[i], v) for i, v in enumerate(dom) if not v.startswith(_MISSING))
                best = (
                    key,
                    GangPlacement(
                        job.job_id,
                        job.required_level,
                        dom,
                        labels,
                        tuple(assignments),
                        dict(counts),
                        spans,
                        leftover,
                        usage,
                    ),
                )
            if exact_order:
                break
        return None if best is None else best[1]

    full = {ps.name: ps.count for ps in job.pod_sets}
    placed = attempt(full)
    if placed is not None:
        return placed
    lo = job.min_replicas
    # No domain holds more than its room; with one pod set that bound is exact, so probe it first.
    most = max((sum(min(ps.count, r[i]) for i, ps in enumerate(job.pod_sets)) for r in room.values()), default=0)
    hi = min(job.total_replicas - 1, most)
    found: GangPlacement | None = None
    if lo <= hi:
        found = attempt(shrink_counts(job.pod_sets, hi))
        if found is not None:
            return found
        hi -= 1
    while lo <= hi:  # largest elastic total that fits
        mid = (lo + hi) // 2
        got = attempt(shrink_counts(job.pod_sets, mid))
        if got is not None:
            found, lo = got, mid + 1
        else:
            hi = mid - 1
    if found is not None:
        return found
    return _refusal(job, groups, req_depth, levels, node_reasons, dra)


def _refusal(
    job: JobRequest,
    groups: Mapping[DomainId, list[Node]],
    req_depth: int | None,
    levels: TopologyLevels,
    node_reasons: Counter[Reason],
    dra: DraEvaluator | None,
) -> GangRefusal:
    gang = job.job_id
    want = job.min_replicas
    if not groups or all(not m for m in groups.values()):
        common = ", ".join(f"{r.code}: {k} nodes" for r, k in node_reasons.most_common(3)) or "no nodes"
        r = Reason.NO_FEASIBLE_NODE
        return GangRefusal(gang, r, r.message(gang=gang, detail=common), (), 0, want, dict(node_reasons))
    # Room per domain: replicas of each pod set it could hold alone, bounded by the need.
    best_dom: DomainId = ()
    best_have = -1
    best_gpus = 0
    for dom, members in groups.items():
        have = 0
        for ps in job.pod_sets:
            have += min(ps.count, sum(capacity(n, ps.shape, dra=dra).count for n in members))
        if have > best_have:
            best_dom, best_have = dom, have
            best_gpus = sum(n.free_whole_gpus for n in members)
    level = level_name(levels.keys[req_depth]) if req_depth is not None else "cluster"
    r = Reason.DOMAIN_TOO_SMALL
    detail = r.message(
        level=level, domain=_display(best_dom) or "(all nodes)", have=best_have, gang=gang, want=want, gpus=best_gpus
    )
    return GangRefusal(gang, r, detail, best_dom, best_have, want, dict(node_reasons))
