"""Does one replica fit on one node right now: the core's fit plus what only the extender knows
(gang pinning, allocated claims, reservations of gangs not fully started), as one typed verdict."""

from __future__ import annotations

from dataclasses import dataclass

from extender.facts import NodeFacts
from placement import fit as core_fit
from placement.dra import DraEvaluator
from placement.model import GPU_PRODUCT_LABEL, PodShape
from placement.podspec import NODE_NAME_FIELD
from placement.reasons import Reason

__all__ = ["Query", "QueryMemo", "Verdict", "OK", "check_node", "room_for"]


@dataclass(frozen=True, slots=True)
class Query:
    """What is asked of every node (hashable: the per-shape verdict cache key).

    gang: (job, attempt) of a gang pod, whose own reservation it may use; pinned: the node the
    agent assigned it; claim_nodes: nodes allowed by the pod's already-allocated claims.
    """

    shape: PodShape
    gang: tuple[str, str] | None = None
    pinned: str | None = None
    claim_nodes: frozenset[str] | None = None

    @property
    def gang_name(self) -> str:
        return "" if self.gang is None else f"{self.gang[0]} (attempt {self.gang[1]})"


@dataclass(frozen=True, slots=True)
class Verdict:
    """reason None = fits. unresolvable: evicting pods on the node could not fix it."""

    reason: Reason | None
    unresolvable: bool = False
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.reason is None


OK = Verdict(None)
_DRA_REASONS = (Reason.NO_DRA_DEVICES, Reason.INSUFFICIENT_DRA_DEVICES)


def _refused(f: core_fit.Fit, q: Query, facts: NodeFacts) -> Verdict:
    reason = f.reason or Reason.INVALID_REQUEST
    message = f.detail or reason.message()
    if reason in _DRA_REASONS:
        sels = [s for r in q.shape.dra for s in r.selectors]
        if sels:
            message += " where " + " and ".join(sels)
    elif reason is Reason.NO_GPU:
        mig = sorted(k.rpartition("mig-")[2] for k, v in facts.node.extended_free.items() if "/mig-" in k)
        if mig:
            message += f" to give whole (its GPUs are in MIG mode: {', '.join(mig)})"
        elif facts.node.dra_devices:
            message += " published as an extended resource (its devices are DRA-only)"
    if q.gang is not None:
        message += f" (replica of gang {q.gang_name})"
    return Verdict(reason, not reason.preemptible, message)


class QueryMemo:
    """What one query has learned, kept across inventory versions: the verdict of each node (valid
    while its NodeFacts object is the same) and the verdict of each fit-equivalence class."""

    __slots__ = ("by_node", "by_class", "label_keys")

    def __init__(self, q: Query) -> None:
        self.by_node: dict[str, tuple[NodeFacts, Verdict]] = {}
        self.by_class: dict[tuple[int, tuple[str | None, ...]], tuple[str, Verdict]] = {}
        keys = [k for k, _ in q.shape.node_selector] + [r.key for t in q.shape.affinity for r in t]
        # matchFields on the node name make every node its own class
        self.label_keys: tuple[str, ...] | None = (
            None if NODE_NAME_FIELD in keys else tuple(sorted(set(keys) | {GPU_PRODUCT_LABEL}))
        )


def _renamed(v: Verdict, rep: str, name: str) -> Verdict:
    """A class member's verdict from its representative's: core messages start "node <name>"."""
    head = f"node {rep}"
    if not v.message.startswith(head):
        return v
    return Verdict(v.reason, v.unresolvable, f"node {name}" + v.message[len(head) :])


def room_for(f: NodeFacts, q: Query, dra: DraEvaluator) -> int:
    """Replicas of the query's shape the node holds after other gangs' reservations (0 = none)."""
    node = f.effective(q.gang, dra) if f.holds else f.node
    return core_fit.capacity(node, q.shape, dra=dra).count


def check_node(f: NodeFacts, q: Query, dra: DraEvaluator, memo: QueryMemo | None = None) -> Verdict:
    """The verdict for one node. Gang pinning and allocated claims bind every pod; beyond that,
    pods that want no GPU pass everywhere (not ours to judge: kube-scheduler checks the rest)."""
    s = q.shape
    name = f.name
    if q.pinned is not None and name != q.pinned:
        return Verdict(
            Reason.NOT_ASSIGNED_TO_GANG,
            True,
            f"node {name} is not the node assigned to this replica of gang {q.gang_name} ({q.pinned})",
        )
    if q.claim_nodes is not None and name not in q.claim_nodes:
        return Verdict(
            Reason.NODE_SELECTOR_MISMATCH,
            True,
            f"node {name} is not where the pod's allocated ResourceClaim lives ({', '.join(sorted(q.claim_nodes))})",
        )
    if not s.wants_gpu:
        return OK
    if memo is not None and f.sig_id >= 0 and memo.label_keys is not None:
        # Nodes alike in everything the core's fit reads share one verdict (idle nodes of one
        # type are the common case): check one of them, rename the message for the others.
        labels = f.node.labels
        key = (f.sig_id, tuple(map(labels.get, memo.label_keys)))
        hit = memo.by_class.get(key)
        if hit is not None:
            return hit[1] if hit[1].reason is None else _renamed(hit[1], hit[0], name)
        raw = core_fit.capacity(f.node, s, dra=dra)
        v = OK if raw.count > 0 else _refused(raw, q, f)
        memo.by_class[key] = (name, v)
        return v
    raw = core_fit.capacity(f.node, s, dra=dra)
    if raw.count == 0:
        return _refused(raw, q, f)
    if not f.holds:
        return OK
    eff = core_fit.capacity(f.effective(q.gang, dra), s, dra=dra)
    if eff.count > 0:
        return OK
    held = "; ".join(h.describe() for h in f.holds if h.gang != q.gang)
    return Verdict(Reason.RESERVED_FOR_GANG, True, f"node {name} holds {held}; without that: {eff.detail or 'no room'}")
