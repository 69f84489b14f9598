"""What a cluster's GPUs are doing now, per model and per finest topology domain (the fleet view's picture).

Read from the catalog's arrays, the reservations overlay included: `free` is what the placer could still
give, `reserved` what reservations not yet bound take, `used` what the cluster reports busy, `unavailable`
what sits on nodes that are cordoned, not ready or excluded. The four add up to `total`.

`probe_replicas` answers "where could a gang of `probe_gpus`-GPU replicas go": per domain, how many such
replicas the nodes could host by the same per-node capacity the placer prunes with (whole GPUs, pods,
model; not CPU, memory, MIG or DRA, which the exact fit checks at decision time).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from fleetplan.arrays import ClusterArrays
from placement.model import HOSTNAME_LABEL, PodShape

__all__ = ["GpuCounts", "DomainOccupancy", "ClusterOccupancy", "by_model", "occupancy", "picture_depth"]


@dataclass(frozen=True, slots=True)
class GpuCounts:
    model: str
    total: int
    free: int
    reserved: int
    used: int
    unavailable: int

    def __add__(self, other: GpuCounts) -> GpuCounts:
        return GpuCounts(
            self.model,
            self.total + other.total,
            self.free + other.free,
            self.reserved + other.reserved,
            self.used + other.used,
            self.unavailable + other.unavailable,
        )


def by_model(counts: Iterable[GpuCounts]) -> tuple[GpuCounts, ...]:
    """Counts of the same model added up (a fleet's from its clusters'), sorted by model."""
    out: dict[str, GpuCounts] = {}
    for c in counts:
        out[c.model] = out[c.model] + c if c.model in out else c
    return tuple(out[m] for m in sorted(out))


@dataclass(frozen=True, slots=True)
class DomainOccupancy:
    path: tuple[str | None, ...]
    """Label values from the broadest level down to the picture's level (None: the node lacks the label)."""
    nodes: int
    model: str
    """The model with the most GPUs in the domain ('' when it has none)."""
    gpus: GpuCounts
    whole_free_nodes: int
    """GPU nodes with every GPU free: what a job that wants whole nodes can take."""
    probe_replicas: int


@dataclass(frozen=True, slots=True)
class ClusterOccupancy:
    level: str
    """Label key of the picture's level ('' when the cluster reports no topology)."""
    gpus: tuple[GpuCounts, ...]
    domains: tuple[DomainOccupancy, ...]

    @property
    def largest_probe_replicas(self) -> int:
        return max((d.probe_replicas for d in self.domains), default=0)


def picture_depth(arrays: ClusterArrays) -> int | None:
    """The finest level above the node that most nodes carry a label for (None: no such level).

    A level few nodes are labelled with (an NVLink clique key on PCIe nodes) would draw every node as its
    own domain; the next broader level is the picture a person reads."""
    depths = [d for d, key in enumerate(arrays.levels) if key != HOSTNAME_LABEL]
    n = len(arrays.nodes)
    for depth in reversed(depths):
        labelled = np.array([p[-1] is not None for p in arrays.dom_paths[depth]], np.bool_)
        if n and int(labelled[arrays.dom[depth]].sum()) * 2 >= n:
            return depth
    return None


def _counts(
    model: str, total: np.ndarray, free: np.ndarray, reserved: np.ndarray, used: np.ndarray, rows: np.ndarray
) -> GpuCounts:
    t, f, r, u = (int(a[rows].sum()) for a in (total, free, reserved, used))
    return GpuCounts(model, t, f, r, u, max(t - f - r - u, 0))


def occupancy(arrays: ClusterArrays, probe_gpus: int = 8) -> ClusterOccupancy:
    """Per model and per domain of the picture's level; pure, linear in nodes (numpy)."""
    n = len(arrays.nodes)
    total = np.fromiter((node.total_gpus for node in arrays.nodes), np.int64, n)
    usable = arrays.usable
    free = arrays.eff_free_gpu()
    reserved = np.where(usable, arrays.free_gpu - free, 0)  # whole GPUs the holds take, by the arrays' one rule
    used = np.where(usable, np.maximum(total - arrays.free_gpu, 0), 0)
    models = [node.gpu_model or "" for node in arrays.nodes]
    has_gpu = total > 0
    per_model: dict[str, list[int]] = {}
    for i, m in enumerate(models):
        if has_gpu[i]:
            per_model.setdefault(m, []).append(i)
    gpus = tuple(
        _counts(m, total, free, reserved, used, np.array(rows, np.int64)) for m, rows in sorted(per_model.items())
    )
    probe = arrays.capacity(PodShape(gpus=max(probe_gpus, 1)))
    whole = has_gpu & (free == total)
    depth = picture_depth(arrays)
    if depth is None:
        groups: dict[int, list[int]] = {0: list(range(n))} if n else {}
        paths: list[tuple[str | None, ...]] = [()]
        level = ""
    else:
        groups = {}
        for i, d in enumerate(arrays.dom[depth].tolist()):
            groups.setdefault(d, []).append(i)
        paths = arrays.dom_paths[depth]
        level = arrays.levels[depth]
    domains = []
    for d, members in groups.items():
        rows = np.array(members, np.int64)
        weight: dict[str, int] = {}
        for i in members:
            if has_gpu[i]:
                weight[models[i]] = weight.get(models[i], 0) + int(total[i])
        model = max(sorted(weight), key=weight.__getitem__) if weight else ""
        domains.append(
            DomainOccupancy(
                path=paths[d],
                nodes=len(members),
                model=model,
                gpus=_counts(model, total, free, reserved, used, rows),
                whole_free_nodes=int(whole[rows].sum()),
                probe_replicas=int(probe[rows].sum()),
            )
        )
    domains.sort(key=lambda x: tuple("" if v is None else v for v in x.path))
    return ClusterOccupancy(level, gpus, tuple(domains))
