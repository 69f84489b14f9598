"""The fleet as numpy columns: per-node free GPUs and domains, per-cluster summaries, to prune before exact fit."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from placement.model import WHOLE_GPU_MILLI, Node, PodShape, TopologyLevels
from placement.topology import DomainId, domain_of, node_path

__all__ = ["ModelTable", "ClusterArrays", "Fleet", "DomainCandidate"]

I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]
BOOL = npt.NDArray[np.bool_]
DCAP_GPUS = (1, 2, 4, 8)
"""GPU counts per replica for which domain capacities are tabulated (a shape uses the largest <= its count)."""
_DCAP_COL = np.array(DCAP_GPUS, np.int64)[None, :]


class ModelTable:
    """GPU model name <-> small integer code, shared by every cluster (code 0 = no GPU model)."""

    def __init__(self) -> None:
        self.names: list[str] = [""]
        self.codes: dict[str, int] = {"": 0}

    def code(self, name: str | None) -> int:
        key = name or ""
        got = self.codes.get(key)
        if got is None:
            got = len(self.names)
            self.codes[key] = got
            self.names.append(key)
        return got

    def codes_for(self, models: Iterable[str]) -> list[int]:
        return [self.codes[m] for m in models if m in self.codes]


@dataclass(frozen=True, slots=True)
class DomainCandidate:
    """A domain whose summed node capacities could hold the gang: rows into the cluster's node arrays."""

    level: int | None
    path: tuple[str | None, ...]
    rows: I64
    leftover_gpus: int


class ClusterArrays:
    """One cluster's nodes as columns; the reservations overlay is kept as separate `pend_*` columns."""

    def __init__(self, nodes: Sequence[Node], levels: tuple[str, ...], models: ModelTable) -> None:
        self.nodes: list[Node] = list(nodes)
        self.levels = levels
        self.models = models
        n = len(self.nodes)
        self.row: dict[str, int] = {node.name: i for i, node in enumerate(self.nodes)}
        self.free_gpu = np.zeros(n, np.int64)
        self.milli_free = np.zeros(n, np.int64)
        self.cpu_free = np.zeros(n, np.int64)
        self.mem_free = np.zeros(n, np.int64)
        self.pods_free = np.zeros(n, np.int64)
        self.model = np.zeros(n, np.int32)
        self.gpu_mem = np.zeros(n, np.int64)
        self.schedulable = np.zeros(n, np.bool_)
        self.excluded = np.zeros(n, np.bool_)
        self.pend_gpu = np.zeros(n, np.int64)
        """Whole GPUs held by reserved-but-unbound replicas of whole-GPU shapes."""
        self.pend_milli = np.zeros(n, np.int64)
        self.pend_share_milli = np.zeros(n, np.int64)
        """The part of `pend_milli` held by GPU-share shapes (under a whole GPU per device)."""
        self.pend_cpu = np.zeros(n, np.int64)
        self.pend_mem = np.zeros(n, np.int64)
        self.pend_pods = np.zeros(n, np.int64)
        for i, node in enumerate(self.nodes):
            self._fill(i, node)
        self._dsum: dict[int, I64] = {}
        """Per level (-1 = whole cluster): for each g in DCAP_GPUS, per domain, the g-GPU replicas it could hold."""
        self._caps: dict[PodShape, I64] = {}
        self._usable: BOOL | None = None
        self._eff: I64 | None = None
        self._by_model: dict[int, I64] | None = None
        self._gpu_totals: dict[str, int] | None = None
        self.fits_cache: dict[tuple[object, ...], bool] = {}
        """Memo for callers keyed on demands; cleared on every change like the other caches."""
        # Domain ids per level, by the core's rule (`topology.domain_of`), so the pruning here and
        # the exact gang fit agree on what a domain is; dom_paths keep the reported label values.
        self.dom: list[I64] = []
        self.dom_paths: list[list[tuple[str | None, ...]]] = []
        topology_levels = TopologyLevels(levels)
        for depth in range(len(levels)):
            ids: dict[DomainId, int] = {}
            col = np.zeros(n, np.int64)
            paths: list[tuple[str | None, ...]] = []
            for i, node in enumerate(self.nodes):
                key = domain_of(node, topology_levels, depth)
                idx = ids.setdefault(key, len(ids))
                if idx == len(paths):
                    paths.append(tuple(node_path(node, topology_levels)[: depth + 1]))
                col[i] = idx
            self.dom.append(col)
            self.dom_paths.append(paths)

    @classmethod
    def build(cls, nodes: Iterable[Node], levels: tuple[str, ...], models: ModelTable) -> ClusterArrays:
        return cls(list(nodes), levels, models)

    def _fill(self, i: int, node: Node) -> None:
        self.free_gpu[i] = node.free_whole_gpus
        self.milli_free[i] = sum(g.milli_free for g in node.gpus)
        self.cpu_free[i] = node.cpu_milli_free
        self.mem_free[i] = node.memory_free
        self.pods_free[i] = node.pods_free
        self.model[i] = self.models.code(node.gpu_model)
        self.gpu_mem[i] = node.gpu_memory_mib
        self.schedulable[i] = node.ready and not node.cordoned

    def try_update(self, upserts: Sequence[Node], removed: Sequence[str]) -> bool:
        """Update rows in place; False when the shape changed (new/removed node, moved topology)."""
        if removed:
            return False
        for node in upserts:
            i = self.row.get(node.name)
            if i is None or self.nodes[i].topology != node.topology:
                return False
        for node in upserts:
            i = self.row[node.name]
            self.nodes[i] = node
            self._fill(i, node)
        self._by_model = None
        self._changed()
        return True

    def set_pending(self, pending: Iterable[tuple[Any, Any]]) -> None:
        """Overlay from scratch: subtract what reserved-but-unbound replicas will take on their nodes."""
        for col in (
            self.pend_gpu,
            self.pend_milli,
            self.pend_share_milli,
            self.pend_cpu,
            self.pend_mem,
            self.pend_pods,
        ):
            col.fill(0)
        self.add_pending(pending, +1)

    def add_pending(self, pending: Iterable[tuple[Any, Any]], sign: int) -> None:
        """Incremental overlay: add (sign=+1) or remove (-1) reserved-but-unbound replicas."""
        touched: list[int] = []
        for res, rep in pending:
            i = self.row.get(rep.node)
            if i is None:
                continue
            shape: PodShape = res.shapes[rep.pod_set]
            if shape.gpu_milli >= WHOLE_GPU_MILLI:
                self.pend_gpu[i] += sign * shape.gpus
            else:
                self.pend_share_milli[i] += sign * shape.gpus * shape.gpu_milli
            self.pend_milli[i] += sign * shape.gpus * shape.gpu_milli
            self.pend_cpu[i] += sign * shape.cpu_milli
            self.pend_mem[i] += sign * shape.memory
            self.pend_pods[i] += sign
            touched.append(i)
        self._patch_rows(np.unique(np.array(touched, np.int64)))

    def _patch_rows(self, rows: I64) -> None:
        """Only the pending columns of `rows` moved: patch the derived arrays there instead of dropping them
        (one hold per decision would otherwise rebuild every array of the cluster for the next decision)."""
        self.fits_cache.clear()
        if len(rows) == 0:
            return
        if self._eff is None:
            self._dsum.clear()
            self._caps.clear()
            return
        old = self._eff[rows]
        eff = self._eff.copy()  # copies: an array handed out earlier never changes under its holder
        eff[rows] = self._free_whole_after_overlay(rows)
        self._eff = eff
        new = eff[rows]
        if self._dsum:
            delta = new[:, None] // _DCAP_COL - old[:, None] // _DCAP_COL  # (rows, DCAP_GPUS)
            moved = [(int(rows[k]), delta[k]) for k in np.flatnonzero(delta.any(axis=1))]
            for key, sums in list(self._dsum.items()):
                if not moved:
                    break
                patched = sums.copy()
                for r, d in moved:  # a hold touches few rows: a loop beats ufunc.at
                    patched[:, self.dom[key][r] if key >= 0 else 0] += d
                self._dsum[key] = patched
        for shape, cap in list(self._caps.items()):
            cap = cap.copy()
            cap[rows] = self._capacity(shape, rows)
            self._caps[shape] = cap

    def set_excluded(self, names: Iterable[str]) -> None:
        self._changed()
        self.excluded.fill(False)
        for name in names:
            i = self.row.get(name)
            if i is not None:
                self.excluded[i] = True

    def _changed(self) -> None:
        """Any column changed: drop every derived array."""
        self._dsum.clear()
        self._caps.clear()
        self.fits_cache.clear()
        self._usable = None
        self._eff = None
        self._gpu_totals = None

    def gpu_totals(self) -> dict[str, int]:
        """GPUs per model on schedulable nodes, busy or free (what fair shares divide)."""
        if self._gpu_totals is None:
            totals: dict[str, int] = {}
            for i, node in enumerate(self.nodes):
                if self.schedulable[i] and node.gpu_model:
                    totals[node.gpu_model] = totals.get(node.gpu_model, 0) + len(node.gpus)
            self._gpu_totals = totals
        return self._gpu_totals

    @property
    def usable(self) -> BOOL:
        if self._usable is None:
            self._usable = self.schedulable & ~self.excluded
        return self._usable

    def eff_free_gpu(self) -> I64:
        """Per node, the most whole GPUs still free once the overlay's held replicas are in place."""
        if self._eff is None:
            self._eff = self._free_whole_after_overlay(slice(None))
        return self._eff

    def _free_whole_after_overlay(self, at: Any) -> I64:
        """Whole GPUs free after the holds, as an upper bound: held shares fill the partly used GPUs first
        and only their remainder takes whole GPUs (the fewest any packing can take), as the exact fit's
        best-fit packing of shares on one device may leave the other GPUs whole."""
        partial_free = self.milli_free[at] - WHOLE_GPU_MILLI * self.free_gpu[at]  # share left on GPUs in part use
        share_spill = np.maximum(self.pend_share_milli[at] - partial_free, 0)
        taken = self.pend_gpu[at] + (share_spill + WHOLE_GPU_MILLI - 1) // WHOLE_GPU_MILLI
        return np.where(self.usable[at], np.maximum(self.free_gpu[at] - taken, 0), 0)

    def capacity(self, shape: PodShape) -> I64:
        """Replicas of `shape` each node could hold: exact for whole GPUs/CPU/memory, an upper bound otherwise."""
        got = self._caps.get(shape)
        if got is None:
            got = self._capacity(shape)
            self._caps[shape] = got
        return got

    def _capacity(self, shape: PodShape, rows: I64 | None = None) -> I64:
        """Per node (or only for `rows`), from the columns and the current overlay."""
        at: Any = slice(None) if rows is None else rows
        n = len(self.nodes) if rows is None else len(rows)
        cap = np.where(self.usable[at], np.maximum(self.pods_free[at] - self.pend_pods[at], 0), 0)
        if shape.cpu_milli > 0:
            cap = np.minimum(cap, np.maximum(self.cpu_free[at] - self.pend_cpu[at], 0) // shape.cpu_milli)
        if shape.memory > 0:
            cap = np.minimum(cap, np.maximum(self.mem_free[at] - self.pend_mem[at], 0) // shape.memory)
        if shape.gpus > 0:
            if shape.gpu_milli >= WHOLE_GPU_MILLI:
                cap = np.minimum(cap, self.eff_free_gpu()[at] // shape.gpus)
            else:
                free = np.maximum(self.milli_free[at] - self.pend_milli[at], 0)
                cap = np.minimum(cap, free // max(shape.gpus * shape.gpu_milli, 1))
        if shape.wants_gpu:
            model = self.model[at]
            if shape.gpu_models:
                cap = np.where(np.isin(model, self.models.codes_for(shape.gpu_models)), cap, 0)
            elif shape.gpus > 0 or shape.mig_count > 0:
                cap = np.where(model > 0, cap, 0)
            if shape.min_gpu_memory_mib > 0 and shape.gpus > 0:  # as the exact fit: MIG and DRA shapes ignore it
                cap = np.where(self.gpu_mem[at] >= shape.min_gpu_memory_mib, cap, 0)
        return cap if len(cap) == n else np.zeros(n, np.int64)

    def domain_caps(self, level: int | None) -> I64:
        """For g in DCAP_GPUS: the most g-GPU replicas one domain of `level` could hold (whole cluster if None).

        Ignores CPU, memory and models: an upper bound that rules clusters out before any exact fit."""
        key = -1 if level is None else level
        sums = self._dsum.get(key)
        if sums is None:
            free = self.eff_free_gpu()
            ndom = (int(self.dom[level].max()) + 1 if len(free) else 0) if level is not None else 1
            sums = np.zeros((len(DCAP_GPUS), ndom), np.int64)
            if len(free):
                for j, g in enumerate(DCAP_GPUS):
                    per = free // g
                    sums[j] = (
                        per.sum()
                        if level is None
                        else np.bincount(self.dom[level], weights=per, minlength=ndom).astype(np.int64)
                    )
            self._dsum[key] = sums
        if sums.shape[1] == 0:
            return np.zeros(len(DCAP_GPUS), np.int64)
        return sums.max(axis=1)  # type: ignore[no-any-return]

    def could_hold(self, demands: Sequence[tuple[PodShape, int]], level: int | None) -> bool:
        """Cheap necessary condition: some domain has room for every whole-GPU pod set's count."""
        caps = self.domain_caps(level)
        for shape, count in demands:
            if shape.gpus <= 0 or shape.gpu_milli < WHOLE_GPU_MILLI:
                continue
            j = bisect.bisect_right(DCAP_GPUS, shape.gpus) - 1
            if j < 0 or caps[j] < count:
                return False
        return True

    def summary(self, n_models: int) -> tuple[I64, I64]:
        """Per model code: the most free whole GPUs on one node, and the total free."""
        free = self.eff_free_gpu()
        mx = np.zeros(n_models, np.int64)
        tot = np.zeros(n_models, np.int64)
        if len(free):
            tot[: max(n_models, 0)] = np.bincount(self.model, weights=free, minlength=n_models)[:n_models]
            for code, rows in self._model_rows().items():  # a cluster has few models: one masked max each
                if code < n_models:
                    mx[code] = free[rows].max()
        return mx, tot

    def _model_rows(self) -> dict[int, I64]:
        if self._by_model is None:
            self._by_model = {int(c): np.flatnonzero(self.model == c) for c in np.unique(self.model)}
        return self._by_model

    def candidate_domains(
        self, demands: Sequence[tuple[PodShape, int]], level: int | None, limit: int
    ) -> list[DomainCandidate]:
        """Domains (of `level`, or the whole cluster) whose capacities cover every pod set's count, best fit first."""
        n = len(self.nodes)
        if n == 0:
            return []
        total_gpus = sum(shape.gpus * count for shape, count in demands if shape.gpu_milli >= WHOLE_GPU_MILLI)
        if level is None:  # one domain, the whole cluster: plain sums
            for shape, count in demands:
                if int(self.capacity(shape).sum()) < count:
                    return []
            free_all = int(self.eff_free_gpu().sum())
            if free_all < total_gpus:
                return []
            return [DomainCandidate(None, (), np.arange(n), free_all - total_gpus)]
        ids = self.dom[level]
        ndom = int(ids.max()) + 1 if level is not None else 1
        ok = np.ones(ndom, np.bool_)
        for shape, count in demands:
            sums = np.bincount(ids, weights=self.capacity(shape), minlength=ndom)
            ok &= sums >= count
        free = np.bincount(ids, weights=self.eff_free_gpu(), minlength=ndom)
        ok &= free >= total_gpus
        doms = np.flatnonzero(ok)
        if len(doms) == 0:
            return []
        leftover = free[doms] - total_gpus
        order = doms[np.argsort(leftover, kind="stable")][:limit]
        out = []
        for d in order:
            rows = np.flatnonzero(ids == d)
            path = self.dom_paths[level][int(d)]
            out.append(DomainCandidate(level, path, rows, int(free[d] - total_gpus)))
        return out


class Fleet:
    """Every cluster's arrays plus a (clusters x models) summary matrix for fleet-wide pruning."""

    def __init__(self) -> None:
        self.models = ModelTable()
        self.clusters: dict[str, ClusterArrays] = {}
        self._usable: dict[str, bool] = {}
        self._summ: dict[str, tuple[I64, I64]] = {}
        self._matrix: tuple[list[str], I64, I64, BOOL] | None = None

    def put(self, cluster: str, arrays: ClusterArrays) -> None:
        self.clusters[cluster] = arrays
        self.refresh_summary(cluster)

    def set_usable(self, cluster: str, usable: bool) -> None:
        if self._usable.get(cluster) != usable:
            self._usable[cluster] = usable
            self._matrix = None

    def refresh_summary(self, cluster: str) -> None:
        """The cluster's arrays changed: its summary is recomputed when next read (a hold per decision
        would otherwise pay for one each)."""
        if cluster in self.clusters:
            self._summ.pop(cluster, None)
            self._matrix = None

    def _summary(self, cluster: str) -> tuple[I64, I64] | None:
        summ = self._summ.get(cluster)
        if summ is None:
            arrays = self.clusters.get(cluster)
            if arrays is None:
                return None
            summ = self._summ[cluster] = arrays.summary(len(self.models.names))
        return summ

    def total_free(self, cluster: str) -> int:
        """Free whole GPUs of a cluster after the overlay (from its cached summary)."""
        summ = self._summary(cluster)
        return int(summ[1].sum()) if summ is not None else 0

    def _build_matrix(self) -> tuple[list[str], I64, I64, BOOL]:
        if self._matrix is None:
            names = sorted(self.clusters)
            m = len(self.models.names)
            mx = np.zeros((len(names), m), np.int64)
            tot = np.zeros((len(names), m), np.int64)
            for i, name in enumerate(names):
                a, b = self._summary(name) or (np.zeros(0, np.int64), np.zeros(0, np.int64))
                mx[i, : len(a)] = a
                tot[i, : len(b)] = b
            usable = np.array([self._usable.get(n, False) for n in names], np.bool_)
            self._matrix = (names, mx, tot, usable)
        return self._matrix

    def prune(self, demands: Sequence[tuple[PodShape, int]]) -> list[str]:
        """Usable clusters whose summaries do not rule the demand out (whole-GPU shapes only are pruned)."""
        names, mx, tot, usable = self._build_matrix()
        keep = usable.copy()
        for shape, count in demands:
            if shape.gpus == 0 or shape.gpu_milli < WHOLE_GPU_MILLI:
                continue
            codes = self.models.codes_for(shape.gpu_models) if shape.gpu_models else list(range(1, mx.shape[1]))
            if not codes:
                return []
            keep &= mx[:, codes].max(axis=1) >= shape.gpus
            keep &= tot[:, codes].sum(axis=1) >= shape.gpus * count
        return [names[i] for i in np.flatnonzero(keep)]
