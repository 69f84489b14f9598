"""One immutable inventory version: name index, pre-serialised fragments and per-shape verdicts.

Verdicts are cached per (version, query) as numpy columns over all nodes; each node's verdict is
also memoised per query against its NodeFacts object, so after a pod binds only that node is
re-checked. Scores are computed once per (version, query), vectorised.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from extender.config import ExtenderConfig
from extender.facts import NodeFacts
from extender.nodefit import Query, Verdict, check_node, room_for
from placement import dra as core_dra
from placement.gpuarrays import GpuArrays, PodDemand
from placement.scoring import BestFitPolicy, extender_scores

__all__ = ["Snapshot", "ShapeVerdict"]

_MEMO_LIMIT = 64


class ShapeVerdict:
    """Verdicts of one query over every node of a snapshot (row i = snapshot node i)."""

    __slots__ = ("verdicts", "ok", "unresolvable", "_frags", "_scores")

    def __init__(self, verdicts: list[Verdict]) -> None:
        self.verdicts = verdicts
        self.ok: npt.NDArray[np.bool_] = np.fromiter((v.reason is None for v in verdicts), np.bool_, len(verdicts))
        self.unresolvable: npt.NDArray[np.bool_] = np.fromiter((v.unresolvable for v in verdicts), np.bool_,
                                                               len(verdicts))
        self._frags: dict[int, bytes] = {}
        self._scores: npt.NDArray[np.int64] | None = None

    def message_json(self, i: int) -> bytes:
        """The refusal message of node i, JSON-quoted (cached)."""
        m = self._frags.get(i)
        if m is None:
            m = self._frags[i] = orjson.dumps(self.verdicts[i].message)
        return m


class Snapshot:
    """Read-only view of one inventory version."""

    def __init__(
        self, version: int, facts: list[NodeFacts], classes: Mapping[str, tuple[str, ...]],
        memo: OrderedDict[Query, dict[str, tuple[NodeFacts, Verdict]]], evaluator: core_dra.DraEvaluator,
        config: ExtenderConfig,
    ) -> None:
        self.version = version
        self.facts = facts
        self.index: dict[str, int] = {f.name: i for i, f in enumerate(facts)}
        self.name_json: list[bytes] = [f.name_json for f in facts]
        self.host_prefix: list[bytes] = [f.host_prefix for f in facts]
        self.classes = classes
        self.evaluator = evaluator
        self.config = config
        self._memo = memo
        self._verdicts: OrderedDict[Query, ShapeVerdict] = OrderedDict()
        self._arrays: GpuArrays | None = None

    @classmethod
    def build(
        cls, version: int, facts: list[NodeFacts], classes: Mapping[str, tuple[str, ...]], *,
        previous: Snapshot | None, config: ExtenderConfig,
    ) -> Snapshot:
        memo = previous._memo if previous is not None else OrderedDict()
        ev = previous.evaluator if previous is not None else core_dra.DraEvaluator(classes)
        if previous is not None and dict(previous.classes) != dict(classes):
            memo = OrderedDict()  # device classes changed: every DRA verdict may differ
            ev = core_dra.DraEvaluator(classes)
        return cls(version, facts, classes, memo, ev, config)

    def __len__(self) -> int:
        return len(self.facts)

    # ------------------------------------------------------------------ verdicts

    def verdict(self, q: Query) -> ShapeVerdict:
        """Verdicts of `q` on every node, cached for this version."""
        sv = self._verdicts.get(q)
        if sv is not None:
            self._verdicts.move_to_end(q)
            return sv
        memo = self._memo.get(q)
        if memo is None:
            memo = self._memo[q] = {}
            if len(self._memo) > _MEMO_LIMIT:
                self._memo.popitem(last=False)
        else:
            self._memo.move_to_end(q)
        out: list[Verdict] = []
        ev = self.evaluator
        for f in self.facts:
            hit = memo.get(f.name)
            if hit is not None and hit[0] is f:
                out.append(hit[1])
                continue
            v = check_node(f, q, ev)
            memo[f.name] = (f, v)
            out.append(v)
        sv = ShapeVerdict(out)
        self._verdicts[q] = sv
        if len(self._verdicts) > self.config.verdict_cache_size:
            self._verdicts.popitem(last=False)
        return sv

    def check_one(self, f: NodeFacts, q: Query) -> Verdict:
        """An uncached verdict for ad-hoc facts (preemption what-ifs)."""
        return check_node(f, q, self.evaluator)

    # ------------------------------------------------------------------ scores

    def _gpu_arrays(self) -> GpuArrays:
        if self._arrays is None:
            facts = self.facts
            nodes = [f.node for f in self.facts]
            width = max((len(n.gpus) for n in nodes), default=1) or 1
            left = np.zeros((len(nodes), width), np.int32)
            for i, n in enumerate(nodes):
                if n.gpus:
                    left[i, : len(n.gpus)] = [g.milli_free for g in n.gpus]
            models = [n.gpu_model or "" for n in nodes]
            names = sorted(set(models))
            code = {m: i for i, m in enumerate(names)}
            self._arrays = GpuArrays(
                [n.name for n in nodes],
                [max(n.cpu_milli_free, 0) for n in nodes],
                [max(n.memory_free, 0) >> 20 for n in nodes],
                left,
                [len(n.gpus) for n in nodes],
                [code[m] for m in models],
                names,
            )
        return self._arrays

    def scores(self, q: Query) -> npt.NDArray[np.int64]:
        """Extender scores 0..10 of `q` on every node (0 where it does not fit), cached."""
        sv = self.verdict(q)
        if sv._scores is not None:
            return sv._scores
        s = q.shape
        n = len(self.facts)
        if not s.wants_gpu or q.pinned is not None:
            out = np.where(sv.ok, 10 if q.pinned is not None else 0, 0).astype(np.int64)
        elif s.gpus and not s.dra and s.mig_profile is None:
            demand = PodDemand(cpu_milli=s.cpu_milli, mem_mib=s.memory >> 20, gpu_count=s.gpus,
                               gpu_milli=s.gpu_milli)
            out = extender_scores(self._gpu_arrays(), demand, sv.ok, BestFitPolicy())
        else:
            out = self._pack_scores(q, sv)
        sv._scores = out
        del n
        return out

    def _pack_scores(self, q: Query, sv: ShapeVerdict) -> npt.NDArray[np.int64]:
        """MIG / DRA: prefer the node left with the fewest matching free units (keeps others whole)."""
        rows = np.flatnonzero(sv.ok)
        out = np.zeros(len(self.facts), np.int64)
        if len(rows) == 0:
            return out
        left = np.array([room_for(self.facts[i], q, self.evaluator) - 1 for i in rows.tolist()], np.float64)
        lo, hi = float(left.min()), float(left.max())
        out[rows] = 10 if hi <= lo else np.rint((hi - left) / (hi - lo) * 10).astype(np.int64)
        return out

    # ------------------------------------------------------------------ lookups

    def positions(self, names: Sequence[str]) -> npt.NDArray[np.intp]:
        """Snapshot row of each name, -1 for names the inventory does not know."""
        get = self.index.get
        return np.fromiter([get(n, -1) for n in names], np.intp, len(names))

    def facts_by_name(self, name: str) -> NodeFacts | None:
        i = self.index.get(name)
        return None if i is None else self.facts[i]

    def node_summary(self) -> list[dict[str, Any]]:
        """Small per-node view for debugging endpoints and logs."""
        return [{"name": f.name, "gpuModel": f.node.gpu_model, "gpus": f.node.total_gpus,
                 "freeGpus": f.node.free_whole_gpus} for f in self.facts]
