"""Taking a shape's capacity on a node and giving it back: allocate, release, and vacate for a preemption search.

The count these keep true is `fit.capacity`'s; allocate takes DRA devices by the same plan it counts with.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from placement import mig
from placement.dra import DraEvaluator
from placement.errors import CapacityError
from placement.fit import capacity, dra_plan, mig_detailed
from placement.model import WHOLE_GPU_MILLI, Gpu, MigInstance, Node, PodShape

__all__ = ["Allocation", "allocate", "release", "vacate"]


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
        if mig_detailed(node):
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
        plan, _ = dra_plan(node, shape, dra, replicas)
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
        if mig_detailed(node):
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
