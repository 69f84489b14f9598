"""One immutable inventory version: name index, pre-serialised fragments and per-shape verdicts.

A request costs O(candidates): verdicts of a query are filled in lazily, only for the rows a
request names, and kept for the version; each node's verdict is also memoised per query against
its NodeFacts object, so after a pod binds only that node is checked again. Raw scores are one
vectorised pass per (version, query); each reply rescales them over its own candidates.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt
import orjson

from extender.config import ExtenderConfig
from extender.facts import NodeFacts
from extender.names import NameTable, Rows
from extender.nodefit import Query, QueryMemo, Verdict, check_node
from extender.verdicts import Refusals, ShapeVerdict, bytes_array
from extender.verdicts import code_name as code_name
from placement import dra as core_dra
from placement.frag import TargetWorkload, TypicalPod
from placement.gpuarrays import GpuArrays, PodDemand
from placement.scoring import Policy, extender_scores, make_policy

__all__ = ["Snapshot", "ShapeVerdict", "Refusals", "SCORE_MAX"]

SCORE_MAX = 10
_MEMO_LIMIT = 64
_SUFFIX = [f"{v}}}".encode() for v in range(SCORE_MAX + 1)]
_SUFFIX_S = np.array(_SUFFIX, dtype="S3")

_NEXT_ROW_VERSION = [1 << 40]  # apart from the core's own counter; unique within the process


def _row_versions(n: int) -> npt.NDArray[np.int64]:
    """Fresh row versions: a row's scores stay memoised by the policy while its version holds."""
    start = _NEXT_ROW_VERSION[0]
    _NEXT_ROW_VERSION[0] += n
    return np.arange(start, start + n, dtype=np.int64)


def make_scoring_policy(config: ExtenderConfig) -> Policy:
    """The configured scoring policy over the configured target workload."""
    total = sum(c.weight for c in config.target_workload)
    workload = TargetWorkload(
        tuple(
            TypicalPod(c.cpu_milli, c.gpu_milli, c.gpus, frozenset(), c.weight / total) for c in config.target_workload
        )
    )
    return make_policy(config.scoring_policy, workload=workload, rng=np.random.default_rng(0))


class Snapshot:
    """Read-only view of one inventory version."""

    def __init__(
        self,
        version: int,
        names: list[str],
        facts: list[NodeFacts],
        classes: Mapping[str, tuple[str, ...]],
        memo: OrderedDict[Query, QueryMemo],
        evaluator: core_dra.DraEvaluator,
        config: ExtenderConfig,
        previous: Snapshot | None = None,
        changed: list[int] | None = None,
    ) -> None:
        self.version = version
        self.names = names
        self.facts = facts
        self.index: dict[str, int]
        self.name_json: list[bytes]
        self.host_prefix: list[bytes]
        prev = previous if previous is not None and previous.names == names else None
        self._prev = prev
        if prev is not None:  # same node list: reuse the index, carry verdicts over lazily
            prev._prev = None  # keep the chain one snapshot deep
            self.index = prev.index
            self.name_json, self.host_prefix = prev.name_json, prev.host_prefix
            if changed is None:
                changed = [i for i, (a, b) in enumerate(zip(prev.facts, facts)) if a is not b]
            self._changed: Rows = np.array(changed, np.intp)
        else:
            # Keys decoded in one go sit next to each other in memory: a request's lookups, in
            # kube-scheduler's ever-changing order, then stay in cache (about twice as fast).
            self.index = dict(zip(orjson.loads(orjson.dumps(names)), range(len(names))))
            self.name_json = [f.name_json for f in facts]
            self.host_prefix = [f.host_prefix for f in facts]
            self._changed = np.arange(len(facts), dtype=np.intp)
        self.classes = classes
        self.evaluator = evaluator
        self.config = config
        self._memo = memo
        self._verdicts: OrderedDict[Query, ShapeVerdict] = OrderedDict()
        self._arrays: GpuArrays | None = None
        self._entry_table: npt.NDArray[np.object_] | None = None
        self._sig_arr: npt.NDArray[np.int64] | None = None
        self._label_codes: dict[str, tuple[npt.NDArray[np.int64], int]] = {}
        self._heads: tuple[npt.NDArray[np.object_], npt.NDArray[np.object_]] | None = None
        self._host_s: npt.NDArray[np.bytes_] | None = None
        self._name_s: npt.NDArray[np.bytes_] | None = None
        self._name_table: NameTable | None = None
        self.last_passed: tuple[Query, bytes, Rows, bool] | None = None
        """(query, `"NodeNames":[...]` bytes, rows, whether those are all the nodes that fit) of the
        last names-mode filter reply: kube-scheduler sends prioritize the list its filter passed, so
        prioritize can skip the name lookups (and, for all the fitting nodes, reuse their scores)."""
        self.policy: Policy = previous.policy if previous is not None else make_scoring_policy(config)

    @classmethod
    def build(
        cls,
        version: int,
        names: list[str],
        facts: list[NodeFacts],
        classes: Mapping[str, tuple[str, ...]],
        *,
        previous: Snapshot | None,
        config: ExtenderConfig,
        changed: list[int] | None = None,
    ) -> Snapshot:
        """A snapshot; `changed` lists the rows whose facts differ from `previous` (None: compare)."""
        memo = previous._memo if previous is not None else OrderedDict()
        ev = previous.evaluator if previous is not None else core_dra.DraEvaluator(classes)
        if previous is not None and dict(previous.classes) != dict(classes):
            memo = OrderedDict()  # device classes changed: every DRA verdict may differ
            ev = core_dra.DraEvaluator(classes)
            previous = None
        return cls(version, names, facts, classes, memo, ev, config, previous, changed)

    def __len__(self) -> int:
        return len(self.facts)

    # ------------------------------------------------------------------ verdicts

    def verdict(self, q: Query) -> ShapeVerdict:
        """The (lazily filled) verdicts of `q` for this version."""
        sv = self._verdicts.get(q)
        if sv is not None:
            return sv
        prev = self._prev._verdicts.get(q) if self._prev is not None else None
        if prev is not None:
            sv = prev.carry(self, self._changed)
        else:
            memo = self._memo.get(q)
            if memo is None:
                memo = self._memo[q] = QueryMemo(q)
                if len(self._memo) > _MEMO_LIMIT:
                    self._memo.popitem(last=False)
            sv = ShapeVerdict(self, q, memo)
        self._verdicts[q] = sv
        if len(self._verdicts) > self.config.verdict_cache_size:
            self._verdicts.popitem(last=False)
        return sv

    def sig_arr(self) -> npt.NDArray[np.int64]:
        """Fit-signature id of every row (-1: checked on its own)."""
        if self._sig_arr is None:
            self._sig_arr = np.fromiter((f.sig_id for f in self.facts), np.int64, len(self.facts))
        return self._sig_arr

    def label_codes(self, key: str) -> tuple[npt.NDArray[np.int64], int]:
        """Each row's value of one label as a small integer (0 = missing), and how many codes."""
        hit = self._label_codes.get(key)
        if hit is None:
            seen: dict[str | None, int] = {None: 0}
            codes = np.fromiter(
                (seen.setdefault(f.node.labels.get(key), len(seen)) for f in self.facts), np.int64, len(self.facts)
            )
            hit = self._label_codes[key] = (codes, len(seen))
        return hit

    def message_heads(self) -> tuple[npt.NDArray[np.object_], npt.NDArray[np.object_]]:
        """Per row, `"name":"node name` and `"name":` (refusal texts are these plus a class suffix)."""
        if self._heads is None:
            if self._prev is not None and self._prev._heads is not None:
                self._heads = self._prev._heads
            else:
                nj = self.name_json
                self._heads = (bytes_array([j + b':"node ' + j[1:-1] for j in nj]), bytes_array([j + b":" for j in nj]))
        return self._heads

    def check_one(self, f: NodeFacts, q: Query) -> Verdict:
        """An uncached verdict for ad-hoc facts (preemption what-ifs)."""
        return check_node(f, q, self.evaluator)

    # ------------------------------------------------------------------ scores

    def gpu_arrays(self) -> GpuArrays:
        """Free CPU, memory and per-GPU share of every node as numpy columns (for the scorers)."""
        if self._arrays is None and self._prev is not None and self._prev._arrays is not None:
            self._arrays = self._update_arrays(self._prev._arrays)
        if self._arrays is None:
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
                version=_row_versions(len(nodes)),
            )
        return self._arrays

    def _update_arrays(self, old: GpuArrays) -> GpuArrays | None:
        """The previous version's columns with the changed rows rewritten (None: rebuild)."""
        changed = self._changed.tolist()
        width = old.gpu_left.shape[1]
        models = {m: i for i, m in enumerate(old.model_names)}
        nodes = [self.facts[i].node for i in changed]
        if any(len(n.gpus) > width or (n.gpu_model or "") not in models for n in nodes):
            return None
        cpu, mem, left = old.cpu_left.copy(), old.mem_left.copy(), old.gpu_left.copy()
        count, code = old.gpu_count.copy(), old.model_code.copy()
        for i, n in zip(changed, nodes):
            cpu[i] = max(n.cpu_milli_free, 0)
            mem[i] = max(n.memory_free, 0) >> 20
            left[i, :] = 0
            if n.gpus:
                left[i, : len(n.gpus)] = [g.milli_free for g in n.gpus]
            count[i] = len(n.gpus)
            code[i] = models[n.gpu_model or ""]
        version = old.version.copy()
        version[self._changed] = _row_versions(len(self._changed))
        return GpuArrays(old.names, cpu, mem, left, count, code, old.model_names, version=version)

    def scores(self, q: Query, rows: Rows) -> npt.NDArray[np.int64]:
        """Extender scores 0..10 of `rows` (valid rows): 0 where the pod does not fit; whole-GPU and
        shared-GPU pods are scored by the core's policy, MIG and DRA pods by tightness."""
        sv = self.verdict(q)
        sv.ensure(rows)
        fit = sv.ok[rows]
        out = np.zeros(len(rows), np.int64)
        if not fit.any() or (not q.shape.wants_gpu and q.pinned is None):
            return out
        if q.pinned is not None:  # a gang replica passes only its assigned node
            out[fit] = SCORE_MAX
            return out
        s = q.shape
        if s.gpus and not s.dra and s.mig_profile is None:
            # The core's own extender scoring (its pick gets 10, the other candidates that fit
            # 0..9), with the snapshot's policy so scores stay memoised per row version.
            arrays = self.gpu_arrays()
            feasible = np.zeros(len(arrays), np.bool_)
            feasible[rows[fit]] = True
            demand = PodDemand(
                cpu_milli=s.cpu_milli,
                mem_mib=s.memory >> 20,
                gpu_count=s.gpus,
                gpu_milli=s.gpu_milli,
                models=s.gpu_models,
            )
            scored: npt.NDArray[np.int64] = extender_scores(arrays, demand, feasible, self.policy)[rows]
            return scored
        raw = sv.raw_scores(rows[fit])
        lo, hi = float(raw.min()), float(raw.max())
        if hi - lo <= 0.0:
            out[fit] = SCORE_MAX
        else:
            out[fit] = np.rint((raw - lo) / (hi - lo) * SCORE_MAX).astype(np.int64)
        return out

    def entries(self, rows: Rows, scores: npt.NDArray[np.int64]) -> list[bytes]:
        """`{"Host":"name","Score":s}` of each row, gathered from a table of every node's eleven
        possible entries (built once per node list, shared by every query and version)."""
        if self._entry_table is None:
            if self._prev is not None and self._prev._entry_table is not None:
                self._entry_table = self._prev._entry_table
            else:
                table = np.empty((len(self.host_prefix), SCORE_MAX + 1), dtype=object)
                for i, p in enumerate(self.host_prefix):
                    table[i, :] = [p + suf for suf in _SUFFIX]
                self._entry_table = table
        out: list[bytes] = self._entry_table[rows, scores].tolist()
        return out

    def priorities_body(self, rows: Rows, scores: npt.NDArray[np.int64]) -> bytes:
        """The HostPriorityList of `rows` (valid rows) in their order: one numpy gather of fixed-width
        `,{"Host":"name","Score":` and `s}` cells, then the NUL padding dropped in one pass (JSON
        output holds no raw NUL). Per-node Python objects are never touched."""
        if not len(rows):
            return b"[]"
        heads = self._host_cells()
        out = np.empty(len(rows), dtype=[("h", heads.dtype), ("s", _SUFFIX_S.dtype)])
        out["h"] = heads[rows]
        out["s"] = _SUFFIX_S[scores]
        blob = out.tobytes().replace(b"\0", b"")
        return b"".join((b"[", memoryview(blob)[1:], b"]"))

    def names_csv(self, rows: Rows) -> bytes:
        """`"a","b",...`: the JSON names of `rows` joined by commas, gathered like priorities_body."""
        if not len(rows):
            return b""
        if self._name_s is None:
            if self._prev is not None and self._prev._name_s is not None:
                self._name_s = self._prev._name_s
            else:
                self._name_s = np.array([b"," + j for j in self.name_json], dtype=np.bytes_)
        return self._name_s[rows].tobytes().replace(b"\0", b"")[1:]

    def _host_cells(self) -> npt.NDArray[np.bytes_]:
        if self._host_s is None:
            if self._prev is not None and self._prev._host_s is not None:
                self._host_s = self._prev._host_s
            else:
                self._host_s = np.array([b"," + p for p in self.host_prefix] or [b","], dtype=np.bytes_)
        return self._host_s

    # ------------------------------------------------------------------ lookups

    def positions(self, names: Sequence[str]) -> Rows:
        """Snapshot row of each name, -1 for names the inventory does not know."""
        try:  # the usual case, every name known: no intermediate list
            return np.fromiter(map(self.index.__getitem__, names), np.intp, len(names))
        except KeyError:
            return np.array(list(map(self.index.get, names, itertools.repeat(-1))), np.intp)

    def name_table(self) -> NameTable:
        """The vectorised name -> row lookup (built once per node list, shared by its versions)."""
        if self._name_table is None:
            if self._prev is not None and self._prev._name_table is not None:
                self._name_table = self._prev._name_table
            else:
                self._name_table = NameTable(self.names)
        return self._name_table

    def facts_by_name(self, name: str) -> NodeFacts | None:
        i = self.index.get(name)
        return None if i is None else self.facts[i]
