"""GPU fragmentation of nodes against a target workload (FGD, USENIX ATC'23), vectorised.

A node's fragmentation F_n(M) is the expected idle GPU milli that a pod drawn
from the target workload M (the "typical pods") could not use on that node.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from placement.gpuarrays import GPU_MILLI, GpuArrays, PodDemand

F64 = npt.NDArray[np.float64]
POPULARITY_THRESHOLD = 0.95
MIN_CPU_MILLI = 100  # a zero CPU request counts as 100m, as kube-scheduler's non-zero request


@dataclass(frozen=True)
class TypicalPod:
    """One class of the target workload and its probability."""

    cpu_milli: int
    gpu_milli: int
    gpu_count: int
    models: frozenset[str]
    prob: float
    mem_mib: int = 0  # 0: memory is not considered (FGD's measure)


@dataclass(frozen=True)
class TargetWorkload:
    """The typical pods as columns, ready for vectorised fragmentation."""

    classes: tuple[TypicalPod, ...]
    cpu: npt.NDArray[np.int64] = field(init=False, repr=False, compare=False)
    mem: npt.NDArray[np.int64] = field(init=False, repr=False, compare=False)
    gpu: npt.NDArray[np.int64] = field(init=False, repr=False, compare=False)
    count: npt.NDArray[np.int64] = field(init=False, repr=False, compare=False)
    prob: F64 = field(init=False, repr=False, compare=False)
    thresholds: npt.NDArray[np.int64] = field(init=False, repr=False, compare=False)
    threshold_index: npt.NDArray[np.int64] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        c = self.classes
        gpu = np.array([m.gpu_milli for m in c], dtype=np.int64)
        # Thresholds are the distinct per-GPU sizes; CPU-only classes map to a dummy slot.
        thresholds = np.unique(gpu[gpu > 0]) if np.any(gpu > 0) else np.array([1], np.int64)
        index = np.searchsorted(thresholds, np.maximum(gpu, thresholds[0]))
        object.__setattr__(self, "cpu", np.array([m.cpu_milli for m in c], dtype=np.int64))
        object.__setattr__(self, "mem", np.array([m.mem_mib for m in c], dtype=np.int64))
        object.__setattr__(self, "gpu", gpu)
        object.__setattr__(self, "count", np.array([m.gpu_count for m in c], dtype=np.int64))
        object.__setattr__(self, "prob", np.array([m.prob for m in c], dtype=np.float64))
        object.__setattr__(self, "thresholds", thresholds.astype(np.int64))
        object.__setattr__(self, "threshold_index", index.astype(np.int64))

    def access(self, model_names: Sequence[str]) -> npt.NDArray[np.bool_]:
        """[n_models, M]: may class m run on a node of that model (GPU classes only)."""
        out = np.ones((max(len(model_names), 1), len(self.classes)), dtype=np.bool_)
        for j, m in enumerate(self.classes):
            if m.models:
                for i, name in enumerate(model_names):
                    out[i, j] = name in m.models
        return out


def typical_pods(
    demands: Iterable[PodDemand],
    threshold: float = POPULARITY_THRESHOLD,
    with_memory: bool = False,
) -> TargetWorkload:
    """The most popular pod shapes covering `threshold` of all pods (FGD's GetTypicalPods).

    With `with_memory`, each class also carries the median memory of its pods, so
    a node short of memory counts its idle GPUs as fragmented for that class.
    """
    counts: Counter[tuple[int, int, int, str]] = Counter()
    mems: dict[tuple[int, int, int, str], list[int]] = {}
    for d in demands:
        spec = "|".join(sorted(d.models)) if d.gpu_count else ""
        key = (d.cpu_milli or MIN_CPU_MILLI, d.gpu_milli, d.gpu_count, spec)
        counts[key] += 1
        if with_memory:
            mems.setdefault(key, []).append(d.mem_mib)
    total = sum(counts.values())
    # Count descending, then cpu, gpu milli, gpu count and spec, each descending.
    ordered = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
    kept: list[tuple[tuple[int, int, int, str], int]] = []
    cum = 0
    for key, n in ordered:
        kept.append((key, n))
        cum += n
        if cum >= threshold * total:
            break
    return TargetWorkload(
        tuple(
            TypicalPod(
                c,
                g,
                k,
                frozenset(s.split("|")) if s else frozenset(),
                n / cum,
                int(np.median(mems[(c, g, k, s)])) if with_memory else 0,
            )
            for (c, g, k, s), n in kept
        )
    )


def without_memory(workload: TargetWorkload) -> TargetWorkload:
    """The same classes with memory dropped (FGD's own measure)."""
    if not np.any(workload.mem > 0):
        return workload
    return TargetWorkload(tuple(replace(m, mem_mib=0) for m in workload.classes))


def frag_amount(
    cpu_left: npt.ArrayLike,
    gpu_left: npt.ArrayLike,
    model_code: npt.ArrayLike,
    access: npt.NDArray[np.bool_],
    workload: TargetWorkload,
    mem_left: npt.ArrayLike | None = None,
) -> F64:
    """F_n(M) for H node states: rows of `gpu_left` [H, G] with absent GPUs as 0.

    `access` comes from `workload.access(model_names)`. Memory counts only when
    given and the classes carry memory (FGD's measure ignores it).
    """
    cpu = np.asarray(cpu_left, dtype=np.int64)
    left = np.asarray(gpu_left, dtype=np.int64)
    codes = np.asarray(model_code, dtype=np.int64)
    total = left.sum(axis=1)
    thr = workload.thresholds
    below = left[:, None, :] < thr[None, :, None]  # [H, U, G]
    n_fit = left.shape[1] - below.sum(axis=2)  # GPUs with L >= threshold
    stranded = np.where(below, left[:, None, :], 0).sum(axis=2)  # idle milli below threshold
    ti = workload.threshold_index
    satisfied = (
        (workload.gpu[None, :] > 0)
        & access[codes]
        & (n_fit[:, ti] >= workload.count[None, :])
        & (cpu[:, None] >= workload.cpu[None, :])
    )
    if mem_left is not None and np.any(workload.mem > 0):
        satisfied &= np.asarray(mem_left, dtype=np.int64)[:, None] >= workload.mem[None, :]
    per_class = np.where(satisfied, stranded[:, ti], total[:, None])
    result: F64 = per_class.astype(np.float64) @ workload.prob
    return result


def frag_single(cpu_left: int, gpu_left: Sequence[int], model: str, workload: TargetWorkload) -> float:
    """F_n(M) of one node, for tests and diagnostics."""
    names = (model,)
    return float(frag_amount([cpu_left], [list(gpu_left)], [0], workload.access(names), workload)[0])


class FragEvaluator:
    """F_n(M) before and after a hypothetical placement, memoised per row version."""

    def __init__(self, workload: TargetWorkload) -> None:
        self.workload = workload
        self._access: dict[tuple[str, ...], npt.NDArray[np.bool_]] = {}
        self._versions = np.zeros(0, dtype=np.int64)
        self._frag = np.zeros(0, dtype=np.float64)

    def access(self, model_names: tuple[str, ...]) -> npt.NDArray[np.bool_]:
        found = self._access.get(model_names)
        if found is None:
            found = self._access[model_names] = self.workload.access(model_names)
        return found

    def current(self, arrays: GpuArrays, rows: npt.NDArray[np.int64]) -> F64:
        """F of the rows as they are now; only rows whose version changed are recomputed."""
        n = len(arrays)
        if len(self._versions) != n:
            self._versions = np.zeros(n, dtype=np.int64)
            self._frag = np.zeros(n, dtype=np.float64)
        stale = rows[self._versions[rows] != arrays.version[rows]]
        if len(stale):
            self._frag[stale] = frag_amount(
                arrays.cpu_left[stale],
                arrays.gpu_left[stale],
                arrays.model_code[stale],
                self.access(arrays.model_names),
                self.workload,
                arrays.mem_left[stale],
            )
            self._versions[stale] = arrays.version[stale]
        out: F64 = self._frag[rows]
        return out

    def after_share(self, arrays: GpuArrays, rows: npt.NDArray[np.int64], demand: PodDemand) -> F64:
        """[R, G]: F after putting a sharing pod on GPU i of each row.

        NaN where the pod does not fit, and where GPU i has the same free milli as a
        lower-index GPU of the row (same outcome), so each distinct choice is computed once.
        """
        left = arrays.gpu_left[rows].astype(np.int64)
        r, g = left.shape
        earlier = np.tril(np.ones((g, g), dtype=np.bool_), k=-1)
        repeat = ((left[:, :, None] == left[:, None, :]) & earlier[None]).any(axis=2)
        ri, gi = np.nonzero((left >= demand.gpu_milli) & ~repeat)
        hypo = left[ri].copy()
        hypo[np.arange(len(ri)), gi] -= demand.gpu_milli
        out: F64 = np.full((r, g), np.nan)
        out[ri, gi] = frag_amount(
            arrays.cpu_left[rows][ri] - demand.cpu_milli,
            hypo,
            arrays.model_code[rows][ri],
            self.access(arrays.model_names),
            self.workload,
            arrays.mem_left[rows][ri] - demand.mem_mib,
        )
        return out

    def after_whole(self, arrays: GpuArrays, rows: npt.NDArray[np.int64], demand: PodDemand) -> F64:
        """[R]: F after a non-sharing pod takes g from each of the k tightest GPUs that fit."""
        left = arrays.gpu_left[rows]
        if demand.gpu_count:
            order = np.argsort(np.where(left >= demand.gpu_milli, left, 2 * GPU_MILLI), axis=1, kind="stable")[
                :, : demand.gpu_count
            ]
            left = left.copy()
            np.put_along_axis(left, order, np.take_along_axis(left, order, 1) - demand.gpu_milli, 1)
        return frag_amount(
            arrays.cpu_left[rows] - demand.cpu_milli,
            left,
            arrays.model_code[rows],
            self.access(arrays.model_names),
            self.workload,
            arrays.mem_left[rows] - demand.mem_mib,
        )
