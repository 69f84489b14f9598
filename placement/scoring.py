"""Node scoring policies behind one interface, including FGD and Tandem's default.

Every policy scores the nodes of a `GpuArrays` for one `PodDemand` (higher is
better) and picks the GPU(s) on the chosen node. The simulator and the
extender run the very same code.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Protocol

import numpy as np
import numpy.typing as npt

from placement.frag import FragEvaluator, TargetWorkload, without_memory
from placement.gpuarrays import GPU_MILLI, GpuArrays, PodDemand

F64 = npt.NDArray[np.float64]
BOOL = npt.NDArray[np.bool_]
MAX_SPEC_CPU = 128_000  # FGD's normalisation constants
MAX_SPEC_GPU = 8_000
EXTENDER_MAX_SCORE = 10
DEFAULT_POLICY = "tandem-frag"


class Policy(Protocol):
    """A node-scoring policy. `score` is defined on feasible rows; other rows are ignored."""

    name: str

    def score(self, arrays: GpuArrays, demand: PodDemand, feasible: BOOL) -> F64: ...

    def select_gpus(self, arrays: GpuArrays, row: int, demand: PodDemand) -> tuple[int, ...]: ...


def choose_node(policy: Policy, arrays: GpuArrays, demand: PodDemand, feasible: BOOL) -> int | None:
    """Highest score among feasible rows; ties go to the lowest row (rows are in priority order)."""
    rows = np.flatnonzero(feasible)
    if len(rows) == 0:
        return None
    if len(rows) == 1 and not isinstance(policy, RandomPolicy):
        return int(rows[0])
    scores = policy.score(arrays, demand, feasible)[rows]
    return int(rows[int(np.argmax(scores))])


class _BestGpu:
    """GPU choice shared by the heuristics: `best` in the FGD simulator."""

    def select_gpus(self, arrays: GpuArrays, row: int, demand: PodDemand) -> tuple[int, ...]:
        return arrays.select_gpus_best(row, demand)


class RandomPolicy:
    """A uniformly random feasible node, then a uniformly random fitting GPU."""

    name = "random"

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def score(self, arrays: GpuArrays, demand: PodDemand, feasible: BOOL) -> F64:
        out = np.zeros(len(arrays), dtype=np.float64)
        rows = np.flatnonzero(feasible)
        if len(rows):
            out[rows[int(self.rng.integers(len(rows)))]] = 1.0
        return out

    def select_gpus(self, arrays: GpuArrays, row: int, demand: PodDemand) -> tuple[int, ...]:
        if not demand.is_sharing:
            return arrays.select_gpus_best(row, demand)
        fit = np.flatnonzero(arrays.gpu_left[row] >= demand.gpu_milli)
        return (int(fit[int(self.rng.integers(len(fit)))]),)


class BestFitPolicy(_BestGpu):
    """Least CPU and GPU left over after placement (FGD's 05-BestFit)."""

    name = "bestfit"

    def score(self, arrays: GpuArrays, demand: PodDemand, feasible: BOOL) -> F64:
        cpu = (arrays.cpu_left - demand.cpu_milli) / MAX_SPEC_CPU
        gpu = (arrays.gpu_total_left - demand.total_gpu_milli) / MAX_SPEC_GPU
        return np.floor(100.0 * (1.0 - (0.5 * cpu + 0.5 * gpu)))


class DotProductPolicy(_BestGpu):
    """Smallest dot product of node-free and pod-request vectors (FGD's 02-DotProd)."""

    name = "dotprod"

    def score(self, arrays: GpuArrays, demand: PodDemand, feasible: BOOL) -> F64:
        dot = (arrays.cpu_left / MAX_SPEC_CPU) * (demand.cpu_milli / MAX_SPEC_CPU)
        dot = dot + (arrays.gpu_total_left / MAX_SPEC_GPU) * (demand.total_gpu_milli / MAX_SPEC_GPU)
        return np.floor(100.0 * (1.0 - dot / 2.0))


class _GpuPodsOnly(_BestGpu, ABC):
    """A heuristic about GPU shapes: a CPU-only pod has none, so every node scores 0 for it."""

    def score(self, arrays: GpuArrays, demand: PodDemand, feasible: BOOL) -> F64:
        if demand.is_cpu_only:
            return np.zeros(len(arrays), dtype=np.float64)
        return self.score_gpu_pod(arrays, demand)

    @abstractmethod
    def score_gpu_pod(self, arrays: GpuArrays, demand: PodDemand) -> F64:
        """Scores for a pod that asks for GPUs (higher is better)."""


class PackingPolicy(_GpuPodsOnly):
    """Prefer partly used GPUs, then partly used nodes, then free nodes (04-GpuPacking)."""

    name = "packing"

    def score_gpu_pod(self, arrays: GpuArrays, demand: PodDemand) -> F64:
        left = arrays.gpu_left.astype(np.int64)
        count = arrays.gpu_count.astype(np.int64)
        free_nodes = (left == GPU_MILLI).sum(axis=1) == count
        ordered = np.sort(left, axis=1, kind="stable")
        ok = ordered >= demand.gpu_milli
        chosen = ok & (np.cumsum(ok, axis=1) <= demand.gpu_count)
        n_free = (chosen & (ordered == GPU_MILLI)).sum(axis=1)
        used = np.where(chosen, ordered * 100 // GPU_MILLI, 0).sum(axis=1)
        partial = np.where(n_free > 0, np.maximum(50 - n_free, 33), np.maximum(100 - used // 10, 50))
        return np.where(free_nodes, np.maximum(33 - count, count), partial).astype(np.float64)


class ClusteringPolicy(_GpuPodsOnly):
    """Put pods of the same GPU shape together (03-GpuClustering)."""

    name = "clustering"

    def score_gpu_pod(self, arrays: GpuArrays, demand: PodDemand) -> F64:
        bonus = 25 * (MAX_SPEC_GPU - arrays.gpu_total_left) // MAX_SPEC_GPU
        tags = arrays.pod_tags
        tag = demand.tag_bit
        has = (tags & tag) != 0
        base = np.where(has, np.where(tags == tag, 75, 50), np.where(tags == 0, 25, 0))
        return (base + bonus).astype(np.float64)


class _Cached:
    """Per (cpu, mem, k, g) memo of node scores and GPU choices, valid while a row's version holds."""

    def __init__(self) -> None:
        self._entries: dict[tuple[int, int, int, int], tuple[npt.NDArray[np.int64], F64, npt.NDArray[np.int64]]] = {}

    def lookup(
        self,
        arrays: GpuArrays,
        demand: PodDemand,
        rows: npt.NDArray[np.int64],
        compute: Callable[[npt.NDArray[np.int64]], tuple[F64, npt.NDArray[np.int64]]],
    ) -> tuple[F64, npt.NDArray[np.int64]]:
        key = (demand.cpu_milli, demand.mem_mib, demand.gpu_count, demand.gpu_milli)
        n = len(arrays)
        entry = self._entries.get(key)
        if entry is None or len(entry[0]) != n:
            entry = (np.zeros(n, np.int64), np.zeros(n, np.float64), np.zeros(n, np.int64))
            self._entries[key] = entry
        versions, scores, gpus = entry
        stale = rows[versions[rows] != arrays.version[rows]]
        if len(stale):
            s, g = compute(stale)
            scores[stale] = s
            gpus[stale] = g
            versions[stale] = arrays.version[stale]
        return scores, gpus


class _FragPolicy(ABC):
    """Shared plumbing of the fragmentation policies: memo, GPU choice from the same scores, and the
    fragmentation decrease itself; a policy says how a sharing pod's GPU is chosen and what it adds."""

    name = "frag-base"

    def __init__(self, workload: TargetWorkload) -> None:
        self.frag = FragEvaluator(workload)
        self._cache = _Cached()

    def _node_scores(
        self, arrays: GpuArrays, demand: PodDemand, rows: npt.NDArray[np.int64]
    ) -> tuple[F64, npt.NDArray[np.int64]]:
        before = self.frag.current(arrays, rows)
        if demand.is_sharing:
            frag_score, gpu = self._share_scores(before, self.frag.after_share(arrays, rows, demand))
        else:
            frag_score = _sigmoid_score(before - self.frag.after_whole(arrays, rows, demand))
            gpu = np.zeros(len(rows), np.int64)
        return self._adjusted(frag_score, arrays, demand, rows), gpu

    @abstractmethod
    def _share_scores(self, before: F64, after: F64) -> tuple[F64, npt.NDArray[np.int64]]:
        """A sharing pod's score per row and the GPU it takes there, from the fragmentation before and
        after it lands on each GPU (`after` is rows x GPUs, NaN where it does not fit)."""

    def _adjusted(self, frag_score: F64, arrays: GpuArrays, demand: PodDemand, rows: npt.NDArray[np.int64]) -> F64:
        """The final score from the fragmentation score; as is unless a policy weighs something else too."""
        return frag_score

    def score(self, arrays: GpuArrays, demand: PodDemand, feasible: BOOL) -> F64:
        rows = np.flatnonzero(feasible)
        scores, _ = self._cache.lookup(arrays, demand, rows, lambda r: self._node_scores(arrays, demand, r))
        return np.where(feasible, scores, -np.inf)

    def select_gpus(self, arrays: GpuArrays, row: int, demand: PodDemand) -> tuple[int, ...]:
        if not demand.is_sharing:
            return arrays.select_gpus_best(row, demand)
        rows = np.array([row], dtype=np.int64)
        _, gpus = self._cache.lookup(arrays, demand, rows, lambda r: self._node_scores(arrays, demand, r))
        return (int(gpus[row]),)


def _sigmoid_score(delta: F64) -> F64:
    out: F64 = np.floor(100.0 / (1.0 + np.exp(-delta / 1000.0)))
    return out


class FgdPolicy(_FragPolicy):
    """Fragmentation Gradient Descent as published: integer sigmoid of the frag decrease."""

    name = "fgd"

    def __init__(self, workload: TargetWorkload) -> None:
        super().__init__(without_memory(workload))  # FGD's measure ignores memory

    def _share_scores(self, before: F64, after: F64) -> tuple[F64, npt.NDArray[np.int64]]:
        s = np.where(np.isnan(after), -1.0, _sigmoid_score(before[:, None] - np.nan_to_num(after)))
        return s.max(axis=1), np.argmax(s, axis=1).astype(np.int64)


class TandemFragPolicy(_FragPolicy):
    """Tandem's default: FGD's fragmentation gradient, memory-aware, plus resource alignment.

    Score = floor(100 * sigmoid(F decrease / 1000)) - align_weight * mismatch, where
    mismatch = round(|log2(node CPU per idle GPU) - log2(pod CPU per GPU)|). Keeping
    the integer resolution keeps ties, and ties go to a fixed node order, which packs
    (first fit); alignment sends CPU-heavy pods to nodes whose GPUs are used up and
    GPU-heavy pods to nodes with CPU to spare, so neither resource is stranded.
    Sharing pods take the GPU whose use leaves the least fragmentation.
    """

    name = "tandem-frag"

    def __init__(self, workload: TargetWorkload, *, align_weight: float = 2.0) -> None:
        super().__init__(workload)
        self.align_weight = align_weight

    def _share_scores(self, before: F64, after: F64) -> tuple[F64, npt.NDArray[np.int64]]:
        gpu = np.argmin(np.where(np.isnan(after), np.inf, after), axis=1).astype(np.int64)
        return _sigmoid_score(before - after[np.arange(len(before)), gpu]), gpu

    def _adjusted(self, frag_score: F64, arrays: GpuArrays, demand: PodDemand, rows: npt.NDArray[np.int64]) -> F64:
        return frag_score - self.align_weight * _mismatch(arrays, demand, rows)


def _mismatch(arrays: GpuArrays, demand: PodDemand, rows: npt.NDArray[np.int64]) -> F64:
    """Octaves between the node's free CPU per idle GPU and the pod's CPU per GPU, rounded."""
    floor_gpus = 0.1  # a node (or pod) without GPU counts as a tenth of one, not zero
    node = np.log2(
        np.maximum(arrays.cpu_left[rows], 1) / np.maximum(arrays.gpu_total_left[rows] / GPU_MILLI, floor_gpus)
    )
    pod = np.log2(max(demand.cpu_milli, 1) / max(demand.total_gpu_milli / GPU_MILLI, floor_gpus))
    out: F64 = np.round(np.abs(node - pod))
    return out


POLICY_NAMES = ("random", "dotprod", "clustering", "packing", "bestfit", "fgd", DEFAULT_POLICY)


def make_policy(name: str, *, workload: TargetWorkload | None = None, rng: np.random.Generator | None = None) -> Policy:
    """A fresh policy instance; fragmentation policies need the target workload."""
    if name == "random":
        return RandomPolicy(rng if rng is not None else np.random.default_rng())
    simple: dict[str, Callable[[], Policy]] = {
        "bestfit": BestFitPolicy,
        "dotprod": DotProductPolicy,
        "packing": PackingPolicy,
        "clustering": ClusteringPolicy,
    }
    if name in simple:
        return simple[name]()
    if name in ("fgd", DEFAULT_POLICY):
        if workload is None:
            raise ValueError(f"policy {name} needs a target workload")
        return FgdPolicy(workload) if name == "fgd" else TandemFragPolicy(workload)
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}")


def extender_scores(arrays: GpuArrays, demand: PodDemand, feasible: BOOL, policy: Policy) -> npt.NDArray[np.int64]:
    """Scores 0..10 (kube-scheduler extender range); infeasible nodes get 0.

    The node the policy itself would choose (first row among the best) gets 10 and
    every other feasible node 0..9 by min-max rescaling, so a scheduler that follows
    the extender lands on the policy's own pick instead of a random near-tie.
    """
    out = np.zeros(len(arrays), dtype=np.int64)
    rows = np.flatnonzero(feasible)
    if len(rows) == 0:
        return out
    raw = policy.score(arrays, demand, feasible)[rows]
    lo, hi = float(raw.min()), float(raw.max())
    if hi > lo:
        scaled = np.floor((raw - lo) / (hi - lo) * (EXTENDER_MAX_SCORE - 1))
        out[rows] = np.clip(scaled, 0, EXTENDER_MAX_SCORE - 1).astype(np.int64)
    else:
        out[rows] = EXTENDER_MAX_SCORE - 1
    out[rows[int(np.argmax(raw))]] = EXTENDER_MAX_SCORE
    return out
