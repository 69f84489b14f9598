"""What the API and the fleet view draw of a cluster's GPUs, computed from its capacity as a `FleetView` reads it.

Both return frozen records, so the rooms that render clusters never hold the catalog's live arrays:
`cluster_gpus` (ClusterSummary: GPUs and free whole GPUs per model, optionally per topology domain) and
`OccupancyMemo` (the fleet picture's occupancy, computed again only when the cluster's capacity moved).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fleetplan.arrays import ClusterArrays
from fleetplan.occupancy import ClusterOccupancy, occupancy

__all__ = ["ModelGpus", "DomainGpus", "ClusterGpus", "cluster_gpus", "OccupancyMemo"]


@dataclass(frozen=True, slots=True)
class ModelGpus:
    """GPUs of one model and how many of them are free whole GPUs once the reservations overlay is in place."""

    model: str
    total: int
    free: int


@dataclass(frozen=True, slots=True)
class DomainGpus:
    depth: int
    """Index of the domain's topology level in the cluster's levels (broadest first)."""
    path: tuple[str | None, ...]
    """Label values from the broadest level down to this one (None: the nodes lack the label)."""
    nodes: int
    gpus: tuple[ModelGpus, ...]


@dataclass(frozen=True, slots=True)
class ClusterGpus:
    gpus: tuple[ModelGpus, ...]
    """Per model, sorted by model name; nodes without GPUs are left out."""
    domains: tuple[DomainGpus, ...] = ()
    """Per domain of each level asked for, level by level, in domain order."""


def _per_model(arrays: ClusterArrays, free: npt.NDArray[np.int64], rows: Iterable[int]) -> tuple[ModelGpus, ...]:
    acc: dict[str, list[int]] = {}
    for i in rows:
        node = arrays.nodes[i]
        if node.gpus:
            counts = acc.setdefault(node.gpu_model or "", [0, 0])
            counts[0] += node.total_gpus
            counts[1] += int(free[i])
    return tuple(ModelGpus(m, acc[m][0], acc[m][1]) for m in sorted(acc))


def cluster_gpus(arrays: ClusterArrays, depths: Iterable[int] = ()) -> ClusterGpus:
    """Per model over the cluster, and per domain of each of `depths`; linear in nodes per level."""
    free = arrays.eff_free_gpu()
    domains: list[DomainGpus] = []
    for depth in depths:
        groups: dict[int, list[int]] = {}
        for i, d in enumerate(arrays.dom[depth].tolist()):
            groups.setdefault(d, []).append(i)
        for d, rows in sorted(groups.items()):
            domains.append(DomainGpus(depth, arrays.dom_paths[depth][d], len(rows), _per_model(arrays, free, rows)))
    return ClusterGpus(_per_model(arrays, free, range(len(arrays.nodes))), tuple(domains))


class OccupancyMemo:
    """Each cluster's occupancy, computed again only when its capacity moved: the catalog replaces a cluster's
    arrays on a full report, and hands out a new free-GPU array whenever their columns or the overlay change,
    so in between every poll of every browser reads the cached picture."""

    def __init__(self, probe_gpus: int) -> None:
        self.probe_gpus = probe_gpus
        self._cache: weakref.WeakKeyDictionary[ClusterArrays, tuple[object, ClusterOccupancy]] = (
            weakref.WeakKeyDictionary()
        )
        """Keyed by the arrays themselves: a cluster's entry goes with the arrays its next full report replaces."""

    def of(self, arrays: ClusterArrays) -> ClusterOccupancy:
        free = arrays.eff_free_gpu()
        hit = self._cache.get(arrays)
        if hit is not None and hit[0] is free:
            return hit[1]
        occ = occupancy(arrays, self.probe_gpus)
        self._cache[arrays] = (free, occ)
        return occ
