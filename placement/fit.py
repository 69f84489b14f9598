"""Per-node fit: how many replicas of a shape a node holds, which devices they take, and the undo."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from placement import mig
from placement.dra import DraEvaluator, check_selector, device_slices
from placement.errors import CapacityError
from placement.model import WHOLE_GPU_MILLI, DraDevice, Gpu, LabelRequirement, MigInstance, Node, PodShape
from placement.reasons import Reason

NODE_NAME_FIELD = "metadata.name"  # same key podspec uses for matchFields

__all__ = ["Fit", "Allocation", "capacity", "allocate", "release", "vacate", "node_admits", "UNBOUNDED"]

UNBOUNDED = 1 << 30
"""Capacity of a shape that asks for nothing a node could run out of (never happens: pods count)."""

_DEFAULT_DRA = DraEvaluator()


@dataclass(frozen=True, slots=True)
class Fit:
    """Replicas of a shape that fit on a node; when 0, the reason and a human detail."""

    count: int
    reason: Reason | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Allocation:
    """What `allocate` took on one node, exactly enough for `release` to give it back.

    gpus: (gpu index, milli taken) per device per replica; mig: (gpu index, start) of detailed
    MIG instances; extended: extended-resource counts taken (mixed-strategy MIG and others);
    dra: (driver, pool, name) of DRA devices.
    """

    node: str
    shape: PodShape
    replicas: int
    gpus: tuple[tuple[int, int], ...] = ()
    mig: tuple[tuple[int, int], ...] = ()
    extended: tuple[tuple[str, int], ...] = ()
    dra: tuple[tuple[str, str, str], ...] = ()


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


def _mig_detailed(node: Node) -> bool:
    return any(g.mig for g in node.gpus)


def _mig_capacity(node: Node, shape: PodShape, profile: str) -> Fit:
    if _mig_detailed(node):
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


def _dra_plan(
    node: Node, shape: PodShape, evaluator: DraEvaluator, limit: int
) -> tuple[list[list[DraDevice]], Fit | None]:
    """Greedy device choice for up to `limit` replicas (one list of devices per replica).

    Used by both capacity and allocate, so the count and the allocation always agree.
    Returns the refusal when not even one replica fits.
    """
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
        plan, refusal = _dra_plan(node, shape, dra or _DEFAULT_DRA, n)
        if refusal is not None:
            return refusal
        n = len(plan)
    return _fit(n)


# --------------------------------------------------------------------------- allocate / release


def _take_gpus(gpus: list[Gpu], shape: PodShape) -> list[tuple[int, int]]:
    """One replica's devices, chosen as the device plugin would: lowest index for whole GPUs,
    best fit (least share left) for a single shared device, most room for several."""
    models, min_mem, milli = shape.gpu_models, shape.min_gpu_memory_mib, shape.gpu_milli
    if milli >= WHOLE_GPU_MILLI:  # lowest free index first, as the device plugin hands them out
        ok = [
            (pos, g)
            for pos, g in enumerate(gpus)
            if g.milli_used == 0
            and g.healthy
            and not g.mig
            and (not models or g.model in models)
            and g.memory_mib >= min_mem
        ]
        ok.sort(key=lambda pg: pg[1].index)
        picked = ok[: shape.gpus]
        for pos, g in picked:
            gpus[pos] = Gpu(g.index, g.model, g.memory_mib, WHOLE_GPU_MILLI, g.mig, g.healthy)
        return [(g.index, WHOLE_GPU_MILLI) for _, g in picked]
    ok = [
        (pos, g)
        for pos, g in enumerate(gpus)
        if g.healthy
        and not g.mig
        and (not models or g.model in models)
        and g.memory_mib >= min_mem
        and g.milli_free >= milli
    ]
    if shape.gpus == 1:
        ok.sort(key=lambda pg: (pg[1].milli_free, pg[1].index))
    else:
        ok.sort(key=lambda pg: (-(pg[1].milli_free // milli), pg[1].index))
    picked = ok[: shape.gpus]
    taken = min(milli, WHOLE_GPU_MILLI)
    for pos, g in picked:  # direct construction: dataclasses.replace is several times slower
        gpus[pos] = Gpu(g.index, g.model, g.memory_mib, g.milli_used + taken, g.mig, g.healthy)
    return [(g.index, taken) for _, g in picked]


def _take_mig(gpus: list[Gpu], profile: str, count: int) -> list[tuple[int, int]]:
    took: list[tuple[int, int]] = []
    for pos, g in sorted(enumerate(gpus), key=lambda pg: pg[1].index):
        if not g.healthy or not g.mig:
            continue
        insts = list(g.mig)
        changed = False
        for k, inst in sorted(enumerate(insts), key=lambda ki: ki[1].start):
            if len(took) == count:
                break
            if inst.profile == profile and not inst.used:
                insts[k] = dataclasses.replace(inst, used=True)
                took.append((g.index, inst.start))
                changed = True
        if changed:
            gpus[pos] = dataclasses.replace(g, mig=tuple(insts))
        if len(took) == count:
            break
    return took


def allocate(
    node: Node, shape: PodShape, replicas: int = 1, *, dra: DraEvaluator | None = None
) -> tuple[Node, Allocation]:
    """Take `replicas` replicas of `shape` on `node`; returns the new node and what was taken.

    Raises CapacityError when fewer than `replicas` fit.
    """
    fit = capacity(node, shape, dra=dra)
    if fit.count < replicas:
        why = fit
        if fit.count > 0:  # what runs out after the replicas that do fit
            why = capacity(allocate(node, shape, fit.count, dra=dra)[0], shape, dra=dra)
        raise CapacityError(node.name, replicas, fit.count, why.reason, why.detail)
    gpus = list(node.gpus)
    taken_gpus: list[tuple[int, int]] = []
    taken_mig: list[tuple[int, int]] = []
    extended = dict(node.extended_free)
    taken_ext: dict[str, int] = {}
    for _ in range(replicas):
        if shape.gpus > 0:
            taken_gpus.extend(_take_gpus(gpus, shape))
    if shape.mig_profile is not None and shape.mig_count > 0:
        if _mig_detailed(node):
            taken_mig = _take_mig(gpus, shape.mig_profile, shape.mig_count * replicas)
        else:
            res = mig.resource_name(shape.mig_profile)
            taken_ext[res] = taken_ext.get(res, 0) + shape.mig_count * replicas
    for name, want in shape.extended:
        if want > 0:
            taken_ext[name] = taken_ext.get(name, 0) + want * replicas
    for name, amount in taken_ext.items():
        extended[name] = extended.get(name, 0) - amount
    dra_keys: list[tuple[str, str, str]] = []
    devices = node.dra_devices
    if shape.dra:
        plan, _ = _dra_plan(node, shape, dra or _DEFAULT_DRA, replicas)
        keys = {d.key for replica in plan for d in replica}
        dra_keys = [d.key for replica in plan for d in replica]
        devices = tuple(dataclasses.replace(d, allocated=True) if d.key in keys else d for d in devices)
    new = dataclasses.replace(
        node,
        gpus=tuple(gpus),
        extended_free=extended if taken_ext else node.extended_free,
        dra_devices=devices,
        cpu_milli_free=node.cpu_milli_free - shape.cpu_milli * replicas,
        memory_free=node.memory_free - shape.memory * replicas,
        pods_free=node.pods_free - replicas,
    )
    alloc = Allocation(
        node=node.name,
        shape=shape,
        replicas=replicas,
        gpus=tuple(taken_gpus),
        mig=tuple(taken_mig),
        extended=tuple(sorted(taken_ext.items())),
        dra=tuple(dra_keys),
    )
    return new, alloc


def release(node: Node, allocation: Allocation) -> Node:
    """Give back exactly what `allocation` took on `node` (the inverse of allocate)."""
    shape, r = allocation.shape, allocation.replicas
    gpus = node.gpus
    if allocation.gpus or allocation.mig:
        give: dict[int, int] = {}
        for idx, milli in allocation.gpus:
            give[idx] = give.get(idx, 0) + milli
        mig_back: dict[int, set[int]] = {}
        for idx, start in allocation.mig:
            mig_back.setdefault(idx, set()).add(start)
        out: list[Gpu] = []
        for g in gpus:
            if g.index in give:
                g = dataclasses.replace(g, milli_used=g.milli_used - give[g.index])
            if g.index in mig_back:
                starts = mig_back[g.index]
                g = dataclasses.replace(
                    g,
                    mig=tuple(
                        MigInstance(i.profile, i.gi_profile_id, i.start, i.size, False)
                        if i.start in starts and i.used and i.profile == shape.mig_profile
                        else i
                        for i in g.mig
                    ),
                )
            out.append(g)
        gpus = tuple(out)
    extended = node.extended_free
    if allocation.extended:
        ext = dict(extended)
        for name, amount in allocation.extended:
            ext[name] = ext.get(name, 0) + amount
        extended = ext
    devices = node.dra_devices
    if allocation.dra:
        keys = set(allocation.dra)
        devices = tuple(dataclasses.replace(d, allocated=False) if d.key in keys else d for d in devices)
    return dataclasses.replace(
        node,
        gpus=gpus,
        extended_free=extended,
        dra_devices=devices,
        cpu_milli_free=node.cpu_milli_free + shape.cpu_milli * r,
        memory_free=node.memory_free + shape.memory * r,
        pods_free=node.pods_free + r,
    )


def vacate(node: Node, shape: PodShape, replicas: int = 1) -> Node:
    """The node as if `replicas` running replicas of `shape` had left it, when only the node is known.

    A preemption search knows which node a victim's replica runs on but not which devices it holds
    (the report has per-device usage, not per pod): it frees the most used devices that could be the
    replica's. Whole-GPU and MIG replicas come back exactly up to device identity, which a gang fit does
    not see; DRA devices are not freed (the fit stays conservative). The cluster's own check of the
    dispatch is what holds the result to the truth.
    """
    if replicas <= 0:
        return node
    gpus = list(node.gpus)
    models = shape.gpu_models
    if shape.gpus > 0:
        milli = min(shape.gpu_milli, WHOLE_GPU_MILLI)
        for _ in range(replicas):  # one replica at a time: shares of several replicas may sit on one device
            order = sorted(
                (
                    pos
                    for pos, g in enumerate(gpus)
                    if not g.mig and g.milli_used >= milli and (not models or g.model in models)
                ),
                # a share sits on a partly used device before a full one (which may be whole-GPU work)
                key=lambda pos: (
                    milli < WHOLE_GPU_MILLI and gpus[pos].milli_used >= WHOLE_GPU_MILLI,
                    -gpus[pos].milli_used,
                    -gpus[pos].index,
                ),
            )
            for pos in order[: shape.gpus]:
                g = gpus[pos]
                gpus[pos] = Gpu(g.index, g.model, g.memory_mib, g.milli_used - milli, g.mig, g.healthy)
    extended = dict(node.extended_free)
    if shape.mig_profile is not None and shape.mig_count > 0:
        want = shape.mig_count * replicas
        if _mig_detailed(node):
            for pos, g in sorted(enumerate(gpus), key=lambda pg: -pg[1].index):
                if want == 0:
                    break
                insts = list(g.mig)
                for k, inst in enumerate(insts):
                    if want and inst.used and inst.profile == shape.mig_profile:
                        insts[k] = dataclasses.replace(inst, used=False)
                        want -= 1
                gpus[pos] = dataclasses.replace(g, mig=tuple(insts))
        else:
            res = mig.resource_name(shape.mig_profile)
            extended[res] = extended.get(res, 0) + want
    for name, amount in shape.extended:
        if amount > 0:
            extended[name] = extended.get(name, 0) + amount * replicas
    cpu = node.cpu_milli_free + shape.cpu_milli * replicas
    mem = node.memory_free + shape.memory * replicas
    return dataclasses.replace(
        node,
        gpus=tuple(gpus),
        extended_free=extended,
        cpu_milli_free=min(cpu, node.cpu_milli_allocatable) if node.cpu_milli_allocatable else cpu,
        memory_free=min(mem, node.memory_allocatable) if node.memory_allocatable else mem,
        pods_free=node.pods_free + replicas,
    )
