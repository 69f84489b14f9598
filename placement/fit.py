"""Per-node fit: how many replicas of a shape a node holds now, and the binding reason when none do.

Read-only: `allocation` takes and gives back what this counts, through the same DRA plan, so the count
and the allocation always agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from placement import mig
from placement.dra import DraEvaluator, check_selector, device_slices
from placement.model import WHOLE_GPU_MILLI, DraDevice, LabelRequirement, Node, PodShape
from placement.podspec import NODE_NAME_FIELD
from placement.reasons import Reason

__all__ = ["Fit", "capacity", "node_admits", "dra_plan", "mig_detailed", "UNBOUNDED"]

UNBOUNDED = 1 << 30
"""Capacity of a shape that asks for nothing a node could run out of (never happens: pods count)."""

_DEFAULT_DRA = DraEvaluator()


@dataclass(frozen=True, slots=True)
class Fit:
    """Replicas of a shape that fit on a node; when 0, the reason and a human detail."""

    count: int
    reason: Reason | None = None
    detail: str = ""


_FITS = tuple(Fit(i) for i in range(257))  # shared instances: building a frozen dataclass costs ~1 us


def _fit(count: int) -> Fit:
    return _FITS[count] if count < len(_FITS) else Fit(count)


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f}Gi"


def _refuse(reason: Reason, **fields: object) -> Fit:
    return Fit(0, reason, reason.message(**fields))


def node_admits(node: Node, shape: PodShape) -> Fit | None:
    """The non-resource checks (ready, cordon, taints, selector, affinity); None when they pass."""
    if not node.ready:
        return _refuse(Reason.NOT_READY, node=node.name)
    if node.cordoned:
        return _refuse(Reason.CORDONED, node=node.name)
    tolerations = shape.tolerations
    for taint in node.taints:
        if taint.effect == "PreferNoSchedule":
            continue
        for tol in tolerations:
            if tol.tolerates(taint):
                break
        else:
            shown = f"{taint.key}={taint.value}:{taint.effect}" if taint.value else f"{taint.key}:{taint.effect}"
            return _refuse(Reason.TAINT_NOT_TOLERATED, node=node.name, taint=shown)
    labels = node.labels
    for key, value in shape.node_selector:
        if labels.get(key) != value:
            return _refuse(Reason.NODE_SELECTOR_MISMATCH, node=node.name, detail=f"{key}={value}")
    if shape.affinity and not any(all(_requirement_ok(r, node) for r in term) for term in shape.affinity):
        return _refuse(Reason.NODE_SELECTOR_MISMATCH, node=node.name, detail="required node affinity")
    if shape.gpu_models:
        model = node.gpu_model
        if model is None:
            return _refuse(Reason.NO_GPU, node=node.name)
        if model not in shape.gpu_models:
            return _refuse(
                Reason.GPU_MODEL_MISMATCH, node=node.name, have=model, want="|".join(sorted(shape.gpu_models))
            )
    return None


def _requirement_ok(req: LabelRequirement, node: Node) -> bool:
    if req.key == NODE_NAME_FIELD:  # matchFields on metadata.name
        return req.matches({NODE_NAME_FIELD: node.name})
    return req.matches(node.labels)


def _share_replicas(slots: Sequence[int], per_replica: int) -> int:
    """Most replicas when each needs `per_replica` distinct devices and device i offers slots[i]."""
    if per_replica == 1:
        return sum(slots)
    lo, hi = 0, sum(slots) // per_replica
    while lo < hi:  # largest R with sum(min(s, R)) >= per_replica * R
        mid = (lo + hi + 1) // 2
        if sum(min(s, mid) for s in slots) >= per_replica * mid:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _gpu_capacity(node: Node, shape: PodShape) -> Fit:
    """Replicas by GPUs alone: one pass, no lists for whole GPUs (this runs per node per request)."""
    if not node.gpus:
        return _refuse(Reason.NO_GPU, node=node.name)
    models, min_mem, milli, want = shape.gpu_models, shape.min_gpu_memory_mib, shape.gpu_milli, shape.gpus
    whole = milli >= WHOLE_GPU_MILLI
    usable = eligible = free = best_mem = best_share = 0
    slots: list[int] = []
    for g in node.gpus:
        if g.mig or not g.healthy or (models and g.model not in models):
            continue
        usable += 1
        if g.memory_mib < min_mem:
            best_mem = max(best_mem, g.memory_mib)
            continue
        eligible += 1
        if whole:
            if g.milli_used == 0:
                free += 1
        else:
            left = WHOLE_GPU_MILLI - g.milli_used
            best_share = max(best_share, left)
            slots.append(left // milli)
    if not usable:
        return _refuse(Reason.GPU_MODEL_MISMATCH, node=node.name, have=node.gpu_model, want="non-MIG GPU")
    if not eligible:
        return _refuse(Reason.GPU_MEMORY_TOO_SMALL, node=node.name, have=best_mem, want=min_mem)
    if eligible < want:
        return _refuse(Reason.GPU_COUNT_TOO_LARGE, node=node.name, have=eligible, want=want)
    if whole:
        if free < want:
            return _refuse(Reason.INSUFFICIENT_GPUS, node=node.name, have=free, want=want)
        return _fit(free // want)
    n = _share_replicas(slots, want)
    if n == 0:
        return _refuse(Reason.INSUFFICIENT_GPU_SHARE, node=node.name, have=best_share, want=milli)
    return _fit(n)


def mig_detailed(node: Node) -> bool:
    """Whether the node lists its MIG instances per GPU (else it only counts them, mixed strategy)."""
    return any(g.mig for g in node.gpus)


def _mig_capacity(node: Node, shape: PodShape, profile: str) -> Fit:
    if mig_detailed(node):
        offered = any(i.profile == profile for g in node.gpus if g.healthy for i in g.mig)
        free = sum(mig.free_instances(g, profile) for g in node.gpus)
    else:
        resource = mig.resource_name(profile)
        offered = resource in node.extended_free
        free = node.extended_free.get(resource, 0)
    if not offered:
        return _refuse(Reason.NO_MIG_PROFILE, node=node.name, want=profile)
    n = free // shape.mig_count
    if n == 0:
        return _refuse(Reason.INSUFFICIENT_MIG, node=node.name, have=free, want=shape.mig_count, profile=profile)
    return _fit(n)


# --------------------------------------------------------------------------- DRA planning


def dra_plan(
    node: Node, shape: PodShape, evaluator: DraEvaluator | None, limit: int
) -> tuple[list[list[DraDevice]], Fit | None]:
    """Greedy device choice for up to `limit` replicas (one list of devices per replica).

    Used by both capacity and allocate, so the count and the allocation always agree. Returns the
    refusal when not even one replica fits. `evaluator` None: the NVIDIA driver's device classes.
    """
    evaluator = evaluator or _DEFAULT_DRA
    devices = node.dra_devices
    if not devices:  # common case: a node without ResourceSlices, answered without evaluating CEL
        for req in shape.dra:
            exprs = evaluator.selectors(req.device_class, req.selectors)
            if exprs is None:
                return [], _refuse(Reason.DRA_CLASS_UNKNOWN, node=node.name, want=req.device_class)
            for expr in exprs:  # same answer on every node: a bad selector raises (cached compile)
                check_selector(expr)
        return [], _refuse(Reason.NO_DRA_DEVICES, node=node.name, want=shape.dra[0].device_class)
    # Devices already taken, and memory slices they cover (dynamic MIG partitions overlap).
    taken: set[tuple[str, str, str]] = set()
    busy: dict[str, int] = {}
    slices: dict[tuple[str, str, str], tuple[str, int] | None] = {}
    for d in devices:
        sl = device_slices(d)
        slices[d.key] = sl
        if d.allocated:
            taken.add(d.key)
            if sl is not None:
                busy[sl[0]] = busy.get(sl[0], 0) | sl[1]
    matches = []
    for req in shape.dra:
        m = evaluator.match(devices, req.device_class, req.selectors)
        if m.unknown_class:
            return [], _refuse(Reason.DRA_CLASS_UNKNOWN, node=node.name, want=req.device_class)
        matches.append(m)

    def free(d: DraDevice) -> bool:
        if d.key in taken:
            return False
        sl = slices[d.key]
        return sl is None or not busy.get(sl[0], 0) & sl[1]

    def mark(d: DraDevice) -> None:
        taken.add(d.key)
        sl = slices[d.key]
        if sl is not None:
            busy[sl[0]] = busy.get(sl[0], 0) | sl[1]

    plan: list[list[DraDevice]] = []
    while len(plan) < limit:
        chosen: list[DraDevice] = []
        for req, m in zip(shape.dra, matches):
            picks: list[DraDevice] = []
            for d in m.devices:  # one at a time: two picks of one request may overlap (dynamic MIG)
                if len(picks) == req.count:
                    break
                if free(d):
                    picks.append(d)
                    mark(d)
            if len(picks) < req.count:
                if plan:
                    return plan, None
                have = len(picks) + sum(1 for d in m.devices if free(d))
                if not m.devices:
                    if m.errors:
                        return plan, _refuse(Reason.DRA_SELECTOR_ERROR, node=node.name, detail=m.first_error)
                    return plan, _refuse(Reason.NO_DRA_DEVICES, node=node.name, want=req.device_class)
                return plan, _refuse(
                    Reason.INSUFFICIENT_DRA_DEVICES, node=node.name, have=have, want=req.device_class, need=req.count
                )
            chosen.extend(picks)
        plan.append(chosen)
    return plan, None


# --------------------------------------------------------------------------- capacity


def capacity(node: Node, shape: PodShape, *, dra: DraEvaluator | None = None) -> Fit:
    """How many replicas of `shape` fit on `node` now, with the binding reason when none do."""
    refused = node_admits(node, shape)
    if refused is not None:
        return refused
    n = UNBOUNDED
    if shape.gpus > 0:
        f = _gpu_capacity(node, shape)
        if f.count == 0:
            return f
        n = f.count
    if shape.mig_profile is not None and shape.mig_count > 0:
        f = _mig_capacity(node, shape, shape.mig_profile)
        if f.count == 0:
            return f
        n = min(n, f.count)
    for name, want in shape.extended:
        have = node.extended_free.get(name, 0)
        if want > 0:
            if have < want:
                return _refuse(Reason.INSUFFICIENT_EXTENDED, node=node.name, have=have, want=want, resource=name)
            n = min(n, have // want)
    if shape.cpu_milli > 0:
        if node.cpu_milli_free < shape.cpu_milli:
            return _refuse(Reason.INSUFFICIENT_CPU, node=node.name, have=node.cpu_milli_free, want=shape.cpu_milli)
        n = min(n, node.cpu_milli_free // shape.cpu_milli)
    if shape.memory > 0:
        if node.memory_free < shape.memory:
            return _refuse(
                Reason.INSUFFICIENT_MEMORY, node=node.name, have=_gib(node.memory_free), want=_gib(shape.memory)
            )
        n = min(n, node.memory_free // shape.memory)
    if node.pods_free <= 0:
        return _refuse(Reason.TOO_MANY_PODS, node=node.name)
    n = min(n, node.pods_free)
    if shape.dra:
        # Last: the most expensive check, bounded by what everything else allows.
        plan, refusal = dra_plan(node, shape, dra, n)
        if refusal is not None:
            return refusal
        n = len(plan)
    return _fit(n)
