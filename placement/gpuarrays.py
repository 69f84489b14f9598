"""Columnar (numpy) view of a set of GPU nodes, so scoring is vectorised over nodes.

Units: CPU in millicores, memory in MiB, GPU in milli-GPU per device (1000 = one
whole GPU). Absent GPUs (a 2-GPU node in an 8-wide table) hold 0 and are masked
by ``present``. Every row carries a globally unique ``version`` that changes on
each placement, so callers can memoise per-row results across copies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

GPU_MILLI = 1000
DEFAULT_MAX_PODS = 1001

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
BOOL = npt.NDArray[np.bool_]

# Versions are unique over the process so a memo keyed on a version is never stale.
_NEXT_VERSION = [1]


def fresh_versions(n: int) -> I64:
    """n row versions never handed out before in this process (for callers passing `version=`)."""
    start = _NEXT_VERSION[0]
    _NEXT_VERSION[0] += n
    return np.arange(start, start + n, dtype=np.int64)


@dataclass(frozen=True)
class PodDemand:
    """What one pod asks of one node: CPU, memory and k GPUs of g milli each."""

    cpu_milli: int
    mem_mib: int = 0
    gpu_count: int = 0
    gpu_milli: int = 0
    models: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if self.cpu_milli < 0 or self.mem_mib < 0 or self.gpu_count < 0:
            raise ValueError("pod demand must not be negative")
        if not 0 <= self.gpu_milli <= GPU_MILLI:
            raise ValueError("gpu_milli must lie in 0..1000")
        if (self.gpu_count == 0) != (self.gpu_milli == 0):
            raise ValueError("gpu_count and gpu_milli must both be zero or both positive")

    @property
    def total_gpu_milli(self) -> int:
        """G = k * g, the pod's whole GPU request in milli."""
        return self.gpu_count * self.gpu_milli

    @property
    def is_sharing(self) -> bool:
        return self.gpu_count == 1 and self.gpu_milli < GPU_MILLI

    @property
    def is_cpu_only(self) -> bool:
        return self.gpu_count == 0

    @property
    def tag_bit(self) -> int:
        """Bit of this pod's GpuClustering tag: 1 for share-gpu, 1<<k for k whole GPUs."""
        if self.is_cpu_only:
            return 0
        return 1 if self.is_sharing else 1 << self.gpu_count


class GpuArrays:
    """Free resources of N nodes as numpy columns; rows are nodes."""

    __slots__ = (
        "names",
        "model_names",
        "cpu_left",
        "mem_left",
        "gpu_left",
        "gpu_count",
        "model_code",
        "pod_count",
        "max_pods",
        "pod_tags",
        "version",
        "present",
    )

    def __init__(
        self,
        names: Sequence[str],
        cpu_left: npt.ArrayLike,
        mem_left: npt.ArrayLike,
        gpu_left: npt.ArrayLike,
        gpu_count: npt.ArrayLike,
        model_code: npt.ArrayLike,
        model_names: Sequence[str],
        *,
        pod_count: npt.ArrayLike | None = None,
        max_pods: npt.ArrayLike | None = None,
        pod_tags: npt.ArrayLike | None = None,
        version: npt.ArrayLike | None = None,
    ) -> None:
        self.names: tuple[str, ...] = tuple(names)
        n = len(self.names)
        self.model_names: tuple[str, ...] = tuple(model_names)
        self.cpu_left: I64 = np.array(cpu_left, dtype=np.int64).reshape(n)
        self.mem_left: I64 = np.array(mem_left, dtype=np.int64).reshape(n)
        self.gpu_left: I32 = np.array(gpu_left, dtype=np.int32).reshape(n, -1)
        self.gpu_count: I32 = np.array(gpu_count, dtype=np.int32).reshape(n)
        self.model_code: I32 = np.array(model_code, dtype=np.int32).reshape(n)
        self.pod_count: I32 = np.zeros(n, np.int32) if pod_count is None else np.array(pod_count, np.int32).reshape(n)
        self.max_pods: I32 = (
            np.full(n, DEFAULT_MAX_PODS, np.int32) if max_pods is None else np.array(max_pods, np.int32).reshape(n)
        )
        self.pod_tags: I32 = np.zeros(n, np.int32) if pod_tags is None else np.array(pod_tags, np.int32).reshape(n)
        self.version: I64 = fresh_versions(n) if version is None else np.array(version, np.int64).reshape(n)
        width = self.gpu_left.shape[1]
        self.present: BOOL = np.arange(width)[None, :] < self.gpu_count[:, None]
        if np.any(self.gpu_left[~self.present] != 0):
            raise ValueError("absent GPUs must hold 0")
        if np.any(self.gpu_left < 0) or np.any(self.gpu_left > GPU_MILLI):
            raise ValueError("gpu_left must lie in 0..1000")
        if np.any(self.model_code >= max(len(self.model_names), 1)):
            raise ValueError("model code out of range")

    @classmethod
    def from_nodes(
        cls,
        names: Sequence[str],
        cpu_milli: Sequence[int],
        mem_mib: Sequence[int],
        gpus: Sequence[int],
        models: Sequence[str],
    ) -> GpuArrays:
        """Empty nodes: every GPU fully free. Model "" means no GPU model label."""
        model_names = tuple(sorted(set(models)))
        index = {m: i for i, m in enumerate(model_names)}
        width = max(max(gpus, default=0), 1)
        count = np.array(gpus, dtype=np.int32)
        left = np.where(np.arange(width)[None, :] < count[:, None], GPU_MILLI, 0)
        return cls(names, cpu_milli, mem_mib, left, count, [index[m] for m in models], model_names)

    def __len__(self) -> int:
        return len(self.names)

    @property
    def gpu_total_left(self) -> I64:
        """L_tot per node: idle GPU milli."""
        total: I64 = self.gpu_left.sum(axis=1, dtype=np.int64)
        return total

    def model_mask(self, models: frozenset[str]) -> BOOL:
        """Nodes whose GPU model is allowed; an empty set allows every model."""
        if not models:
            return np.ones(len(self), dtype=np.bool_)
        codes = [i for i, m in enumerate(self.model_names) if m in models]
        return np.isin(self.model_code, codes)

    def feasible(self, demand: PodDemand) -> BOOL:
        """The filter phase: CPU, memory, pod slots and, for GPU pods, model and room."""
        ok = (self.cpu_left >= demand.cpu_milli) & (self.mem_left >= demand.mem_mib)
        ok &= self.pod_count < self.max_pods
        if demand.gpu_count > 0:
            ok &= self.model_mask(demand.models)
            fits = (self.gpu_left >= demand.gpu_milli).sum(axis=1)
            ok &= fits >= demand.gpu_count
        return ok

    def select_gpus_best(self, row: int, demand: PodDemand) -> tuple[int, ...]:
        """Whole GPUs: the lowest-index free ones; partial: the tightest that fit (lowest index on ties)."""
        left = self.gpu_left[row]
        if demand.gpu_count == 0:
            return ()
        if demand.gpu_milli == GPU_MILLI:
            free = np.flatnonzero(left == GPU_MILLI)[: demand.gpu_count]
            if len(free) < demand.gpu_count:
                raise ValueError("node has too few free GPUs")
            return tuple(int(i) for i in free)
        fit = np.flatnonzero(left >= demand.gpu_milli)
        if len(fit) < demand.gpu_count:
            raise ValueError("too few GPUs have room")
        tight = fit[np.argsort(left[fit], kind="stable")][: demand.gpu_count]
        return tuple(sorted(int(i) for i in tight))

    def place(self, row: int, demand: PodDemand, gpus: Sequence[int]) -> None:
        """Commit a placement in place (the simulator's cheap path); bumps the row version."""
        if len(gpus) != demand.gpu_count:
            raise ValueError("wrong number of GPUs for the demand")
        self.cpu_left[row] -= demand.cpu_milli
        self.mem_left[row] -= demand.mem_mib
        for i in gpus:
            if self.gpu_left[row, i] < demand.gpu_milli or not self.present[row, i]:
                raise ValueError("GPU lacks room")
            self.gpu_left[row, i] -= demand.gpu_milli
        self.pod_count[row] += 1
        self.pod_tags[row] |= demand.tag_bit
        self.version[row] = fresh_versions(1)[0]

    def placed(self, row: int, demand: PodDemand, gpus: Sequence[int]) -> GpuArrays:
        """A new view with the placement applied; this one is left unchanged."""
        other = self.copy()
        other.place(row, demand, gpus)
        return other

    def copy(self) -> GpuArrays:
        return GpuArrays(
            self.names,
            self.cpu_left,
            self.mem_left,
            self.gpu_left,
            self.gpu_count,
            self.model_code,
            self.model_names,
            pod_count=self.pod_count,
            max_pods=self.max_pods,
            pod_tags=self.pod_tags,
            version=self.version,
        )

    def take(self, rows: npt.ArrayLike) -> GpuArrays:
        """A view of a subset (or reordering) of rows; versions are kept for memo reuse."""
        idx = np.asarray(rows, dtype=np.int64)
        return GpuArrays(
            [self.names[int(i)] for i in idx],
            self.cpu_left[idx],
            self.mem_left[idx],
            self.gpu_left[idx],
            self.gpu_count[idx],
            self.model_code[idx],
            self.model_names,
            pod_count=self.pod_count[idx],
            max_pods=self.max_pods[idx],
            pod_tags=self.pod_tags[idx],
            version=self.version[idx],
        )
