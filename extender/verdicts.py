"""The verdicts of one query over one snapshot's nodes (ShapeVerdict), filled in lazily, refusals kept pre-serialised."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import orjson

from extender.names import Rows
from extender.nodefit import Query, QueryMemo, Verdict, check_node, room_for

if TYPE_CHECKING:
    from extender.snapshot import Snapshot

__all__ = ["ShapeVerdict", "Refusals", "bytes_array", "code_name"]

_VECTOR_MIN = 32  # rows to fill before classes are worth numpy's fixed costs
_CODES: dict[str, int] = {"Fit": 0}
_CODE_NAMES: list[str] = ["Fit"]


def _code(v: Verdict) -> int:
    name = v.reason.code if v.reason is not None else "Fit"
    c = _CODES.get(name)
    if c is None:
        c = _CODES[name] = len(_CODE_NAMES)
        _CODE_NAMES.append(name)
    return c


def code_name(code: int) -> str:
    return _CODE_NAMES[code]


def bytes_array(items: Sequence[bytes]) -> npt.NDArray[np.object_]:
    """A numpy object array holding `items` as they are (np.array would make a fixed-width bytes array)."""
    arr = np.empty(len(items), dtype=object)
    arr[:] = items
    return arr


@dataclass(frozen=True, slots=True)
class Refusals:
    """Pre-joined refusal entries of every node for one query (see ShapeVerdict.refusals_of_all)."""

    failed: bytes
    unresolvable: bytes
    reasons: dict[str, int]


class ShapeVerdict:
    """Verdicts of one query over the nodes of a snapshot (row i = snapshot node i), filled in
    for the rows requests name. For each refused row, `"name":"reason"` is kept pre-serialised."""

    __slots__ = (
        "snap",
        "query",
        "memo",
        "done",
        "ok",
        "unresolvable",
        "codes",
        "verdicts",
        "frags",
        "_refusals",
        "_fit_scores",
    )

    def __init__(self, snap: Snapshot, query: Query, memo: QueryMemo) -> None:
        n = len(snap.facts)
        self.snap = snap
        self.query = query
        self.memo = memo
        self.done = np.zeros(n, np.bool_)
        self.ok = np.zeros(n, np.bool_)
        self.unresolvable = np.zeros(n, np.bool_)
        self.codes = np.zeros(n, np.intp)
        self.verdicts: list[Verdict | None] = [None] * n
        self.frags = bytes_array([b""] * n)
        self._refusals: Refusals | None = None
        self._fit_scores: npt.NDArray[np.int64] | None = None

    def carry(self, snap: Snapshot, changed: Rows) -> ShapeVerdict:
        """This query's verdicts moved to the next version of the same node list: rows whose
        facts changed are computed again, the others are kept."""
        sv = ShapeVerdict.__new__(ShapeVerdict)
        sv.snap, sv.query, sv.memo = snap, self.query, self.memo
        sv.done, sv.ok = self.done.copy(), self.ok.copy()
        sv.unresolvable, sv.codes = self.unresolvable.copy(), self.codes.copy()
        sv.verdicts, sv.frags = list(self.verdicts), self.frags.copy()
        sv._refusals = None  # rows changed: the refusals of every node are joined again when asked
        sv._fit_scores = None
        if len(changed):
            sv.done[changed] = False
            sv.ok[changed] = False
            sv.unresolvable[changed] = False
            sv.codes[changed] = 0
        return sv

    def ensure(self, rows: Rows) -> None:
        """Compute the verdicts of `rows` (valid rows only) not computed yet."""
        todo = rows[~self.done[rows]]
        if not len(todo):
            return
        facts, memo, q, ev = self.snap.facts, self.memo, self.query, self.snap.evaluator
        todo = np.unique(todo)
        if (
            len(todo) >= _VECTOR_MIN
            and memo.label_keys is not None
            and q.pinned is None
            and q.claim_nodes is None
            and q.shape.wants_gpu
        ):
            classed = self.snap.sig_arr()[todo] >= 0
            if classed.any() and self._ensure_classes(todo[classed]):
                todo = todo[~classed]
        by_node = memo.by_node
        nj = self.snap.name_json
        for i in todo.tolist():
            f = facts[i]
            hit = by_node.get(f.name)
            if hit is not None and hit[0] is f:
                v = hit[1]
            else:
                v = check_node(f, q, ev, memo)
                by_node[f.name] = (f, v)
            self.verdicts[i] = v
            if v.reason is None:
                self.ok[i] = True
            else:
                self.unresolvable[i] = v.unresolvable
                self.codes[i] = _code(v)
                self.frags[i] = nj[i] + b":" + orjson.dumps(v.message)
        self.done[todo] = True

    def _ensure_classes(self, rows: Rows) -> bool:
        """Fill `rows` (nodes with a fit signature) one equivalence class at a time: one check per
        class, then numpy scatters the verdict and builds each row's refusal text from its own
        name and the class's message. Verdict objects are not kept for these rows (only pinned
        gang queries read them, and those never come here). False: too many classes to encode."""
        snap, memo, q, ev = self.snap, self.memo, self.query, self.snap.evaluator
        assert memo.label_keys is not None
        combined = snap.sig_arr()[rows].astype(np.int64)
        for key in memo.label_keys:
            codes, n_codes = snap.label_codes(key)
            if int(combined.max(initial=0)) > (1 << 62) // (n_codes + 1):
                return False
            combined = combined * (n_codes + 1) + codes[rows]
        uniq, first, inv = np.unique(combined, return_index=True, return_inverse=True)
        k = len(uniq)
        ok_u = np.zeros(k, np.bool_)
        unres_u = np.zeros(k, np.bool_)
        codes_u = np.zeros(k, np.intp)
        own_name = np.zeros(k, np.bool_)
        suffix_u = bytes_array([b""] * k)
        facts = snap.facts
        for j, r in enumerate(rows[first].tolist()):
            f = facts[r]
            v = check_node(f, q, ev, memo)
            if v.reason is None:
                ok_u[j] = True
                continue
            unres_u[j] = v.unresolvable
            codes_u[j] = _code(v)
            head = f"node {f.name}"
            if v.message.startswith(head):  # the usual core message: "node <name> ..."
                own_name[j] = True
                suffix_u[j] = orjson.dumps(v.message[len(head) :])[1:]
            else:
                suffix_u[j] = orjson.dumps(v.message)
        inv = inv.reshape(-1)
        self.ok[rows] = ok_u[inv]
        self.unresolvable[rows] = unres_u[inv]
        self.codes[rows] = codes_u[inv]
        bad = ~ok_u[inv]
        if bad.any():
            brows, binv = rows[bad], inv[bad]
            named, bare = snap.message_heads()
            self.frags[brows] = np.where(own_name[binv], named[brows], bare[brows]) + suffix_u[binv]
        self.done[rows] = True
        return True

    def ensure_all(self) -> None:
        self.ensure(np.arange(len(self.done), dtype=np.intp))

    def refusals_of_all(self) -> Refusals:
        """The refusals of a request naming every node of the snapshot: the FailedNodes and
        FailedAndUnresolvableNodes insides (entries in row order) and the count per reason code,
        joined once per (version, query) since every such request gets the same ones."""
        if self._refusals is None:
            self.ensure_all()
            bad = ~self.ok
            u = self.unresolvable
            counts = np.bincount(self.codes[bad], minlength=1)
            self._refusals = Refusals(
                b",".join(self.frags[bad & ~u].tolist()),
                b",".join(self.frags[bad & u].tolist()),
                {code_name(c): int(counts[c]) for c in np.flatnonzero(counts).tolist()},
            )
        return self._refusals

    def fitting_scores(self) -> npt.NDArray[np.int64]:
        """Scores of a prioritize naming exactly the nodes that fit (what follows an all-node
        filter), by row, 0 elsewhere: scores depend on the candidate set, not on its order."""
        if self._fit_scores is None:
            self.ensure_all()
            rows = np.flatnonzero(self.ok)
            out = np.zeros(len(self.ok), np.int64)
            out[rows] = self.snap.scores(self.query, rows)
            self._fit_scores = out
        return self._fit_scores

    def raw_scores(self, rows: Rows) -> npt.NDArray[np.float64]:
        """MIG / DRA scores of `rows` (ensured, fitting): the tighter the node (the fewer further
        replicas it could take), the better, so larger free sets stay whole."""
        q = self.query
        facts, ev = self.snap.facts, self.snap.evaluator
        return -np.array([room_for(facts[i], q, ev) for i in rows.tolist()], np.float64)
