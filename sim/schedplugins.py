"""The scheduler stand-in's in-tree filters and scores, written from kube-scheduler's plugins.

Pure functions over Node / Pod JSON, deliberately independent of ``placement/``'s fit and scoring so
that the fake control plane can disagree with Tandem (only Kubernetes' quantity grammar is shared).
Filters run in kube-scheduler's default order and a node's reasons are those of the first plugin that
rejects it. Reason strings are kube-scheduler's own, because tests and operators read them in
``PodScheduled`` messages.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from placement.quantity import cpu_milli, to_int_bytes
from sim.kubeapi.podspec_checks import is_extended_resource

__all__ = [
    "NodeInfo",
    "FILTERS",
    "pod_requests",
    "run_filters",
    "prefilter_node_names",
    "tolerates",
    "match_node_selector_term",
    "score_resource_fit",
    "score_taint_toleration",
    "score_node_affinity",
    "REASON_UNSCHEDULABLE",
    "REASON_NODE_NAME",
    "REASON_AFFINITY",
    "REASON_AFFINITY_CONFLICT",
    "REASON_TOO_MANY_PODS",
]

JSON = dict[str, Any]

REASON_UNSCHEDULABLE = "node(s) were unschedulable"
REASON_NODE_NAME = "node(s) didn't match the requested node name"
REASON_AFFINITY = "node(s) didn't match Pod's node affinity/selector"
REASON_AFFINITY_CONFLICT = "pod affinity terms conflict"
REASON_TOO_MANY_PODS = "Too many pods"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
CPU, MEMORY, PODS, EPHEMERAL = "cpu", "memory", "pods", "ephemeral-storage"
MAX_NODE_SCORE = 100


def _amount(name: str, value: str | int | float) -> int:
    """One resource amount in kube-scheduler's units: millicores for CPU, whole units otherwise."""
    if isinstance(value, float):
        value = str(value)  # a JSON number a client wrote; the quantity grammar reads its decimal text
    return cpu_milli(value) if name == CPU else to_int_bytes(value)


def _container_requests(container: Mapping[str, Any]) -> dict[str, int]:
    """A container's requests; limits stand in for missing requests, as API defaulting does."""
    res = container.get("resources") or {}
    merged = dict(res.get("limits") or {})
    merged.update(res.get("requests") or {})
    return {k: _amount(k, v) for k, v in merged.items()}


def _add(into: dict[str, int], other: Mapping[str, int]) -> None:
    for k, v in other.items():
        into[k] = into.get(k, 0) + v


def _maximize(into: dict[str, int], other: Mapping[str, int]) -> None:
    for k, v in other.items():
        into[k] = max(into.get(k, 0), v)


def pod_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """Requests as kube-scheduler computes them: max(sum(containers) + sidecars, max(init)) + overhead.

    A sidecar (init container with ``restartPolicy: Always``) is added to the total and keeps
    running beside every later init container.
    """
    spec = pod.get("spec") or {}
    total: dict[str, int] = {}
    for c in spec.get("containers") or []:
        _add(total, _container_requests(c))
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for c in spec.get("initContainers") or []:
        reqs = _container_requests(c)
        if c.get("restartPolicy") == "Always":
            _add(total, reqs)
            _add(sidecars, reqs)
            _maximize(init_peak, sidecars)
        else:
            running = dict(reqs)
            _add(running, sidecars)
            _maximize(init_peak, running)
    _maximize(total, init_peak)
    _add(total, {k: _amount(k, v) for k, v in (spec.get("overhead") or {}).items()})
    return total


@dataclasses.dataclass
class NodeInfo:
    """One node as a scheduling cycle sees it: the Node object plus what its pods already request."""

    node: JSON
    requested: dict[str, int] = dataclasses.field(default_factory=dict)
    pods: int = 0

    @property
    def name(self) -> str:
        return str(self.node["metadata"]["name"])

    @property
    def allocatable(self) -> dict[str, int]:
        alloc = (self.node.get("status") or {}).get("allocatable") or {}
        return {k: _amount(k, v) for k, v in alloc.items()}

    def add(self, requests: Mapping[str, int]) -> None:
        """Count one more pod on the node (bound or assumed)."""
        _add(self.requested, requests)
        self.pods += 1


# ---- TaintToleration -------------------------------------------------------------------------


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """``Toleration.ToleratesTaint``: empty effect and empty key match any; operator Equal or Exists."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if key and key != taint.get("key"):
        return False
    op = toleration.get("operator") or "Equal"
    if op == "Exists":
        return True
    if op == "Equal":
        return (toleration.get("value") or "") == (taint.get("value") or "")
    return False


def _tolerations(pod: Mapping[str, Any]) -> list[JSON]:
    return list((pod.get("spec") or {}).get("tolerations") or [])


def _taints(node: Mapping[str, Any]) -> list[JSON]:
    return list((node.get("spec") or {}).get("taints") or [])


def filter_node_unschedulable(pod: JSON, info: NodeInfo) -> list[str]:
    if not (info.node.get("spec") or {}).get("unschedulable"):
        return []
    taint = {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}
    if any(tolerates(t, taint) for t in _tolerations(pod)):
        return []
    return [REASON_UNSCHEDULABLE]


def filter_node_name(pod: JSON, info: NodeInfo) -> list[str]:
    wanted = (pod.get("spec") or {}).get("nodeName")
    return [REASON_NODE_NAME] if wanted and wanted != info.name else []


def filter_taint_toleration(pod: JSON, info: NodeInfo) -> list[str]:
    tolerations = _tolerations(pod)
    for taint in _taints(info.node):
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(tolerates(t, taint) for t in tolerations):
            return [f"node(s) had untolerated taint {{{taint.get('key', '')}: {taint.get('value') or ''}}}"]
    return []


# ---- NodeAffinity ----------------------------------------------------------------------------


def _match_requirement(req: Mapping[str, Any], value: str | None) -> bool:
    op = req.get("operator")
    values = [str(v) for v in req.get("values") or []]
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt"):
        if value is None or len(values) != 1:
            return False
        try:
            have, bound = int(value), int(values[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def match_node_selector_term(term: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """A NodeSelectorTerm: expressions (labels) and fields (``metadata.name`` only) all hold; empty matches nothing."""
    exprs = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not exprs and not fields:
        return False
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    for req in exprs:
        key = str(req.get("key", ""))
        if not _match_requirement(req, labels.get(key)):
            return False
    for req in fields:
        if req.get("key") != "metadata.name":
            return False
        if not _match_requirement(req, meta.get("name")):
            return False
    return True


def _required_terms(pod: Mapping[str, Any]) -> list[JSON] | None:
    aff = ((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    req = aff.get("requiredDuringSchedulingIgnoredDuringExecution")
    if req is None:
        return None
    return list(req.get("nodeSelectorTerms") or [])


def prefilter_node_names(pod: JSON) -> set[str] | None:
    """NodeAffinity's PreFilter: the node names every required term pins by ``metadata.name In``.

    None means every node is a candidate (some term pins nothing); an empty set means the terms
    contradict each other.
    """
    terms = _required_terms(pod)
    if not terms:
        return None
    names: set[str] = set()
    for term in terms:
        term_names: set[str] | None = None
        for req in term.get("matchFields") or []:
            if req.get("key") == "metadata.name" and req.get("operator") == "In":
                values = {str(v) for v in req.get("values") or []}
                term_names = values if term_names is None else term_names & values
        if term_names is None:
            return None
        names |= term_names
    return names


def filter_node_affinity(pod: JSON, info: NodeInfo) -> list[str]:
    selector = (pod.get("spec") or {}).get("nodeSelector") or {}
    labels = (info.node.get("metadata") or {}).get("labels") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        return [REASON_AFFINITY]
    terms = _required_terms(pod)
    if terms is not None and not any(match_node_selector_term(t, info.node) for t in terms):
        return [REASON_AFFINITY]
    return []


# ---- NodeResourcesFit ------------------------------------------------------------------------


def filter_resources_fit(
    pod: JSON,
    info: NodeInfo,
    requests: Mapping[str, int] | None = None,
    ignored: frozenset[str] = frozenset(),
    ignored_groups: frozenset[str] = frozenset(),
) -> list[str]:
    """``fitsRequest``: the pod count first, then every requested resource that does not fit. Extended
    resources named in NodeResourcesFitArgs' ``ignoredResources`` (or whose prefix is in
    ``ignoredResourceGroups``) are not checked: an extender accounts for them."""
    reqs = pod_requests(pod) if requests is None else requests
    alloc = info.allocatable
    reasons: list[str] = []
    if info.pods + 1 > alloc.get(PODS, 0):
        reasons.append(REASON_TOO_MANY_PODS)
    for name in [CPU, MEMORY, EPHEMERAL] + sorted(k for k in reqs if k not in (CPU, MEMORY, EPHEMERAL, PODS)):
        want = reqs.get(name, 0)
        if is_extended_resource(name) and (name in ignored or name.partition("/")[0] in ignored_groups):
            continue
        if want > 0 and want > alloc.get(name, 0) - info.requested.get(name, 0):
            reasons.append(f"Insufficient {name}")
    return reasons


FilterFn = Callable[[JSON, NodeInfo], list[str]]

FILTERS: tuple[tuple[str, FilterFn], ...] = (
    ("NodeUnschedulable", filter_node_unschedulable),
    ("NodeName", filter_node_name),
    ("TaintToleration", filter_taint_toleration),
    ("NodeAffinity", filter_node_affinity),
    ("NodeResourcesFit", filter_resources_fit),
)
"""Filter plugins in kube-scheduler's default order (those the stand-in implements)."""


def run_filters(
    pod: JSON,
    nodes: Iterable[NodeInfo],
    ignored: frozenset[str] = frozenset(),
    ignored_groups: frozenset[str] = frozenset(),
) -> tuple[list[NodeInfo], dict[str, list[str]]]:
    """Feasible nodes, and each rejected node's reasons (from the first plugin that rejected it)."""
    feasible: list[NodeInfo] = []
    rejected: dict[str, list[str]] = {}
    requests = pod_requests(pod)
    for info in nodes:
        for name, fn in FILTERS:
            reasons = (
                filter_resources_fit(pod, info, requests, ignored, ignored_groups)
                if name == "NodeResourcesFit"
                else fn(pod, info)
            )
            if reasons:
                rejected[info.name] = reasons
                break
        else:
            feasible.append(info)
    return feasible, rejected


# ---- scores ----------------------------------------------------------------------------------


def score_resource_fit(
    pod_reqs: Mapping[str, int], info: NodeInfo, resources: Sequence[tuple[str, int]], strategy: str = "MostAllocated"
) -> int:
    """NodeResourcesFit score: weighted mean over ``resources`` of the per-resource score, in integers.

    MostAllocated scores (requested + pod) × 100 / allocatable, LeastAllocated the free share;
    an extended resource the pod does not request is left out, as upstream does.
    """
    if strategy not in ("MostAllocated", "LeastAllocated"):
        raise ValueError(f"unsupported NodeResourcesFit scoring strategy {strategy!r}")
    alloc = info.allocatable
    total = weights = 0
    for name, weight in resources:
        want = pod_reqs.get(name, 0)
        if want == 0 and name not in (CPU, MEMORY, EPHEMERAL):
            continue
        cap = alloc.get(name, 0)
        if cap == 0:
            continue
        used = info.requested.get(name, 0) + want
        if strategy == "MostAllocated":
            score = min(used, cap) * MAX_NODE_SCORE // cap
        else:
            score = 0 if used > cap else (cap - used) * MAX_NODE_SCORE // cap
        total += score * weight
        weights += weight
    return total // weights if weights else 0


def _normalize(raw: Mapping[str, int], reverse: bool) -> dict[str, int]:
    """``helper.DefaultNormalizeScore`` to 0..100 (reverse: fewer is better)."""
    top = max(raw.values(), default=0)
    if top == 0:
        return {k: MAX_NODE_SCORE if reverse else 0 for k in raw}
    out = {}
    for k, v in raw.items():
        s = MAX_NODE_SCORE * v // top
        out[k] = MAX_NODE_SCORE - s if reverse else s
    return out


def score_taint_toleration(pod: JSON, nodes: Sequence[NodeInfo]) -> dict[str, int]:
    """Fewer untolerated PreferNoSchedule taints score higher (counted, then normalised in reverse)."""
    tols = [t for t in _tolerations(pod) if (t.get("effect") or "") in ("", "PreferNoSchedule")]
    raw = {
        n.name: sum(
            1
            for taint in _taints(n.node)
            if taint.get("effect") == "PreferNoSchedule" and not any(tolerates(t, taint) for t in tols)
        )
        for n in nodes
    }
    return _normalize(raw, reverse=True)


def score_node_affinity(pod: JSON, nodes: Sequence[NodeInfo]) -> dict[str, int] | None:
    """Sum of the weights of matching preferred terms, normalised; None (skipped) without preferences."""
    aff = ((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    prefs = aff.get("preferredDuringSchedulingIgnoredDuringExecution") or []
    if not prefs:
        return None
    raw = {
        n.name: sum(
            int(p.get("weight", 0)) for p in prefs if match_node_selector_term(p.get("preference") or {}, n.node)
        )
        for n in nodes
    }
    return _normalize(raw, reverse=False)
